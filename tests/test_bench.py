"""bench/: every benchmark `tgs bench` lists exists, and the measuring helpers that turn
workload reports into figures say what they should. (The benchmarks themselves are long
experiments: they run from `tgs bench`, not here.)"""
from __future__ import annotations

import importlib
import inspect
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import rig
from bench.common import Outputs
from bench.dynamics import lowest_by_bound, settle
from bench.lab import ControllerTrace, Job, Lab, opportunistic, production
from tgs_runtime import proto, sim
from tgs_runtime.commands.bench import BENCHMARKS
from tgs_runtime.daemon.controllers import MACHINE_WHY
from tgs_runtime.paths import REPO_ROOT
from tgs_runtime.workload import Report, Workload


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_each_listed_benchmark_has_a_run(name):
    run = importlib.import_module(f"bench.{name}").run
    assert list(inspect.signature(run).parameters) == ["echo", "quick", "json_path"]


def job_with(points: list[tuple[float, int]]) -> Job:
    """A job whose reports came at monotonic times t with `iterations` done by then."""
    job = Job("synthetic", proc=None, started=0.0, log=Path("/nonexistent"))
    for t, its in points:
        job.reports.append(Report(iterations_per_s=0, iterations=its, kernels=0, elapsed_s=t))
        job.arrivals.append(t)
    return job


def test_rate_between_interpolates_on_arrival_times():
    job = job_with([(10.0, 0), (11.0, 50), (12.0, 150)])
    assert job.rate_between(10.5, 11.5) == pytest.approx(75.0)
    assert job.rate_between(9.0, 11.0) != job.rate_between(9.0, 11.0)  # before the first report: NaN


def test_a_pytorch_window_ending_while_a_job_is_paused_waits_for_its_next_report():
    """A job reports after a step; one paused over the window's end (opportunistic work
    gated through a profile, a step of 2 s on its host) had no report there and the
    window read NaN. It is measured once the job reports again: here 100 it/s, silent
    from 2.3 s to 4.3 s after its first report, over a window ending about 2.6 s in."""
    from bench.pytorch import window

    program = ("import json, sys, time\n"
               "t0 = time.monotonic()\n"
               "while True:\n"
               "    e = time.monotonic() - t0\n"
               "    if not 2.3 <= e < 4.3:\n"
               "        print(json.dumps({'iterations_per_s': 100, 'iterations': int(e * 100), 'kernels': 0,"
               " 'elapsed_s': e}), flush=True)\n"
               "    time.sleep(0.1)\n")
    with Lab() as lab:
        job = lab.run([sys.executable, "-c", program], "paused")
        rate = window({"job": job}, 0.5, late_s=10)["job"]
    assert rate == pytest.approx(100, rel=0.1)
    assert job.arrivals[-1] - job.arrivals[0] > 4.2, "measured only after the pause"


def test_a_job_s_own_noise_is_the_spread_of_its_report_rates_in_a_window():
    """The exclusive ResNet-50's half-second rates, 15 and 17 it/s in turn inside the
    window (and 40 it/s before it, warming up): they spread 1/16 of their mean, which the
    pytorch table says beside the exclusive rates; under three reports, no figure."""
    from bench.pytorch import spread_words

    job = Job("synthetic", proc=None, started=0.0, log=Path("/nonexistent"))
    for k, rate in enumerate([40.0] + [15.0, 17.0] * 5):
        job.reports.append(Report(iterations_per_s=rate, iterations=k, kernels=0, elapsed_s=0.5 * k))
        job.arrivals.append(0.5 * k)
    assert job.rate_spread(0.5, 5.0) == pytest.approx(1 / 16)
    assert job.rate_spread(0.5, 1.0) is None
    assert "spread 6.2%" in spread_words(job.rate_spread(0.5, 5.0)) and "too few" in spread_words(None)


def test_a_window_that_ends_with_the_run_counts_its_last_iterations():
    """The last periodic report of a 7.2 s run came at 7.0 s; the summary has the totals at
    its end. A window up to the end is measured at the true rate (it lost 4 % before)."""
    job = job_with([(k * 0.25, k * 25) for k in range(29)])  # 100 it/s, reports to 7.0 s
    job.reports.append(Report(iterations_per_s=100.0, iterations=720, kernels=0, elapsed_s=7.2, summary=True))
    job.arrivals.append(7.2)
    assert job.rate(2.4, 7.2) == pytest.approx(100.0)
    assert job.rate_between(2.4, 7.2) == pytest.approx(100.0)


def test_settle_finds_when_a_rate_comes_back_and_stays():
    # 50 it/s for the first 3 s, then 100 it/s: settled once the rolling window is all at 100
    pts, its = [], 0
    for k in range(41):
        t = k * 0.25
        pts.append((t, its))
        its += (50 if t < 3 else 100) * 0.25
    job = job_with(pts)
    s = settle(job, 0.0, 10.0, lambda r: r >= 97)
    assert s == pytest.approx(4.0, abs=0.3)
    assert settle(job, 0.0, 10.0, lambda r: r >= 200) is None, "never good: never settled"


def test_the_lowest_rolling_rate_is_found_under_each_bound():
    """dynamics' brackets: 100 it/s (solo 100), 90 it/s from 5 s to 8 s under a deeper
    bound, 100 again after: the dip shows under the bound it came under, and a stretch too
    short for a whole window has no figure."""
    pts, its = [], 0
    for k in range(49):
        t = k * 0.25
        pts.append((t, its))
        its += (90 if 5 <= t < 8 else 100) * 0.25
    job = job_with(pts)
    lows = lowest_by_bound(job, 0.0, 12.0, [[0.0, 2], [5.0, 8], [8.0, 2], [11.5, 1]], 100.0)
    assert lows[0] == pytest.approx(1.0, abs=0.01) and lows[1] == pytest.approx(0.9, abs=0.01)
    assert lows[2] == pytest.approx(1.0, abs=0.01) and lows[3] is None


