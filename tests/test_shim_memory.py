"""Memory sharing through libtgs.so: conversion to managed memory, quotas, the container's
view of memory, and tgsd's eviction and restore orders (moved pages show in simgpu's
accounting; the workload's checksums hold)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

from harness.shimside import counters
from tgs_runtime import proto
from tgs_runtime.workload import Workload

MB = 1 << 20


def run(simgpu, c_programs, container_env, *args, label="checks"):
    exe = c_programs("shim_checks.c", link_cuda=True)
    proc = subprocess.run([str(exe), *map(str, args)], env=simgpu.env(label, container_env), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_device_allocations_become_managed_memory(simgpu, container, libshim, c_programs):
    c = container(proto.Class.OPPORTUNISTIC)
    out = run(simgpu, c_programs, c.env(libshim.shim), "convert")
    assert out["managed"] == 1 and out["async_managed"] == 1, "truthful: converted memory says it is managed"
    assert out["memory_type"] == 2 and out["pitch"] % 512 == 0 and out["pitch"] >= 1000
    c.drained()  # the process has exited; its last notices may still be on their way through the socket
    kinds = {(m.h.type, m.kind) for m in c.notices}
    assert kinds == {(proto.MsgType.ALLOC, proto.MemKind.MANAGED), (proto.MsgType.FREE, proto.MemKind.MANAGED)}
    assert c.ranges() == {}, "a free notice for every allocation"
    assert counters(c)["footprint_bytes"] == 0, "everything freed is told and uncharged"


def test_production_conversion_can_be_switched_off(simgpu, container, libshim, c_programs):
    c = container(proto.Class.PRODUCTION, convert=False)
    out = run(simgpu, c_programs, c.env(libshim.shim), "convert")
    assert out["managed"] == 0
    c.drained()  # (beside five busy loops, read at once, no notice had arrived yet)
    assert {m.kind for m in c.notices} == {proto.MemKind.DEVICE}


def test_opportunistic_memory_past_its_quota_is_refused(simgpu, container, libshim, c_programs):
    c = container(proto.Class.OPPORTUNISTIC)
    c.control.set_budget(0, quota=256 * MB)
    out = run(simgpu, c_programs, c.env(libshim.shim), "quota", 64)
    assert out == {"blocks": 4, "error": "CUDA_ERROR_OUT_OF_MEMORY"}
    out = run(simgpu, c_programs, c.env(libshim.shim), "vmm", 512)
    assert out["create"] == "CUDA_ERROR_OUT_OF_MEMORY", "cuMemCreate is charged to the quota too"


def test_production_has_no_quota_and_never_oom_from_managed_memory(simgpu, container, libshim, c_programs):
    simgpu.memory = "1G"
    c = container(proto.Class.PRODUCTION)
    out = run(simgpu, c_programs, c.env(libshim.shim), "quota", 512)
    assert out["blocks"] >= 8, "converted memory may oversubscribe the device"


def test_vmm_memory_is_charged_and_never_converted(simgpu, container, libshim, c_programs):
    c = container(proto.Class.OPPORTUNISTIC)
    c.control.set_budget(0, quota=1024 * MB)
    p = simgpu.spawn([str(c_programs("shim_checks.c", link_cuda=True)), "vmm", "128"], "vmm", c.env(libshim.shim))
    c.wait_for(lambda: counters(c)["vmm_bytes"] == 128 * MB, what="the cuMemCreate charge")
    assert counters(c)["footprint_bytes"] == 128 * MB
    assert p.wait() == 0
    # the process has exited; its last notice may still be on its way through the socket
    c.wait_for(lambda: len(c.notices) >= 2, timeout=5, what="the free notice")
    kinds = [(m.h.type, m.kind, m.size) for m in c.notices]
    assert kinds == [(proto.MsgType.ALLOC, proto.MemKind.VMM, 128 * MB), (proto.MsgType.FREE, proto.MemKind.VMM, 128 * MB)]
    assert counters(c)["vmm_bytes"] == 0


def test_memory_queries_report_the_containers_view(simgpu, container, libshim, c_programs):
    c = container(proto.Class.OPPORTUNISTIC)
    c.control.set_budget(0, quota=1024 * MB, view_total=1024 * MB)
    holder = simgpu.spawn([str(c_programs("shim_checks.c", link_cuda=True)), "hold", "256", "20"], "hold",
                          c.env(libshim.shim))
    c.wait_for(lambda: counters(c)["footprint_bytes"] == 256 * MB, what="the holder's allocation")
    out = run(simgpu, c_programs, c.env(libshim.shim), "meminfo")
    assert out == {"free": 768 * MB, "total": 1024 * MB, "device_total": 1024 * MB}, "all processes of the container count"
    probe = textwrap.dedent("""
        import json, pynvml as n
        n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0)
        m = n.nvmlDeviceGetMemoryInfo(h); m2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
        print(json.dumps([m.total, m.used, m.free, m2.total, m2.used, m2.free]))
    """)
    proc = subprocess.run([sys.executable, "-c", probe], env=simgpu.env("nvml", c.env(libshim.shim)),
                          capture_output=True, text=True, timeout=60)
    holder.kill()
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [1024 * MB, 256 * MB, 768 * MB] * 2


def test_memory_view_never_goes_negative(simgpu, container, libshim, c_programs):
    c = container(proto.Class.PRODUCTION)
    c.control.set_budget(0, view_total=64 * MB)
    holder = simgpu.spawn([str(c_programs("shim_checks.c", link_cuda=True)), "hold", "256", "20"], "hold",
                          c.env(libshim.shim))
    c.wait_for(lambda: counters(c)["footprint_bytes"] == 256 * MB, what="the allocation")
    out = run(simgpu, c_programs, c.env(libshim.shim), "meminfo")
    holder.kill()
    assert out["free"] == 0 and out["total"] == 64 * MB


def test_eviction_and_restore_orders_move_pages_and_keep_data(simgpu, container, libshim):
    simgpu.memory = "2G"
    c = container(proto.Class.OPPORTUNISTIC)
    w = Workload(kernel_us=500, kernels=4, seconds=7, param_mb=200, act_mb=100, verify=True, report_s=0.5)
    p = simgpu.workload(w, "opp", c.env(libshim.shim))
    simgpu.wait_for_contexts(["opp"])
    ranges = c.wait_for(lambda: len(c.ranges()) == 2 and c.ranges(), what="the two allocations")
    conn = c.conns[0]
    time.sleep(0.5)
    assert simgpu.context("opp")["resident_bytes"] >= 300 * MB
    for r in ranges.values():
        ack = c.order(conn, proto.OrderOp.EVICT, r.ptr, r.size)
        assert (ack.status, ack.bytes) == (0, r.size)
    time.sleep(0.5)
    evicted = simgpu.context("opp")
    assert evicted["resident_bytes"] == 0 and evicted["pages_out"] >= 150, evicted
    assert evicted["remote_bytes"] > 0, "evicted memory is read over the bus, not migrated back"
    for r in ranges.values():
        assert c.order(conn, proto.OrderOp.RESTORE, r.ptr, r.size).status == 0
    time.sleep(0.5)
    restored = simgpu.context("opp")
    assert restored["resident_bytes"] >= 300 * MB and restored["pages_in"] > evicted["pages_in"]
    # a part of a range: its tail, as tgsd orders it
    big = max(ranges.values(), key=lambda r: r.size)
    before = simgpu.context("opp")["resident_bytes"]
    assert c.order(conn, proto.OrderOp.EVICT, big.ptr + 64 * MB, big.size - 64 * MB).status == 0
    time.sleep(0.3)
    part = simgpu.context("opp")
    assert part["resident_bytes"] == before - (big.size - 64 * MB), "only the part ordered moved"
    assert c.order(conn, proto.OrderOp.RESTORE, big.ptr + 64 * MB, big.size - 64 * MB).status == 0
    for bad in ((big.ptr + big.size - 4096, 8192), (big.ptr, big.size + 4096), (big.ptr, 0), (0x1234000, 4096)):
        refused = c.order(conn, proto.OrderOp.EVICT, *bad)
        assert refused.status == 1, f"an order outside what the process holds is refused: {bad}"
    assert p.wait() == 0, p.stderr
    assert p.summary().checksum_ok is True
    ctr = counters(c)
    assert ctr["evicted_bytes"] == ctr["restored_bytes"] == 300 * MB + big.size - 64 * MB


def test_cuda_ipc_on_converted_memory_fails_as_the_driver_says_and_the_shim_says_why(simgpu, container, libshim,
                                                                                      c_programs):
    exe = c_programs("shim_checks.c", link_cuda=True)

    def ipc(c) -> tuple[dict, str]:
        proc = subprocess.run([str(exe), "ipc"], env=simgpu.env("ipc", c.env(libshim.shim)), capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr

    out, err = ipc(container(proto.Class.OPPORTUNISTIC))
    assert out == {"first": "CUDA_ERROR_INVALID_VALUE", "second": "CUDA_ERROR_INVALID_VALUE"}, "the driver's answer"
    assert err.count("cuIpcGetMemHandle failed") == 1, f"said once per process: {err}"
    assert "cannot run as opportunistic: run it as production with TGS_CONVERT_MEMORY=false" in err
    out, err = ipc(container(proto.Class.PRODUCTION))
    assert out["first"] == "CUDA_ERROR_INVALID_VALUE" and "TGS_CONVERT_MEMORY=false" in err \
        and "convert_production = false" in err
    out, err = ipc(container(proto.Class.PRODUCTION, convert=False))
    assert out == {"first": "CUDA_SUCCESS", "second": "CUDA_SUCCESS"}, "plain device memory exports"
    assert "cuIpcGetMemHandle" not in err
