"""simgpu's NVML, through pynvml (the nvidia-ml-py package tgsd uses)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tgs_runtime.workload import Workload

PROBE = textwrap.dedent(
    """
    import json, pynvml as n
    n.nvmlInit()
    out = {"driver": n.nvmlSystemGetDriverVersion(), "count": n.nvmlDeviceGetCount(), "devices": []}
    for i in range(out["count"]):
        h = n.nvmlDeviceGetHandleByIndex(i)
        m = n.nvmlDeviceGetMemoryInfo(h)
        m2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
        uuid = n.nvmlDeviceGetUUID(h)
        assert n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID(uuid)) == i
        procs = [{"pid": p.pid, "used": p.usedGpuMemory} for p in n.nvmlDeviceGetComputeRunningProcesses(h)]
        out["devices"].append({"name": n.nvmlDeviceGetName(h), "uuid": uuid, "total": m.total, "used": m.used,
                               "free": m.free, "used_v2": m2.used, "util": n.nvmlDeviceGetUtilizationRates(h).gpu,
                               "cc": list(n.nvmlDeviceGetCudaComputeCapability(h)), "procs": procs})
    try:
        n.nvmlDeviceGetPowerUsage(n.nvmlDeviceGetHandleByIndex(0))
        out["power"] = "present"
    except n.NVMLError_FunctionNotFound:
        out["power"] = "not found"
    n.nvmlShutdown()
    print(json.dumps(out))
    """
)


def probe(simgpu, extra_env=None) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE], env=simgpu.env("probe", extra_env),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_nvml_sees_the_devices_and_a_running_job(simgpu):
    simgpu.devices = 2
    job = simgpu.workload(Workload(kernel_us=1000, kernels=10, seconds=4, param_mb=64, act_mb=32), "job")
    simgpu.wait_for_contexts(["job"])
    import time
    time.sleep(1.2)
    out = probe(simgpu)
    job.kill()
    status = simgpu.status()
    assert out["count"] == 2 and out["driver"].startswith("simgpu")
    d0, d1 = out["devices"]
    assert [d0["uuid"], d1["uuid"]] == [d["uuid"] for d in status["devices"]]
    assert d0["total"] == 4 << 30 and d0["used"] >= 96 << 20 and d0["free"] == d0["total"] - d0["used"]
    assert d0["used_v2"] == d0["used"]
    assert d0["util"] >= 80, "a GPU-bound job keeps the engine busy"
    assert d0["cc"] == [8, 0]
    assert [p["pid"] for p in d0["procs"]] == [job.popen.pid] and d0["procs"][0]["used"] >= 96 << 20
    assert d1["procs"] == [] and d1["used"] == 0
    assert out["power"] == "not found", "functions simgpu lacks are absent, as on an older driver"


def test_simgpu_visible_devices_limits_nvml(simgpu):
    simgpu.devices = 3
    first = probe(simgpu)
    uuid2 = first["devices"][2]["uuid"]
    out = probe(simgpu, {"SIMGPU_VISIBLE_DEVICES": uuid2, "CUDA_VISIBLE_DEVICES": "0"})
    assert out["count"] == 1 and out["devices"][0]["uuid"] == uuid2