def test_the_host_s_cpu_time_is_shared_out_as_busy_and_stolen():
    """dynamics' host column: of 200 CPU seconds in a phase, 150 busy and 10 stolen; a
    stretch too short to tick says nothing; the machine's own counters move forward."""
    from bench.common import HostCpu
    before, after = HostCpu(1_000.0, 40.0, 5_000.0), HostCpu(1_150.0, 50.0, 5_200.0)
    assert before.share(after) == {"busy": 0.75, "stolen": 0.05}
    assert HostCpu.in_words(before.share(after)) == "0.75 / 0.05"
    assert HostCpu.in_words(before.share(before)) == "-"
    now = HostCpu.now()
    assert 0 <= now.stolen <= now.busy + now.stolen <= now.total


def test_results_are_written_before_plots_and_kept_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setattr(Outputs, "dir", property(lambda self: tmp_path / self.name))
    said = []

    def no_matplotlib():
        raise ImportError("no module", name="matplotlib")

    paths = Outputs("x").write({"a": 1}, "| table |", said.append, {"x.png": no_matplotlib})
    assert json.loads((tmp_path / "x" / "x.json").read_text()) == {"a": 1}
    assert (tmp_path / "x" / "x.md").read_text().strip() == "| table |"
    assert [p.name for p in paths] == ["x.json", "x.md"]
    assert any("matplotlib is not installed" in s for s in said)


def test_the_rig_benchmark_follows_the_controller_through_moving_loads_and_writes_its_tables(tmp_path, monkeypatch):
    """`tgs bench rig --quick`: the controller alone, no GPU, beside work that costs
    production up to 20 %; its JSON has every case and the Markdown the summary."""
    monkeypatch.setattr(Outputs, "dir", property(lambda self: tmp_path / self.name))
    from bench import rig
    said: list[str] = []
    result = rig.run(echo=said.append, quick=True, json_path=tmp_path / "rig.json")
    written = json.loads((tmp_path / "rig.json").read_text())
    assert {g: len(cs) for g, cs in written["cases"].items()} == {"falls": 18, "rises": 15, "waves": 12, "stalls": 9,
                                                                 "rhythms": 24, "irregular": 12, "noisy": 11,
                                                                 "steal": 9, rig.WITHOUT: 9}
    assert written["summary"] == result["summary"]
    for group, s in result["summary"].items():
        # the tolerance is 3 %: production keeps most of its solo progress whatever its load does,
        # and opportunistic work gets a good part of what the tolerance allows
        assert 0.93 <= s["production_mean"] <= 1.0, (group, s)
        assert s["opportunistic_mean"] >= 0.3, (group, s)
    md = (tmp_path / "rig" / "rig.md").read_text()
    assert "| waves" in md and "worst 10 s window" in md
    assert any("rig.json" in line for line in said)



def test_the_rig_s_production_expects_its_idle_spells_when_its_shim_would():
    """The rig models production's shim (`bench/rig.py`): a job in its rhythm has its
    spells expected once it has come back from as many as libtgs.so waits for."""
    defined = re.search(r"^#define TGS_GAPS_TO_EXPECT (\d+)", (REPO_ROOT / "libshim/src/tgs.h").read_text(), re.M)
    assert defined and int(defined.group(1)) == rig.GAPS_TO_EXPECT

def test_the_suite_interrupts_a_benchmark_past_its_time_and_reports_failures(tmp_path):
    from bench.suite import run_step

    log = tmp_path / "step.txt"
    hang = [sys.executable, "-c", "import time\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    print('cleaned up')"]
    outcome, took = run_step(hang, 1, {}, log)
    assert outcome.startswith("timed out after 1 s") and took < 20
    assert "cleaned up" in log.read_text(), "interrupted with SIGINT, so that it can clean up"
    outcome, _ = run_step([sys.executable, "-c", "import sys; print('first'); sys.exit('what went wrong')"], 30, {}, log)
    assert outcome == "failed (exit 1): what went wrong"


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_a_suite_that_is_ended_ends_the_benchmark_it_runs(tmp_path, sig):
    """`tgs bench suite` ended with SIGTERM (or Ctrl-C) while a benchmark runs: the
    benchmark, in a session of its own, is interrupted with SIGINT (so that it cleans up)
    before the suite goes; it went on alone. Killed outright (SIGKILL), the suite cannot
    do so itself: the benchmark is interrupted all the same. (The suite here is `run_step`
    in a process set up as `tgs` sets itself up for SIGTERM.)"""
    import signal

    import psutil

    from tgs_runtime.paths import REPO_ROOT

    pidfile, log = tmp_path / "pid", tmp_path / "step.txt"
    hang = [sys.executable, "-c", f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
            "try:\n    time.sleep(120)\nexcept KeyboardInterrupt:\n    print('cleaned up')"]
    suite = subprocess.Popen([sys.executable, "-c", "from tgs_runtime.cli import unwind_on_sigterm\nunwind_on_sigterm()\n"
                              "from bench.suite import run_step\n"
                              f"run_step({hang!r}, 600, {{}}, __import__('pathlib').Path({str(log)!r}))"], cwd=REPO_ROOT)
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    benchmark = psutil.Process(int(pidfile.read_text()))
    suite.send_signal(getattr(signal, sig))
    try:
        assert suite.wait(60) == (128 + signal.SIGTERM if sig == "SIGTERM" else -signal.SIGKILL)
        psutil.wait_procs([benchmark], timeout=10)
        assert not benchmark.is_running(), "the benchmark went on alone"
        assert "cleaned up" in log.read_text(), "interrupted with SIGINT, so that it can clean up"
    finally:
        suite.kill()
        if benchmark.is_running():
            benchmark.kill()


