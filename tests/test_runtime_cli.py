"""tgs-runtime and tgs-hook as the container engine calls them, without docker: a fake
lower runtime records what it is given; tgsd is real."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest


CONTAINER_ID = "c" * 64


@pytest.fixture
def rt(tgsd, libshim, tmp_path, simgpu):
    """(run, tgsd, bundle): run(*runc args) calls tgs-runtime as containerd's shim would."""
    lower = tmp_path / "fake-runc"
    record = tmp_path / "lower.args"
    lower.write_text(f"#!/bin/sh\necho \"$@\" > {record}\n")
    lower.chmod(0o755)
    d = tgsd(f'[runtime]\nlower_runtime = ["{lower}"]\n')
    bundle = tmp_path / "bundle"
    (bundle / "rootfs" / "etc").mkdir(parents=True)
    spec = json.loads((Path(__file__).parent / "data" / "oci" / "docker-config.json").read_text())
    spec["root"]["path"] = "rootfs"
    (bundle / "config.json").write_text(json.dumps(spec))
    log = tmp_path / "runtime.log"

    def run(*args, stdin=None):
        proc = subprocess.run([str(libshim.root / "tgs-runtime"), "--tgs-config", str(d.config), "--root",
                               "/run/x", "--log", str(log), "--log-format", "json", *args], capture_output=True,
                              text=True, timeout=60, input=stdin)
        proc.lower_args = record.read_text().split() if record.exists() else None
        proc.log = log.read_text() if log.exists() else ""
        record.unlink(missing_ok=True)
        return proc

    return run, d, bundle


def test_pass_through_subcommands_are_execd_untouched(rt):
    run, d, bundle = rt
    for sub in (["state", CONTAINER_ID], ["start", CONTAINER_ID], ["delete", "--force", CONTAINER_ID], ["--version"]):
        p = run(*sub)
        assert p.returncode == 0 and p.stdout == "" and p.stderr == ""
        assert p.lower_args == ["--root", "/run/x", "--log", p.lower_args[3], "--log-format", "json", *sub]


def test_create_of_a_non_tgs_container_changes_nothing(rt):
    run, d, bundle = rt
    before = _set_env(bundle, "NVIDIA_VISIBLE_DEVICES=0")
    p = run("create", "--bundle", str(bundle), CONTAINER_ID)
    assert p.returncode == 0 and p.lower_args[-3:] == ["--bundle", str(bundle), CONTAINER_ID]
    assert (bundle / "config.json").read_text() == before
    assert d.status()["gpus"][0]["containers"] == []


def _set_env(bundle, *env, devices=(), annotations=None):
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["env"] = ["PATH=/bin", *env]
    if annotations is not None:
        spec["annotations"] = annotations
    spec["linux"]["devices"] = [{"path": path, "type": "c", "major": major, "minor": minor, "fileMode": 8630,
                                 "uid": 0, "gid": 0} for path, major, minor in devices]
    (bundle / "config.json").write_text(json.dumps(spec))
    return (bundle / "config.json").read_text()


def cdi_nodes(minor: int) -> list[tuple[str, int, int]]:
    """The device nodes CDI (docker --device nvidia.com/gpu=N, containerd, CRI-O) gives GPU N;
    it also sets NVIDIA_VISIBLE_DEVICES=void."""
    return [(f"/dev/nvidia{minor}", 195, minor), ("/dev/nvidiactl", 195, 255), ("/dev/nvidia-uvm", 508, 0)]


@pytest.fixture
def two_gpus(simgpu):
    simgpu.devices = 2


CDI_WAYS = {  # the environment, device nodes and annotations of a container given GPU 1 by CDI
    "asked, CDI device nodes": (["NVIDIA_VISIBLE_DEVICES=void", "TGS_CLASS=opportunistic"], cdi_nodes(1), {}),
    "default class, CDI device nodes": (["NVIDIA_VISIBLE_DEVICES=void"], cdi_nodes(1), {}),
    "default class, the device plugin's CDI annotation": (
        [], [], {"nvidia.cdi.k8s.io/nvidia-device-plugin_1": "nvidia.com/gpu=1"}),
}


def _default_class(d) -> None:
    d.config.write_text(d.config.read_text().replace("[runtime]\n", "[runtime]\ndefault_class = \"opportunistic\"\n", 1))


