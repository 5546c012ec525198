"""`tgs bench suite`: every benchmark, one after the other, unattended, within a time budget
(10 minutes unless TGS_SUITE_MINUTES says otherwise): the one command to run on a lent GPU.

Each benchmark runs as its own `tgs bench NAME` process, so that one that hangs or fails
costs only its own time: past its share of the budget it is interrupted (SIGINT, so that
its tgsd, jobs and dockerd are cleaned up), then killed. A benchmark runs full length when
the time left allows it and the quick runs of those after it, else quick, else not at all;
the table says which, how long each took and how it ended. tgsd logs are kept under
bench/results/suite/logs, or in TGS_BENCH_LOGS where it is set; on a real GPU the
benchmarks' tgsd caps unified memory at TGS_BENCH_BUDGET (default 24G), far below the
card. TGS_SUITE=a,b picks benchmarks (in this order)."""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import RESULTS, Echo, Outputs, machine, table
from tgs_runtime import sim
from tgs_runtime.childd import ends_with_us
from tgs_runtime.paths import REPO_ROOT


@dataclass(frozen=True)
class Step:
    name: str
    full_s: float   # how long it takes, measured on simgpu (the benchmarks are timed, not sized)
    quick_s: float
    why_not: str | None = None  # set when it cannot run here


# In the order they run; the seconds were measured by this suite on simgpu (2 cores, 2026-11-22)
# except pytorch's (full: 317 s on an H200 on 2026-11-27 with eight windows, about 40 s each,
# and three more since, each TGS setting's second window; quick: a guess), the 120 s (50 s quick)
# of isolation's four rows of other kernels added on 2026-11-23 (their runs' lengths) and 36 s
# for its fifth (2026-11-24, 24 s runs in either mode; quick: 176 s in the suite with a run of
# 7.2 s, 17 s added), and dynamics' with its handover phases (2026-11-23: 266 s, 147 s
# quick, run alone).
PLAN = (Step("isolation", 446, 195), Step("pytorch", 440, 200), Step("oversubscription", 115, 70),
        Step("dynamics", 270, 150), Step("multi", 150, 45), Step("overhead", 90, 15))
GRACE_S = 30  # what an interrupted benchmark gets to clean up


def _steps(real: bool) -> list[Step]:
    wanted = [n.strip() for n in os.environ.get("TGS_SUITE", "").split(",") if n.strip()]
    known = {s.name: s for s in PLAN}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ValueError(f"TGS_SUITE names {', '.join(unknown)}: expected some of {', '.join(known)}")
    steps = [known[n] for n in wanted] if wanted else list(PLAN)
    out = []
    for s in steps:
        if s.name == "pytorch" and not real:
            s = Step(s.name, s.full_s, s.quick_s, "needs a real GPU")
        elif s.name == "pytorch" and importlib.util.find_spec("torch") is None:
            s = Step(s.name, s.full_s, s.quick_s, "PyTorch is not installed")
        out.append(s)
    return out


def bench_argv(name: str, quick: bool) -> list[str]:
    return [sys.executable, "-m", "tgs_runtime", "bench", name] + (["--quick"] if quick else [])


def _interruptible():
    """A `preexec_fn` for the benchmark's process: SIGINT interrupts it, even when the
    suite was started in the background by a shell (which ignores SIGINT there, and an
    ignored SIGINT stays ignored across exec: Python then installs no KeyboardInterrupt),
    and it is interrupted so when the suite ends in a way that gives the suite no chance
    to (SIGKILL)."""
    with_us = ends_with_us(signal.SIGINT)

    def preexec() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        with_us()
    return preexec