def test_the_suite_fits_its_budget_and_says_what_it_left_out(tmp_path, monkeypatch):
    import bench.common
    import bench.suite as suite

    monkeypatch.setattr(suite, "RESULTS", tmp_path)
    monkeypatch.setattr(bench.common, "RESULTS", tmp_path)  # its table too: not over the last real suite's
    monkeypatch.setenv("TGS_SUITE", "multi,pytorch")
    monkeypatch.setenv("TGS_SUITE_MINUTES", "0.5")
    monkeypatch.setattr(suite.sim, "real_gpu", lambda: False)
    result = suite.run(echo=lambda _line: None, json_path=tmp_path / "suite.json")
    steps = {s["name"]: s for s in result["steps"]}
    assert steps["multi"]["outcome"].startswith("not run: 30 s left, it needs 45 s")
    assert steps["pytorch"]["outcome"] == "not run: needs a real GPU"
    assert json.loads((tmp_path / "suite.json").read_text())["steps"] == result["steps"]
    monkeypatch.setenv("TGS_SUITE", "nonsense")
    with pytest.raises(ValueError, match="TGS_SUITE names nonsense"):
        suite.run(echo=lambda _line: None)


def test_the_controllers_to_compare_come_from_the_environment_and_a_typo_stops_the_run(monkeypatch):
    from click.testing import CliRunner

    from bench.common import controllers
    from tgs_runtime.commands.bench import bench_cmd

    monkeypatch.delenv("TGS_BENCH_CONTROLLERS", raising=False)
    assert controllers() == ["tgs-paper", "fast"]
    monkeypatch.setenv("TGS_BENCH_CONTROLLERS", "fast")
    assert controllers() == ["fast"]
    monkeypatch.setenv("TGS_BENCH_CONTROLLERS", "fats")
    for name in ("isolation", "dynamics"):  # before anything runs
        out = CliRunner().invoke(bench_cmd, [name])
        assert out.exit_code == 1 and "TGS_BENCH_CONTROLLERS='fats': expected" in out.output, out.output
        assert "solo" not in out.output
    # the pytorch benchmark's settings likewise, told before it looks for PyTorch
    monkeypatch.setenv("TGS_BENCH_PYTORCH_SETTINGS", "fast,slow-loadr")
    out = CliRunner().invoke(bench_cmd, ["pytorch"])
    assert out.exit_code == 1 and "TGS_BENCH_PYTORCH_SETTINGS='fast,slow-loadr': expected a comma list of " \
        "co-execution, mps, fast, bound-two, bound-eight, slow-loader" in out.output, out.output


def test_the_shims_log_level_is_checked_before_anything_runs_and_their_logs_are_kept(monkeypatch, tmp_path, libshim):
    """TGS_BENCH_SHIM_LOG sets the TGS containers' shims' level; a bad one is told at once.
    With TGS_BENCH_LOGS, each job's stderr is kept beside tgsd's log: a file, not a pipe,
    which a shim logging at debug level would fill (the job then blocks on its write)."""
    from click.testing import CliRunner

    from bench.lab import Lab
    from tgs_runtime.commands.bench import bench_cmd

    monkeypatch.setenv("TGS_BENCH_SHIM_LOG", "verbose")
    out = CliRunner().invoke(bench_cmd, ["multi", "--quick"])
    assert out.exit_code == 1 and "TGS_BENCH_SHIM_LOG='verbose': expected one of error, warn, info, debug" in out.output
    assert "JCT" not in out.output, out.output
    monkeypatch.setenv("TGS_BENCH_SHIM_LOG", "debug")
    monkeypatch.setenv("TGS_BENCH_LOGS", str(tmp_path))
    with Lab(tgsd={}) as lab:
        # a production container, attached and idle: tgsd bounds the opportunistic job's
        # kernels in flight throughout, and so it times them. Alone on the GPU it has no
        # bound, and whether it timed any raced tgsd's first budget (CI: none timed)
        lab.container("production")
        job = lab.run(Workload(kernel_us=200, kernels=10, seconds=1.5, report_s=0.5), "opp", lab.container("opportunistic"))
        assert job.finish(60) == 0, job.stderr
    kept = [p for p in tmp_path.iterdir() if p.name.endswith("-opp.stderr.txt")]
    assert len(kept) == 1 and " debug: its kernels run " in kept[0].read_text(), kept
    assert any(p.name.startswith("tgsd-") for p in tmp_path.iterdir())


