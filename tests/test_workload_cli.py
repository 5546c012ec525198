"""The workload program's flags and output contract."""
from __future__ import annotations

import itertools
import json
import signal
import subprocess
import time

import pytest

from tgs_runtime.workload import Workload, parse_output


def test_json_lines_follow_the_contract(simgpu):
    p = simgpu.run(Workload(kernel_us=500, kernels=4, gap_us=2000, seconds=1.2, report_s=0.3, verify=True), "w")
    assert p.popen.returncode == 0, p.stderr
    lines = [json.loads(l) for l in p.stdout.splitlines()]
    for line in lines:
        assert {"iterations_per_s", "iterations", "kernels", "elapsed_s"} <= line.keys()
    assert lines[-1]["summary"] is True and lines[-1]["checksum_ok"] is True
    assert len(lines) >= 4
    s = parse_output(p.stdout)[-1]
    assert s.kernels == 4 * s.iterations
    # one iteration: 2 ms of kernels and a 2 ms gap
    assert 180 <= s.iterations_per_s <= 260, s


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_ends_the_run_early_and_it_still_verifies_and_reports(simgpu, sig):
    """The oversubscription benchmark runs its opportunistic job until production has
    ended, then stops it: the run ends as if its time were up, its writes checked."""
    p = simgpu.workload(Workload(kernel_us=500, kernels=4, seconds=600, report_s=0.2, verify=True), "w")
    simgpu.wait_for_contexts(["w"])
    time.sleep(0.5)
    p.kill(sig)
    assert p.wait(30) == 0, p.stderr
    s = p.summary()
    assert s.checksum_ok is True and s.iterations > 0
    assert s.elapsed_s < 30, f"it ran on for {s.elapsed_s:.1f} s after the signal"


def test_the_last_kernels_of_an_iteration_can_run_long(simgpu):
    """--long-kernels 2 --long-us 5000 among 20 kernels of 10 us: each iteration keeps the
    engine busy 18 x 10 us + 2 x 5 ms, the long ones on twice the grid (simgpu's own
    accounting; 108 SMs, one block each)."""
    w = Workload(kernel_us=10, kernels=20, long_kernels=2, long_us=5000, iterations=20, seconds=30)
    assert w.duty == 1.0
    p = simgpu.run(w, "w")
    assert p.popen.returncode == 0, p.stderr
    ctx = simgpu.context("w")
    assert ctx["kernels"] == 400 and ctx["blocks"] == 20 * (18 * 108 + 2 * 216)
    assert 0.95 * 20 * 10.18e6 <= ctx["busy_ns"] <= 1.05 * 20 * 10.18e6, ctx["busy_ns"]


def test_kernels_can_come_on_several_grid_sizes_in_turn(simgpu):
    """--shapes 3: kernel i of the run (across iterations) has 108 + i % 3 blocks, or, if
    it is one of the long ones (the last of each iteration), 2 x (108 + 2) + i % 3."""
    w = Workload(kernel_us=10, kernels=10, long_kernels=1, long_us=10, shapes=3, iterations=20, seconds=30)
    p = simgpu.run(w, "w")
    assert p.popen.returncode == 0, p.stderr
    want = sum((220 if i % 10 == 9 else 108) + i % 3 for i in range(200))
    assert simgpu.context("w")["blocks"] == want


def test_a_phase_changes_the_kernels_per_iteration_within_the_run(simgpu):
    """--phase-s 0.6 --phase-kernels 2: 4 kernels an iteration, then 2 from 0.6 s on, in the
    same process (its progress lines count both)."""
    w = Workload(kernel_us=1000, kernels=4, phase_s=0.6, phase_kernels=2, seconds=1.2, report_s=0.1)
    p = simgpu.run(w, "w")
    assert p.popen.returncode == 0, p.stderr
    lines = parse_output(p.stdout)
    early = [b for b in lines if b.elapsed_s < 0.55 and not b.summary]
    late = [b for b in lines if b.elapsed_s > 0.7 and not b.summary]
    per_iteration = [(b.kernels - a.kernels) / (b.iterations - a.iterations) for a, b in (early[-2:], late[-2:])]
    assert per_iteration == [4, 2], per_iteration


def test_a_phase_changes_the_gap_between_iterations_within_the_run(simgpu):
    """--phase-s 0.6 --phase-gap-us 4000: 4 ms of kernels back to back, then 4 ms on the host
    after each iteration from 0.6 s on (a data loader that gets slower, or, the other way
    round, faster): half the iterations a second, and the engine idle half the time."""
    w = Workload(kernel_us=1000, kernels=4, phase_s=0.6, phase_gap_us=4000, seconds=1.2, report_s=0.1)
    p = simgpu.run(w, "w")
    assert p.popen.returncode == 0, p.stderr
    lines = [b for b in parse_output(p.stdout) if not b.summary]
    early = [b.iterations_per_s for b in lines if 0.2 < b.elapsed_s < 0.55]
    late = [b.iterations_per_s for b in lines if b.elapsed_s > 0.75]
    ratio = (sum(late) / len(late)) / (sum(early) / len(early))
    assert 0.4 <= ratio <= 0.6, f"{early} it/s before the phase, {late} in it"