@pytest.mark.parametrize("way", CDI_WAYS)
def test_a_gpu_given_by_cdi_is_the_containers_gpu(two_gpus, rt, way):
    """With CDI, the GPU is a device node in the spec (NVIDIA_VISIBLE_DEVICES set to void) or
    a CDI device in an annotation: TGS takes it from either (a node by its minor number).
    With a default class, so does the launcher's look."""
    run, d, bundle = rt
    env, devices, annotations = CDI_WAYS[way]
    if "TGS_CLASS=opportunistic" not in env:
        _default_class(d)
    _set_env(bundle, *env, devices=devices, annotations=annotations)
    p = run("create", "--bundle", str(bundle), CONTAINER_ID)
    assert p.returncode == 0, p.stderr
    assert d.container(CONTAINER_ID, gpu=1)["class"] == "opportunistic" and d.container(CONTAINER_ID, gpu=0) is None
    assert "/run/tgs" in [m["destination"] for m in json.loads((bundle / "config.json").read_text())["mounts"]]


def test_a_default_class_leaves_a_container_with_every_gpu_node_but_no_gpu_request_alone(two_gpus, rt):
    """A privileged container has every device node of the host, the GPUs' among them, and
    no NVIDIA_VISIBLE_DEVICES: a node without CDI's void is no GPU job for the default class."""
    run, d, bundle = rt
    _default_class(d)
    before = _set_env(bundle, devices=[*cdi_nodes(0), *cdi_nodes(1), ("/dev/sda", 8, 0)])
    p = run("create", "--bundle", str(bundle), CONTAINER_ID)
    assert p.returncode == 0 and p.lower_args[-1] == CONTAINER_ID
    assert (bundle / "config.json").read_text() == before
    assert all(g["containers"] == [] for g in d.status()["gpus"])