def test_a_lab_that_cannot_start_leaves_nothing_behind(tmp_path, monkeypatch):
    """A benchmark whose simulated GPU cannot be made (here the C parts are not where
    TGS_LIBSHIM_BUILD says) fails saying so, and leaves no lab folder in /tmp (one per
    such run was left)."""
    import tempfile

    from bench.lab import Lab
    from tgs_runtime import sim
    from tgs_runtime.paths import MissingArtifact

    monkeypatch.setattr(sim, "real_gpu", lambda: False)  # (on a GPU machine too: the simulated one)
    monkeypatch.setenv("TGS_LIBSHIM_BUILD", str(tmp_path / "nothing-built"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(MissingArtifact, match="tgs-workload is missing"):
        Lab(tgsd={})
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("tgs-lab-")]


def test_the_dynamics_plot_draws_one_controller_as_well_as_two():
    from bench.dynamics import plot

    one = {"phases": [{"phase": "25 % duty", "start_s": 0.0, "production_s": 1.0, "opportunistic_s": 1.0}],
           "series": {"production": [[(0.5, 1.0), (1.0, 0.99)]], "opportunistic": [(0.5, 0.7), (1.0, 0.75)]}}
    with_twin = {**one, "series": {**one["series"], "twin": [[(0.5, 0.98), (1.0, 0.99)]]}}
    for runs in ({"fast": one}, {"fast": one, "tgs-paper": with_twin}):
        assert len(plot(runs, 10.0).axes) == len(runs)


def test_the_twin_runs_the_same_production_jobs_as_the_containers_and_hands_over_alike():
    """dynamics' control: in each phase the twin (plain processes on a second simulated GPU)
    starts the workloads the containers start, and the pair's second job runs on into the
    next phase on both sides, where it is the job judged."""
    from bench.dynamics import SCHEDULE, Jobs, start_phase

    class FakeLab:
        def __init__(self):
            self.started = []

        def run(self, w, label, container=None):
            self.started.append((w.argv(Path("wl")), label, container))
            return label

    main, twin = FakeLab(), FakeLab()
    second = twin_second = None
    judged = []
    for ph in SCHEDULE:
        job, second = start_phase(main, ph, 20.0, f"fast-{ph.name}", second, ({"c": "prod"}, {"c": "second"}))
        twin_job, twin_second = start_phase(twin, ph, 20.0, f"twin-{ph.name}", twin_second)
        judged.append((job, twin_job))
    assert [a for a, _, _ in main.started] == [a for a, _, _ in twin.started]
    assert all(c is None for _, _, c in twin.started) and main.started[0][2] == {"c": "prod"}
    none = [i for i, ph in enumerate(SCHEDULE) if ph.jobs is Jobs.NONE][0]
    assert judged[none] == ("fast-two at 25 %-second", "twin-two at 25 %-second")
    assert judged[[ph.duty for ph in SCHEDULE].index(None)] == (None, None), "the idle phase starts nothing"


def test_a_twin_gpu_runs_its_job_alone_beside_a_lab_s(libshim):
    """The benchmarks' control: a job on the twin GPU and one on a lab's run at the same
    time, each on a simulated GPU of its own (each engine's accounting has its own job and
    nothing of the other's); isolation adds production's twin to a setting's jobs."""
    from bench.isolation import twinned
    from bench.lab import twin_gpu

    with Lab() as lab, twin_gpu() as twin:
        assert twin is not None and twin.settings.state != lab.settings.state
        jobs = twinned({"prod": lab.run(production(0.5, 2, report_s=0.25), "main")}, twin, 0.5, 2, "x")
        assert set(jobs) == {"prod", "twin"}
        assert jobs["twin"].proc.args == jobs["prod"].proc.args, "the same job"
        assert all(j.wait() == 0 for j in jobs.values())
        main, alone = sim.contexts(lab.snapshot()), sim.contexts(twin.snapshot())
    assert main["main"]["busy_ns"] > 0.5e9 and "twin-x" not in main, main.keys()
    assert alone["twin-x"]["busy_ns"] > 0.5e9 and "main" not in alone, alone.keys()
    assert twinned({"prod": None}, None, 0.5, 2, "x") == {"prod": None}, "no twin: the jobs alone"


def test_the_twin_s_cell_gives_its_settling_and_its_lowest():
    from bench.dynamics import twin_in_words

    assert twin_in_words({"settled_s": 1.5, "lowest": 0.9912}) == "1.5 s (0.991)"
    assert twin_in_words({"settled_s": None, "lowest": 0.95}) == "never (0.950)"
    assert twin_in_words(None) == "-"


def test_the_handover_judges_production_against_the_pair_then_against_one_job_alone():
    """dynamics' last two phases: two production jobs at 25 % duty leave half the GPU idle
    and are each held to one job's throughput beside the other; once one ends, the other is
    held to its throughput alone, with three quarters idle. The second job's reports are
    judged by the phase they fall in."""
    from bench.dynamics import SCHEDULE, Jobs, phase_at

    pair, after = SCHEDULE[-2], SCHEDULE[-1]
    assert (pair.jobs, after.jobs) == (Jobs.PAIR, Jobs.NONE) and pair.duty == after.duty == 0.25
    assert (pair.solo, pair.idle) == ("pair 0.25", 0.5)
    assert (after.solo, after.idle) == ("0.25", 0.75)
    spans = [(100.0, 110.0, pair), (110.0, 120.0, after)]
    assert [phase_at(spans, t) for t in (105.0, 110.0, 125.0)] == [pair, after, after]


def test_the_mps_baseline_gives_the_opportunistic_job_the_idle_share_of_the_sms_at_low_priority():
    from bench import mps

    assert mps.opportunistic_percent(0.39) == 61
    assert mps.opportunistic_percent(0.0) == 100
    assert mps.opportunistic_percent(0.97) == mps.MIN_PERCENT  # never starved to nothing
    opp = mps.Client(mps.opportunistic_percent(0.39), below_normal=True).env()
    assert opp == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "61", "CUDA_MPS_CLIENT_PRIORITY": "1"}
    assert mps.Client().env()["CUDA_MPS_CLIENT_PRIORITY"] == "0"
    with pytest.raises(ValueError, match="1-100"):
        mps.Client(0).env()


def test_the_mps_baseline_says_why_it_cannot_run(tmp_path, monkeypatch):
    from bench import mps

    assert "simgpu" in mps.unavailable(real=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "nvidia-cuda-mps-control is not installed" in mps.unavailable(real=True)
    # a client of the private daemon finds it by its own pipe directory, never the host's default
    m = mps.Mps(tmp_path)
    env = m.client(mps.Client(50, below_normal=True))
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "mps-pipe")
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"


