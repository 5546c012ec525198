"""`tgs demo`: a production and an opportunistic job on one GPU, shown live, and the
table that says what sharing cost and what it gained.

Phases, each measured in the same run (ARCHITECTURE.md, "Measures"):
  exclusive     production alone, then opportunistic alone
  co-execution  both at once, no control (what a shared GPU does by itself)
  TGS           both at once, each in a TGS container of its class

The TGS phase goes through `docker run --runtime=tgs` when a docker daemon has the tgs
runtime and its tgsd answers (demodocker.py; on the GPU that tgsd manages: simgpu when its
config enables [sim]). Otherwise its jobs are plain processes with libtgs.so preloaded,
registered as tgs-runtime registers a container, with a tgsd of the demo's own (started
with a temporary config). The exclusive and co-execution phases are plain processes on
the same GPU. On a machine with an NVIDIA GPU the jobs run on it; otherwise on simgpu.
"""
from __future__ import annotations

import enum
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol, Sequence

from tgs_runtime import demodocker, sim
from tgs_runtime.childd import ChildTgsd, ProcessContainer, ends_with_us, merge, own_config
from tgs_runtime.paths import artifacts
from tgs_runtime.workload import Report, Workload, parse_line

Echo = Callable[[str], None]


@dataclass(frozen=True)
class DemoPlan:
    production: Workload
    opportunistic: Workload
    phase_seconds: float

    @classmethod
    def default(cls, phase_seconds: float = 10) -> "DemoPlan":
        # production: a training job that keeps the GPU busy half the time
        prod = Workload.with_duty(0.5, period_ms=20, kernels=10, seconds=phase_seconds, report_s=1)
        # opportunistic: a GPU-bound job that would take all it can get
        opp = Workload(kernel_us=2000, kernels=5, gap_us=0, seconds=phase_seconds, report_s=1)
        return cls(prod, opp, phase_seconds)


@dataclass
class PhaseResult:
    name: str
    throughput: dict[str, float] = field(default_factory=dict)  # role -> iterations/s
    busy_fraction: float | None = None  # simgpu's accounting; None on a real GPU


class Via(str, enum.Enum):
    AUTO = "auto"            # docker when it can, else processes
    DOCKER = "docker"        # docker run --runtime=tgs, or fail saying why not
    PROCESSES = "processes"  # plain processes with the shim


class Job(Protocol):
    def lines(self) -> Iterator[str]: ...           # its stdout, line by line, until it ends
    def finish(self) -> str | None: ...             # None when it succeeded, else why not
    def stop(self) -> None: ...                     # gone, whatever state it was in


