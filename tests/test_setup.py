"""`tgs setup` and `tgs doctor`."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


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
    assert data["runtimes"]["tgs"] == {"path": "/usr/bin/tgs-runtime", "runtimeArgs": ["--tgs-config", "/etc/tgs/config.toml"]}
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


def test_setup_containerd(tmp_path):
    out = tgs("setup", "containerd")
    assert 'containerd.runtimes.tgs]' in out.stdout and 'pod_annotations = ["tgs.class"]' in out.stdout
    conf = tmp_path / "config.toml"
    conf.write_text("version = 2\n")
    tgs("setup", "containerd", "--write", str(conf))
    tgs("setup", "containerd", "--write", str(conf))
    text = conf.read_text()
    assert text.startswith("version = 2\n") and text.count("containerd.runtimes.tgs]") == 1
    import tomllib
    tgs_handler = tomllib.loads(text)["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["tgs"]
    # the device plugin's annotations for the NVIDIA runtime name the GPUs where containerd injects no CDI device
    assert tgs_handler["container_annotations"] == ["tgs.class", "nvidia.cdi.k8s.io/*"]


def test_doctor_passes_on_a_working_host_and_says_what_to_fix(docker, libshim, tmp_path):
    d, t = docker()
    djson = d.workdir / "daemon.json"
    env = {**os.environ, "DOCKER_HOST": d.host}
    ok = tgs("doctor", "--config", str(t.config), "--daemon-json", str(djson), env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "tgsd answers" in ok.stdout and "dockerd has loaded the tgs runtime" in ok.stdout
    assert "simgpu (simulated)" in ok.stdout and "ok    lower runtime " in ok.stdout
    t.stop()
    bad = tgs("doctor", "--config", str(t.config), "--daemon-json", str(tmp_path / "none.json"), env=env)
    assert bad.returncode == 1
    assert "FAIL  tgsd is not running" in bad.stdout and "fix: systemctl enable --now tgsd" in bad.stdout
    assert "has no tgs runtime" in bad.stdout and "fix: tgs setup docker" in bad.stdout


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