def test_a_job_that_hangs_is_killed_and_says_how_far_it_got():
    from bench.lab import Lab

    with Lab(memory="1G") as lab:
        job = lab.run(["sleep", "60"], "hangs")
        assert job.finish(0.5) is None
        assert job.proc.poll() is not None, "the hung job was left running"
        assert "killed (it never reported)" in job.errors[-1]
        assert lab.run(["true"], "ends").finish(30) == 0


def test_the_pytorch_table_has_the_mps_row_when_it_ran_and_says_why_when_not():
    from bench.pytorch import report

    res = {"excl_prod": 15.0, "excl_opp": 25.0, "co-execution": {"prod": 12.0, "opp": 20.0},
           "fast": {"prod": 14.7, "opp": 10.0}, "mps_percent": 61, "mps_not_run": None,
           "mps": {"prod": 13.5, "opp": 12.5}}
    result, md = report(res, duty=0.4, gap_ms=40, quick=True)
    assert result["summary"]["mps"] == {"production_ratio": 0.9, "opportunistic_ratio": 0.5, "idle_share": 0.833}
    assert "| MPS, opportunistic on 61 % of the SMs | 0.900" in md and "CUDA_MPS_CLIENT_PRIORITY=1" in md
    del res["mps"]
    res["mps_not_run"] = "nvidia-cuda-mps-control is not installed"
    result, md = report(res, duty=0.4, gap_ms=40, quick=True)
    assert list(result["summary"]) == ["co-execution", "fast"]
    assert "MPS baseline not run: nvidia-cuda-mps-control is not installed." in md and "tgsd in" not in md
    def gpu(t):
        return {"controller": {"state": "run", "opportunistic_beside_production": 0.01, "rate_blocks_per_s": None,
                               "inflight_max": 2},
                "containers": [{"id": "p", "class": "production", "busy_s": 0.5 * t, "iteration_starts": int(29.4 * t)}]}

    res["fast_windows"] = [res["fast"]]
    res["fast_tgsd"] = [ControllerTrace([(t, gpu(t)) for t in (1.0, 6.0)]).summary()]
    result, md = report(res, duty=0.4, gap_ms=40, quick=True)
    assert "tgsd in TGS fast's window 1 (`tgs status`, every 0.5 s): the opportunistic shims watched production " \
           "in 2 of 2 status samples (the controller's figure beside it: 0.01 s/s, median)" in md
    assert "That is 2.00 iteration starts per ResNet-50 step." in md  # 29.4 starts/s at 14.7 it/s
    assert result["raw"]["fast_tgsd"][0]["watched"] == 2
    assert "idle_share_windows" not in result["summary"]["fast"]  # one window: nothing beside the figure
    # the A/B row, side by side, over two windows: its figures are their mean, each window's share beside it
    res["fast, bound kept at two_windows"] = [{"prod": 14.7, "opp": 9.0}, {"prod": 14.7, "opp": 6.0}]
    res["fast, bound kept at two"] = {"prod": 14.7, "opp": 7.5}
    result, md = report(res, duty=0.4, gap_ms=40, quick=False)
    assert list(result["summary"]) == ["co-execution", "fast", "fast, bound kept at two"]
    assert result["summary"]["fast, bound kept at two"]["idle_share_windows"] == [0.6, 0.4]
    assert "| fast, bound kept at two | 0.980                  | 0.300                     | 0.500" \
           "              | 0.600 / 0.400" in md
    # production on its host 2 s a step: against itself alone so, its idle time that job's
    res.update({"excl_prod_nogap": 35.0, "excl_prod_host_2000": 0.49,
                "fast, production 2 s on its host a step": {"prod": 0.48, "opp": 20.0}})
    result, md = report(res, duty=0.4, gap_ms=40, quick=False)
    assert result["summary"]["fast, production 2 s on its host a step"] == {
        "production_ratio": 0.98, "opportunistic_ratio": 0.8, "idle_share": 0.811}  # duty 0.014
    assert "ResNet-50 on its host 2 s a step: 0.490 it/s (duty 0.014)" in md
    res["excl_prod_spread"] = 0.021
    assert "the ResNet-50 alone, its half-second rates spread 2.1%" in report(res, duty=0.4, gap_ms=40, quick=False)[1]


def test_oversubscription_s_multiple_of_co_execution_comes_from_the_rates_not_the_rounded_ratios():
    """Co-execution's opportunistic job runs at about 0.003 of exclusive: the table's
    ratios, rounded to three places, are too coarse to divide (the suite at 2fec9b0 read
    5.7x from 0.017 / 0.003 where the rates, 7.83 and 1.59 it/s, make 4.9x)."""
    from bench.oversubscription import summarise

    def ran(prod: float, opp: float) -> dict:
        return {k: {"rate": rate, "rc": 0, "checksum_ok": True} for k, rate in (("prod", prod), ("opp", opp))}

    res = {"exclusive": ran(157.9, 463.9), "co-execution": ran(26.1, 1.59), "TGS": ran(153.4, 7.83)}
    res["TGS"]["opp"]["bus_share"] = 0.9126
    res["TGS"]["twin"] = {"rate": 150.1, "rc": 0, "checksum_ok": True}
    res["TGS"]["host_cpu"] = {"busy": 0.071, "stolen": 0.078}
    rows, summary = summarise(res)
    assert [r[6] for r in rows] == ["-", "0.91"] and summary["TGS"]["opportunistic_bus_share"] == 0.9126
    # production's twin alone against the same exclusive run: the machine's share of a fall
    assert [r[7:] for r in rows] == [["-", "-"], ["0.951", "0.07 / 0.08"]] and summary["TGS"]["twin_ratio"] == 0.951
    assert summary["TGS"]["opportunistic_vs_co_execution"] == 4.9
    assert [r[2] for r in rows] == ["0.003", "0.017"]
    assert summary["co-execution"]["failed"] == [] and rows[0][3] == "none"


