"""`tgs setup` and `tgs doctor`."""
from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import tomllib

import pytest

from tgs_runtime.containerd_config import CRI_RUNTIME_PLUGIN


def tgs(*args, env=None):
    return subprocess.run([sys.executable, "-m", "tgs_runtime", *args], capture_output=True, text=True, timeout=60,
                          env=env)


@pytest.fixture
def prefix(tmp_path, libshim):
    p = tmp_path / "root"
    (p / "etc" / "docker").mkdir(parents=True)
    (p / "etc" / "docker" / "daemon.json").write_text(json.dumps(
        {"log-driver": "journald", "runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}))
    return p


def test_setup_docker_installs_and_keeps_every_other_key(prefix):
    out = tgs("setup", "docker", "--prefix", str(prefix))
    assert out.returncode == 0, out.stderr
    data = json.loads((prefix / "etc/docker/daemon.json").read_text())
    assert data["log-driver"] == "journald" and data["runtimes"]["nvidia"] == {"path": "nvidia-container-runtime"}
    assert data["runtimes"]["tgs"] == {"path": "/usr/bin/tgs-runtime"}, "the default config needs no runtimeArgs"
    for f in ("usr/lib/tgs/libtgs.so", "usr/bin/tgs-runtime", "usr/bin/tgs-runtime-create", "usr/bin/tgs-hook",
              "usr/bin/tgsd", "etc/tgs/config.toml", "etc/systemd/system/tgsd.service"):
        assert (prefix / f).exists(), f
    assert os.access(prefix / "usr/bin/tgs-hook", os.X_OK)
    assert (prefix / "usr/bin/tgs-hook").read_bytes().startswith(b"\x7fELF"), "the C hook"
    assert (prefix / "usr/bin/tgs-runtime-create").read_text().startswith(f"#!{sys.executable} -IS")
    backups = list((prefix / "etc/docker").glob("daemon.json.tgs-backup-*"))
    assert len(backups) == 1 and "tgs" not in backups[0].read_text()
    assert "SIGHUP" in out.stdout
    again = tgs("setup", "docker", "--prefix", str(prefix))
    assert "already has the tgs runtime" in again.stdout


def test_setup_docker_points_the_runtime_at_another_config(prefix):
    """Only a config other than /etc/tgs/config.toml is named in runtimeArgs (dockerd runs
    such a runtime through a shell script of its own)."""
    out = tgs("setup", "docker", "--prefix", str(prefix), "--config", "/srv/tgs/tgs.toml")
    assert out.returncode == 0, out.stderr
    data = json.loads((prefix / "etc/docker/daemon.json").read_text())
    assert data["runtimes"]["tgs"] == {"path": "/usr/bin/tgs-runtime", "runtimeArgs": ["--tgs-config", "/srv/tgs/tgs.toml"]}


def test_setup_keeps_an_operators_config(prefix):
    (prefix / "etc/tgs").mkdir(parents=True)
    (prefix / "etc/tgs/config.toml").write_text("# mine\n")
    tgs("setup", "docker", "--prefix", str(prefix))
    assert (prefix / "etc/tgs/config.toml").read_text() == "# mine\n"


def test_dry_run_changes_nothing(prefix):
    before = (prefix / "etc/docker/daemon.json").read_text()
    out = tgs("setup", "docker", "--prefix", str(prefix), "--dry-run")
    assert out.returncode == 0 and '+    "tgs": {' in out.stdout and "would copy" in out.stdout
    assert (prefix / "etc/docker/daemon.json").read_text() == before
    assert not (prefix / "usr").exists()


def test_undo(prefix):
    tgs("setup", "docker", "--prefix", str(prefix))
    out = tgs("setup", "docker", "--prefix", str(prefix), "--undo")
    assert out.returncode == 0, out.stderr
    data = json.loads((prefix / "etc/docker/daemon.json").read_text())
    assert "tgs" not in data["runtimes"] and data["runtimes"]["nvidia"] and data["log-driver"] == "journald"
    assert not (prefix / "usr/bin/tgs-runtime").exists() and (prefix / "etc/tgs/config.toml").exists()


def test_a_malformed_daemon_json_is_left_alone(prefix):
    (prefix / "etc/docker/daemon.json").write_text("{ not json")
    out = tgs("setup", "docker", "--prefix", str(prefix))
    assert out.returncode == 1 and "is not valid JSON" in out.stderr and "nothing was changed" in out.stderr
    assert (prefix / "etc/docker/daemon.json").read_text() == "{ not json"


KUBEADM_RUNC = ('[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
                '  runtime_type = "io.containerd.runc.v2"\n'
                '  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
                '    SystemdCgroup = true\n')  # kubelet's cgroup driver is systemd: runc's must be too


def containerd_reads(conf: Path) -> dict:
    """The tgs handler as the installed containerd reads the file (`containerd config dump`)."""
    out = subprocess.run(["containerd", "--config", str(conf), "config", "dump"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    dumped = tomllib.loads(out.stdout)
    cri = dumped["plugins"][CRI_RUNTIME_PLUGIN[dumped.get("version", 1)]]
    return {"tgs": cri["containerd"]["runtimes"].get("tgs"), "sandbox_image": cri.get("sandbox_image")}


@pytest.mark.parametrize("before", [
    None,                                                                      # no file yet
    "# the cluster's containerd config\n",                                     # comments only
    'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "pause:3.9"\n',
    'oom_score = 0\n[plugins.cri]\n  sandbox_image = "pause:3.9"\n',           # version 1: no version line
    'version = 2\n' + KUBEADM_RUNC,
], ids=["absent", "comments", "version-2", "version-1", "systemd-cgroup"])
def test_setup_containerd_puts_the_handler_where_containerd_reads_it(prefix, before):
    conf = prefix / CONTAINERD.lstrip("/")
    if before is not None:
        conf.parent.mkdir(parents=True)
        conf.write_text(before)
    first = setup_containerd(prefix, "--write", CONTAINERD)
    again = setup_containerd(prefix, "--write", CONTAINERD)
    assert first.returncode == 0 and "added the tgs runtime handler" in first.stdout, first.stderr
    assert again.returncode == 0 and "already has the tgs runtime handler" in again.stdout
    assert os.access(prefix / "usr/bin/tgs-runtime", os.X_OK) and (prefix / "usr/lib/tgs/libtgs.so").exists()
    read = containerd_reads(conf)
    assert read["tgs"] is not None, f"containerd does not see the handler in:\n{conf.read_text()}"
    assert read["tgs"]["options"]["BinaryName"] == "/usr/bin/tgs-runtime"
    assert read["tgs"]["pod_annotations"] == ["tgs.class", "tgs.convert-memory"]
    # the device plugin's annotations for the NVIDIA runtime name the GPUs where containerd injects no CDI device
    assert read["tgs"]["container_annotations"] == ["tgs.class", "tgs.convert-memory", "nvidia.cdi.k8s.io/*"]
    if before and "sandbox_image" in before:
        assert read["sandbox_image"] == "pause:3.9"
    # as runc's, which kubelet's cgroup driver matches
    assert read["tgs"]["options"].get("SystemdCgroup", False) == bool(before and "SystemdCgroup" in before)
    if before and before.startswith("#"):
        assert before in conf.read_text()


def test_setup_containerd_for_containerd_2(prefix):
    """Version 3 (containerd 2) keeps runtime handlers under io.containerd.cri.v1.runtime."""
    conf = prefix / CONTAINERD.lstrip("/")
    conf.parent.mkdir(parents=True)
    conf.write_text("version = 3\n")
    assert setup_containerd(prefix, "--write", CONTAINERD).returncode == 0
    written = tomllib.loads(conf.read_text())
    assert set(written["plugins"]) == {"io.containerd.cri.v1.runtime"}
    printed = tgs("setup", "containerd", "--containerd-config-version", "3").stdout
    assert tomllib.loads(printed) == {k: v for k, v in written.items() if k != "version"}


@pytest.mark.parametrize("before,args,message", [
    ('version = 3\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.tgs]\n  runtime_type = "x"\n', (),
     'tgs runtime handler: it is under plugins."io.containerd.grpc.v1.cri", which containerd does not read from a '
     'version 3 config (it reads plugins."io.containerd.cri.v1.runtime"): remove the '
     '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.tgs] section'),
    ("version = 2\n[plugins\n", (), "cannot be read as TOML"),
    ("version = 7\n", (), "has version = 7: containerd's configs are versions 1, 2, 3"),
    ("version = 2\n", ("--containerd-config-version", "3"), "is a version 2 config, not 3"),
], ids=["another-versions-handler", "not-toml", "unknown-version", "version-mismatch"])
def test_setup_containerd_refuses_what_it_cannot_do_right(prefix, before, args, message):
    conf = prefix / CONTAINERD.lstrip("/")
    conf.parent.mkdir(parents=True)
    conf.write_text(before)
    out = setup_containerd(prefix, "--write", CONTAINERD, *args)
    assert out.returncode == 1 and message in out.stderr and "nothing was changed" in out.stderr, out.stderr
    assert conf.read_text() == before and not (prefix / "usr").exists()


@pytest.mark.parametrize("docker_too", [False, True])
def test_setup_containerd_undo(prefix, docker_too):
    """The handler goes, the config is as it was; the programs go unless docker still runs them."""
    conf = prefix / CONTAINERD.lstrip("/")
    conf.parent.mkdir(parents=True)
    before = 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "pause:3.9"\n'
    conf.write_text(before)
    if docker_too:
        assert tgs("setup", "docker", "--prefix", str(prefix)).returncode == 0
    assert setup_containerd(prefix, "--write", CONTAINERD).returncode == 0
    dry = setup_containerd(prefix, "--undo", "--dry-run")
    assert dry.returncode == 0 and f"would remove the tgs runtime handler from {conf}" in dry.stdout, dry.stderr
    assert "tgs" in conf.read_text()
    out = setup_containerd(prefix, "--undo")
    assert out.returncode == 0, out.stderr
    assert conf.read_text() == before
    assert (prefix / "usr/bin/tgs-runtime").exists() == docker_too and (prefix / "etc/tgs/config.toml").exists()
    assert ("still names the tgs runtime" in out.stdout) == docker_too
    if docker_too:  # and the other way round: docker's undo keeps what containerd's handler runs
        assert setup_containerd(prefix, "--write", CONTAINERD).returncode == 0
        undo_docker = tgs("setup", "docker", "--prefix", str(prefix), "--undo")
        assert "still has the tgs runtime handler" in undo_docker.stdout and (prefix / "usr/bin/tgs-runtime").exists()


def test_setup_containerd_undo_leaves_a_handler_it_did_not_write(prefix):
    conf = prefix / CONTAINERD.lstrip("/")
    conf.parent.mkdir(parents=True)
    mine = 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.tgs]\n  runtime_type = "x"\n'
    conf.write_text(mine)
    out = setup_containerd(prefix, "--undo")
    assert out.returncode == 1 and "has a tgs runtime handler that tgs setup did not write" in out.stderr
    assert conf.read_text() == mine


def test_setup_containerd_dry_run_changes_nothing(prefix):
    out = setup_containerd(prefix, "--write", CONTAINERD, "--dry-run")
    assert out.returncode == 0, out.stderr
    assert f"would add the tgs runtime handler in {prefix}{CONTAINERD}" in out.stdout and "would copy" in out.stdout
    assert not (prefix / "etc/containerd").exists() and not (prefix / "usr").exists()


@pytest.mark.parametrize("engine", ["docker", "containerd"])
def test_setup_never_replaces_a_device_or_a_directory(prefix, engine):
    """`--daemon-json /dev/null` (or --write) must not turn /dev/null into a file."""
    (prefix / "dev").mkdir()
    os.mknod(prefix / "dev/null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    args = ("docker", "--daemon-json", "/dev/null") if engine == "docker" else ("containerd", "--write", "/dev/null")
    out = tgs("setup", *args, "--prefix", str(prefix))
    assert out.returncode == 1 and f"{prefix}/dev/null is not a regular file" in out.stderr, out.stderr
    assert stat.S_ISCHR(os.lstat(prefix / "dev/null").st_mode) and not (prefix / "usr").exists()
    assert sorted(p.name for p in (prefix / "dev").iterdir()) == ["null"]


def test_doctor_passes_on_a_working_host_and_says_what_to_fix(docker, libshim, tmp_path):
    d, t = docker()
    djson = d.workdir / "daemon.json"
    env = {**os.environ, "DOCKER_HOST": d.host}
    ok = tgs("doctor", "--config", str(t.config), "--daemon-json", str(djson), env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "tgsd answers" in ok.stdout and "dockerd has loaded the tgs runtime" in ok.stdout
    assert "simgpu (simulated)" in ok.stdout and "ok    lower runtime " in ok.stdout
    t.stop()
    bad = tgs("doctor", "--config", str(t.config), "--daemon-json", str(tmp_path / "none.json"),
              "--containerd-config", str(tmp_path / "none.toml"), env=env)
    assert bad.returncode == 1
    assert "FAIL  tgsd is not running" in bad.stdout and "fix: systemctl enable --now tgsd" in bad.stdout
    assert f"has no tgs runtime, and {tmp_path}/none.toml no tgs runtime handler" in bad.stdout
    assert "fix: tgs setup docker, or for Kubernetes: tgs setup containerd --write" in bad.stdout


CONTAINERD = "/etc/containerd/config.toml"


def setup_containerd(root: Path, *args: str, env: dict[str, str] | None = None):
    """`tgs setup containerd` installing under `root` (--prefix): paths named as on the host."""
    return tgs("setup", "containerd", "--prefix", str(root), *args, env=env)


def fake_containerd(tmp_path: Path, release: str, version: int) -> dict[str, str]:
    """An environment whose `containerd` says it is `release` and writes configs of `version`."""
    bin_dir = tmp_path / "fake-containerd"
    bin_dir.mkdir()
    (bin_dir / "containerd").write_text(
        f'#!/bin/sh\ncase "$1" in\n  --version) echo "containerd github.com/containerd/containerd/v2 v{release} 0a1b2c";;\n'
        f'  config) echo "version = {version}";;\nesac\n')
    (bin_dir / "containerd").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


MAIN_V3 = 'version = 3\n[plugins."io.containerd.cri.v1.images"]\n  snapshotter = "overlayfs"\n'


@pytest.mark.parametrize("release,main,version,note", [
    ("2.2.1", MAIN_V3, 3, False),                                       # conf.d is imported without being named
    ("2.1.4", MAIN_V3, 3, True),                                        # not imported: said
    ("2.1.4", 'version = 2\nimports = ["conf.d/*.toml"]\n', 2, False),  # the main config's version, not 3
], ids=["2.2-conf.d", "2.1-not-imported", "2.1-imports-version-2"])
def test_setup_containerd_writes_a_drop_in_for_containerd_2(prefix, tmp_path, release, main, version, note):
    """containerd 2 merges imported files into the main config; a new drop-in gets the main
    config's version (containerd does not load one of a higher version)."""
    (prefix / "etc/containerd").mkdir(parents=True)
    (prefix / CONTAINERD.lstrip("/")).write_text(main)
    drop_in = prefix / "etc/containerd/conf.d/tgs.toml"
    out = setup_containerd(prefix, "--write", "/etc/containerd/conf.d/tgs.toml",
                           env=fake_containerd(tmp_path, release, 3))
    assert out.returncode == 0, out.stderr
    written = tomllib.loads(drop_in.read_text())
    assert written["version"] == version and "tgs" in written["plugins"][CRI_RUNTIME_PLUGIN[version]]["containerd"][
        "runtimes"]
    assert ("does not import" in out.stdout) == note, out.stdout


def test_setup_containerd_puts_no_drop_in_under_containerd_1(prefix):
    """containerd 1.x (the one installed here) replaces a plugin's whole section with an
    imported file's: a drop-in with the handler would drop the main config's CRI settings."""
    main = prefix / CONTAINERD.lstrip("/")
    main.parent.mkdir(parents=True)
    main.write_text('version = 2\nimports = ["conf.d/*.toml"]\n[plugins."io.containerd.grpc.v1.cri"]\n'
                    '  sandbox_image = "pause:3.9"\n')
    out = setup_containerd(prefix, "--write", "/etc/containerd/conf.d/tgs.toml")
    assert out.returncode == 1 and "merges an imported file's plugin sections whole" in out.stderr, out.stderr
    assert f"add the handler to {main} itself" in out.stderr
    assert not (main.parent / "conf.d").exists() and not (prefix / "usr").exists()


@pytest.mark.parametrize("release,main,drop_in_version,problem", [
    ("2.2.1", MAIN_V3, 3, None),
    ("2.2.1", 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "p"\n', 3,
     "its file is version 3, above"),
    (None, 'version = 2\nimports = ["conf.d/*.toml"]\n', 2, "merges an imported file's plugin sections whole"),
], ids=["2.2-right", "2.2-higher-version", "1.6-installed-here"])
def test_doctor_finds_the_handler_in_a_drop_in(tgsd, libshim, tmp_path, release, main, drop_in_version, problem):
    from tgs_runtime.containerd_config import stanza

    t = tgsd()
    (tmp_path / "main.toml").write_text(main)
    drop_in = tmp_path / "conf.d" / "tgs.toml"
    drop_in.parent.mkdir()
    drop_in.write_text(f"version = {drop_in_version}\n" + stanza(drop_in_version, libshim.root / "tgs-runtime",
                                                                   t.config))
    env = fake_containerd(tmp_path, release, 3) if release else dict(os.environ)
    env["DOCKER_HOST"] = f"unix://{tmp_path}/no-docker.sock"
    out = tgs("doctor", "--config", str(t.config), "--daemon-json", str(tmp_path / "none.json"),
              "--containerd-config", str(tmp_path / "main.toml"), env=env)
    assert "docker is not set up for TGS, containerd is" in out.stdout, out.stdout
    if problem is None:
        assert out.returncode == 0 and f"ok    {drop_in} has the tgs runtime handler" in out.stdout, out.stdout
    else:
        assert out.returncode == 1 and f"FAIL  containerd's tgs runtime handler in {drop_in}: " in out.stdout
        assert problem in out.stdout, out.stdout


@pytest.mark.parametrize("version,binary,runc,problem", [
    (2, "built", "", None),
    (3, "built", "", 'under plugins."io.containerd.grpc.v1.cri", which containerd does not read from a version 3 '
     'config'),
    (2, "/nonexistent/tgs-runtime", "", "its BinaryName (/nonexistent/tgs-runtime) is not an installed tgs-runtime"),
    (2, "built", KUBEADM_RUNC, "its SystemdCgroup is false, the default runtime's true"),
], ids=["right", "another-versions-plugin", "no-runtime-there", "systemd-cgroup-differs"])
def test_doctor_on_a_containerd_node_without_docker(tgsd, libshim, tmp_path, version, binary, runc, problem):
    """A Kubernetes node: the handler in containerd's config is checked, and docker's absence
    is not a failure."""
    from tgs_runtime.containerd_config import stanza

    t = tgsd()
    conf = tmp_path / "containerd.toml"
    runtime = libshim.root / "tgs-runtime" if binary == "built" else Path(binary)
    conf.write_text(f"version = {version}\n{runc}" + stanza(2, runtime, t.config))
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    out = tgs("doctor", "--config", str(t.config), "--daemon-json", str(tmp_path / "none.json"),
              "--containerd-config", str(conf), env=env)
    assert "has no tgs runtime: docker is not set up for TGS, containerd is" in out.stdout, out.stdout
    assert "no docker daemon answers" not in out.stdout
    if problem is None:
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"ok    {conf} has the tgs runtime handler where containerd reads it" in out.stdout
    else:
        assert out.returncode == 1 and f"FAIL  containerd's tgs runtime handler in {conf}: " in out.stdout
        assert problem in out.stdout, out.stdout


def test_doctor_says_why_docker_does_not_answer(libshim, tmp_path):
    """Where no dockerd answers, `tgs doctor` says where it looked and why not: a socket no
    one listens on (a dockerd that died), no socket at all. It said only the SDK's
    exception's name (DockerException) for either."""
    dead = tmp_path / "dead.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(dead))
    s.close()  # the file stays, and nothing listens
    for sock, why in ((dead, "connection refused: nothing listens there"),
                      (tmp_path / "none.sock", "no such socket: docker is not running, or not installed")):
        out = tgs("doctor", "--daemon-json", str(tmp_path / "none.json"),
                  env={**os.environ, "DOCKER_HOST": f"unix://{sock}"})
        assert out.returncode == 1
        assert f"FAIL  no docker daemon answers at unix://{sock} ({why})" in out.stdout, out.stdout
        assert "fix: start docker (systemctl start docker), or use containerd (tgs setup containerd)" in out.stdout


def test_doctor_fails_when_no_lower_runtime_is_installed(libshim, tmp_path):
    config = tmp_path / "tgs.toml"
    config.write_text(f"[runtime]\nlower_runtime = [\"{tmp_path}/none/runc\"]\n"
                      f"[daemon]\nstate_dir = \"{tmp_path}/state\"\n")
    out = tgs("doctor", "--config", str(config), "--daemon-json", str(tmp_path / "none.json"))
    assert out.returncode == 1
    assert f"FAIL  no lower runtime found (tried {tmp_path}/none/runc" in out.stdout
    assert "every container of the tgs runtime would fail" in out.stdout and "fix: install runc" in out.stdout


@pytest.mark.parametrize("lower,installed,route,words", [
    ("/usr/bin/nvidia-container-runtime", [], "NVIDIA_RUNTIME", "get the GPUs NVIDIA_VISIBLE_DEVICES names"),
    ("/usr/bin/runc", ["nvidia-container-runtime-hook"], "GPUS_FLAG", "they get GPUs with `docker run --gpus`"),
    ("/usr/bin/runc", ["cdi/nvidia.yaml"], "CDI", "they get GPUs as CDI devices"),
    ("/usr/bin/runc", ["cdi/other-vendor.yaml"], "NONE", "TGS containers would not see the GPU"),
    ("/usr/bin/runc", [], "NONE", "TGS containers would not see the GPU"),
])
def test_how_tgs_containers_get_their_gpus_on_a_real_host(tmp_path, monkeypatch, lower, installed, route, words):
    """What `tgs doctor` says (and fails on) and how `tgs demo` runs its containers, on a real
    GPU host (not on simgpu, where TGS mounts the GPU itself)."""
    from tgs_runtime.runtime.gpu_access import GpuAccess, Route

    (tmp_path / "cdi").mkdir()
    for name in installed:
        # a CDI spec as nvidia-ctk cdi generate writes it (the start of one), or a stand-in program
        kind = "nvidia.com/gpu" if "nvidia" in name else "example.com/fpga"
        (tmp_path / name).write_text(f"---\ncdiVersion: 0.5.0\nkind: {kind}\n" if "cdi/" in name else "#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    access = GpuAccess.of(lower, cdi_dirs=[tmp_path / "missing", tmp_path / "cdi"])
    assert access.route == Route[route] and words in access.describe()


def test_a_cdi_spec_from_before_a_driver_upgrade_is_seen(tmp_path):
    """`tgs doctor` fails a CDI spec whose driver libraries are not the running driver's."""
    from tgs_runtime.runtime.gpu_access import cdi_driver_versions

    spec = tmp_path / "nvidia.yaml"
    spec.write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ncontainerEdits:\n  mounts:\n"
                    "  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05\n"
                    "    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05\n"
                    "  - hostPath: /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05\n")
    assert cdi_driver_versions(spec) == {"580.95.05"}
    spec.write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n")
    assert cdi_driver_versions(spec) == set() and cdi_driver_versions(tmp_path / "gone.yaml") == set()


def test_doctor_fails_the_cdi_route_where_dockerd_has_cdi_off(docker, simgpu, tmp_path):
    """GPUs only by CDI, but a dockerd without it (docker 20.10 here): TGS containers would
    start without their GPUs."""
    d, _ = docker()
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n")
    config = tmp_path / "tgs.toml"
    config.write_text(f"[runtime]\nlower_runtime = [\"runc\"]\n[daemon]\nstate_dir = \"{tmp_path}/state\"\n")
    path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    env = simgpu.env(extra={"PATH": path, "DOCKER_HOST": d.host})
    out = tgs("doctor", "--config", str(config), "--daemon-json", str(tmp_path / "none.json"), "--containerd-config",
              str(tmp_path / "none.toml"), "--cdi-spec-dir", str(cdi), env=env)
    assert "ok    dockerd has loaded the tgs runtime" in out.stdout, out.stdout + out.stderr
    assert f"FAIL  TGS containers run on {shutil.which('runc', path=path)}: they get GPUs as CDI devices ({cdi}/nvidia.yaml)" in out.stdout
    assert "but dockerd 20.10" in out.stdout and "has CDI off" in out.stdout, out.stdout
    assert 'fix: turn CDI on in /etc/docker/daemon.json ("features": {"cdi": true}' in out.stdout


@pytest.mark.parametrize("release,enable_cdi,problem", [
    (None, None, "but containerd 1.6 has no CDI (1.7 and later have)"),      # the one installed here
    ("1.7.24", None, "but containerd 1.7 has CDI off"),                      # 1.7's default
    ("1.7.24", True, None),
    ("2.1.4", None, None),                                                   # 2.0's default
], ids=["1.6", "1.7-default", "1.7-enabled", "2.1-default"])
def test_doctor_checks_containerd_gives_cdi_devices(simgpu, libshim, tmp_path, release, enable_cdi, problem):
    """A Kubernetes node whose GPUs come by CDI only: containerd must put them in."""
    from tgs_runtime.containerd_config import stanza

    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n")
    config = tmp_path / "tgs.toml"
    config.write_text(f"[runtime]\nlower_runtime = [\"runc\"]\n[daemon]\nstate_dir = \"{tmp_path}/state\"\n")
    version = 3 if release and release.startswith("2") else 2
    plugin = CRI_RUNTIME_PLUGIN[version]
    conf = tmp_path / "containerd.toml"
    conf.write_text(f"version = {version}\n" + (f'[plugins."{plugin}"]\n  enable_cdi = true\n' if enable_cdi else "")
                    + stanza(version, libshim.root / "tgs-runtime", config))
    env = fake_containerd(tmp_path, release, 3) if release else dict(os.environ)
    env = simgpu.env(extra={"PATH": env["PATH"], "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"})
    out = tgs("doctor", "--config", str(config), "--daemon-json", str(tmp_path / "none.json"), "--containerd-config",
              str(conf), "--cdi-spec-dir", str(cdi), env=env)
    assert f"ok    {conf} has the tgs runtime handler" in out.stdout, out.stdout + out.stderr
    described = f"TGS containers run on {shutil.which('runc', path=env['PATH'])}: they get GPUs as CDI devices"
    if problem is None:
        assert f"ok    {described}" in out.stdout, out.stdout
    else:
        assert f"FAIL  {described}" in out.stdout and problem in out.stdout, out.stdout


@pytest.mark.parametrize("libcuda,stale", [("580.95.05", True), (None, False)])
def test_doctor_on_a_gpu_host_with_cdi(tmp_path, simgpu, libcuda, stale):
    """doctor's checks of a real GPU host, against simgpu's NVML (its driver reads
    simgpu-13.0): the CDI route, and a spec mounting another driver's libraries."""
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    mounts = f"containerEdits:\n  mounts:\n  - hostPath: /usr/lib/libcuda.so.{libcuda}\n" if libcuda else ""
    (cdi / "nvidia.yaml").write_text(f"cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n{mounts}")
    config = tmp_path / "tgs.toml"
    config.write_text(f"[runtime]\nlower_runtime = [\"runc\"]\n[daemon]\nstate_dir = \"{tmp_path}/state\"\n")
    env = simgpu.env(extra={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"})
    out = tgs("doctor", "--config", str(config), "--daemon-json", str(tmp_path / "none.json"),
              "--cdi-spec-dir", str(tmp_path / "missing"), "--cdi-spec-dir", str(cdi), env=env)
    assert "ok    GPU backend: NVML, driver simgpu-13.0" in out.stdout, out.stdout + out.stderr
    assert f"they get GPUs as CDI devices ({cdi}/nvidia.yaml)" in out.stdout
    message = (f"FAIL  the CDI spec {cdi}/nvidia.yaml mounts the libraries of driver 580.95.05, but the driver is "
               "simgpu-13.0")
    assert (message in out.stdout) == stale
