"""tgsd end to end on the simulated GPU: shims run as plain processes registered through
the admin socket (as tgs-runtime registers containers). Bounds are loose and read from
simgpu's own accounting; exact figures belong to bench/."""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from datetime import datetime

import pytest

from bench.common import HostCpu
from harness.simgpu import SM_COUNT, threads_in_words
from tgs_runtime import proto, sim
from tgs_runtime.admin import Refused
from tgs_runtime.control import ActivityFile, IterationMark
from tgs_runtime.workload import Workload

HALF = Workload.with_duty(0.5, period_ms=20, kernels=10, seconds=9, report_s=0.5)
HOG = Workload(kernel_us=1000, kernels=10, seconds=9, report_s=0.5)


def test_a_production_container_without_processes_leaves_the_other_timed():
    """Production's progress is timed from the marks of each production container on the
    GPU that has processes; one registered for a later job does not turn timing off, and
    one that has processes but no mark yet leaves production counted."""
    from types import SimpleNamespace

    from tgs_runtime.daemon.service import _marks

    def container(cid, processes, mark):
        control = SimpleNamespace(iteration_mark=lambda slot: mark)
        return SimpleNamespace(id=cid, processes=processes, control=control), 0

    def process(*gpus):
        return SimpleNamespace(gpus=set(gpus))

    running = container("a", {1: process()}, IterationMark(2_000_000_000, 5400))
    waiting = container("b", {}, None)
    assert [(m.source, m.t, m.blocks) for m in _marks([running, waiting], "g0")] == [("a", 2.0, 5400)]
    other = container("c", {2: process()}, IterationMark(1_000_000_000, 10))
    assert [m.source for m in _marks([running, other], "g0")] == ["a", "c"], "two running jobs: each timed"
    assert _marks([running, container("d", {3: process()}, None)], "g0") == (), \
        "a running job without marks: production is counted"


def test_a_container_s_pauses_and_busy_time_are_left_out_where_one_of_its_processes_uses_the_gpu():
    """The pauses in a mark are left out of production's progress where one process of the
    container uses the GPU (one rank per GPU: each GPU's are its rank's), or, none seen on
    it yet, the container has one process; the pauses of two on one GPU are kept in. Its
    busy time is known likewise (its host spells are timed from it: `Window.host_spells`)."""
    from types import SimpleNamespace

    from tgs_runtime.daemon.service import _marks

    def mark(*processes):
        control = SimpleNamespace(iteration_mark=lambda slot: IterationMark(2_000_000_000, 5400, 300_000_000,
                                                                            700_000_000, 9))
        c = SimpleNamespace(id="a", processes={i: SimpleNamespace(gpus=set(g)) for i, g in enumerate(processes)},
                            control=control)
        m = _marks([(c, 0)], "g0")[0]
        assert m.number == 9
        return m.paused_s, m.busy_s

    assert mark({"g0"}, {"g1"}) == (0.3, 0.7), "one rank per GPU"
    assert mark(set()) == (0.3, 0.7), "one process, not seen on the GPU yet"
    assert mark({"g0"}, {"g0"}) == (0.0, None), "two processes on the GPU"
    assert mark(set(), set()) == (0.0, None), "two processes, neither seen on the GPU yet"


def busy(simgpu, labels, seconds):
    return sim.busy_between(*simgpu.snapshots(seconds))


def test_production_keeps_its_engine_and_opportunistic_gets_the_idle_half(simgpu, tgsd, libshim):
    d = tgsd()
    prod, opp = d.register("production"), d.register("opportunistic")
    solo = simgpu.workload(Workload.with_duty(0.5, seconds=4, report_s=0.5), "solo", prod.env(libshim.shim))
    simgpu.wait_for_contexts(["solo"])
    time.sleep(1)
    alone = busy(simgpu, ["solo"], 2)["solo"] / 2
    solo.wait()
    p = simgpu.workload(HALF, "prod", prod.env(libshim.shim))
    o = simgpu.workload(HOG, "opp", opp.env(libshim.shim))
    simgpu.wait_for_contexts(["prod", "opp"])
    time.sleep(3)
    # the shims' counters reach the controller: opportunistic work waited behind production
    # and, anticipating it, ran beside it for a small part of each second (0.2-0.6 % in the
    # dynamics benchmark). The least of three readings over the window: in one full CI run
    # on this 2-core machine, slowed by its neighbours, the one reading at its end was 0.063 s/s
    before, beside = simgpu.status(), []
    for _ in range(3):
        time.sleep(4 / 3)
        beside.append(d.status()["gpus"][0]["controller"]["opportunistic_beside_production"])
    shared = sim.busy_between(before, simgpu.status())
    p.wait()
    o.wait()
    prod_share, opp_share = shared["prod"] / 4, shared["opp"] / 4
    assert 0.4 <= alone <= 0.55, f"the production job alone keeps the engine busy {alone:.2f} of the time"
    assert prod_share >= 0.9 * alone, f"production: {prod_share:.3f} of the engine shared, {alone:.3f} alone"
    # 0.78-0.98 of the idle time when run alone here, 0.54 once in a full run on this 2-core
    # machine: the controller takes production's measurement noise for harm (docs/results/history.md,
    # isolation). The paper's controller gets about a quarter: 0.4 still tells them apart.
    assert opp_share >= 0.4 * (1 - alone), f"opportunistic got {opp_share:.3f} of the engine; idle was {1 - alone:.3f}"
    state = d.status()["gpus"][0]["controller"]
    assert state["state"] in ("run", "profile") and state["gate"] is True
    assert None not in beside and min(beside) < 0.05, f"opportunistic work beside production: {beside} s/s"


def test_a_production_job_stopped_mid_iteration_leaves_the_gpu_to_opportunistic_work(simgpu, tgsd, libshim):
    """A production job frozen with work launched (`docker pause`, SIGSTOP, a debugger)
    never completes its synchronisation, so its activity byte stays set: once its work on
    the GPU has drained, tgsd lifts the gate and opportunistic work takes the engine until
    production goes on, when it has the engine back."""
    d = tgsd()
    prod, opp = d.register("production"), d.register("opportunistic")
    p = simgpu.workload(dataclasses.replace(HALF, seconds=14), "prod", prod.env(libshim.shim))
    o = simgpu.workload(dataclasses.replace(HOG, seconds=14), "opp", opp.env(libshim.shim))
    simgpu.wait_for_contexts(["prod", "opp"])
    time.sleep(2)
    running = busy(simgpu, ["prod", "opp"], 2)
    activity = ActivityFile.open(d.state_dir / "activity" / simgpu.uuids()[0])
    for _ in range(100):  # stopped where its byte says production is busy: mid-iteration (not mid-launch)
        p.popen.send_signal(signal.SIGSTOP)
        time.sleep(0.01)
        if activity.busy_slots() and simgpu.answers():
            break
        p.popen.send_signal(signal.SIGCONT)
        time.sleep(0.003)
    assert activity.busy_slots() and simgpu.answers(), "production never stopped mid-iteration, between launches"
    # its work drains, NVML's utilization falls (a 1 s window), then stall.STALL_S: about 2 s
    lifted = d.wait_event("production holds the GPU without using it: opportunistic work goes on until it launches "
                          "again", timeout=10)
    time.sleep(0.2)
    # where the opportunistic job's launching thread spent the window, and how much of the
    # host's CPU time its hypervisor took meanwhile, said on failure
    waits, cpu = [d.container(opp.id)], HostCpu.now()
    before, after = simgpu.snapshots(2)
    stopped = sim.busy_between(before, after)
    waits.append(d.container(opp.id))
    host = cpu.share(HostCpu.now())
    queued = {label: (c["queued"], c["kernels"]) for label, c in sim.contexts(after).items()}
    threads = threads_in_words(o.popen.pid)  # (a CI run found it running nothing and in no wait of the shim's)
    p.popen.send_signal(signal.SIGCONT)
    time.sleep(1.5)
    again = busy(simgpu, ["prod", "opp"], 2)
    assert p.wait() == 0 and o.wait() == 0, p.stderr + o.stderr
    # most of the engine, not all of it: its launching thread refills a queue of two 1 ms
    # kernels, and where its wake-ups come late the engine idles between them (in two of 15
    # runs here it had 0.68 and 0.83 of the engine, waiting at the in-flight bound 1.8 and
    # 1.5 s of the 2 s); without the lift it had none
    assert stopped["prod"] == 0 and stopped["opp"] / 2 >= 0.5, (
        f"while production was stopped: {stopped}; the opportunistic shims waited "
        + str({k: round(waits[1].get(k, 0) - waits[0].get(k, 0), 3) for k in map(proto.wait_key, proto.WAIT_CAUSES)})
        + f" s; simgpu's contexts (queued, kernels) after the window: {queued}; the host's CPUs busy / stolen "
        + HostCpu.in_words(host) + f"; the opportunistic job's threads (state, wchan): {threads}"
        + "; its budget as tgsd wrote it, before and after the window: "
        + str([{k: w.get(k) for k in ("budget_blocks_per_s", "inflight_max", "gated", "anticipating", "turn",
                                       "launches", "throttled_s")} for w in waits]))
    assert again["prod"] >= 0.9 * running["prod"], f"production before {running['prod']:.2f} s/s, after {again['prod']:.2f}"
    assert lifted["gpu"] == simgpu.uuids()[0]
    d.wait_event("production goes on: opportunistic work waits behind it again", timeout=1)