def test_create_of_a_tgs_container_reserves_and_edits(rt):
    run, d, bundle = rt
    _set_env(bundle, "TGS_CLASS=opportunistic", "NVIDIA_VISIBLE_DEVICES=0")
    p = run("create", "--bundle", str(bundle), "--pid-file", "/x/pid", CONTAINER_ID)
    assert p.returncode == 0, p.stderr
    assert p.lower_args == ["--root", "/run/x", "--log", p.lower_args[3], "--log-format", "json", "create",
                            "--bundle", str(bundle), "--pid-file", "/x/pid", CONTAINER_ID]
    spec = json.loads((bundle / "config.json").read_text())
    assert "/run/tgs" in [m["destination"] for m in spec["mounts"]]
    assert spec["hooks"]["createRuntime"][0]["path"].endswith("tgs-hook")
    c = d.container(CONTAINER_ID)
    assert c["class"] == "opportunistic" and c["phase"] == "reserved"
    # the hook attaches with the init pid, and deregisters after
    hook = spec["hooks"]["createRuntime"][0]
    state = json.dumps({"ociVersion": "1.0.2", "id": CONTAINER_ID, "pid": d.inits[0].pid if d.inits else
                        subprocess.Popen(["sleep", "30"]).pid, "status": "creating", "bundle": str(bundle)})
    out = subprocess.run([hook["path"], *hook["args"][1:]], input=state, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert d.container(CONTAINER_ID)["phase"] == "attached"
    stop = spec["hooks"]["poststop"][0]
    out = subprocess.run([stop["path"], *stop["args"][1:]], input=state, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and d.container(CONTAINER_ID) is None


def test_tgsd_sets_containers_up_without_python_on_the_create_path(rt, tmp_path, libshim):
    """The launcher has tgsd decide and edit; the Python part is not needed then (nor run)."""
    run, d, bundle = rt
    alone = tmp_path / "alone"
    alone.mkdir()
    launcher = alone / "tgs-runtime"
    launcher.write_bytes((libshim.root / "tgs-runtime").read_bytes())
    launcher.chmod(0o755)
    _set_env(bundle, "TGS_CLASS=production", "NVIDIA_VISIBLE_DEVICES=0")
    p = subprocess.run([str(launcher), "--tgs-config", str(d.config), "create", "-b", str(bundle), CONTAINER_ID],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert d.container(CONTAINER_ID)["class"] == "production"
    assert "/run/tgs" in [m["destination"] for m in json.loads((bundle / "config.json").read_text())["mounts"]]


def test_with_tgsd_down_tgs_containers_fail_and_others_start(rt):
    run, d, bundle = rt
    d.stop()
    _set_env(bundle, "TGS_CLASS=opportunistic", "NVIDIA_VISIBLE_DEVICES=0")
    p = run("create", "--bundle", str(bundle), CONTAINER_ID)
    assert p.returncode == 1 and p.lower_args is None
    assert "cannot set up TGS for this opportunistic container: tgsd is not running" in p.stderr
    # the launcher's look matches (TGS_CLASS is mentioned), but the container does not ask for TGS
    before = _set_env(bundle, "NVIDIA_VISIBLE_DEVICES=0", "NOTE=TGS_CLASS=opportunistic is not set here")
    p = run("create", "--bundle", str(bundle), CONTAINER_ID)
    assert p.returncode == 0 and p.lower_args[-1] == CONTAINER_ID
    assert (bundle / "config.json").read_text() == before


@pytest.mark.parametrize("env,devices,message", [
    (("TGS_CLASS=bogus", "NVIDIA_VISIBLE_DEVICES=0"), (), "TGS_CLASS='bogus': expected production or opportunistic"),
    (("TGS_CLASS=production", "NVIDIA_VISIBLE_DEVICES=5"), (), "GPU 5: this host has 1 GPU(s)"),
    (("TGS_CLASS=opportunistic", "NVIDIA_VISIBLE_DEVICES=MIG-4f8c2a6e-0b1d-5e7f-9a3c-2d4e6f8a0b1c"), (),
     "is a MIG instance: TGS shares whole GPUs"),
    (("TGS_CLASS=opportunistic", "NVIDIA_VISIBLE_DEVICES=0:1"), (), "GPU '0:1' is a MIG instance"),
    (("TGS_CLASS=opportunistic", "NVIDIA_VISIBLE_DEVICES=void"), cdi_nodes(5),
     "GPU device /dev/nvidia5: no GPU on this host has that device node (known: /dev/nvidia0)"),
    (("TGS_CLASS=opportunistic", "NVIDIA_VISIBLE_DEVICES=void"),
     [*cdi_nodes(0), ("/dev/nvidia-caps/nvidia-cap21", 511, 21)],
     "GPU /dev/nvidia0 (with /dev/nvidia-caps/nvidia-cap21) is a MIG instance: TGS shares whole GPUs"),
    (("TGS_CLASS=opportunistic", "NVIDIA_VISIBLE_DEVICES=0", "TGS_CONVERT_MEMORY=false"), (),
     "TGS_CONVERT_MEMORY=false: an opportunistic container's GPU memory is always managed memory"),
])
def test_refused_creates_leave_nothing_behind(rt, env, devices, message):
    run, d, bundle = rt
    before = _set_env(bundle, *env, devices=devices)
    p = run("create", "--bundle", str(bundle), CONTAINER_ID)
    assert p.returncode == 1 and p.lower_args is None
    assert message in p.stderr
    last = json.loads(p.log.splitlines()[-1])
    assert last["level"] == "error" and message in last["msg"], "the line the containerd shim shows"
    assert (bundle / "config.json").read_text() == before
    assert d.status()["gpus"][0]["containers"] == [] and list((d.state_dir / "c").iterdir()) == []


def test_a_production_container_asks_to_keep_its_device_memory(rt):
    """TGS_CONVERT_MEMORY=false reaches tgsd through create: the container's memory is not
    converted, though the host converts production's."""
    run, d, bundle = rt
    _set_env(bundle, "TGS_CLASS=production", "NVIDIA_VISIBLE_DEVICES=0", "TGS_CONVERT_MEMORY=false")
    p = run("create", "--bundle", str(bundle), CONTAINER_ID)
    assert p.returncode == 0, p.stderr
    assert d.container(CONTAINER_ID)["memory"]["converted"] is False


def test_malformed_config_json(rt):
    run, d, bundle = rt
    (bundle / "config.json").write_text('{"process": {"env": ["TGS_CLASS=production", ')
    p = run("create", "--bundle", str(bundle), CONTAINER_ID)
    assert p.returncode == 1 and "config.json is not valid JSON" in p.stderr and p.lower_args is None
    assert (bundle / "config.json").read_text().startswith('{"process"')


def test_missing_bundle(rt, tmp_path):
    run, d, bundle = rt
    p = run("create", "--bundle", str(tmp_path / "nowhere"), CONTAINER_ID)
    assert p.returncode == 1 and "no config.json" in p.stderr


@pytest.mark.parametrize("bad", ['\n[control]\nshare = "no"\n', "\n[control\nshare = = \n"],
                         ids=["a bad value", "not TOML"])
def test_a_bad_tgs_config_fails_a_tgs_create_but_no_other_container(rt, tmp_path, libshim, bad):
    run, d, bundle = rt
    before = _set_env(bundle, "NVIDIA_VISIBLE_DEVICES=0")
    good = d.config.read_text()
    d.config.write_text(good + bad)
    try:
        plain = run("create", "--bundle", str(bundle), CONTAINER_ID)
        assert plain.returncode == 0 and plain.lower_args[-3:] == ["--bundle", str(bundle), CONTAINER_ID], plain.stderr
        assert (bundle / "config.json").read_text() == before
        assert run("state", CONTAINER_ID).returncode == 0
        _set_env(bundle, "TGS_CLASS=production", "NVIDIA_VISIBLE_DEVICES=0")
        p = run("create", "--bundle", str(bundle), CONTAINER_ID)
        assert p.returncode == 1 and "bad TGS config" in p.stderr, p.stderr
        assert ("control.share" in p.stderr) == ("share" in bad and "= =" not in bad)
    finally:
        d.config.write_text(good)


@pytest.mark.parametrize("stdin", ["", "not json", '{"pid": 1}', '{"id": 7}'])
def test_the_hook_refuses_garbage(libshim, tgsd, stdin):
    d = tgsd()
    hook = str(libshim.root / "tgs-hook")
    create = subprocess.run([hook, "--tgs-config", str(d.config), "createRuntime"], input=stdin,
                            capture_output=True, text=True, timeout=30)
    assert create.returncode == 1 and "the OCI state on stdin is not usable" in create.stderr
    stop = subprocess.run([hook, "--tgs-config", str(d.config), "poststop"], input=stdin, capture_output=True,
                          text=True, timeout=30)
    assert stop.returncode == 0, "poststop always exits 0"


def test_the_hook_with_tgsd_down(libshim, tgsd):
    d = tgsd()
    d.stop()
    # nested members named like the state's own do not count
    state = json.dumps({"annotations": {"id": "nested", "pid": "x"}, "id": "c\u00e9-1", "pid": 1})
    hook = str(libshim.root / "tgs-hook")
    create = subprocess.run([hook, "--tgs-config", str(d.config), "createRuntime"], input=state,
                            capture_output=True, text=True, timeout=30)
    assert create.returncode == 1 and "createRuntime of container c\u00e9-1: tgsd is not running" in create.stderr
    stop = subprocess.run([hook, "--tgs-config", str(d.config), "poststop"], input=state, capture_output=True,
                          text=True, timeout=30)
    assert stop.returncode == 0


def test_the_hook_reads_a_literal_state_dir(libshim, tmp_path):
    """TOML's literal strings ('...') are read as the basic ones are."""
    config = tmp_path / "tgs.toml"
    config.write_text(f"[runtime]\nlower_runtime = 'runc'\n[daemon]\nstate_dir = '{tmp_path}/state' # here\n")
    out = subprocess.run([str(libshim.root / "tgs-hook"), "--tgs-config", str(config), "createRuntime"],
                         input='{"id": "x", "pid": 1}', capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and f"tgsd is not running (no {tmp_path}/state/tgsd.sock)" in out.stderr


def _fake_runtime(directory: Path, name: str, record: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(f"#!/bin/sh\necho {name} \"$@\" > {record}\n")
    path.chmod(0o755)
    return path


LOWER_LISTS = {
    "a string": '[runtime]\nlower_runtime = "{fake}"  # {missing} is not tried\n',
    "one line": '[runtime]\nlower_runtime = ["{missing}", "{fake}"]\n',
    "several lines": '[runtime]\nlower_runtime = [\n  "{missing}",  # not installed here\n  # a comment line\n'
                     '  \'{fake}\',\n]\n',
    "spaced header": '[ runtime ]  # TOML allows this\nlower_runtime=["{missing}","{fake}"]\n',
}


@pytest.mark.parametrize("program", ["tgs-runtime", "tgs-runtime-create"])
@pytest.mark.parametrize("shape", LOWER_LISTS)
def test_the_first_lower_runtime_that_exists_runs_the_container(libshim, tmp_path, program, shape):
    """The launcher and its Python part read [runtime] lower_runtime alike, in either TOML shape."""
    record = tmp_path / "ran"
    fake = _fake_runtime(tmp_path / "bin", "fake-runc", record)
    config = tmp_path / "tgs.toml"
    config.write_text(LOWER_LISTS[shape].format(missing=tmp_path / "none" / "nvidia-runtime", fake=fake)
                      + f"[daemon]\nstate_dir = \"{tmp_path}/state\"\n")
    p = subprocess.run([str(libshim.root / program), "--tgs-config", str(config), "state", CONTAINER_ID],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert record.read_text().split() == ["fake-runc", "state", CONTAINER_ID]


@pytest.mark.parametrize("program", ["tgs-runtime", "tgs-runtime-create"])
def test_by_default_the_nvidia_runtime_runs_containers_where_it_is_installed(libshim, tmp_path, program):
    """With no lower_runtime in the config: nvidia-container-runtime when it is on PATH (so
    NVIDIA_VISIBLE_DEVICES gives a TGS container its GPUs, as --runtime=nvidia does), else runc."""
    record = tmp_path / "ran"
    config = tmp_path / "tgs.toml"
    config.write_text(f"[daemon]\nstate_dir = \"{tmp_path}/state\"\n")
    _fake_runtime(tmp_path / "runc-only", "runc", record)
    _fake_runtime(tmp_path / "toolkit", "nvidia-container-runtime", record)
    for path, ran in ((f"{tmp_path}/runc-only", "runc"), (f"{tmp_path}/runc-only:{tmp_path}/toolkit",
                                                          "nvidia-container-runtime")):
        p = subprocess.run([str(libshim.root / program), "--tgs-config", str(config), "state", CONTAINER_ID],
                           capture_output=True, text=True, timeout=60, env={"PATH": path})
        assert p.returncode == 0, p.stderr
        assert record.read_text().split()[0] == ran


GPU_OPERATOR_RUNTIME = "/usr/local/nvidia/toolkit/nvidia-container-runtime"


@pytest.mark.parametrize("program", ["tgs-runtime", "tgs-runtime-create"])
def test_by_default_the_gpu_operators_nvidia_runtime_is_tried_before_runc(libshim, tmp_path, program):
    """The GPU Operator installs the NVIDIA runtime off PATH, under /usr/local/nvidia/toolkit."""
    config = tmp_path / "tgs.toml"
    config.write_text(f"[daemon]\nstate_dir = \"{tmp_path}/state\"\n")
    (tmp_path / "empty").mkdir()
    p = subprocess.run([str(libshim.root / program), "--tgs-config", str(config), "state", CONTAINER_ID],
                       capture_output=True, text=True, timeout=60, env={"PATH": str(tmp_path / "empty")})
    if os.access(GPU_OPERATOR_RUNTIME, os.X_OK):  # a GPU Operator node: it was found
        assert "no lower runtime found" not in p.stderr
    else:
        assert f"no lower runtime found (tried nvidia-container-runtime, {GPU_OPERATOR_RUNTIME}, runc;" in p.stderr


def _state_under(libshim, tmp_path, program: str, lower: list[str]) -> tuple[subprocess.CompletedProcess, str]:
    """`state` through `program` with [runtime] lower_runtime = lower: the run, and its log."""
    config = tmp_path / "tgs.toml"
    config.write_text("[runtime]\nlower_runtime = [" + ", ".join(f'"{x}"' for x in lower) + "]\n")
    log = tmp_path / "runtime.log"
    p = subprocess.run([str(libshim.root / program), "--tgs-config", str(config), "--log", str(log), "state",
                        CONTAINER_ID], capture_output=True, text=True, timeout=60)
    return p, log.read_text() if log.exists() else ""


@pytest.mark.parametrize("program", ["tgs-runtime", "tgs-runtime-create"])
def test_with_no_lower_runtime_installed_the_error_names_each_tried(libshim, tmp_path, program):
    p, log = _state_under(libshim, tmp_path, program, [f"{tmp_path}/a/runc", "no-such-runtime"])
    assert p.returncode != 0
    message = f"no lower runtime found (tried {tmp_path}/a/runc, no-such-runtime"
    assert message in p.stderr and message in log


@pytest.mark.parametrize("program", ["tgs-runtime", "tgs-runtime-create"])
def test_a_lower_runtime_that_cannot_run_is_named_with_the_reason(libshim, tmp_path, program):
    """An installed lower runtime the kernel cannot execute (a broken download, a binary of
    another architecture) fails every container with its path and the system's reason."""
    broken = tmp_path / "bin" / "runc"
    broken.parent.mkdir()
    broken.write_bytes(b"\x7fELF not really\n")
    broken.chmod(0o755)
    p, log = _state_under(libshim, tmp_path, program, [str(broken)])
    assert p.returncode != 0
    assert f"cannot run {broken}: Exec format error" in p.stderr, p.stderr
    assert f"cannot run {broken}" in log
