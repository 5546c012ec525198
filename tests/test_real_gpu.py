"""The workload against the real driver. Needs an NVIDIA GPU: skipped, saying so, without one."""
from __future__ import annotations

import os
import subprocess

import pytest

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