def _interrupt(p: subprocess.Popen) -> None:
    """Interrupts a benchmark's process group (SIGINT, so that its tgsd, jobs and dockerd
    are cleaned up); killed after GRACE_S."""
    os.killpg(p.pid, signal.SIGINT)
    try:
        p.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def run_step(argv: list[str], limit_s: float, env: dict[str, str], log: Path) -> tuple[str, float]:
    """Runs one benchmark's process, its output into `log`; returns how it ended and how
    long it took. Where the suite itself is interrupted meanwhile (Ctrl-C, SIGTERM), so is
    the benchmark, before the suite goes: in a session of its own, it went on alone."""
    env = {**env, "PYTHONUNBUFFERED": "1"}  # its last line is then the last it said
    t0 = time.monotonic()
    with open(log, "w") as out:
        p = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True, preexec_fn=_interruptible())
        try:
            rc = p.wait(timeout=max(limit_s, 1))
        except subprocess.TimeoutExpired:
            _interrupt(p)
            return f"timed out after {limit_s:.0f} s (interrupted; see {log.name})", time.monotonic() - t0
        except BaseException:
            _interrupt(p)
            raise
    took = time.monotonic() - t0
    if rc == 0:
        return "ok", took
    lines = [l for l in log.read_text(errors="replace").splitlines() if l.strip()]
    return f"failed (exit {rc}): {(lines or ['no output'])[-1][:200]}", took


def run(echo: Echo = print, quick: bool = False, json_path: Path | None = None) -> dict:
    budget_s = float(os.environ.get("TGS_SUITE_MINUTES", "10")) * 60
    real = sim.real_gpu()
    gpu = "real GPU" if real else "simgpu (simulated)"
    steps = _steps(real)
    here = RESULTS / "suite"
    logs = here / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    kept = os.environ.get("TGS_BENCH_LOGS")  # where tgsd's logs go, if not with each benchmark's output in logs
    env = {**os.environ, "TGS_BENCH_LOGS": kept or str(logs)}
    echo(f"suite on {gpu}: {', '.join(s.name for s in steps)} within {budget_s / 60:g} minutes")
    start = time.monotonic()
    rows, results = [], []
    for i, s in enumerate(steps):
        left = budget_s - (time.monotonic() - start)
        later = sum(x.quick_s for x in steps[i + 1:] if not x.why_not)
        if s.why_not:
            mode, outcome, took = "-", f"not run: {s.why_not}", 0.0
        else:
            if not quick and s.full_s + later <= left:
                mode = "full"
            elif s.quick_s <= left:
                mode = "quick"
            else:
                mode = None
            if mode is None:
                outcome, took, mode = f"not run: {left:.0f} s left, it needs {s.quick_s:.0f} s", 0.0, "-"
            else:
                echo(f"  {s.name} ({mode}), {left:.0f} s left")
                limit = min(left, (s.full_s if mode == "full" else s.quick_s) * 2)
                outcome, took = run_step(bench_argv(s.name, mode == "quick"), limit, env, logs / f"{s.name}.txt")
        echo(f"  {s.name}: {outcome}" + (f" in {took:.0f} s" if took else ""))
        where = f"bench/results/{s.name}/" if outcome == "ok" else (f"logs/{s.name}.txt" if took else "-")
        rows.append([s.name, mode, f"{took:.0f}", outcome, where])
        results.append({"name": s.name, "mode": mode, "seconds": round(took, 1), "outcome": outcome})
    total = time.monotonic() - start
    result = {"benchmark": "suite", "simulated": not real, "machine": machine(gpu), "budget_s": budget_s,
              "seconds": round(total, 1), "steps": results}
    md = (f"### suite: every benchmark within {budget_s / 60:g} minutes ({gpu}, {result['machine']['date']}, "
          f"commit {result['machine']['commit']})\n\n"
          + table(["benchmark", "mode", "seconds", "outcome", "results"], rows)
          + f"\n\nAll of it took {total:.0f} s. tgsd logs: {kept or 'bench/results/suite/logs/'} (TGS_BENCH_LOGS)."
          + " The MPS baseline is a row of pytorch's table (where nvidia-cuda-mps-control exists).")
    Outputs("suite", json_path).write(result, md, echo)
    return result
