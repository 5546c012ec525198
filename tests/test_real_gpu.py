"""The workload, the MPS baseline and TGS containers through docker against the real driver.
Needs an NVIDIA GPU: skipped, saying so, without one."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from harness.demotable import demo_rows
from harness.hostgpu import HostGpu, share_one_gpu_through_docker
from tgs_runtime.sim import real_gpu_reason
from tgs_runtime.workload import Workload, summary


@pytest.mark.gpu
@pytest.mark.skipif(real_gpu_reason() is not None, reason=str(real_gpu_reason()))
def test_workload_on_a_real_gpu(libshim):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIMGPU_") and k != "LD_LIBRARY_PATH"}
    w = Workload(kernel_us=1000, kernels=10, seconds=3, param_mb=64, act_mb=64, verify=True)
    proc = subprocess.run(w.argv(libshim.workload), env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    s = summary(proc.stdout)
    assert s.checksum_ok is True
    assert 70 <= s.iterations_per_s <= 105, f"10 x 1 ms kernels per iteration: {s.iterations_per_s:.1f}/s"


def _mps_reason() -> str | None:
    from bench.mps import unavailable

    return real_gpu_reason() or unavailable(real=True)


@pytest.mark.gpu
@pytest.mark.skipif(_mps_reason() is not None, reason=f"the MPS baseline: {_mps_reason()}")
def test_the_mps_baseline_serves_a_limited_low_priority_client_and_goes_away(libshim, tmp_path):
    from bench.mps import Client, Mps

    env = {k: v for k, v in os.environ.items() if not k.startswith("SIMGPU_") and k != "LD_LIBRARY_PATH"}
    w = Workload(kernel_us=1000, kernels=10, seconds=3, param_mb=64, act_mb=64, verify=True)
    with Mps(tmp_path) as m:
        proc = subprocess.Popen(w.argv(libshim.workload), env={**env, **m.client(Client(50, below_normal=True))},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)  # it runs 3 s: its server is up now
        servers = m._command("get_server_list").stdout.split()
        out, err = proc.communicate(timeout=120)
        daemon = m.proc
    assert proc.returncode == 0, err
    assert summary(out).checksum_ok is True
    assert servers, "the workload ran, but not through the private MPS server"
    assert daemon.poll() is not None, "the MPS control daemon outlived the baseline"


@pytest.mark.gpu
@pytest.mark.docker
@pytest.mark.skipif(real_gpu_reason() is not None, reason=str(real_gpu_reason()))
def test_docker_runs_tgs_containers_on_a_real_gpu(libshim, c_programs, tmp_path):
    """`docker run --runtime=tgs` on the real GPU: real dockerd and runc, libtgs.so over the
    real driver in the containers, tgsd on the real NVML (its unified memory capped far
    below the card). Without the NVIDIA toolkit (and docker 20.10 has no CDI), the GPU is
    given as CDI gives it; on a lent GPU machine, scripts/device-setup brings docker."""
    if shutil.which("dockerd") is None:
        pytest.skip("dockerd is not installed (apt-get install docker.io; on a lent GPU machine, scripts/device-setup)")
    from tgs_runtime.childd import own_config

    share_one_gpu_through_docker(HostGpu.real(), own_config(None, budget="4G"), libshim, c_programs("maps.c"), tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(real_gpu_reason() is not None, reason=str(real_gpu_reason()))
def test_the_demo_runs_on_a_real_gpu(libshim):
    """The README's first command on a machine with a GPU uses the GPU: its three phases on
    the real driver, TGS through libtgs.so with a tgsd of the demo's own."""
    from tgs_runtime.paths import REPO_ROOT

    env = {k: v for k, v in os.environ.items() if not k.startswith(("TGS_", "SIMGPU_")) and k != "LD_LIBRARY_PATH"}
    out = subprocess.run([sys.executable, "-m", "tgs_runtime", "demo", "--seconds", "4", "--via", "processes"],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Running on this machine's NVIDIA GPU" in out.stdout and "simulated" not in out.stdout, out.stdout
    rows = demo_rows(out.stdout)
    assert set(rows) == {"exclusive", "co-execution", "TGS"}, out.stdout
    assert rows["TGS"][1] >= 0.85, f"production kept {rows['TGS'][1]} of exclusive under TGS:\n{out.stdout}"
    assert rows["TGS"][3] >= 0.1, f"the opportunistic job got {rows['TGS'][3]} of its exclusive:\n{out.stdout}"