def test_oversubscription_takes_both_jobs_rates_while_both_ran():
    """Production writes its memory before it iterates and the opportunistic job, started
    first, ends first: on each job's own clock the window took in production alone at full
    speed (co-execution read 11.2 it/s for a production job making 1.6 beside the other).
    The rates come from the time both iterated, less its settling part."""
    from bench.oversubscription import rate_over, together

    # opportunistic: 400 it/s alone until 3 s, 1.6 it/s while production iterates (4-16 s), ends at 16 s
    opp = job_with([(0.5 * k, 200 * k) for k in range(1, 7)]
                   + [(3.0 + 0.5 * k, 1200 + round(0.8 * k)) for k in range(1, 27)])
    # production: iterates from 4 s (its set-up before), 1.6 it/s beside the other, 150 it/s alone after 16 s
    prod = job_with([(4.0 + 0.5 * k, round(0.8 * k)) for k in range(1, 25)]
                    + [(16.0 + 0.5 * k, 19 + 75 * k) for k in range(1, 5)])
    span = together([prod, opp], 0.3)
    assert span == pytest.approx((4.5 + 0.3 * 11.5, 16.0))
    assert prod.rate_between(*span) == pytest.approx(1.6, abs=0.1)
    assert opp.rate_between(*span) == pytest.approx(1.6, abs=0.1)
    assert together([prod, job_with([(20.0, 5), (21.0, 10)])], 0.3) is None, "they never iterated together"
    # production's twin alone, its run over before the window's end: no rate, not one of part of it
    assert rate_over(job_with([(2.0 + 0.5 * k, 75 * k) for k in range(1, 20)]), span) is None
    assert rate_over(job_with([(2.0 + 0.5 * k, 75 * k) for k in range(1, 40)]), span) == pytest.approx(150)
    assert rate_over(prod, None) is None


def test_oversubscription_without_time_together_shows_no_rate_not_zero():
    """On an H200 the opportunistic job's iterations were over before production's set-up
    was: the table read 0.000 for both, failed none, as if TGS had stopped both jobs."""
    from bench.oversubscription import summarise

    ok = {"rc": 0, "checksum_ok": True}
    res = {"exclusive": {"prod": {**ok, "rate": 163.5}, "opp": {**ok, "rate": 495.9}},
           "TGS": {"prod": {**ok, "rate": None}, "opp": {**ok, "rate": None}}}
    rows, summary = summarise(res)
    assert rows[0][1:4] == ["-", "-", "none"]
    assert summary["TGS"]["production_ratio"] is None and "opportunistic_vs_co_execution" not in summary["TGS"]


def test_a_controller_trace_sums_up_only_its_window():
    def gpu(beside, rate, inflight, busy, gated, overlap, blocks=0):
        return {"controller": {"state": "run", "opportunistic_beside_production": beside, "rate_blocks_per_s": rate,
                               "inflight_max": inflight},
                "containers": [{"id": "p", "class": "production", "busy_s": busy, "iteration_starts": int(busy * 100),
                                "paused_s": 0.2 * busy, "gated_s": 0, "beside_production_s": 0, "attained_blocks": 10**9, "throttled_s": 0,
                                "rhythm_s": {5.5: 1.2, 50: 9.9}.get(busy)},
                               {"id": "o", "class": "opportunistic", "busy_s": 0, "gated_s": gated,
                                "beside_production_s": overlap, "attained_blocks": blocks,
                                "inflight_wait_s": 0.5 * gated, "anticipation_wait_s": 0.1 * blocks / 1000,
                                "token_wait_s": 0}]}

    trace = ControllerTrace([(0.0, gpu(0.9, 10, 1, 0, 0, 0)), (1.0, gpu(None, None, None, 5, 4, 1, 1000)),
                             (2.0, gpu(0.02, 500, 2, 5.5, 4.45, 1.01, 1500)),
                             (3.0, gpu(0.04, 700, 2, 6, 4.9, 1.02, 3500)),
                             (9.0, gpu(0.9, 10, 1, 50, 50, 50))], span=(0.5, 3.5))
    s = trace.summary()
    assert s == {"samples": 3, "watched": 2, "beside_production_per_s_median": 0.03, "production_busy_per_s": 0.5,
                 "production_iteration_starts_per_s": 50.0, "production_paused_per_s": 0.1,
                 "opportunistic_gated_per_s": 0.45,
                 "opportunistic_beside_per_s": 0.01, "opportunistic_inflight_per_s": 0.225,
                 "opportunistic_anticipation_per_s": 0.125, "opportunistic_token_per_s": 0.0, "unlimited": 1,
                 "rate_blocks_per_s_median": 600,
                 "states": {"run": 3}, "inflight_max": {"None": 1, "2": 2},
                 "opportunistic_by_bound": {
                     "None": {"blocks_per_s": 500, "gated_per_s": 0.45, "inflight_per_s": 0.225,
                              "anticipation_per_s": 0.05, "token_per_s": 0.0},
                     "2": {"blocks_per_s": 2000, "gated_per_s": 0.45, "inflight_per_s": 0.225,
                           "anticipation_per_s": 0.2, "token_per_s": 0.0}},
                 "production_rhythm_s_max": 1.2}
    words = ControllerTrace.describe(s)
    assert "production's shims counted it busy 0.5 s/s in 50 iterations/s and paused on its own 0.1 s/s, the " \
           "opportunistic ones waited behind it 0.45 s/s" in words
    assert ("and waited 0.225 s/s at the in-flight bound, 0.125 s/s anticipating production, "
            "0 s/s for tokens") in words
    assert words.endswith("; under each in-flight bound, opportunistic None: 500 blocks/s, waited 0.45 s/s behind "
                          "production, 0.225 s/s at the in-flight bound, 0.05 s/s anticipating production, "
                          "0 s/s for tokens; 2: 2,000 blocks/s, waited 0.45 s/s behind production, 0.225 s/s at "
                          "the in-flight bound, 0.2 s/s anticipating production, 0 s/s for tokens"), words
    assert "watched production in 2 of 3 status samples" in words and "0.03 s/s" in words
    assert ControllerTrace.describe(ControllerTrace().summary()) == "no status samples"
    one = ControllerTrace(trace.samples[:1]).summary()
    assert one["production_busy_per_s"] is None and "counted" not in ControllerTrace.describe(one)


