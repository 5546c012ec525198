"""The simulated GPU's model, seen through the workload and simgpu's own accounting:
sharing of the engine, memory capacity, managed-memory migration, and dying processes.
Bounds are loose on purpose: exact figures belong to bench/."""
from __future__ import annotations

import time

import pytest

from tgs_runtime import sim
from tgs_runtime.workload import Workload

GPU_BOUND = Workload(kernel_us=1000, kernels=10, gap_us=0, seconds=4, report_s=0.5)


def test_two_gpu_bound_workloads_share_the_engine(simgpu):
    a = simgpu.workload(GPU_BOUND, "a")
    b = simgpu.workload(GPU_BOUND, "b")
    before = simgpu.wait_for_contexts(["a", "b"])
    time.sleep(2)
    after = simgpu.status()
    share = sim.busy_between(before, after)
    total = share["a"] + share["b"]
    assert total > 1.5, f"the engine was busy {total:.2f}s of 2s"
    for label in ("a", "b"):
        assert 0.35 <= share[label] / total <= 0.65, share
    assert a.wait() == 0 and b.wait() == 0


def test_half_duty_workload_slows_beside_a_gpu_bound_one(simgpu):
    half = Workload.with_duty(0.5, period_ms=20, seconds=3, report_s=0.5)
    solo = simgpu.run(half, "solo").summary().iterations_per_s
    hog = simgpu.workload(Workload(kernel_us=1000, kernels=10, seconds=5), "hog")
    simgpu.wait_for_contexts(["hog"])
    shared = simgpu.run(half, "shared").summary().iterations_per_s
    hog.wait()
    assert 40 <= solo <= 52, f"alone, a 20 ms iteration runs at ~50/s, got {solo:.1f}"
    assert shared < 0.85 * solo, f"beside a GPU-bound job it should slow: {shared:.1f}/s vs {solo:.1f}/s alone"


def test_preemption_at_slice_ends(simgpu):
    """Short kernels are not stuck behind another context's long ones: the long kernel is
    preempted at the end of its time slice (2 ms by default)."""
    long = simgpu.workload(Workload(kernel_us=200_000, kernels=2, seconds=4), "long")
    simgpu.wait_for_contexts(["long"])
    short = simgpu.run(Workload(kernel_us=1000, kernels=1, seconds=2, report_s=0.5), "short")
    long.kill()
    rate = short.summary().iterations_per_s
    assert rate > 100, f"1 ms kernels beside 200 ms kernels ran at {rate:.0f}/s (without preemption: ~5/s)"


def test_device_oom_fails_cleanly_and_disturbs_no_one(simgpu):
    simgpu.memory = "1G"
    steady = simgpu.workload(Workload(kernel_us=500, kernels=4, seconds=3, param_mb=200, act_mb=100, verify=True), "steady")
    simgpu.wait_for_contexts(["steady"])
    greedy = simgpu.run(Workload(seconds=1, param_mb=600, act_mb=300), "greedy")
    assert greedy.popen.returncode == 3
    err = greedy.stdout.strip().splitlines()[-1]
    assert "CUDA_ERROR_OUT_OF_MEMORY" in err and "activations" in err
    assert steady.wait() == 0
    assert steady.summary().checksum_ok is True
    ctx = simgpu.context("greedy")
    assert ctx["state"] == "ended" and ctx["device_bytes"] == 0, "the failed process's memory is back"
    dev = simgpu.status()["devices"][0]
    assert dev["memory_used"] == 0


# simgpu moves a managed page's memory from one copy to the other (mremap); copy-pages: it
# copies the bytes, as on a kernel that cannot move them
MOVES = pytest.mark.parametrize("fault", ["", "copy-pages"], ids=["pages moved", "pages copied"])


@MOVES
def test_managed_memory_oversubscribes_and_migrates(simgpu, fault):
    simgpu.memory = "512M"
    w = Workload(kernel_us=100, kernels=4, seconds=2, param_mb=400, act_mb=300, managed=True, verify=True, report_s=0.5)
    p = simgpu.run(w, "over", extra_env={"SIMGPU_FAULT": fault})
    assert p.popen.returncode == 0, p.stderr
    s = p.summary()
    assert s.checksum_ok is True and s.iterations >= 2
    ctx = simgpu.context("over")
    assert ctx["pages_in"] > 300 and ctx["pages_out"] > 200, ctx
    assert ctx["migrate_ns"] > 0