@pytest.mark.parametrize("ending,fault", [("copyloop", ""), ("unifiedcopy", ""), ("pollloop", ""), ("pollfresh", ""),
                                          ("pollthread", "slow-launch"), ("sidestream", "")],
                         ids=["a synchronous copy", "a synchronous unified copy", "polled events",
                              "polled events, a new stream each time", "a poller thread beside slow launches",
                              "a thread synchronising its own stream"])
def test_production_keeps_its_engine_and_leaves_its_idle_time_however_it_waits(ending, fault, simgpu, tgsd,
                                                                                    libshim, c_programs):
    """A production job whose iterations end with no stream, context or event
    synchronisation is idle after each: one that copies its result to the host
    synchronously (the CUDA runtime's cudaMemcpy, by cuMemcpyDtoH or by the unified
    cuMemcpy), and one that polls events until its work
    is done (TensorFlow's way, which also polls events in mid-iteration, when its work is
    not done; and, as a job that makes a stream for each step and destroys it, on streams
    that come and go; and from a thread of its own, which finds the GPU idle while the launching
    thread is in the middle of a launch: the kernel that launch queues is still
    production's). And one whose threads each synchronise their own stream (a thread
    uploading the next input, an inference server's instances): one thread's
    synchronisation leaves production busy while another's stream still runs.
    Opportunistic work gets their gaps, and production keeps its engine."""
    d = tgsd()
    prod, opp = d.register("production"), d.register("opportunistic")
    loop = [str(c_programs("shim_checks.c", link_cuda=True)), ending]
    env = {**prod.env(libshim.shim), **({"SIMGPU_FAULT": fault} if fault else {})}
    solo = simgpu.spawn([*loop, "4"], "solo", env)
    simgpu.wait_for_contexts(["solo"])
    time.sleep(1)
    alone = busy(simgpu, ["solo"], 2)["solo"] / 2
    assert solo.wait() == 0, solo.stdout + solo.stderr
    p = simgpu.spawn([*loop, "9"], "prod", env)
    o = simgpu.workload(HOG, "opp", opp.env(libshim.shim))
    simgpu.wait_for_contexts(["prod", "opp"])
    time.sleep(3)
    shared = busy(simgpu, ["prod", "opp"], 4)
    assert p.wait() == 0 and o.wait() == 0, p.stdout + p.stderr + o.stderr
    prod_share, opp_share = shared["prod"] / 4, shared["opp"] / 4
    assert 0.35 <= alone <= 0.55, f"the loop alone keeps the engine busy {alone:.2f} of the time"
    assert prod_share >= 0.9 * alone, f"production: {prod_share:.3f} of the engine shared, {alone:.3f} alone"
    assert opp_share >= 0.4 * (1 - alone), f"opportunistic got {opp_share:.3f} of the engine; idle was {1 - alone:.3f}"


def test_the_controller_follows_when_production_load_doubles(simgpu, tgsd, libshim):
    d = tgsd()
    prod, opp = d.register("production"), d.register("opportunistic")
    # two 25 %-duty jobs of different periods (20, 22 ms): their phases drift, so their sum is
    # steady; the second adds 20/22 of the first's blocks, so the doubled load is ~1.9x (1.8
    # measured; with 27 ms it was 1.74x and once fell below the 1.6 asked for)
    quarter = lambda seconds, period=20: Workload.with_duty(0.25, period_ms=period, kernels=5, seconds=seconds,
                                                            report_s=0.5)
    # the doubled load alone, for reference
    a, b = simgpu.workload(quarter(3.5), "ref-a", prod.env(libshim.shim)), simgpu.workload(
        quarter(3.5, 22), "ref-b", prod.env(libshim.shim))
    simgpu.wait_for_contexts(["ref-a", "ref-b"])
    time.sleep(0.5)
    ref = busy(simgpu, ["ref-a", "ref-b"], 2.5)
    doubled_alone = (ref["ref-a"] + ref["ref-b"]) / 2.5
    a.wait(), b.wait()
    a = simgpu.workload(quarter(25), "prod-a", prod.env(libshim.shim))
    o = simgpu.workload(Workload(kernel_us=1000, kernels=10, seconds=25), "opp", opp.env(libshim.shim))
    simgpu.wait_for_contexts(["prod-a", "opp"])
    # The controller first knew production as the doubled reference load: the one job
    # alone must be known before the load doubles again. It gets there by a profile after
    # production's return from idle, or, when the jobs' turnover was too quick to look
    # idle, after its cuts do not help (about 4 s; once, on a loaded machine, longer than
    # the 4 s this test used to wait, and the doubling was then no change at all).
    solo_before, deadline = None, time.monotonic() + 12
    time.sleep(2)
    while time.monotonic() < deadline:
        ctl = d.status()["gpus"][0]["controller"]
        solo, progress = ctl["solo_blocks_per_s"], ctl["production_progress_blocks_per_s"]
        if ctl["state"] == "run" and solo and progress and abs(solo - progress) <= 0.2 * progress:
            solo_before = solo
            break
        time.sleep(0.25)
    assert solo_before, f"the controller never settled on the one job: {ctl}"
    b = simgpu.workload(quarter(12, 22), "prod-b", prod.env(libshim.shim))
    time.sleep(5)  # the target: the controller has followed within 5 s
    ctl = d.status()["gpus"][0]["controller"]
    shared = busy(simgpu, ["prod-a", "prod-b", "opp"], 3)
    for x in (a, b, o):
        x.wait()
    assert solo_before and ctl["solo_blocks_per_s"] >= 1.6 * solo_before, (solo_before, ctl)
    prod_share = (shared["prod-a"] + shared["prod-b"]) / 3
    assert prod_share >= 0.9 * doubled_alone, f"production kept {prod_share:.2f} of the engine, {doubled_alone:.2f} alone"
    assert shared["opp"] / 3 >= 0.25, "opportunistic still gets the idle part"


def test_opportunistic_work_goes_on_when_one_of_two_production_jobs_ends(simgpu, tgsd, libshim):
    """Two production containers; one job ends with no idle moment while the other goes
    on, and opportunistic kernels do it a little harm (nothing anticipates production
    here). The pair's solo figure cannot be reached again: a second after the process
    ends the controller sees production outside its figure and profiles it, and
    opportunistic work keeps its part of the idle time from then on. Before, cuts aimed
    at the pair's figure took most of it for seconds (and, before the check, for good:
    docs/results/history.md, the eighth and ninth sessions)."""
    d = tgsd("[control]\nanticipate = false")
    a, b, opp = d.register("production"), d.register("production"), d.register("opportunistic")
    quarter = lambda seconds: Workload.with_duty(0.25, period_ms=20, kernels=10, seconds=seconds, report_s=0.5)
    o = simgpu.workload(Workload(kernel_us=1000, kernels=10, seconds=32, report_s=0.5), "opp", opp.env(libshim.shim))
    simgpu.wait_for_contexts(["opp"])
    pa = simgpu.workload(quarter(12), "prod-a", a.env(libshim.shim))
    pb = simgpu.workload(quarter(27), "prod-b", b.env(libshim.shim))
    pa.wait(60)
    time.sleep(2)  # a second to judge the turnover, one to profile
    windows = [busy(simgpu, ["prod-b", "opp"], 5) for _ in range(2)]
    ctl = d.status()["gpus"][0]["controller"]
    pb.wait(60)
    o.kill()  # starved (the fault this test is about), it would not finish
    # Nothing aims at the pair's figure once prod-a has ended: its fall is judged (prod-b
    # measured alone, or the fall taken as production's own) before any rate cut. Without
    # the judgement a second after the turnover, rate cuts came at once ("production at
    # 0.597 of its solo progress ...: rate cut"; opportunistic work got 0.04-0.10 of the
    # engine in the first 6 s, 0.241 with the judgement taken out of today's controller,
    # whose other checks restore the figure sooner) and, before those checks, for good.
    # Read in tgsd's own log from the moment it dropped prod-a's process (cuts before then
    # answer the pair, and this test's clock, read after prod-a's exit, once counted one
    # that came 20 ms before the drop); one judged in the very period of the drop failed a
    # CI run (test_nothing_is_judged_in_the_period_a_production_process_ends)
    events = d.events()
    at = lambda e: datetime.fromisoformat(e["timestamp"]).timestamp()
    hello = [e["process"] for e in events if e.get("event") == "process said hello" and e.get("pid") == pa.popen.pid]
    gone = [at(e) for e in events if e.get("event") == "process disconnected" and e.get("process") in hello]
    assert len(gone) == 1, f"tgsd's log has prod-a's process as {hello} and its drop as {gone}"
    gone = gone[0]
    after = [e for e in events if e.get("event") == "controller decision" and at(e) >= gone]
    # judged: profiled at once, or by a profile under way as prod-a went (beside five busy
    # loops one ended 0.24 s after the drop, with prod-b alone), or by a checked figure
    judged = next((i for i, e in enumerate(after)
                   if e["state"] == "profile" or e["why"].startswith(("profiled", "checked"))), None)
    trail = [(round(at(e) - gone, 2), e["why"], e.get("solo_blocks_per_s")) for e in after[:6]]
    assert judged is not None and at(after[judged]) - gone <= 2.5, f"prod-a's end was not judged: {trail}"
    cuts = [e["why"] for e in after[:judged] if "rate cut" in e["why"] or "in-flight bound 1" in e["why"]]
    assert not cuts, f"cut as prod-a ended, before its end was judged: {trail}"
    # prod-b alone keeps the engine busy about a quarter of the time. Opportunistic work
    # got 0.66-0.70 of the engine here. The better of two windows: in one full CI run, on
    # a machine slowed by its neighbours, production's noisy progress brought a cut after
    # the judgement (its figure rightly prod-b's), and opportunistic work got 0.128 of
    # the first 6 s; starved for good, it would get next to none of either
    got = [w["opp"] / 5 for w in windows]
    assert max(got) >= 0.3, f"opportunistic work got {got[0]:.3f} and {got[1]:.3f} of the engine: {ctl}"
    assert min(w["prod-b"] for w in windows) / 5 >= 0.2, f"production kept {windows} of the engine"


