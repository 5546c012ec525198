"""The benchmarks' bench: one GPU (simgpu, or the real one when there is one), an optional
tgsd of our own, containers registered as tgs-runtime registers them (plain processes with
the shim, a sleeping process standing in for each container's init), workloads whose JSON
lines are collected as they come, and the engine's own accounting."""
from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from bench.common import every, shim_log_level
from tgs_runtime import proto, sim
from tgs_runtime.childd import ChildTgsd, merge, own_config
from tgs_runtime.daemon.controllers import MACHINE_WHY
from tgs_runtime.paths import artifacts
from tgs_runtime.workload import Report, Workload, parse_line


@dataclass
class Job:
    label: str
    proc: subprocess.Popen
    started: float
    log: Path  # its stderr (a file, not a pipe: a shim logging at debug level would fill a pipe and block)
    reports: list[Report] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # monotonic time each report came
    errors: list[str] = field(default_factory=list)

    @property
    def stderr(self) -> str:
        """What it wrote to stderr so far."""
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def _read(self) -> None:
        with self.proc.stdout:  # closed at its end
            for line in self.proc.stdout:
                if line.startswith("{"):
                    try:
                        report = parse_line(line)
                    except Exception:  # an error line
                        self.errors.append(line.strip())
                        continue
                    self.reports.append(report)
                    self.arrivals.append(time.monotonic())

    def rate_spread(self, w0: float, w1: float) -> float | None:
        """How much the rates of its reports that came between two monotonic moments spread:
        their standard deviation over their mean (None under three). Each report's rate
        spans whole iterations (a report follows a step), so this is the job's own noise at
        the report interval, as a profile timed from iteration start to iteration start
        sees it over that long."""
        rates = [r.iterations_per_s for t, r in zip(self.arrivals, self.reports)
                 if w0 <= t <= w1 and not r.summary]
        if len(rates) < 3:
            return None
        mean = statistics.fmean(rates)
        return statistics.pstdev(rates) / mean if mean > 0 else None

    def reported_since(self, t: float) -> bool:
        """Whether a report came at or after monotonic moment t, or none will (it ended)."""
        return bool(self.arrivals and self.arrivals[-1] >= t) or self.proc.poll() is not None

    def wait(self, timeout: float = 600) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(10)
        return rc

    def finish(self, timeout: float) -> int | None:
        """Waits for the job to end; one still running after `timeout` seconds is killed,
        noted in `errors` (with how far it got) and gives None."""
        try:
            return self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.wait(30)
            last = [r for r in self.reports if not r.summary]
            where = (f"its last report at {last[-1].elapsed_s:.1f} s, {last[-1].iterations} iterations"
                     if last else "it never reported")
            self.errors.append(f"still running {timeout:.0f} s after it was due to end, killed ({where})")
            return None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()

    def stop(self) -> None:
        """Ends the run now as if its time were up (the workload's SIGINT: it still verifies
        and reports)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)

    @property
    def summary(self) -> Report | None:
        return self.reports[-1] if self.reports and self.reports[-1].summary else None

    def iterations_at(self, elapsed: float) -> float:
        """Iterations done `elapsed` seconds into the run (interpolated between reports).
        The summary's totals are the run's last point: the last periodic report may come up
        to a report interval before the end (without it, a window ending at the end of a
        7.2 s run lost its last 0.2 s of iterations: 4 %)."""
        pts = [(0.0, 0)] + [(r.elapsed_s, r.iterations) for r in self.reports]
        at = _interpolate(pts, elapsed)
        return float(pts[-1][1]) if at is None else at

    def rate(self, t0: float, t1: float) -> float:
        """Iterations per second between two moments of the run."""
        return (self.iterations_at(t1) - self.iterations_at(t0)) / (t1 - t0)

    def rate_between(self, w0: float, w1: float) -> float:
        """Iterations per second between two monotonic wall-clock moments (for jobs whose
        start-up time varies, such as PyTorch's); NaN outside the reports' span (the
        summary's totals included)."""
        pts = [(t, r.iterations) for t, r in zip(self.arrivals, self.reports)]
        a, b = _interpolate(pts, w0), _interpolate(pts, w1)
        return float("nan") if a is None or b is None else (b - a) / (w1 - w0)


def _interpolate(pts: list[tuple[float, int]], x: float) -> float | None:
    """y at x on the line through pts (x ascending); None outside their span."""
    if not pts or not pts[0][0] <= x <= pts[-1][0]:
        return None
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x1 >= x:
            return y0 + (y1 - y0) * (x - x0) / max(x1 - x0, 1e-9)
    return float(pts[-1][1])


@dataclass
class ControllerTrace:
    """GPU 0 as `tgs status` shows it (its controller and containers), sampled while jobs
    run: what a benchmark's figures alone do not say (how much of the time production's
    shims counted it busy, in how many iterations, how long the opportunistic ones waited
    behind it and whether they watched it, which bound and rate held). `span`: the
    monotonic window the figures are measured on; only the samples inside it are summed
    up (all of them while it is None)."""
    samples: list[tuple[float, dict]] = field(default_factory=list)
    span: tuple[float, float] | None = None

    def summary(self) -> dict:
        inside = [(t, g) for t, g in self.samples if self.span is None or self.span[0] <= t <= self.span[1]]
        ctl = [g["controller"] for _, g in inside]
        beside = [c["opportunistic_beside_production"] for c in ctl
                  if c.get("opportunistic_beside_production") is not None]
        rates = [c["rate_blocks_per_s"] for c in ctl if c.get("rate_blocks_per_s") is not None]
        rhythms = [c["rhythm_s"] for _, g in inside for c in g["containers"] if c.get("rhythm_s")]
        return {"samples": len(inside),
                "watched": len(beside),  # samples in which the opportunistic shims watched production
                "beside_production_per_s_median": round(statistics.median(beside), 4) if beside else None,
                **self._counted(inside),
                "unlimited": len(inside) - len(rates),
                "rate_blocks_per_s_median": round(statistics.median(rates)) if rates else None,
                "states": dict(Counter(str(c.get("state")) for c in ctl)),
                "inflight_max": dict(Counter(str(c.get("inflight_max")) for c in ctl)),
                "opportunistic_by_bound": self._by_bound(inside),
                # the longest idle spell production's processes expected as their rhythm
                # (over half a second: on its host between bursts, not idle)
                "production_rhythm_s_max": max(rhythms, default=None)}

    def moves(self, t0: float, t1: float) -> dict:
        """What the controller did between two monotonic moments (a benchmark's phase), as
        its status samples show it (to the sampling period): the in-flight bound at the
        first sample and each change after it, when it began a profile (seconds from t0),
        in how many of the samples a rate limit held (outside profiles), and the decisions
        the samples caught, each with its time and why (one superseded between two samples
        is not seen)."""
        inside = [(t - t0, g["controller"]) for t, g in self.samples if t0 <= t <= t1]
        bounds: list[list] = []
        profiles: list[float] = []
        decisions: list[list] = []
        for i, (t, c) in enumerate(inside):
            d = c.get("decision")
            if d and d["why"] and (not decisions or decisions[-1][1] != d["why"]):
                decisions.append([round(t - d["age_s"], 1) + 0.0, d["why"]])  # (+ 0.0: no -0.0)
            if not bounds or c.get("inflight_max") != bounds[-1][1]:
                bounds.append([round(t, 1), c.get("inflight_max")])
            if c.get("state") == "profile" and (i == 0 or inside[i - 1][1].get("state") != "profile"):
                profiles.append(round(t, 1))
        limited = sum(1 for _, c in inside if c.get("state") != "profile" and c.get("rate_blocks_per_s") is not None)
        return {"samples": len(inside), "inflight_max": bounds, "profiles_s": profiles, "rate_limited": limited,
                "decisions": decisions}

    @staticmethod
    def moves_in_words(m: dict, lowest: list[float | None] | None = None) -> str:
        """`moves` in a table cell: "bound 2, 4 at 6.5 s, 8 at 11.5 s; profiled at 0.0 s; rate
        limited in 3 of 40 samples"; with `lowest` (a figure for each bound, None for none)
        each bound is followed by its figure in brackets: "bound 2 (0.991), 4 at 6.5 s (0.962)"."""
        if not m["samples"]:
            return "no status samples"
        lows = lowest or [None] * len(m["inflight_max"])
        steps = [(f"{b}" if i == 0 else f"{b} at {t:.1f} s") + ("" if low is None else f" ({low:.3f})")
                 for i, ((t, b), low) in enumerate(zip(m["inflight_max"], lows))]
        parts = ["bound " + ", ".join(steps) if any(b for _, b in m["inflight_max"]) else "no bound"]
        if m["profiles_s"]:
            parts.append("profiled at " + ", ".join(f"{t:.1f} s" for t in m["profiles_s"]))
        if m["rate_limited"]:
            parts.append(f"rate limited in {m['rate_limited']} of {m['samples']} samples")
        machine = [t for t, why in m.get("decisions", []) if MACHINE_WHY in why]
        if machine:  # falls taken as the host's slowness (CPU time stolen), nothing done
            parts.append("the machine's at " + ", ".join(f"{t:.1f} s" for t in machine))
        return "; ".join(parts)

    @staticmethod
    def _by_bound(inside: list[tuple[float, dict]]) -> dict:
        """Under each in-flight bound, the opportunistic containers' blocks per second and
        their launching threads' waits by cause, in seconds per second (proto.WAIT_CAUSES): each stretch
        between two samples counted under the bound of its first (the bound a deeper trial of
        tgsd's is judged by: did the job gain by it, and where did its time go?)."""
        def opp(g: dict, key: str) -> float:
            return sum(c.get(key, 0) for c in g["containers"] if c["class"] == "opportunistic")

        keys = ("attained_blocks", *map(proto.wait_key, proto.WAIT_CAUSES))
        done: dict[str, Counter] = {}
        took: Counter = Counter()
        for (t0, g0), (t1, g1) in zip(inside, inside[1:]):
            bound = str(g0["controller"].get("inflight_max"))
            done.setdefault(bound, Counter()).update({k: opp(g1, k) - opp(g0, k) for k in keys})
            took[bound] += t1 - t0
        return {b: {"blocks_per_s": round(done[b]["attained_blocks"] / took[b]),
                    **{f"{cause}_per_s": round(done[b][proto.wait_key(cause)] / took[b], 3)
                       for cause in proto.WAIT_CAUSES}}
                for b in took if took[b] > 0}

    @staticmethod
    def _counted(inside: list[tuple[float, dict]]) -> dict:
        """Per second between the first and the last sample, from the containers' counters
        (those in both): production busy (the busiest production container), its iteration
        starts and its pauses of its own (summed over the production containers),
        opportunistic waiting behind it, its work beside it, and its launching threads'
        other waits by cause (proto.SHIM_WAITS; summed over the opportunistic containers).
        None: fewer than two samples."""
        keys = ("production_busy_per_s", "production_iteration_starts_per_s", "production_paused_per_s",
                "opportunistic_gated_per_s", "opportunistic_beside_per_s",
                *(f"opportunistic_{k}_per_s" for k in proto.SHIM_WAITS))
        if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
            return dict.fromkeys(keys)
        (t0, g0), (t1, g1) = inside[0], inside[-1]
        first = {c["id"]: c for c in g0["containers"]}
        grew = [(c["class"], {k: c.get(k, 0) - first[c["id"]].get(k, 0)
                              for k in ("busy_s", "iteration_starts", "paused_s", "beside_production_s",
                                        *map(proto.wait_key, proto.WAIT_CAUSES))})
                for c in g1["containers"] if c["id"] in first]
        dt = t1 - t0
        prod = [d for cls, d in grew if cls == "production"]
        opp = [d for cls, d in grew if cls == "opportunistic"]
        return dict(zip(keys, (round(max((d["busy_s"] for d in prod), default=0) / dt, 3),
                               round(sum(d["iteration_starts"] for d in prod) / dt, 2),
                               round(sum(d["paused_s"] for d in prod) / dt, 3),
                               round(sum(d["gated_s"] for d in opp) / dt, 3),
                               round(sum(d["beside_production_s"] for d in opp) / dt, 4),
                               *(round(sum(d[proto.wait_key(k)] for d in opp) / dt, 3) for k in proto.SHIM_WAITS))))

    @staticmethod
    def describe(s: dict) -> str:
        """A summary in words."""
        if not s["samples"]:
            return "no status samples"
        beside = s["beside_production_per_s_median"]
        counted = ("" if s["production_busy_per_s"] is None else
                   f"; production's shims counted it busy {s['production_busy_per_s']:g} s/s in "
                   f"{s['production_iteration_starts_per_s']:g} iterations/s and paused on its own "
                   f"{s['production_paused_per_s']:g} s/s, the opportunistic "
                   f"ones waited behind it {s['opportunistic_gated_per_s']:g} s/s with their own work beside it "
                   f"{s['opportunistic_beside_per_s']:g} s/s, and "
                   + proto.waits_in_words({k: s.get(f"opportunistic_{k}_per_s") for k in proto.SHIM_WAITS}, "s/s"))
        return (f"the opportunistic shims watched production in {s['watched']} of {s['samples']} status samples"
                + ("" if beside is None else f" (the controller's figure beside it: {beside:g} s/s, median)")
                + counted + f"; in-flight bound {s['inflight_max']}; rate unlimited in {s['unlimited']}"
                + ("" if s["rate_blocks_per_s_median"] is None
                   else f", else {s['rate_blocks_per_s_median']} blocks/s (median)")
                + f"; states {s['states']}"
                + ("" if not s.get("opportunistic_by_bound") else
                   "; under each in-flight bound, opportunistic " + "; ".join(
                       f"{b}: {v['blocks_per_s']:,} blocks/s, "
                       + proto.waits_in_words({k: v.get(f"{k}_per_s") for k in proto.WAIT_CAUSES}, "s/s")
                       for b, v in s["opportunistic_by_bound"].items())))


def production(duty: float, seconds: float, **kw) -> Workload:
    """The benchmarks' production job: 10 kernels per 20 ms iteration, busy `duty` of it."""
    return Workload.with_duty(duty, period_ms=20, kernels=10, seconds=seconds, **kw)


def opportunistic(seconds: float, **kw) -> Workload:
    """The benchmarks' opportunistic job: GPU-bound, 10 kernels of 1 ms per iteration."""
    return Workload(kernel_us=1000, kernels=10, seconds=seconds, **kw)


class Lab:
    """One GPU, one optional tgsd. Use as a context manager."""

    def __init__(self, *, memory: str = "8G", tgsd: dict | None = None):
        self.dir = Path(tempfile.mkdtemp(prefix="tgs-lab-"))
        # None: the real GPU
        self.settings = None if sim.real_gpu() else sim.SimSettings(state=self.dir / "simgpu.state", memory=memory)
        self.jobs: list[Job] = []
        self.tgsd: ChildTgsd | None = None
        try:
            if self.settings:
                self.settings.create()
            if tgsd is not None:
                base = merge(own_config(self.settings, os.environ.get("TGS_BENCH_BUDGET", "24G")),
                             {"daemon": {"log": "json", "log_level": "debug"}})
                self.tgsd = ChildTgsd(merge(base, tgsd), self.dir / "tgs.toml", self.dir / "tgsd.log").start()
        except BaseException:
            self.close()  # a lab that cannot start leaves nothing behind
            raise

    def __enter__(self) -> "Lab":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def container(self, cls: str) -> dict[str, str]:
        """Registers a container with tgsd; the environment its processes run with."""
        assert self.tgsd, "this lab has no tgsd"
        return self.tgsd.register(cls).env(artifacts().shim, log_level=shim_log_level())

    def run(self, w: Workload | list[str], label: str, container: dict | None = None) -> Job:
        """Starts a workload (or any program printing the workload's JSON lines)."""
        env = sim.job_env(self.settings, label, container)
        argv = w.argv(artifacts().workload) if isinstance(w, Workload) else w
        log = self.dir / f"job{len(self.jobs)}-{label}.stderr.txt"
        with open(log, "w") as err:
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        job = Job(label, proc, time.monotonic(), log)
        job._reader = threading.Thread(target=job._read, daemon=True)
        job._reader.start()
        self.jobs.append(job)
        return job

    @contextmanager
    def trace(self, period: float = 0.5) -> Iterator[ControllerTrace]:
        """Samples this lab's tgsd's status of GPU 0 every `period` seconds while the
        block runs (a sample that fails, tgsd busy or gone, is left out)."""
        assert self.tgsd, "this lab has no tgsd"
        trace = ControllerTrace()

        def sample() -> None:
            try:
                gpus = self.tgsd.admin.status()["gpus"]
                if gpus:
                    trace.samples.append((time.monotonic(), gpus[0]))
            except (RuntimeError, KeyError):
                pass

        with every(period, sample):
            yield trace

    def snapshot(self) -> dict | None:
        return sim.status(self.settings.state) if self.settings else None

    def busy(self, before: dict | None, after: dict | None) -> dict[str, float]:
        """Engine seconds per label between two snapshots (simgpu's accounting)."""
        if before is None or after is None:
            return {}
        out = sim.busy_between(before, after)
        out["(all)"] = (after["devices"][0]["busy_ns"] - before["devices"][0]["busy_ns"]) / 1e9
        return out

    def close(self) -> None:
        for j in self.jobs:
            j.kill()
            try:
                j.proc.wait(30)  # its stderr complete before it is kept
            except subprocess.TimeoutExpired:
                pass
        keep = os.environ.get("TGS_BENCH_LOGS")  # a folder to keep tgsd's log and the jobs' stderr in
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            for j in self.jobs:
                if j.log.exists() and j.log.stat().st_size:
                    shutil.copy(j.log, Path(keep) / f"{self.dir.name}-{j.log.name}")
        if self.tgsd:
            self.tgsd.close()
            if keep:
                shutil.copy(self.dir / "tgsd.log", Path(keep) / f"tgsd-{self.dir.name}.log")
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def real(self) -> bool:
        return self.settings is None

    @property
    def gpu_label(self) -> str:
        return "real GPU" if self.real else "simgpu (simulated)"


@contextmanager
def twin_gpu() -> Iterator[Lab | None]:
    """A second simulated GPU with nothing on it and no tgsd, for a control: production's
    jobs started beside a benchmark's at the same moments, alone, so that a slow stretch of
    the machine shows in both. None on a real GPU: there is one GPU to measure on."""
    if sim.real_gpu():
        yield None
        return
    with Lab() as lab:
        yield lab