@dataclass
class ProcessJob:
    proc: subprocess.Popen

    @classmethod
    def start(cls, w: Workload, env: dict[str, str]) -> "ProcessJob":
        # (killed outright, the demo takes its jobs with it: ends_with_us)
        return cls(subprocess.Popen(w.argv(), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    preexec_fn=ends_with_us(signal.SIGKILL)))

    def lines(self) -> Iterator[str]:
        yield from self.proc.stdout

    def finish(self) -> str | None:
        return None if self.proc.wait() == 0 else self.proc.stderr.read()[-2000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _stream(jobs: dict[str, Job], echo: Echo, phase: str) -> dict[str, Report]:
    """Shows each job's progress lines as they arrive; returns each job's summary."""
    lines: queue.Queue = queue.Queue()

    def pump(role: str, job: Job) -> None:
        try:
            for line in job.lines():
                lines.put((role, line))
        finally:
            lines.put((role, None))

    for role, job in jobs.items():
        threading.Thread(target=pump, args=(role, job), daemon=True).start()
    last: dict[str, Report] = {}
    open_ = len(jobs)
    while open_:
        role, line = lines.get()
        if line is None:
            open_ -= 1
            continue
        if not line.startswith("{"):
            continue
        rep = parse_line(line)
        last[role] = rep
        if not rep.summary:
            echo(f"  {phase:<13} {role:<14} {rep.elapsed_s:5.1f}s  {rep.iterations_per_s:7.1f} it/s")
    for role, job in jobs.items():
        why = job.finish()
        if why is not None:
            raise RuntimeError(f"the {role} job failed: {why}")
    return last


class Demo:
    """The demo's jobs on one GPU: the real one, or simgpu (the demo's own, or the one the
    docker runtime's tgsd manages)."""

    def __init__(self, plan: DemoPlan, echo: Echo, workdir: Path, real: bool,
                 docker: demodocker.DockerTgs | None = None):
        self.plan = plan
        self.echo = echo
        self.workdir = workdir
        self.docker = docker
        if docker:
            self.settings = sim.SimSettings(state=docker.cfg.sim.state) if docker.simulated else None
        else:
            self.settings = None if real else sim.SimSettings(state=workdir / "simgpu.state", memory="8G")

    def _env(self, label: str, container: ProcessContainer | None) -> dict[str, str]:
        return sim.job_env(self.settings, label, container.env(artifacts().shim, "error") if container else None)

    def _busy_ns(self) -> int | None:
        if not self.settings or not self.settings.state.exists():
            return None
        return sim.status(self.settings.state)["devices"][0]["busy_ns"]

    def _run(self, phase: str, jobs: Sequence[tuple[str, Workload]],
             start: Callable[[str, str, Workload], Job] | None = None) -> PhaseResult:
        """Runs `jobs` (role, workload) at once; `start` starts one job (a plain process by default)."""
        start = start or (lambda role, label, w: ProcessJob.start(w, self._env(label, None)))
        before = self._busy_ns()
        t0 = time.monotonic()
        running: dict[str, Job] = {}
        try:
            for role, w in jobs:
                running[role] = start(role, f"{phase}:{role}", w)
            summaries = _stream(running, self.echo, phase)
        finally:
            for job in running.values():
                job.stop()
        wall = time.monotonic() - t0
        after = self._busy_ns()
        res = PhaseResult(phase, {role: s.iterations_per_s for role, s in summaries.items()})
        res.busy_fraction = None if after is None else (after - (before or 0)) / 1e9 / wall
        return res

    def _tgs_processes(self, jobs: Sequence[tuple[str, Workload]]) -> PhaseResult:
        self.echo("  (starting a tgsd of the demo's own, with a temporary config, for the TGS phase)")
        config = merge(own_config(self.settings, budget="8G"), {"daemon": {"log": "json"}})
        tgsd = ChildTgsd(config, self.workdir / "tgs.toml", self.workdir / "tgsd.log").start()
        try:
            containers = {role: tgsd.register(role, cid=f"demo-{role}") for role, _ in jobs}
            return self._run("TGS", jobs, lambda role, label, w: ProcessJob.start(w, self._env(label, containers[role])))
        finally:
            tgsd.close()

    def _tgs_docker(self, jobs: Sequence[tuple[str, Workload]]) -> PhaseResult:
        d = self.docker
        self.echo(f"  (TGS phase: docker run --runtime=tgs on {d.where}, tgsd at {d.cfg.daemon.state_dir})")
        tag = demodocker.image(d)
        return self._run("TGS", jobs, lambda role, label, w: demodocker.ContainerJob.start(d, tag, role, label, w))

    def run(self) -> list[PhaseResult]:
        p = self.plan
        if self.settings and not self.settings.state.exists():
            self.settings.create()
        both = [("production", p.production), ("opportunistic", p.opportunistic)]
        results = [
            self._run("exclusive", [("production", p.production)]),
            self._run("exclusive", [("opportunistic", p.opportunistic)]),
            self._run("co-execution", both),
        ]
        results.append(self._tgs_docker(both) if self.docker else self._tgs_processes(both))
        return results


def table(results: list[PhaseResult]) -> str:
    excl_prod = next(r.throughput["production"] for r in results if r.name == "exclusive" and "production" in r.throughput)
    excl_opp = next(r.throughput["opportunistic"] for r in results if r.name == "exclusive" and "opportunistic" in r.throughput)
    rows = [("setting", "production it/s", "vs exclusive", "opportunistic it/s", "vs exclusive", "GPU busy")]
    rows.append(("exclusive", f"{excl_prod:.1f}", "1.00", f"{excl_opp:.1f}", "1.00", "-"))
    for r in results:
        if r.name == "exclusive":
            continue
        prod, opp = r.throughput.get("production", 0.0), r.throughput.get("opportunistic", 0.0)
        rows.append((r.name, f"{prod:.1f}", f"{prod / excl_prod:.2f}", f"{opp:.1f}", f"{opp / excl_opp:.2f}",
                     "-" if r.busy_fraction is None else f"{r.busy_fraction * 100:.0f}%"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_demo(phase_seconds: float, echo: Echo = print, via: Via = Via.AUTO) -> list[PhaseResult]:
    plan = DemoPlan.default(phase_seconds)
    real = sim.real_gpu()
    docker, why_not = (None, "asked for plain processes") if via == Via.PROCESSES else demodocker.find(real)
    if via == Via.DOCKER and not docker:
        raise RuntimeError(f"cannot run the demo through docker: {why_not}")
    with tempfile.TemporaryDirectory(prefix="tgs-demo-") as d:
        demo = Demo(plan, echo, Path(d), real, docker)
        if demo.settings is None:
            echo("Running on this machine's NVIDIA GPU (GPU 0).")
        elif docker:
            echo(f"Running on simgpu, the simulated GPU of the tgs runtime's tgsd ({demo.settings.state}); "
                 "results are simulated.")
        else:
            echo("No NVIDIA GPU here: running on simgpu, a simulated GPU (results are simulated).")
        if docker:
            echo("TGS containers: docker run --runtime=tgs.")
        else:
            echo(f"TGS containers: plain processes with the shim (not docker: {why_not}).")
        echo(f"production: {plan.production.duty * 100:.0f}% GPU duty cycle; opportunistic: GPU-bound; "
             f"{phase_seconds:g} s per phase\n")
        results = demo.run()
    echo("\n" + table(results))
    tgs = next(r for r in results if r.name == "TGS")
    co = next(r for r in results if r.name == "co-execution")
    excl_prod = results[0].throughput["production"]
    echo(f"\nWith TGS, production kept {tgs.throughput['production'] / excl_prod:.0%} of its exclusive throughput "
         f"(co-execution: {co.throughput['production'] / excl_prod:.0%}) while the opportunistic job ran "
         "in the time production left idle.")
    return results


if __name__ == "__main__":  # pragma: no cover
    run_demo(float(sys.argv[1]) if len(sys.argv) > 1 else 10)