@pytest.mark.parametrize("share", ["fair", "las"])
def test_two_opportunistic_containers_share(simgpu, tgsd, libshim, share):
    d = tgsd(f'[control]\nshare = "{share}"\n')
    first, second = d.register("opportunistic"), d.register("opportunistic")
    a = simgpu.workload(Workload(kernel_us=1000, kernels=10, seconds=10), "first", first.env(libshim.shim))
    simgpu.wait_for_contexts(["first"])
    time.sleep(2.5)  # the first has attained service before the second arrives
    b = simgpu.workload(Workload(kernel_us=1000, kernels=10, seconds=7), "second", second.env(libshim.shim))
    simgpu.wait_for_contexts(["second"])
    time.sleep(1.0)
    got = busy(simgpu, ["first", "second"], 2.5)
    a.kill()
    b.kill()
    total = got["first"] + got["second"]
    assert total > 2.0, f"the engine was busy {total:.2f}s of 2.5s"
    if share == "fair":
        assert 0.35 <= got["second"] / total <= 0.65, got
    else:
        assert got["second"] > 2 * got["first"], f"las favours the one with less attained service: {got}"


def test_behind_production_opportunistic_containers_take_turns(simgpu, tgsd, libshim):
    """Three opportunistic containers beside production: one launches at a time (else
    production waits behind all their kernels), and over a few seconds each gets about
    its fair part of the engine."""
    d = tgsd('[control]\nshare = "fair"\n')
    prod = d.register("production")
    opps = [d.register("opportunistic") for _ in range(3)]
    # the jobs outlive the wait and the windows: of 9 s, they ended inside a second window
    # (the first held a profile), and without production all three launched at once (CI)
    long = {"seconds": 30}
    p = simgpu.workload(dataclasses.replace(HALF, **long), "prod", prod.env(libshim.shim))
    jobs = [simgpu.workload(dataclasses.replace(HOG, **long), f"opp{i}", o.env(libshim.shim))
            for i, o in enumerate(opps)]
    simgpu.wait_for_contexts(["prod", "opp0", "opp1", "opp2"])
    time.sleep(2)
    # 3 s without a profile: one that pauses opportunistic work for a second (a second after
    # production's process started, where its progress is off the figure) falls on whose
    # turn it is, and is not about taking turns (CI: [0.295, 0.408, 0.121] s of the engine
    # with one in the window)
    w = d.quiet_window(3, within_s=20)
    for x in (p, *jobs):
        x.kill()
    got = sim.busy_between(w.before, w.after)
    launching, turns = [], []
    for gpu in w.samples:
        members = [c for c in gpu["containers"] if c["class"] == "opportunistic"]
        launching.append(sum(1 for c in members if c["budget_blocks_per_s"] != 0))
        turns.append(sum(1 for c in members if c["turn"]))
    assert max(turns) <= 1, f"opportunistic containers with the turn at once: {turns}"
    assert max(launching) <= 1, f"opportunistic containers allowed to launch at once: {launching}"
    opp = [got[f"opp{i}"] for i in range(3)]
    assert sum(opp) > 0.3, f"opportunistic work got {sum(opp):.2f}s of the engine in 3s"
    assert min(opp) >= 0.15 * sum(opp), f"each takes its turns: {opp}{w.caveat}"


def test_an_opportunistic_container_that_needs_little_takes_no_turns_beside_production(simgpu, tgsd, libshim):
    """Beside production (busy half the time), a GPU-bound opportunistic container and one
    that keeps the GPU busy 5 % of the time alone, tgsd's rate unlimited: the light one's
    kernels never pile up at the in-flight bound, so once that is known it launches beside
    the turns, and the GPU-bound one has the rest of production's idle time. Taking turns,
    the light one held the GPU half the time and left it idle meanwhile: the GPU-bound one
    ran 0.48 of the idle time (0.81-0.83 now). Measured over 3 s with no profile and no
    rate limit (a CI run on 2 cores measured while tgsd held the rate at 27,916-39,083
    blocks/s, production read at 0.969 of its figure: 0.38)."""
    d = tgsd('[control]\nshare = "fair"\n')
    prod, hog, light = d.register("production"), d.register("opportunistic"), d.register("opportunistic")
    long = {"seconds": 45}  # outlive the wait and the windows
    jobs = [simgpu.workload(dataclasses.replace(HALF, **long), "prod", prod.env(libshim.shim)),
            simgpu.workload(dataclasses.replace(HOG, **long), "hog", hog.env(libshim.shim)),
            simgpu.workload(Workload.with_duty(0.05, period_ms=20, kernels=2, report_s=0.5, **long), "light",
                            light.env(libshim.shim))]
    simgpu.wait_for_contexts(["prod", "hog", "light"])
    deadline, no_turn = time.monotonic() + 10, 0
    while no_turn < 10 and time.monotonic() < deadline:  # known to need little: launching for 1 s
        no_turn = no_turn + 1 if d.container(light.id)["budget_blocks_per_s"] != 0 else 0
        time.sleep(0.1)
    w = d.quiet_window(3, within_s=24, unlimited=True)
    got = sim.busy_between(w.before, w.after)
    for x in jobs:
        x.kill()
    idle = 3.0 - got["prod"]
    assert got["light"] >= 0.05, f"the light one ran {got['light']:.3f} s of 3 s"
    assert got["hog"] >= 0.7 * idle, (f"the GPU-bound one ran {got['hog']:.2f} s of production's {idle:.2f} s idle "
                                      f"(the light one {'still' if no_turn < 10 else 'no longer'} taking turns)"
                                      f"{w.caveat}")


def test_memory_oversubscription_protects_production(simgpu, tgsd, libshim):
    simgpu.memory = "2G"
    d = tgsd()
    prod, opp = d.register("production"), d.register("opportunistic")
    pw = Workload(kernel_us=500, kernels=4, gap_us=4000, seconds=10, param_mb=800, act_mb=400, verify=True,
                  report_s=0.5)
    ow = Workload(kernel_us=500, kernels=4, seconds=10, param_mb=800, act_mb=400, verify=True, report_s=0.5)
    o = simgpu.workload(ow, "opp", opp.env(libshim.shim))
    simgpu.wait_for_contexts(["opp"])
    time.sleep(1)
    p = simgpu.workload(pw, "prod", prod.env(libshim.shim))
    assert p.wait() == 0, p.stderr
    assert o.wait() == 0, o.stderr
    assert p.summary().checksum_ok and o.summary().checksum_ok
    ctx = sim.contexts(simgpu.status())
    assert ctx["prod"]["pages_out"] == 0, "production's memory was never evicted"
    assert ctx["opp"]["pages_out"] > 100 and ctx["opp"]["remote_bytes"] > 0, "opportunistic memory went to the host"
    orders = [e for e in d.events() if e.get("event") == "memory order"]
    assert orders and all(e["container"] == opp.id for e in orders)
    assert any(e["op"] == "evict" for e in orders)


