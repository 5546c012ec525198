"""simgpu's driver API, call by call, from a C program linked directly to libcuda.so.1
(tests/c/simgpu_api.c holds the checks and their expectations)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

TESTDATA = Path(__file__).resolve().parent / "data"
CHECKS = [
    "init", "contexts", "memory", "oom", "managed", "events", "streams", "graphs", "vmm",
    "pools", "getproc", "unsupported", "errors", "fork", "timeslice",
]


@pytest.fixture(scope="module")
def api(c_programs):
    return c_programs("simgpu_api.c", link_cuda=True)


def run(simgpu, api, *args, extra_env=None):
    proc = subprocess.run(
        [str(api), *args], env=simgpu.env("api", extra_env), capture_output=True, text=True, timeout=60
    )
    return proc


@pytest.mark.parametrize("check", CHECKS)
def test_driver_api(simgpu, api, check):
    proc = run(simgpu, api, check)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ok {check}" in proc.stdout


def test_unsupported_calls_log_once(simgpu, api):
    proc = run(simgpu, api, "unsupported")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.count("cuArrayCreate_v2 is not simulated") == 1


def test_cudart_requests_all_resolve(simgpu, api):
    """Every entry point the CUDA 13.0 runtime asks cuGetProcAddress_v2 for is answered."""
    data = TESTDATA / "cudart-13.0-getprocaddress.txt"
    proc = run(simgpu, api, "replay", str(data))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "replayed 440 requests, 439 found" in proc.stdout


def test_bad_setting_fails_cuinit_clearly(simgpu, api):
    proc = run(simgpu, api, "init", extra_env={"SIMGPU_MEMORY": "abc"})
    assert proc.returncode == 1
    assert "cuInit(0) returned CUDA_ERROR_INVALID_VALUE" in proc.stdout
    assert "SIMGPU_MEMORY=abc is not a memory size" in proc.stderr


@pytest.mark.parametrize(
    "var,value,message",
    [
        ("SIMGPU_DEVICES", "9", "SIMGPU_DEVICES=9 is not a device count"),
        ("SIMGPU_TIMESLICE_US", "-3", "SIMGPU_TIMESLICE_US=-3"),
        ("SIMGPU_TIME_SCALE", "fast", "SIMGPU_TIME_SCALE=fast"),
    ],
)
def test_other_bad_settings(simgpu, api, var, value, message):
    proc = run(simgpu, api, "init", extra_env={var: value})
    assert proc.returncode == 1
    assert message in proc.stderr


def test_state_of_another_version_is_refused(simgpu, api):
    with open(simgpu.state, "wb") as f:
        f.write(b"SIMGPU01" + (99).to_bytes(4, "little"))
        f.truncate(64 << 20)
    proc = run(simgpu, api, "init")
    assert proc.returncode == 1
    assert "made by another simgpu version" in proc.stderr


def test_cuda_visible_devices(simgpu, api):
    simgpu.devices = 3
    uuids = [d["uuid"] for d in _status_after_init(simgpu, api)["devices"]]
    proc = run(simgpu, api, "init", extra_env={"CUDA_VISIBLE_DEVICES": f"{uuids[2][:12]},0"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"uuid {uuids[2][4:8]}" in proc.stdout
    proc = run(simgpu, api, "init", extra_env={"CUDA_VISIBLE_DEVICES": "7"})
    assert "CUDA_ERROR_NO_DEVICE" in proc.stdout


def _status_after_init(simgpu, api):
    proc = run(simgpu, api, "errors")
    assert proc.returncode == 0
    run(simgpu, api, "init")
    return simgpu.status()