def test_a_controller_trace_says_what_tgsd_did_in_a_phase():
    """dynamics' column: the in-flight bound at the phase's start and each change, the
    profiles begun, the samples under a rate limit; only the phase's own samples."""
    def at(t, state, bound, rate=None, why=None, age=0.2):
        decision = {"age_s": age, "why": why} if why else None
        return (t, {"controller": {"state": state, "inflight_max": bound, "rate_blocks_per_s": rate,
                                   "decision": decision}, "containers": []})

    trace = ControllerTrace([at(9.5, "run", 8), at(10.0, "profile", 2, why="new job"),
                             at(10.5, "profile", 2, why="new job", age=0.7), at(11.0, "run", 2),
                             at(17.0, "run", 4, why="tried 4", age=0.5), at(19.5, "run", 4, 900),
                             at(20.0, "run", 4, 800), at(22.0, "profile", 2), at(24.0, "run", 1)])
    m = trace.moves(10.0, 23.0)
    assert m == {"samples": 7, "inflight_max": [[0.0, 2], [7.0, 4], [12.0, 2]], "profiles_s": [0.0, 12.0],
                 "rate_limited": 2, "decisions": [[-0.2, "new job"], [6.5, "tried 4"]]}
    assert ControllerTrace.moves_in_words(m) == ("bound 2, 4 at 7.0 s, 2 at 12.0 s; profiled at 0.0 s, 12.0 s; "
                                                 "rate limited in 2 of 7 samples")
    assert ControllerTrace.moves_in_words(m, [0.991, 0.962, None]).startswith("bound 2 (0.991), 4 at 7.0 s (0.962), "
                                                                          "2 at 12.0 s; profiled")
    paper = ControllerTrace([at(1.0, "slow-start", 0, 100), at(2.0, "profile", 0)]).moves(0.0, 3.0)
    assert ControllerTrace.moves_in_words(paper) == "no bound; profiled at 2.0 s; rate limited in 1 of 2 samples"
    assert ControllerTrace.moves_in_words(trace.moves(30.0, 40.0)) == "no status samples"
    # a fall taken as the host's slowness (its CPU time stolen) changes no bound or rate: the
    # cell says when
    slow = ControllerTrace([at(1.0, "run", 2), at(3.0, "run", 2, why=f"production at 0.961 ...: {MACHINE_WHY}; "
                                                                   "nothing changed", age=0.4)]).moves(0.0, 4.0)
    assert ControllerTrace.moves_in_words(slow) == "bound 2; the machine's at 2.6 s"


def trace_misses(s: dict) -> list[str]:
    """What a trace's summary of 1 ms opportunistic kernels beside production at 50 % duty
    (`test_a_lab_traces_what_its_tgsd_saw_while_jobs_ran`) gets wrong, by check."""
    waited = sum(s[f"opportunistic_{cause}_per_s"] for cause in proto.WAIT_CAUSES)
    checks = {
        "samples": 6 <= s["samples"] <= 9,
        "run": s["states"].get("run", 0) >= s["samples"] // 2,
        "watched, little beside": s["watched"] >= s["samples"] // 2 and s["beside_production_per_s_median"] < 0.1,
        "production busy": 0.35 <= s["production_busy_per_s"] <= 0.7,
        "its 20 ms iterations (50/s)": 40 <= s["production_iteration_starts_per_s"] <= 55,
        "waited behind it": s["opportunistic_gated_per_s"] >= 0.8 * s["production_busy_per_s"],
        "beside it": s["opportunistic_beside_per_s"] < 0.1,
        # its launching thread's time is accounted for: behind production, or at the in-flight
        # bound (two of its 1 ms kernels), a little anticipating production's next launch
        "waits": s["opportunistic_inflight_per_s"] >= 0.1 and 0.7 <= waited <= 1.1,
        "by bound": "2" in s["opportunistic_by_bound"] and abs(
            s["opportunistic_by_bound"]["2"]["inflight_per_s"] - s["opportunistic_inflight_per_s"]) <= 0.1}
    return [name for name, ok in checks.items() if not ok]