def test_memory_no_order_can_free_is_named_with_what_to_do(simgpu, tgsd, libshim, c_programs):
    """Where production's memory and what an opportunistic container holds on the GPU
    exceed the budget and none of it can move (cuMemCreate memory, as PyTorch's
    expandable_segments allocates), tgsd says so once: by how much, which container holds
    what, and what to set."""
    simgpu.memory = "1G"
    d = tgsd()
    prod, opp = d.register("production"), d.register("opportunistic")
    exe = str(c_programs("shim_checks.c", link_cuda=True))
    o = simgpu.spawn([exe, "vmm", "640", "6"], "opp", opp.env(libshim.shim))
    deadline = time.monotonic() + 10
    while (d.container(opp.id)["memory"]["vmm"] < 640 << 20) and time.monotonic() < deadline:
        time.sleep(0.05)
    p = simgpu.spawn([exe, "hold", "512", "2"], "prod", prod.env(libshim.shim))
    warned = d.wait_event("GPU memory over budget and nothing opportunistic left to move", timeout=10)
    assert p.wait() == 0 and o.wait() == 0, p.stderr + o.stderr
    assert warned["unmovable"] == {opp.id: 640 << 20} and warned["production_footprint"] == 512 << 20
    assert warned["over_by"] == (640 + 512 << 20) - warned["budget"]
    assert "opportunistic_quota" in warned["fix"] and "expandable_segments" in warned["fix"]
    assert not [e for e in d.events() if e.get("event") == "memory order"], "nothing was there to move"


def test_a_production_container_can_keep_plain_device_memory(simgpu, tgsd, libshim):
    """A production container that asks (TGS_CONVERT_MEMORY=false, sent as reserve's
    `convert`) keeps its allocations plain device memory where the host converts
    production's; another on the same host is converted. The choice is the container's for
    its life: the same id asked again otherwise is refused."""
    d = tgsd()
    plain, managed = d.register("production", convert=False), d.register("production")
    job = Workload(seconds=3, kernels=2, report_s=0.5)
    procs = [simgpu.workload(job, c.id, c.env(libshim.shim)) for c in (plain, managed)]
    # once the second iteration has launched, the first has ended (the workload
    # synchronises each) and each of its kernels has touched its part of the memory (after
    # the first kernel only, beside three busy loops, 24 of the converted 32 MiB were resident)
    snap = simgpu.wait_for_contexts([plain.id, managed.id], kernels=job.kernels + 1)
    held = {c.id: d.container(c.id)["memory"] for c in (plain, managed)}
    for p in procs:
        p.wait()
        assert p.returncode == 0, p.stderr
    ctx = sim.contexts(snap, 0)
    assert ctx[plain.id]["device_bytes"] >= 32 << 20 and ctx[plain.id]["resident_bytes"] == 0
    assert ctx[managed.id]["device_bytes"] == 0 and ctx[managed.id]["resident_bytes"] >= 32 << 20
    assert held[plain.id]["converted"] is False and held[managed.id]["converted"] is True
    assert held[plain.id]["footprint"] >= 32 << 20, "plain device memory is the container's footprint as well"
    with pytest.raises(Refused, match=f"container {plain.id} is already registered .* with convert false"):
        d.admin.reserve(plain.id, "production", ["0"], convert=True)
    assert d.admin.reserve(plain.id, "production", ["0"], convert=False)["id"] == plain.id, "the same request again"


def test_opportunistic_quota(simgpu, tgsd, libshim):
    simgpu.memory = "2G"
    d = tgsd('[memory]\nopportunistic_quota = "25%"\n')
    opp = d.register("opportunistic")
    p = simgpu.run(Workload(seconds=0.5, param_mb=400, act_mb=200), "over", opp.env(libshim.shim))
    assert p.popen.returncode == 3 and "CUDA_ERROR_OUT_OF_MEMORY" in p.stdout
    ok = simgpu.run(Workload(seconds=0.5, param_mb=300, act_mb=200), "under", opp.env(libshim.shim))
    assert ok.popen.returncode == 0, ok.stderr


def test_a_job_that_ends_says_nothing_of_losing_tgsd(simgpu, tgsd, libshim, c_programs):
    """At exit the shim says bye and tgsd closes the connection: the shim's connection
    thread, still running while the process exits (here held 200 ms by a library unloaded
    after the shim), must not warn that tgsd was lost."""
    d = tgsd()
    opp = d.register("opportunistic")
    slow_exit = c_programs("exit_delay.c", extra=["-shared", "-fPIC"])
    env = {**opp.env(libshim.shim), "LD_PRELOAD": f"{libshim.shim}:{slow_exit}"}
    p = simgpu.workload(Workload(kernel_us=500, kernels=4, seconds=0.5, param_mb=8, act_mb=8), "ends", env)
    assert p.wait() == 0, p.stderr
    assert "tgs[" not in p.stderr, p.stderr


def test_kill_9_of_tgsd_then_restart(simgpu, tgsd, libshim):
    d = tgsd()
    # the production container keeps its device memory (TGS_CONVERT_MEMORY=false): a choice that outlives tgsd
    prod, opp = d.register("production", convert=False), d.register("opportunistic")
    p = simgpu.workload(Workload.with_duty(0.5, seconds=12, report_s=0.5, verify=True), "prod", prod.env(libshim.shim))
    o = simgpu.workload(Workload(kernel_us=1000, kernels=10, seconds=12, verify=True), "opp", opp.env(libshim.shim))
    simgpu.wait_for_contexts(["prod", "opp"])
    time.sleep(2)
    d.kill9()
    time.sleep(1.5)
    d.start()
    d.wait_event("container taken back after a restart", container=prod.id)
    d.wait_event("container taken back after a restart", container=opp.id)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        st = {c["id"]: c for c in d.status()["gpus"][0]["containers"]}
        if st.get(prod.id, {}).get("processes") and st.get(opp.id, {}).get("processes"):
            break
        time.sleep(0.2)
    assert st[prod.id]["processes"] == 1 and st[opp.id]["processes"] == 1, "the shims reconnected"
    assert st[prod.id]["memory"]["converted"] is False and st[opp.id]["memory"]["converted"] is True
    assert p.wait() == 0 and o.wait() == 0
    assert p.summary().checksum_ok and o.summary().checksum_ok
    assert p.stderr.count("lost tgsd") == 1 and o.stderr.count("lost tgsd") == 1, "one warning per outage"


def test_a_killed_workload_and_a_dead_container_are_released(simgpu, tgsd, libshim):
    d = tgsd()
    opp = d.register("opportunistic")
    w = simgpu.workload(Workload(kernel_us=1000, kernels=10, seconds=30, param_mb=64, act_mb=64), "victim",
                        opp.env(libshim.shim))
    deadline = time.monotonic() + 10
    while not (d.container(opp.id) or {}).get("processes") or d.container(opp.id)["memory"]["resident"] < 128 << 20:
        assert time.monotonic() < deadline, d.container(opp.id)
        time.sleep(0.1)
    w.kill()
    w.wait()
    time.sleep(0.3)
    c = d.container(opp.id)
    assert c["processes"] == 0 and c["memory"]["resident"] == 0, "the process's memory is forgotten"
    assert c["memory"]["footprint"] == 0, "what the killed process held no longer counts against the container"
    opp.init.kill()
    opp.init.wait()
    time.sleep(0.3)
    assert d.container(opp.id) is None, "a dead container is released within a control period"
    assert not opp.dir.exists()


def test_unattached_reservations_are_dropped(simgpu, tgsd):
    d = tgsd("[daemon]\nreservation_timeout_s = 1\n")
    reply = d.admin.reserve("never", "opportunistic", ["0"])
    time.sleep(1.6)
    assert d.container("never") is None
    assert not os.path.exists(reply["dir"])
    d.wait_event("container released", container="never")


def test_bad_requests_are_refused_with_a_reason(simgpu, tgsd):
    d = tgsd()
    with pytest.raises(Refused, match="class 'batch'"):
        d.admin.reserve("a", "batch", ["0"])
    with pytest.raises(Refused, match="GPU '7'|GPU 7"):
        d.admin.reserve("a", "production", ["7"])
    with pytest.raises(Refused, match="no GPUs"):
        d.admin.reserve("a", "production", [])
    with pytest.raises(Refused, match="convert 'no': expected true or false"):
        d.admin.call("reserve", id="a", **{"class": "production"}, gpus=["0"], convert="no")
    with pytest.raises(Refused, match="an opportunistic container's memory is always converted"):
        d.admin.reserve("a", "opportunistic", ["0"], convert=False)
    with pytest.raises(Refused, match="container id"):
        d.admin.reserve("../etc", "production", ["0"])
    with pytest.raises(Refused, match="not reserved"):
        d.admin.attach("ghost", os.getpid())
    with pytest.raises(Refused, match="unknown operation"):
        d.admin.call("explode")
    with pytest.raises(Refused, match="bundle 'b': expected an absolute path"):
        d.admin.call("create", id="a", bundle="b", config=str(d.config))
    with pytest.raises(Refused, match="bad TGS config: /nowhere.toml: no such config file"):
        d.admin.call("create", id="a", bundle="/b", config="/nowhere.toml", named=True)
    with pytest.raises(Refused, match="no config.json"):
        d.admin.call("create", id="a", bundle="/nowhere", config=str(d.config), named=True)
    d.admin.reserve("twice", "production", ["0"])
    d.admin.reserve("twice", "production", ["0"])  # the same again is fine
    with pytest.raises(Refused, match="already registered"):
        d.admin.reserve("twice", "opportunistic", ["0"])