def test_time_on_the_bus_is_counted_as_the_engine_runs_it(simgpu):
    """A context's time moving or reading managed memory over the bus is a part of its
    engine time in any window of its accounting: counted when the kernel was launched, a
    window that took in launches and not yet their run read more time on the bus than on
    the engine (the oversubscription benchmark's 'on the bus' share above 1.00)."""
    simgpu.memory = "512M"
    w = Workload(kernel_us=100, kernels=4, seconds=3, param_mb=400, act_mb=300, managed=True, report_s=0.5)
    p = simgpu.workload(w, "over")
    simgpu.wait_for_contexts(["over"])
    snaps = []
    while p.returncode is None:
        snaps.append(simgpu.context("over"))
        time.sleep(0.005)
    assert p.wait() == 0
    grew = [(b["migrate_ns"] - a["migrate_ns"], b["busy_ns"] - a["busy_ns"]) for a, b in zip(snaps, snaps[1:])]
    assert sum(m for m, _ in grew) > 0.5 * sum(b for _, b in grew), "mostly on the bus: it thrashes its own pages"
    over = [(m, b) for m, b in grew if m > b]
    assert not over, f"{len(over)} of {len(grew)} windows with more time on the bus than on the engine: {over[:5]}"


def test_thrashing_between_processes_is_visible(simgpu):
    """Two managed workloads that each fit, but not together, evict each other's pages
    (in the order pages became resident, across all contexts) and both run slower than alone."""
    simgpu.memory = "512M"
    w = Workload(kernel_us=200, kernels=4, seconds=2.5, param_mb=200, act_mb=100, managed=True, verify=True, report_s=0.5)
    alone = simgpu.run(w, "alone").summary().iterations_per_s
    a = simgpu.workload(w, "a")
    b = simgpu.workload(w, "b")
    assert a.wait() == 0 and b.wait() == 0
    ra, rb = a.summary(), b.summary()
    assert ra.checksum_ok and rb.checksum_ok
    ctx = sim.contexts(simgpu.status())
    assert ctx["a"]["pages_out"] > 50 and ctx["b"]["pages_out"] > 50, "each evicted the other"
    assert ctx["alone"]["pages_out"] == 0, "alone it fits"
    assert ra.iterations_per_s + rb.iterations_per_s < 0.8 * alone


@MOVES
def test_a_lost_write_is_caught(simgpu, fault):
    """If eviction dropped the device copy instead of writing it back, --verify says so."""
    simgpu.memory = "256M"
    w = Workload(kernel_us=100, kernels=4, seconds=1, param_mb=200, act_mb=100, managed=True, verify=True)
    p = simgpu.run(w, "lossy", extra_env={"SIMGPU_FAULT": ",".join(filter(None, ["drop-writeback", fault]))})
    s = p.summary()
    assert s.checksum_ok is False and s.raw["bad_words"] > 0
    assert p.popen.returncode == 4


def test_kill_9_gives_the_engine_back(simgpu):
    long = Workload(kernel_us=1000, kernels=10, seconds=8, report_s=0.5)
    victim = simgpu.workload(long, "victim")
    survivor = simgpu.workload(long, "survivor")
    simgpu.wait_for_contexts(["victim", "survivor"])
    time.sleep(0.5)
    victim.kill()
    victim.wait()
    time.sleep(0.5)  # one liveness check (100 ms) is enough; leave room
    before = simgpu.status()
    time.sleep(1.5)
    after = simgpu.status()
    got = sim.busy_between(before, after)["survivor"]
    # the engine shared with a dead context would give the survivor half at most; the
    # survivor's own launching thread, short of CPU beside seven busy loops, kept it busy 1.30 s
    assert got > 0.75 * 1.5, f"the survivor got {got:.2f}s of 1.5s after the other was killed"
    ended = sim.contexts(after)["victim"]
    assert ended["state"] == "ended" and ended["queued"] == 0 and ended["device_bytes"] == 0
    survivor.kill()


def test_kill_9_mid_kernel_frees_memory(simgpu):
    simgpu.memory = "1G"
    victim = simgpu.workload(Workload(kernel_us=500_000, kernels=1, seconds=10, param_mb=500, act_mb=300), "victim")
    simgpu.wait_for_contexts(["victim"])
    victim.kill()
    victim.wait()
    time.sleep(0.3)
    p = simgpu.run(Workload(seconds=0.5, param_mb=500, act_mb=300), "next")
    assert p.popen.returncode == 0, p.stdout + p.stderr


def test_visible_devices_pick_the_device(simgpu):
    simgpu.devices = 2
    p = simgpu.run(Workload(seconds=0.3), "second", extra_env={"CUDA_VISIBLE_DEVICES": "1"})
    assert p.popen.returncode == 0, p.stderr
    snap = simgpu.status()
    assert "second" in sim.contexts(snap, 1) and "second" not in sim.contexts(snap, 0)