def test_a_lab_traces_what_its_tgsd_saw_while_jobs_ran(libshim):
    """Through simgpu: 1 ms opportunistic kernels beside production at 50 % duty wait behind
    it, and the trace of tgsd's status says so. (The figure covers 3 s, and both jobs'
    start, before the first profile gates the opportunistic one, counts in it: the window
    measured begins after that.) A slow spell of the host's (simgpu's engine starved: work
    queued before a wait still runs through it) reads as work beside production in every
    sample whose 3 s it falls in: a CI run read 0.63 s/s in six of the window's eight, and
    tgsd, seeing production slowed, had set the bound to one. So two windows 2 s long are
    traced, 5 s apart (their samples' 3 s apart too), and one must read all of it; the
    bound stays at two (no deeper trial in either)."""
    with Lab(tgsd={"control": {"inflight_deepest": 2}}) as lab:
        prod_c, opp_c = lab.container("production"), lab.container("opportunistic")
        jobs = [lab.run(production(0.5, 14), "prod", prod_c), lab.run(opportunistic(14), "opp", opp_c)]
        with lab.trace(period=0.25) as trace:
            t0 = time.monotonic()
            time.sleep(12.5)
        for j in jobs:
            j.kill()
    windows = [ControllerTrace(trace.samples, (t0 + start, t0 + start + 2)).summary() for start in (5, 10)]
    misses = [trace_misses(s) for s in windows]
    assert not all(misses), list(zip(misses, windows))


def test_each_benchmark_plots_the_figures_of_its_table():
    """Every benchmark writes a plot beside its JSON and table (isolation and dynamics have
    tests of their own): drawn from the result the benchmark writes, each bar is a figure of
    its table, and each target is where the table says."""
    from bench import launch, multi, oversubscription, pytorch, start

    def heights(ax):
        return [round(p.get_height(), 3) for p in ax.patches]

    def widths(ax):
        return [round(p.get_width(), 3) for p in ax.patches]

    def lines(ax, axis):  # the target lines: (x of a vertical one, y of a horizontal one)
        return [round(line.get_xdata()[0] if axis == "x" else line.get_ydata()[0], 3) for line in ax.lines
                if len(set(line.get_xdata() if axis == "x" else line.get_ydata())) == 1
                and len(line.get_xdata()) == 2]

    def ran(prod: float, opp: float, pages: int) -> dict:
        return {k: {"rate": rate, "rc": 0, "checksum_ok": True, "pages_in": pages, "pages_out": pages}
                for k, rate in (("prod", prod), ("opp", opp))}

    res = {"exclusive": ran(158.0, 456.0, 0), "co-execution": ran(3.0, 5.7, 15000), "TGS": ran(153.0, 7.5, 176)}
    res["TGS"]["prod"].update(pages_in=0, pages_out=0)  # production's memory kept whole
    _, summary = oversubscription.summarise(res)
    fig = oversubscription.plot({"summary": summary, "simulated": True})
    assert heights(fig.axes[0]) == [0.019, 0.968, 0.013, 0.016]  # production's bars, then the opportunistic job's
    assert lines(fig.axes[0], "y") == [0.95, 0.13]  # production's target; 10x co-execution's opportunistic
    assert heights(fig.axes[1]) == [30000, 0.5, 30000, 352]  # pages both ways; none drawn at the axis
    assert len(oversubscription.plot({"summary": {"TGS": summary["TGS"]}, "simulated": False}).axes) == 1

    jobs = [{"name": "long", "iterations": 600, "arrival_s": 0.0}, {"name": "short", "iterations": 100, "arrival_s": 6.0}]
    shares = {share: {"jct_s": {"long": long_s, "short": short_s}, "mean_jct_s": (long_s + short_s) / 2,
                      "production_ratio": 0.998} for share, long_s, short_s in (("fair", 22.9, 7.8), ("las", 22.2, 2.6))}
    fig = multi.plot({"jobs": jobs, "results": shares})
    assert [widths(ax) for ax in fig.axes] == [[22.9, 7.8], [22.2, 2.6]]
    assert [[round(p.get_x(), 3) for p in ax.patches] for ax in fig.axes] == [[0.0, 6.0]] * 2  # from each arrival

    modes = {m: {"ns_per_launch_median": ns, "ns_samples": [ns - 1, ns, ns + 2], "added_instructions": ir}
             for m, ns, ir in (("without the shim", 58.8, 0), ("production", 75.3, 229), ("bounded", 106.9, 561))}
    fig = launch.plot({"modes": modes, "target_added_ns": 100})
    assert widths(fig.axes[0]) == [58.8, 75.3, 106.9] and lines(fig.axes[0], "x") == [158.8]
    assert widths(fig.axes[1]) == [0, 229, 561]
    uncounted = {m: {**v, "added_instructions": None} for m, v in modes.items()}  # a real GPU: no callgrind
    assert len(launch.plot({"modes": uncounted, "target_added_ns": 100}).axes) == 1

    cases = {c: {"median_ms": ms, "samples_ms": [ms - 3, ms, ms + 5]}
             for c, ms in (("runc", 176.8), ("tgs, opportunistic container", 194.3))}
    fig = start.plot({"cases": cases, "target_ratio": 1.15})
    assert widths(fig.axes[0]) == [176.8, 194.3] and lines(fig.axes[0], "x") == [203.32]

    res = {"excl_prod": 15.0, "excl_opp": 25.0, "co-execution": {"prod": 12.0, "opp": 20.0},
           "fast": {"prod": 14.7, "opp": 7.5}, "fast_windows": [{"prod": 14.7, "opp": 9.0}, {"prod": 14.7, "opp": 6.0}],
           "mps_percent": 61, "mps_not_run": "not in TGS_BENCH_PYTORCH_SETTINGS"}
    result, _ = pytorch.report(res, duty=0.4, gap_ms=40, quick=False)
    fig = pytorch.plot(result)
    assert heights(fig.axes[0]) == [0.8, 0.98] and heights(fig.axes[1]) == [1.333, 0.5]
    assert [round(y, 3) for y in fig.axes[1].lines[0].get_ydata()] == []  # co-execution: one window, no dots
    assert [round(y, 3) for y in fig.axes[1].lines[1].get_ydata()] == [0.6, 0.4]  # fast: each window a dot