def test_a_spread_gap_varies_from_iteration_to_iteration_with_the_same_draws_every_run(simgpu):
    """--gap-spread 0.3: each 20 ms gap drawn within 14-26 ms, after 2 ms of kernels. With a
    progress line after each iteration, the iterations' lengths vary over most of that
    range about 22 ms, and a second run draws the same lengths."""
    w = Workload(kernel_us=1000, kernels=2, gap_us=20_000, gap_spread=0.3, iterations=80, seconds=30, report_s=0.01)
    runs = [simgpu.run(w, f"w{i}") for i in range(2)]
    assert all(p.popen.returncode == 0 for p in runs), [p.stderr for p in runs]
    lengths = []
    for p in runs:
        lines = [b for b in parse_output(p.stdout) if not b.summary]
        assert all(b.iterations - a.iterations == 1 for a, b in itertools.pairwise(lines)), "a line an iteration"
        lengths.append([(b.elapsed_s - a.elapsed_s) * 1e3 for a, b in itertools.pairwise(lines)])
    first, second = lengths
    assert max(first) - min(first) >= 8 and 19 <= sum(first) / len(first) <= 25, f"iterations of {first} ms"
    apart = sum(abs(a - b) for a, b in zip(first, second)) / min(len(first), len(second))
    assert apart <= 2, f"two runs' iterations {apart:.1f} ms apart on average: {first[:8]}, {second[:8]}"


def test_host_work_mid_iteration_overlaps_the_kernels_queued_before_it(simgpu):
    """--host-us: after the first half of an iteration's kernels is queued, the job works on
    the host while the GPU runs them. 1 ms of it behind 2 ms of queued kernels costs the
    engine nothing; 6 ms leaves it idle for 4 ms of each 8 ms iteration (simgpu's engine
    time against the run's length). Over 250 iterations (1-2 s): over 60 (a quarter of a
    second), one slow moment of a 2-core CI machine's read 0.844 for the first."""
    busy = {}
    for host_us in (1000, 6000):
        w = Workload(kernel_us=1000, kernels=4, host_us=host_us, iterations=250, seconds=30)
        p = simgpu.run(w, f"host{host_us}")
        assert p.popen.returncode == 0, p.stderr
        busy[host_us] = simgpu.context(f"host{host_us}")["busy_ns"] / 1e9 / parse_output(p.stdout)[-1].elapsed_s
    assert busy[1000] >= 0.85 and 0.35 <= busy[6000] <= 0.6, busy


@pytest.mark.parametrize("args,message", [
    (["--kernels", "0"], "--kernels 0"),
    (["--seconds", "abc"], "--seconds abc"),
    (["--bogus"], "unrecognized option"),
    (["extra"], "unexpected argument extra"),
    (["--kernels", "4", "--long-kernels", "5"], "--long-kernels 5: more than the 4 kernels"),
    (["--shapes", "0"], "--shapes 0"),
    (["--host-us", "-1"], "--host-us -1"),
    (["--gap-spread", "0.2"], "--gap-spread without --gap-us"),
    (["--gap-us", "1000", "--gap-spread", "1"], "--gap-spread 1"),
    (["--host-sync"], "--host-sync without --host-us"),
    (["--host-us", "100", "--host-sync-s", "2"], "--host-sync-s without --host-sync"),
    (["--stall-us", "300000"], "--stall-us 300000 without --stall-every: give both"),
    (["--stall-every", "25"], "--stall-every 25 without --stall-us: give both"),
    (["--stall-inside"], "--stall-inside without --stall-us and --stall-every: give the stalls it moves"),
    (["--phase-s", "5"], "--phase-s 5 without --phase-kernels or --phase-gap-us: give what changes then"),
    (["--phase-kernels", "3"], "--phase-kernels without --phase-s: give how far into the run"),
    (["--phase-gap-us", "0"], "--phase-gap-us without --phase-s: give how far into the run"),
    (["--phase-s", "5", "--phase-kernels", "3", "--verify"], "--verify with --phase-kernels"),
    (["--kernels", "4", "--long-kernels", "2", "--phase-s", "5", "--phase-kernels", "1"],
     "--long-kernels 2: more than the 1 kernels per iteration of the phase"),
])
def test_bad_flags(simgpu, args, message):
    proc = subprocess.run([str(simgpu.artifacts.workload), *args], env=simgpu.env("w"), capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_without_a_driver_it_says_what_to_do(libshim):
    proc = subprocess.run([str(libshim.workload), "--seconds", "0.1"], env={"PATH": "/usr/bin:/bin",
                          "TGS_WORKLOAD_LIBCUDA": "/nonexistent/libcuda.so.1"}, capture_output=True, text=True)
    assert proc.returncode == 2 and "cannot load the CUDA driver" in proc.stderr and "tgs sim run" in proc.stderr


def test_ptx_is_valid_for_ptxas(libshim, tmp_path):
    """The kernels that run on a real GPU assemble (ptxas from the CUDA 13.0 toolkit)."""
    from harness.toolkit import ptxas

    ptx = tmp_path / "k.ptx"
    ptx.write_text(subprocess.run([str(libshim.workload), "--print-ptx"], capture_output=True, text=True).stdout)
    for arch in ("sm_80", "sm_90"):
        proc = subprocess.run([str(ptxas()), f"-arch={arch}", str(ptx), "-o", str(tmp_path / f"{arch}.cubin")],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
