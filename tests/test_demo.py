"""`tgs demo`, the README's first command: it runs on simgpu here, shows live progress and
ends with the table, TGS included."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

from harness.demotable import demo_rows
from tgs_runtime.paths import REPO_ROOT


def test_demo_shows_tgs_protecting_production(libshim):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TGS_", "SIMGPU_"))}
    out = subprocess.run([sys.executable, "-m", "tgs_runtime", "demo", "--seconds", "4"], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "simgpu" in text and "simulated" in text, "a run without a GPU says it is simulated"
    assert re.search(r"TGS\s+production\s+\d+\.\d+s\s+[\d.]+ it/s", text), "live progress of the TGS phase"
    assert "TGS containers: plain processes with the shim" in text
    rows = demo_rows(text)
    assert set(rows) == {"exclusive", "co-execution", "TGS"}, text
    tgs_prod, tgs_opp = rows["TGS"][1], rows["TGS"][3]
    co_prod = rows["co-execution"][1]
    assert tgs_prod >= 0.85, f"production kept {tgs_prod} of exclusive under TGS"
    assert tgs_prod > co_prod, "TGS protects production better than no control"
    assert tgs_opp >= 0.2, f"the opportunistic job got {tgs_opp} of its exclusive throughput"
    assert "With TGS, production kept" in text


@contextlib.contextmanager
def demo_in_its_tgs_phase(tmp_path) -> Iterator[tuple[subprocess.Popen, list, str, Path]]:
    """`tgs demo` through plain processes, in its TGS phase: the demo (its stderr in
    tmp_path/stderr.txt), every process it started, its tgsd's state directory and config;
    whatever is left is killed after."""
    import psutil

    env = {k: v for k, v in os.environ.items() if not k.startswith(("TGS_", "SIMGPU_"))}
    stderr = tmp_path / "stderr.txt"  # a file: a process left behind would hold a pipe open
    with stderr.open("w") as err:
        demo = subprocess.Popen([sys.executable, "-m", "tgs_runtime", "demo", "--seconds", "4", "--via", "processes"],
                                cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    started: list[psutil.Process] = []
    try:
        for line in demo.stdout:  # the TGS phase has begun once its jobs report
            if re.match(r"\s*TGS\s+(production|opportunistic)\s+\d", line):
                break
        started = psutil.Process(demo.pid).children(recursive=True)
        tgsd = [p for p in started if "tgs_runtime.daemon.main" in " ".join(p.cmdline())]
        assert len(tgsd) == 1, "the demo runs a tgsd of its own"
        config = Path(tgsd[0].cmdline()[-1])
        state_dir = re.search(r'state_dir = "([^"]+)"', config.read_text()).group(1)
        yield demo, started, state_dir, config
    finally:
        demo.kill()
        demo.wait()
        demo.stdout.close()
        for p in started:  # what a failure left
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass


def test_a_demo_ended_with_sigterm_stops_its_tgsd_and_leaves_nothing_behind(libshim, tmp_path):
    """`timeout`, systemd and `docker stop` end a command with SIGTERM. Sent in the TGS
    phase, every process the demo started (its own tgsd, the containers' stand-in inits,
    the jobs) is stopped, and tgsd's state directory and the demo's folder are removed
    (ended outright, the demo left its tgsd and two inits running)."""
    import psutil

    with demo_in_its_tgs_phase(tmp_path) as (demo, started, state_dir, config):
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(60) == 128 + signal.SIGTERM, (tmp_path / "stderr.txt").read_text()[-3000:]
        _, alive = psutil.wait_procs(started, timeout=5)
        assert not alive, f"left running: {[p.cmdline() for p in alive]}"
    assert not os.path.exists(state_dir) and not config.parent.exists()


def test_a_demo_killed_outright_leaves_no_process_running(libshim, tmp_path):
    """SIGKILL (the OOM killer, `kill -9`) gives the demo no chance to stop what it
    started: its tgsd and the containers' stand-in inits end with it all the same (the
    tgsd before ran on, and the inits for a day). Its folders (tgsd's log and state) stay."""
    import psutil

    with demo_in_its_tgs_phase(tmp_path) as (demo, started, state_dir, config):
        try:
            demo.kill()
            demo.wait(10)
            _, alive = psutil.wait_procs(started, timeout=10)
            assert not alive, f"left running: {[p.cmdline() for p in alive]}"
        finally:
            shutil.rmtree(state_dir, ignore_errors=True)
            shutil.rmtree(config.parent, ignore_errors=True)


def test_demo_through_docker_with_the_tgs_runtime(docker):
    """With a docker daemon that has the tgs runtime (and its tgsd), the TGS phase is two
    real TGS containers, on the simulated GPU that tgsd manages."""
    host, tgsd = docker()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TGS_", "SIMGPU_"))}
    env["DOCKER_HOST"] = host.host
    out = subprocess.run([sys.executable, "-m", "tgs_runtime", "demo", "--seconds", "4", "--via", "docker"],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "TGS containers: docker run --runtime=tgs." in out.stdout
    assert str(tgsd.simgpu.state) in out.stdout, "it runs on the GPU of the runtime's tgsd"
    rows = demo_rows(out.stdout)
    assert set(rows) == {"exclusive", "co-execution", "TGS"}, out.stdout
    assert rows["TGS"][1] >= 0.85 and rows["TGS"][1] > rows["co-execution"][1], out.stdout
    assert rows["TGS"][3] >= 0.2, out.stdout
    reserved = {e["cls"] for e in tgsd.events() if e.get("event") == "container reserved"}
    assert reserved == {"production", "opportunistic"}, "each job ran in a TGS container of its class"
    assert tgsd.status()["gpus"][0]["containers"] == [], "both containers were released"
    assert host.docker("ps", "-aq", "--filter", "label=tgs.demo").stdout.split() == [], "none left behind"


def test_demo_says_why_it_cannot_use_docker(libshim, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TGS_", "SIMGPU_"))}
    env["DOCKER_HOST"] = f"unix://{tmp_path}/nothing.sock"
    out = subprocess.run([sys.executable, "-m", "tgs_runtime", "demo", "--seconds", "2", "--via", "docker"],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert (f"cannot run the demo through docker: no docker daemon answers at unix://{tmp_path}/nothing.sock (no such "
            "socket: docker is not running, or not installed): start docker (systemctl start docker)") in out.stderr, \
        out.stderr


def test_where_a_gpu_needs_docker_s_gpus_flag_the_demo_s_containers_ask_for_it(docker):
    """On a real GPU under runc, the demo's containers ask docker for GPU 0 (`--gpus`), which
    has dockerd add the NVIDIA hook (a stand-in on the private dockerd's PATH) and set
    NVIDIA_VISIBLE_DEVICES; the TGS container is then set up as with -e alone."""
    import json

    import docker as sdk

    from tgs_runtime import config, demodocker
    from tgs_runtime.runtime.gpu_access import Route
    from tgs_runtime.workload import Workload

    host, tgsd = docker()
    records = host.workdir / "nvidia-hook-records"
    before = set(records.iterdir())
    d = demodocker.DockerTgs(sdk.DockerClient(base_url=host.host), config.load(host.tgs_config), "private",
                             Route.GPUS_FLAG)
    job = demodocker.ContainerJob.start(d, demodocker.image(d), "opportunistic", "gpus-flag",
                                        Workload(kernel_us=100, kernels=2, seconds=0.5, report_s=0.25))
    try:
        assert job.finish() is None
        cid = job.container.id
    finally:
        job.stop()
    assert [json.loads(f.read_text())["id"] for f in set(records.iterdir()) - before] == [cid]
    reserved = [e for e in tgsd.events() if e.get("event") == "container reserved"]
    assert [(e["container"], e["cls"]) for e in reserved] == [(cid, "opportunistic")]