def _raw(path, data: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(path))
        s.sendall(data)
        try:
            return s.recv(100)
        except (ConnectionResetError, socket.timeout):
            return b""


def test_garbage_closes_only_that_connection(simgpu, tgsd, libshim):
    d = tgsd()
    opp = d.register("opportunistic")
    w = simgpu.workload(Workload(kernel_us=1000, kernels=10, seconds=6), "steady", opp.env(libshim.shim))
    simgpu.wait_for_contexts(["steady"])
    admin = d.state_dir / "tgsd.sock"
    assert _raw(admin, struct.pack("<I", 1 << 24)) == b""          # oversized
    assert _raw(admin, struct.pack("<I", 5) + b"{{{{{") == b""      # not JSON
    sock = opp.dir / "tgs.sock"
    assert _raw(sock, struct.pack("<I", 1 << 24)) == b""
    assert _raw(sock, struct.pack("<I", 16) + b"\x01" * 16) == b""
    assert d.status()["gpus"][0]["containers"][0]["processes"] == 1, "the shim's own connection is untouched"
    assert w.wait() == 0 and "pass-through" not in w.stderr
    assert sum(1 for e in d.events() if e.get("event") == "closing a connection: bad message") == 2


def test_malformed_config_refuses_to_start(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[control]\ncontroller = "slowest"\n')
    proc = subprocess.run([sys.executable, "-m", "tgs_runtime.daemon.main", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "control.controller = 'slowest': expected one of 'fast', 'tgs-paper'" in proc.stderr


def test_a_tgsd_of_our_own_that_cannot_start_leaves_no_state_behind(tmp_path):
    """The demo's and the benchmarks' own tgsd (`ChildTgsd`): where it exits before it
    answers, the error carries its log, and its state directory under /tmp is gone (it was
    left, one per failed start)."""
    from tgs_runtime.childd import ChildTgsd

    d = ChildTgsd({"control": {"controller": "slowest"}}, tmp_path / "tgs.toml", tmp_path / "tgsd.log")
    with pytest.raises(RuntimeError, match="control.controller = 'slowest'"):
        d.start()
    assert not d.state_dir.exists()


def test_a_tgsd_of_our_own_runs_the_code_that_started_it_whatever_the_working_directory(tgsd, tmp_path,
                                                                                         monkeypatch):
    """Started from a folder holding another copy of TGS (a worktree of another commit, for a
    side-by-side run), the demo's and the benchmarks' own tgsd runs the code of the process
    that started it: `python -m` looks in the working directory first, and the forty-eighth
    session's comparisons ran the new tgsd in both arms."""
    other = tmp_path / "other-checkout" / "tgs_runtime"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("raise SystemExit('the copy of TGS in the working directory ran')\n")
    monkeypatch.chdir(other.parent)
    d = tgsd()
    assert d.status()["gpus"], "it answers, with its GPU"
    assert "the copy of TGS in the working directory ran" not in d.log_path.read_text()


@pytest.mark.parametrize("address", ["path", "abstract"])
def test_tgsd_tells_systemd_when_it_is_ready_and_when_it_stops(tgsd, tmp_path, monkeypatch, address):
    """The unit is Type=notify: without READY=1, `systemctl start tgsd` waits, then kills it."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if address == "path":
        listener.bind(str(tmp_path / "notify"))
        monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    else:  # systemd's own is abstract: "@" stands for the leading NUL
        name = f"tgs-test-notify-{os.getpid()}-{id(tmp_path)}"
        listener.bind("\0" + name)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
    listener.settimeout(10)
    with listener:
        d = tgsd()  # returns once its admin socket answers
        assert listener.recv(64) == b"READY=1"
        d.stop()
        assert listener.recv(64) == b"STOPPING=1"


@pytest.mark.parametrize("journal,json_lines", [(False, False), (True, True)])
def test_tgsd_logs_key_value_on_a_terminal_and_json_to_the_journal(simgpu, tmp_path, journal, json_lines):
    """`[daemon] log = "auto"`: readable on a terminal, JSON lines under systemd (JOURNAL_STREAM)."""
    import pty
    import select

    from harness.daemon import Tgsd

    t = Tgsd(simgpu, tmp_path / "tgsd", '[daemon]\nlog = "auto"\nlog_level = "info"\n')
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("JOURNAL_STREAM", "NOTIFY_SOCKET")}
    if journal:
        env["JOURNAL_STREAM"] = "8:12345"
    proc = subprocess.Popen([sys.executable, "-m", "tgs_runtime.daemon.main", "--config", str(t.config)],
                            stdout=slave, stderr=slave, env=env)
    os.close(slave)
    out = b""
    try:
        deadline = time.monotonic() + 20
        while b"tgsd started" not in out and time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                out += os.read(master, 65536)
    finally:
        proc.terminate()
        proc.wait(10)
        os.close(master)
        t.close()  # its state directory, under /tmp
    line = next(l for l in out.decode().splitlines() if "tgsd started" in l)
    if json_lines:
        assert json.loads(line)["event"] == "tgsd started", line
    else:
        assert not line.startswith("{") and "tgsd started" in line and "state_dir=" in line, line


def test_sighup_reloads_what_can_change(simgpu, tgsd):
    d = tgsd()
    text = d.config.read_text().replace("[daemon]\n", "[daemon]\ncontrol_period_ms = 50\n")
    d.config.write_text(text + '[control]\nshare = "las"\n')
    d.proc.send_signal(signal.SIGHUP)
    d.wait_event("config changed", key="control.share")
    d.wait_event("config changed", key="daemon.control_period_ms")
    assert d.status()["daemon"]["share"] == "las"


def test_status_schema(simgpu, tgsd, libshim):
    d = tgsd()
    opp = d.register("opportunistic")
    out = subprocess.run([sys.executable, "-m", "tgs_runtime", "status", "--json", "--state-dir", str(d.state_dir)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    st = json.loads(out.stdout)
    assert set(st) == {"version", "daemon", "gpus"}
    g = st["gpus"][0]
    assert {"index", "uuid", "name", "memory_total", "memory_budget", "controller", "containers"} <= set(g)
    assert {"state", "rate_blocks_per_s", "solo_blocks_per_s", "production_progress_blocks_per_s", "inflight_max",
            "gate", "opportunistic_beside_production", "decision"} <= set(g["controller"])
    c = g["containers"][0]
    assert c["id"] == opp.id and c["class"] == "opportunistic"
    assert {"budget_blocks_per_s", "inflight_max", "progress_blocks_per_s", "attained_blocks", "memory", "syncs",
            "iteration_starts", "busy_s", "paused_s", "gated_s", "beside_production_s", "inflight_wait_s",
            "anticipation_wait_s",
            "token_wait_s"} <= set(c)
    assert {"footprint", "resident", "evicted", "quota", "vmm", "converted"} <= set(c["memory"])
    assert c["memory"]["converted"] is True, "an opportunistic container's memory is always converted"
    deadline = time.monotonic() + 10
    while d.status()["gpus"][0]["controller"]["inflight_max"] is None and time.monotonic() < deadline:
        time.sleep(0.1)
    # the host's CPU time its hypervisor took, read every quarter-second (0 on bare metal)
    while (stolen := d.status()["daemon"]["host_cpu_stolen"]) is None and time.monotonic() < deadline + 5:
        time.sleep(0.1)
    assert stolen is not None and 0.0 <= stolen <= 1.0, stolen
    human = subprocess.run([sys.executable, "-m", "tgs_runtime", "status", "--state-dir", str(d.state_dir)],
                           capture_output=True, text=True, timeout=30)
    assert opp.id in human.stdout and "opportunistic" in human.stdout
    assert "no in-flight bound" in human.stdout, "no production on the GPU: opportunistic work is not bounded"
    # the controller's latest decision and why, as its log gave them (here: no production, no limit)
    decision = d.status()["gpus"][0]["controller"]["decision"]
    assert decision and decision["why"] == "no production on the GPU" and 0 <= decision["age_s"] < 60, decision
    assert "its latest decision, " in human.stdout and " s ago: no production on the GPU" in human.stdout, human.stdout
    assert ("since it started, waited 0.0 s behind production, 0.0 s at the in-flight bound, 0.0 s anticipating production, "
            "0.0 s for tokens") in human.stdout, human.stdout
    d.stop()
    down = subprocess.run([sys.executable, "-m", "tgs_runtime", "status", "--state-dir", str(d.state_dir)],
                          capture_output=True, text=True, timeout=30)
    assert down.returncode == 1 and "tgsd is not running" in down.stderr and "systemctl start tgsd" in down.stderr
    assert "Traceback" not in down.stderr, down.stderr



def test_production_measured_alone_is_no_new_decision(simgpu, tgsd, libshim):
    """Production alone moves its solo figure every control period. Each move was taken
    for a decision: logged (at debug level) ten times a second with the reason of the last
    one, "production arrived", and `tgs status` read that decision 0.1 s old for as long
    as production ran alone."""
    d = tgsd()
    prod = d.register("production")
    job = simgpu.workload(Workload.with_duty(0.5, seconds=5, report_s=0.5), "solo", prod.env(libshim.shim))
    simgpu.wait_for_contexts(["solo"])
    time.sleep(3)
    ctl = d.status()["gpus"][0]["controller"]
    job.wait(60)
    assert ctl["state"] == "solo" and ctl["solo_blocks_per_s"], ctl
    assert ctl["decision"]["age_s"] >= 1.5, f"production alone read as a decision {ctl['decision']['age_s']} s ago"
    decisions = [e for e in d.events() if e.get("event") == "controller decision"]
    assert len(decisions) <= 5, [e["why"] for e in decisions]


@pytest.mark.parametrize("ranks", [1, 2])
def test_production_s_own_pauses_are_not_taken_for_a_change_of_its_load(simgpu, tgsd, libshim, ranks):
    """A production job that pauses on its own (0.3 s after every half second of
    iterations: a data loader's stall) beside a GPU-bound opportunistic one. Its shim
    counts the pauses, and tgsd leaves them out of its progress: its figure is its pace
    while it runs, and holds. Before, each window's progress was its pace diluted by
    whatever stalls it held: the figure went 30,654 -> 36,845 -> 26,839 -> 32,264
    blocks/s in 6 s, each move taken as a change of production's own load, and only 4 of
    10 readings of its progress were within 10 % of the figure then (each fall a cut
    where opportunistic work did not watch; the controller rig's stalls). With two
    ranks, one per GPU in one container (GPU 1's steady), GPU 0's pauses are its rank's
    alone and left out as well; they were kept in for any container of several
    processes (its figure 26,675 blocks/s for a pace of 54,000)."""
    simgpu.devices = ranks
    d = tgsd()
    prod, opp = d.register("production", ["all"]), d.register("opportunistic")
    stalling = dataclasses.replace(HALF, seconds=10, stall_us=300_000, stall_every=25)
    p = simgpu.workload(stalling, "prod", prod.env(libshim.shim))
    o = simgpu.workload(dataclasses.replace(HOG, seconds=10), "opp", opp.env(libshim.shim))
    if ranks == 2:
        steady = simgpu.workload(dataclasses.replace(HALF, seconds=10, device=1), "prod-gpu1", prod.env(libshim.shim))
        simgpu.wait_for_contexts(["prod-gpu1"], device=1)
    simgpu.wait_for_contexts(["prod", "opp"])
    time.sleep(3)
    readings = []
    for _ in range(10):
        ctl = d.status()["gpus"][0]["controller"]
        readings.append((ctl["production_progress_blocks_per_s"], ctl["solo_blocks_per_s"], ctl["rate_blocks_per_s"]))
        time.sleep(0.5)
    human = subprocess.run([sys.executable, "-m", "tgs_runtime", "status", "--state-dir", str(d.state_dir)],
                           capture_output=True, text=True, timeout=30).stdout
    paused, processes = d.container(prod.id)["paused_s"], d.container(prod.id)["processes"]
    p.wait()
    o.wait()
    if ranks == 2:
        steady.wait()
    assert processes == ranks, f"the production container had {processes} processes"
    assert paused >= 2.0, f"its shim counted {paused} s of pauses in about 8 s, 0.3 s of each 0.8"
    assert "since it started, paused on its own " in human, human
    decisions = [e["why"] for e in d.events() if e.get("event") == "controller decision"]
    pace = stalling.kernels * SM_COUNT * 1e6 / (stalling.kernel_us * stalling.kernels + stalling.gap_us)
    assert readings[-1][1] >= 0.85 * pace, f"solo figure {readings[-1][1]:,.0f} blocks/s, the job's pace {pace:,.0f}"
    moved = [w for w in decisions if w.startswith(("production rose to", "production fell to"))]
    assert len(moved) <= 1, moved
    near = sum(abs(progress / solo - 1) <= 0.1 for progress, solo, _ in readings)
    assert near >= 8, f"production's progress against its figure: {readings}"


@pytest.mark.parametrize("host_s,mid_us", [(0.55, 0), (1.0, 0), (3.0, 0), (1.0, 300)],
                         ids=["0.55s", "1s", "3s", "1s-with-0.3ms-inside"])
def test_production_on_its_host_every_iteration_is_not_profiled_at_each_return(simgpu, tgsd, libshim, host_s,
                                                                              mid_us):
    """A production job of 50 ms of kernels and 0.55, 1 or 3 s on its host every iteration (a
    slow data loader) beside a GPU-bound opportunistic one. Once its shim has gone idle
    three times, it expects those spells, tgsd reads the expectation, and production on
    its host is not idle: its returns are no longer profiled, and the opportunistic job has
    the time between its bursts (a job of 1 s spells is timed in a window that grows to
    hold two of its iterations; of 3 s spells, 15 s). Before, every spell was taken as idle and every return
    profiled (a GPU-bound job beside 0.2 s of kernels and 0.6 s on the host had 0.40 of the
    idle time on simgpu, beside 0.2 s and 1 s 0.63); and until 2026-11-29 the shim
    expected nothing before eight spells, whose returns were profiled. The last case also
    idles 0.3 ms inside each iteration (the GPU catching up with the launching thread, as
    a ResNet-50's event queries found it on an H200): the shim took those spells for its
    gaps, its rhythm was 1 ms, and every return was profiled (0.479 of the idle time to
    the job, 28 returns profiled in 30 s); now it knows its steps (compute.c, "Steps").
    Its spells are regular, and production hardly waits behind the job: 1.6-2.3 ms an
    iteration here while anticipation let go kernels that held it back by up to 1/128 of
    its spell, whatever the window it is expected back in; in the last case 3.2-3.3 ms
    while the job's kernels, too long for a spell inside, went into each."""
    d = tgsd()
    prod, opp = d.register("production"), d.register("opportunistic")
    seconds = round(16 + 10 * (host_s - 0.55))
    # both run 6 s past `seconds`: in a CI run on 2 cores the 3 s case's `tgs status` came
    # after both jobs had ended (no process in either container), 40 s after they started
    slow = Workload(kernel_us=10_000, kernels=5, gap_us=round(host_s * 1e6), seconds=seconds + 6, report_s=1,
                    host_us=mid_us, host_sync=bool(mid_us))
    p = simgpu.workload(slow, "prod", prod.env(libshim.shim))
    o = simgpu.workload(dataclasses.replace(HOG, seconds=seconds + 6), "opp", opp.env(libshim.shim))
    simgpu.wait_for_contexts(["prod", "opp"])
    time.sleep(seconds - 8)  # its first spells, and the profile of its first return after them
    before, after = simgpu.snapshots(6)
    shared = sim.busy_between(before, after)
    waited = sim.between(before, after, "waited_ns")["prod"] / 1e6
    iterations = sim.between(before, after, "kernels")["prod"] / slow.kernels
    rhythms = []  # (none while it runs a burst: its expectation withdrawn)
    for _ in range(5):
        rhythms.append(d.container(prod.id)["rhythm_s"])
        time.sleep(0.1)
    said = "between its bursts (its rhythm): not idle within it"
    for _ in range(3):  # (a reading that falls in a burst has no rhythm to show)
        human = subprocess.run([sys.executable, "-m", "tgs_runtime", "status", "--state-dir", str(d.state_dir)],
                               capture_output=True, text=True, timeout=30).stdout
        if said in human:
            break
    p.wait()
    o.wait()
    assert any(r and 1.8 * host_s <= r <= 2.3 * host_s for r in rhythms), \
        f"its rhythm in tgs status: {rhythms} ({host_s} s spells)"
    assert said in human, human
    returns = [e["why"] for e in d.events() if e.get("event") == "controller decision"
               and e.get("why", "").startswith("production back from idle")]
    assert len(returns) <= 5, f"{len(returns)} returns profiled in {seconds} s of {host_s + 0.05} s iterations"
    idle = 1 - shared["prod"] / 6
    assert shared["opp"] / 6 >= 0.7 * idle, f"the job had {shared['opp'] / 6:.3f} of the engine, {idle:.3f} idle"
    assert waited / iterations < 1, f"production waited {waited / iterations:.2f} ms per iteration"


def test_a_long_rhythm_whose_own_load_falls_is_profiled_not_cut(simgpu, tgsd, libshim):
    """A production job of 20 kernels of 10 ms and 3 s on its host every iteration whose
    iterations drop to 14 kernels 24 s in (its own load falling by 30 %, in the same
    process: no idle moment, no process starting or ending) beside an opportunistic job
    whose shims cannot tell whose the fall is. Production's shim marks each iteration's
    start with the blocks launched before it: its iterations do less work, so tgsd takes
    the fall for its own at the first violation and profiles it. Cut as harm, the fall was
    cut twice, 6.5 s apart ("rate cut" at 0.713 of the figure, twice, on simgpu), and
    profiled only after two cuts brought nothing back. The profile lets the opportunistic
    job run while production is on its host (it lasted 3.9 s, paused throughout)."""
    d = tgsd()
    prod, opp = d.register("production"), d.register("opportunistic")
    seconds = 40
    job = Workload(kernel_us=10_000, kernels=20, gap_us=3_000_000, seconds=seconds, report_s=1, phase_s=24,
                   phase_kernels=14)
    p = simgpu.workload(job, "prod", prod.env(libshim.shim))
    # an opportunistic job that works in bursts too, so its shims wait behind production for
    # little of its busy time and cannot tell whose the fall is (a GPU-bound one can: the
    # fall is then production's own at once, with no profile)
    light = Workload(kernel_us=1000, kernels=10, gap_us=200_000, seconds=seconds, report_s=1)
    o = simgpu.workload(light, "opp", opp.env(libshim.shim))
    p.wait()
    o.wait()
    whys = [e["why"] for e in d.events() if e.get("event") == "controller decision"]
    fell = [i for i, w in enumerate(whys) if "its own load fell" in w]
    assert fell and not any(w.startswith("two cuts brought nothing back") for w in whys), whys
    profile = list(itertools.takewhile(lambda w: not w.startswith("profiled:"), whys[fell[0] + 1:]))
    assert any(w.startswith("production on its host, not due back") for w in profile), whys[fell[0]:]


def test_a_job_with_host_work_between_launches_gets_the_idle_time_once_the_bound_deepens(simgpu, tgsd, libshim):
    """100 us kernels with 3 ms of host work mid-iteration beside production at 50 % duty:
    under a bound of two the GPU runs dry during the host work (about 0.8 of the idle
    time to the job); production holding, the bound deepens to eight within about 12 s
    and the job keeps the GPU busy through it (about 0.98), production untouched.

    The jobs outlast the wait, and the engine is measured over 3 s under the bound of
    eight throughout: a trial that reads as harm or gains too little (one from two to four
    gained 3.4-7.5 % here, against the 3 % it needs) puts the bound back for 10-30 s before
    it deepens again. With a 16 s wait and 20 s jobs the test failed 3 times in clean-clone
    CI: the bound at two, then at one, by 16 s; and the job at 0.429 of the engine, likely
    a window that the jobs' end cut short. The window is one without a profile: in one CI
    run the bound reached eight 60 s in, and the periodic profile then (opportunistic work
    gated for 0.9 s) left the job 0.339 of the engine. In another (at a057f34) a trial of
    four read a loss, the next met harm read at 0.968 of solo (the bound to one and a rate
    cut, 27 s in), eight came 58 s in and the periodic profile at 60 s: no window at eight
    within 60 s. The wait is 80 s."""
    d = tgsd()
    prod, opp = d.register("production"), d.register("opportunistic")
    host = Workload(kernel_us=100, kernels=100, host_us=3000, seconds=90, report_s=0.5)
    p = simgpu.workload(Workload.with_duty(0.5, period_ms=20, kernels=10, seconds=90, report_s=0.5), "prod",
                        prod.env(libshim.shim))
    o = simgpu.workload(host, "opp", opp.env(libshim.shim))
    simgpu.wait_for_contexts(["prod", "opp"])
    w = d.quiet_window(3, within_s=80, bound=8)
    p.kill()
    o.kill()
    bounds = sorted({g["controller"]["inflight_max"] for g in w.samples})
    assert w.quiet, f"no 3 s under an in-flight bound of eight in 80 s{w.caveat} (the last: bounds {bounds})"
    shared = {label: busy_s / w.seconds for label, busy_s in sim.busy_between(w.before, w.after).items()}
    assert shared["prod"] >= 0.45, f"production kept the engine {shared['prod']:.3f} of the time"
    # production 0.484-0.492 here, the job 0.463-0.482; the job about 0.40 with the bound held at two
    assert shared["opp"] >= 0.44, f"the job got {shared['opp']:.3f} of the engine; idle was 0.5"


def test_opportunistic_kernels_keep_clear_of_production_s_next_iteration(simgpu, tgsd, libshim):
    """Production goes idle for 10 ms between iterations; a GPU-bound opportunistic job
    fills the gaps with 1 ms kernels, but holds back the one that would still run when
    production is expected back. Without that, production waits behind it: about 0.4 ms
    of each 20 ms iteration here (anticipate = false). Measured over 4 s without a profile:
    a CI run on 2 cores took a figure 6 % low under its load, checked it within the window,
    and the 0.9 s gate left opportunistic work 0.64 of the idle time."""
    d = tgsd()
    prod, opp = d.register("production"), d.register("opportunistic")
    p = simgpu.workload(dataclasses.replace(HALF, seconds=30), "prod", prod.env(libshim.shim))
    o = simgpu.workload(dataclasses.replace(HOG, seconds=30), "opp", opp.env(libshim.shim))
    simgpu.wait_for_contexts(["prod", "opp"])
    time.sleep(3)
    w = d.quiet_window(4, within_s=16)
    before, after = w.before, w.after
    member = next(c for c in w.samples[-1]["containers"] if c["class"] == "opportunistic")
    p.kill()
    o.kill()
    got = sim.busy_between(before, after)
    waited = sim.between(before, after, "waited_ns")["prod"] / 1e9
    iterations = sim.between(before, after, "kernels")["prod"] / HALF.kernels
    assert member["anticipating"] and member["gated"], member
    assert iterations > 100, f"production ran {iterations} iterations in 4 s"
    assert waited / iterations < 0.15e-3, f"production waited {waited / iterations * 1e3:.3f} ms per iteration"
    idle = 4 - got["prod"]
    assert got["opp"] >= 0.75 * idle, (f"opportunistic got {got['opp']:.2f} s of the engine; idle was {idle:.2f} s"
                                       f"{w.caveat}")


def test_opportunistic_work_fills_host_spells_that_vary_with_kernels_production_hardly_waits_behind(simgpu, tgsd,
                                                                                                      libshim):
    """Production queues 10 kernels of 20 ms and spends 1 s on its host, each spell drawn
    within +-33 % of it (a loader, an environment's step); beside it a GPU-bound job of
    1 ms kernels. Its shim expects production back after its shortest recent spell, about
    0.7 s: held back from then on until production came back, that job had 0.69-0.71 of the
    idle time, to spare production a millisecond or so of each 1.2 s iteration. A kernel
    that, with the queue before it, would hold production's return back by no more than
    1/128 of its spell and 1/16 of the window it is expected back in (about 0.5 s here)
    now goes (0.96-0.98); production waits behind it a few ms an iteration at most. (Timed from start to start, each spell's noise read as a fall or a
    rise of production's progress, and the rate was cut: tgsd now times it by its busy time.)"""
    d = tgsd()
    prod, opp = d.register("production"), d.register("opportunistic")
    job = Workload(kernel_us=20_000, kernels=10, gap_us=1_000_000, gap_spread=0.33, seconds=32, report_s=1)
    p = simgpu.workload(job, "prod", prod.env(libshim.shim))
    o = simgpu.workload(dataclasses.replace(HOG, seconds=32), "opp", opp.env(libshim.shim))
    simgpu.wait_for_contexts(["prod", "opp"])
    time.sleep(8)  # its first three returns are profiled (its shim expects nothing before)
    w = d.quiet_window(10, within_s=12)
    p.kill()
    o.kill()
    got = sim.busy_between(w.before, w.after)
    waited = sim.between(w.before, w.after, "waited_ns")["prod"] / 1e9
    iterations = sim.between(w.before, w.after, "kernels")["prod"] / job.kernels
    idle = 10 - got["prod"]
    assert got["opp"] >= 0.85 * idle, f"opportunistic got {got['opp']:.2f} s of the engine; idle was {idle:.2f} s{w.caveat}"
    assert waited / iterations < 6e-3, f"production waited {waited / iterations * 1e3:.2f} ms per iteration"


@pytest.mark.parametrize("kernel_us,kernels,least,wait_ms", [(50, 1000, 0.6, 0.15), (1500, 20, 0.2, 0.3)],
                         ids=["50us", "1.5ms"])
def test_an_opportunistic_job_whose_kernels_read_long_still_gets_the_idle_time(simgpu, tgsd, libshim, kernel_us,
                                                                               kernels, least, wait_ms):
    """Every event timing of the opportunistic job reads four times too long
    (SIMGPU_FAULT=long-timings): its 50 us kernels are expected to run 200 us. Launching
    1,000 of them between synchronisations, it expected its queue to end further ahead with
    each launch, and anticipation held it back for work long done: it got 0.25 of
    production's idle time here. The batches of the in-flight bound, found done, bring that
    expectation back to the GPU: 0.80-0.90 (9 runs). Its 1.5 ms kernels, expected to run
    6 ms, hold it back most: there a launch held back by anticipation first takes the
    batches done out of the ring (the bound, which alone did that before, is not reached
    by a job held back): 0.26-0.47 of the idle time in 12 runs, against 0.15-0.16 in 5
    (0.86-0.87 against 0.90-0.91 for the 50 us kernels, 2 runs each). Measured where tgsd
    kept the configured in-flight bound of two: on a loaded 2-core machine it read
    production 3.3 % under its figure, eased the bound to one, and the 50 us kernels had
    0.47 of the idle time (CI, 2026-11-30), which is not what this tests."""
    d = tgsd()
    prod, opp = d.register("production"), d.register("opportunistic")
    p = simgpu.workload(dataclasses.replace(HALF, seconds=30), "prod", prod.env(libshim.shim))
    o = simgpu.workload(Workload(kernel_us=kernel_us, kernels=kernels, seconds=30, report_s=0.5), "opp",
                        {**opp.env(libshim.shim), "SIMGPU_FAULT": "long-timings"})
    simgpu.wait_for_contexts(["prod", "opp"])
    time.sleep(3)
    w = d.quiet_window(4, within_s=16, bound=2)  # a profile gates the job 0.9 s (the test above)
    before, after = w.before, w.after
    p.kill()
    o.kill()
    got = sim.busy_between(before, after)
    iterations = sim.between(before, after, "kernels")["prod"] / HALF.kernels
    waited = sim.between(before, after, "waited_ns")["prod"] / 1e9
    assert iterations > 100, f"production ran {iterations} iterations in 4 s"
    assert waited / iterations < wait_ms * 1e-3, f"production waited {waited / iterations * 1e3:.3f} ms per iteration"
    idle = 4 - got["prod"]
    assert got["opp"] >= least * idle, (f"opportunistic got {got['opp']:.2f} s of the engine; idle was {idle:.2f} s"
                                        f"{w.caveat}")


def test_each_production_process_is_anticipated(simgpu, tgsd, libshim):
    """Two production processes of 25 % duty (20 and 22 ms iterations) wait for each other
    now and then; beside a GPU-bound opportunistic job they should wait no more than that.
    With one expectation per GPU, the one withdrawn at a launch took the other's with it:
    production then waited 0.53-0.56 ms more per iteration here; with one per process,
    -0.01 to +0.05 ms. The in-flight bound is kept at two: tgsd deepened it to four 1.6 s
    before the window and to eight within it, and production waited behind more queued
    work where anticipation missed (0.17-0.33 ms in 2 of 7 runs, against 0.15), which is
    not what this tests."""
    d = tgsd("[control]\ninflight_deepest = 2\n")
    prod, opp = d.register("production"), d.register("opportunistic")
    quarter = lambda name, period: simgpu.workload(
        Workload.with_duty(0.25, period_ms=period, kernels=5, seconds=60, report_s=0.5), name, prod.env(libshim.shim))
    a, b = quarter("a", 20), quarter("b", 22)
    simgpu.wait_for_contexts(["a", "b"])
    time.sleep(1)
    alone = simgpu.snapshots(4)
    o = simgpu.workload(dataclasses.replace(HOG, seconds=60), "opp", opp.env(libshim.shim))
    simgpu.wait_for_contexts(["opp"])
    time.sleep(3)
    # windows with no profile and no rate limit: what anticipation does, not what the rate
    # does (a CI run: the pair's progress, drifting as their bursts fall together and apart,
    # read 0.938 of a figure taken at another moment, with opportunistic work not watching;
    # the rate was cut to 297 blocks/s and ramped back over the next 7 s, and the job had
    # 0.071 s of the 3.25 s left idle)
    quiet = [d.quiet_window(2, within_s=25, unlimited=True) for _ in range(3)]
    a.kill(), b.kill(), o.kill()
    caveat = next((w.caveat for w in quiet if not w.quiet), "")

    def per_iteration(snaps):
        waited, kernels = sim.between(*snaps, "waited_ns"), sim.between(*snaps, "kernels")
        return (waited["a"] + waited["b"]) / 1e6 / ((kernels["a"] + kernels["b"]) / 5)

    # The least of three 2 s windows: the fault waits in every one; a machine slowed by its
    # neighbours made one 4 s window wait +0.225 ms in a full CI run (+0.33 once before)
    each_other, beside = per_iteration(alone), [per_iteration((w.before, w.after)) for w in quiet]
    assert min(beside) - each_other < 0.15, \
        f"production waited {', '.join(f'{x:.3f}' for x in beside)} ms per iteration, {each_other:.3f} alone{caveat}"
    busy = [sim.busy_between(w.before, w.after) for w in quiet]
    idle = sum(w.seconds - b["a"] - b["b"] for w, b in zip(quiet, busy))
    got = sum(b["opp"] for b in busy)
    # 0.9 of it in five runs of six here, 0.52 in one: the bound asks only that it is not starved
    assert got >= 0.4 * idle, f"opportunistic work ran {got:.2f} s of the {idle:.2f} s left idle{caveat}"


def test_opportunistic_kernels_longer_than_production_s_gaps_still_run(simgpu, tgsd, libshim):
    """Kernels of 15 ms never fit production's 10 ms gaps: held back until production is
    due, they would never run (and never be timed again); anticipation leaves them to the
    gate and the controller."""
    d = tgsd()
    prod, opp = d.register("production"), d.register("opportunistic")
    p = simgpu.workload(HALF, "prod", prod.env(libshim.shim))
    o = simgpu.workload(Workload(kernel_us=15000, kernels=2, seconds=9, report_s=0.5), "opp",
                        opp.env(libshim.shim))
    simgpu.wait_for_contexts(["prod", "opp"])
    time.sleep(3)
    before, after = simgpu.snapshots(4)
    p.kill()
    o.kill()
    kernels = sim.between(before, after, "kernels")
    assert kernels["opp"] >= 8, f"the opportunistic job ran {kernels['opp']:.0f} kernels of 15 ms in 4 s"
    assert kernels["prod"] / HALF.kernels > 100, f"production ran {kernels['prod'] / HALF.kernels:.0f} iterations"


def test_each_gpu_of_a_host_is_shared_on_its_own(simgpu, tgsd, libshim):
    """On a host of several GPUs, production on one holds back opportunistic work on that
    one only. Production is given GPU 1 the way a container is (it is the only GPU it sees,
    as its CUDA device 0); an opportunistic container has both GPUs and works on each: on
    GPU 0, where no production runs, it runs free; on GPU 1 it gets production's idle time.
    Each GPU counts the memory its containers hold on it."""
    simgpu.devices = 2
    d = tgsd()
    prod, opp = d.register("production", ["1"]), d.register("opportunistic", ["all"])
    only_gpu_1 = {**prod.env(libshim.shim), "SIMGPU_VISIBLE_DEVICES": "1"}
    solo = simgpu.workload(Workload.with_duty(0.5, seconds=4, report_s=0.5), "solo", only_gpu_1)
    simgpu.wait_for_contexts(["solo"], device=1)
    time.sleep(1)
    alone = sim.busy_between(*simgpu.snapshots(2), device=1)["solo"] / 2
    solo.wait()
    p = simgpu.workload(HALF, "prod", only_gpu_1)
    free = simgpu.workload(HOG, "opp-gpu0", opp.env(libshim.shim))
    beside = simgpu.workload(dataclasses.replace(HOG, device=1, param_mb=48), "opp-gpu1", opp.env(libshim.shim))
    simgpu.wait_for_contexts(["opp-gpu0"], device=0)
    simgpu.wait_for_contexts(["prod", "opp-gpu1"], device=1)
    time.sleep(3)
    before, after = simgpu.snapshots(4)
    gpu0, gpu1 = sim.busy_between(before, after, device=0), sim.busy_between(before, after, device=1)
    status = d.status()["gpus"]
    for proc in (p, free, beside):
        proc.wait()
        assert proc.returncode == 0, proc.stderr
    prod_share, opp_share, free_share = gpu1["prod"] / 4, gpu1["opp-gpu1"] / 4, gpu0["opp-gpu0"] / 4
    assert 0.4 <= alone <= 0.55, f"the production job alone keeps GPU 1 busy {alone:.2f} of the time"
    assert "prod" not in gpu0, "production ran on GPU 0, which its container was not given"
    assert prod_share >= 0.9 * alone, f"production: {prod_share:.3f} of GPU 1's engine shared, {alone:.3f} alone"
    assert opp_share >= 0.4 * (1 - alone), f"opportunistic got {opp_share:.3f} of GPU 1; idle was {1 - alone:.3f}"
    assert free_share >= 0.9, f"with no production on GPU 0, opportunistic work there got only {free_share:.3f} of it"
    held = [{c["id"]: c["memory"]["footprint"] >> 20 for c in g["containers"]} for g in status]
    assert set(held[0]) == {opp.id} and set(held[1]) == {prod.id, opp.id}, f"containers per GPU: {held}"
    # the opportunistic job on GPU 1 holds 32 MiB more than the one on GPU 0 (48 + 16 against 16 + 16)
    assert held[1][opp.id] - held[0][opp.id] == 32 and held[1][prod.id] >= 32, f"MiB held per GPU: {held}"
