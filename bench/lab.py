"""The benchmarks' bench: one GPU (simgpu, or the real one when there is one), an optional
tgsd of our own, containers registered as tgs-runtime registers them (plain processes with
the shim, a sleeping process standing in for each container's init), workloads whose JSON
lines are collected as they come, and the engine's own accounting."""
from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tgs_runtime import sim
from tgs_runtime.childd import ChildTgsd, merge
from tgs_runtime.paths import artifacts
from tgs_runtime.workload import Report, Workload, parse_line


@dataclass
class Job:
    label: str
    proc: subprocess.Popen
    started: float
    reports: list[Report] = field(default_factory=list)
    stderr: str = ""
    arrivals: list[float] = field(default_factory=list)  # monotonic time each report came
    errors: list[str] = field(default_factory=list)

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                try:
                    report = parse_line(line)
                except Exception:  # an error line
                    self.errors.append(line.strip())
                    continue
                self.reports.append(report)
                self.arrivals.append(time.monotonic())

    def wait(self, timeout: float = 600) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(10)
        self.stderr = self.proc.stderr.read() if self.proc.stderr else ""
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()

    @property
    def summary(self) -> Report | None:
        return self.reports[-1] if self.reports and self.reports[-1].summary else None

    def iterations_at(self, elapsed: float) -> float:
        """Iterations done `elapsed` seconds into the run (interpolated between reports)."""
        pts = [(0.0, 0)] + [(r.elapsed_s, r.iterations) for r in self.reports if not r.summary]
        for (t0, i0), (t1, i1) in zip(pts, pts[1:]):
            if t1 >= elapsed:
                return i0 + (i1 - i0) * (elapsed - t0) / max(t1 - t0, 1e-9)
        return float(pts[-1][1])

    def rate(self, t0: float, t1: float) -> float:
        """Iterations per second between two moments of the run."""
        return (self.iterations_at(t1) - self.iterations_at(t0)) / (t1 - t0)

    def rate_between(self, w0: float, w1: float) -> float:
        """Iterations per second between two monotonic wall-clock moments (for jobs whose
        start-up time varies, such as PyTorch's)."""
        pts = [(t, r.iterations) for t, r in zip(self.arrivals, self.reports) if not r.summary]

        def at(w: float) -> float:
            if not pts or w <= pts[0][0]:
                return float("nan")
            for (t0, i0), (t1, i1) in zip(pts, pts[1:]):
                if t1 >= w:
                    return i0 + (i1 - i0) * (w - t0) / max(t1 - t0, 1e-9)
            return float("nan")

        return (at(w1) - at(w0)) / (w1 - w0)

    def series(self) -> list[tuple[float, float]]:
        """(elapsed, iterations/s) per report."""
        return [(r.elapsed_s, r.iterations_per_s) for r in self.reports if not r.summary]


class Lab:
    """One GPU, one optional tgsd. Use as a context manager."""

    def __init__(self, *, memory: str = "8G", tgsd: dict | None = None):
        self.dir = Path(tempfile.mkdtemp(prefix="tgs-lab-"))
        self.real = sim.real_gpu()
        self.settings = sim.SimSettings(state=self.dir / "simgpu.state", memory=memory)
        self.jobs: list[Job] = []
        self.tgsd: ChildTgsd | None = None
        a = artifacts()
        if not self.real:
            subprocess.run([str(a.workload), "--seconds", "0.01", "--param-mb", "0", "--act-mb", "0"],
                           env=self.settings.env(), capture_output=True, check=True)
        if tgsd is not None:
            base = {"daemon": {"log": "json", "log_level": "debug"},
                    "runtime": {"shim_path": str(a.shim), "hook_path": str(a.root / "tgs-hook")}}
            if self.real:  # never let unified memory grow near the card's size
                base["memory"] = {"budget": os.environ.get("TGS_BENCH_BUDGET", "24G")}
            else:
                base["sim"] = {"enabled": True, "state": str(self.settings.state), "lib_dir": str(a.simgpu_dir)}
            self.tgsd = ChildTgsd(merge(base, tgsd), self.dir / "tgs.toml", self.dir / "tgsd.log").start()

    def __enter__(self) -> "Lab":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def env(self, extra: dict | None = None) -> dict[str, str]:
        env = dict(os.environ) if self.real else self.settings.env()
        for k in [k for k in env if k.startswith("TGS_")]:
            del env[k]
        env.update(extra or {})
        return env

    def container(self, cls: str) -> dict[str, str]:
        """Registers a container with tgsd; the environment its processes run with."""
        assert self.tgsd, "this lab has no tgsd"
        return {**self.tgsd.register(cls).env(artifacts().shim), "TGS_LOG_LEVEL": "error"}

    def run(self, w: Workload | list[str], label: str, container: dict | None = None) -> Job:
        """Starts a workload (or any program printing the workload's JSON lines)."""
        env = self.env({**(container or {}), "SIMGPU_LABEL": label})
        argv = w.argv(artifacts().workload) if isinstance(w, Workload) else w
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        job = Job(label, proc, time.monotonic())
        job._reader = threading.Thread(target=job._read, daemon=True)
        job._reader.start()
        self.jobs.append(job)
        return job

    def snapshot(self) -> dict | None:
        return None if self.real else sim.status(self.settings.state)

    def busy(self, before: dict | None, after: dict | None) -> dict[str, float]:
        """Engine seconds per label between two snapshots (simgpu's accounting)."""
        if before is None or after is None:
            return {}
        out = sim.busy_between(before, after)
        out["(all)"] = (after["devices"][0]["busy_ns"] - before["devices"][0]["busy_ns"]) / 1e9
        return out

    def context(self, label: str) -> dict | None:
        snap = self.snapshot()
        return sim.contexts(snap).get(label) if snap else None

    def close(self) -> None:
        for j in self.jobs:
            j.kill()
        if self.tgsd:
            self.tgsd.close()
            keep = os.environ.get("TGS_BENCH_LOGS")  # a folder to keep tgsd's log in
            if keep:
                Path(keep).mkdir(parents=True, exist_ok=True)
                subprocess.run(["cp", str(self.dir / "tgsd.log"), str(Path(keep) / f"tgsd-{self.dir.name}.log")])
        subprocess.run(["rm", "-rf", str(self.dir)])

    @property
    def gpu_label(self) -> str:
        return "real GPU" if self.real else "simgpu (simulated)"
