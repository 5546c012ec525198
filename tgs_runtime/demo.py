"""`tgs demo`: a production and an opportunistic job on one GPU, shown live, and the
table that says what sharing cost and what it gained.

Phases, each measured in the same run (ARCHITECTURE.md, "Measures"):
  exclusive     production alone, then opportunistic alone
  co-execution  both at once, no control (what a shared GPU does by itself)
  TGS           both at once, each in a TGS container of its class (libtgs.so preloaded,
                registered with a tgsd of the demo's own, started with a temporary config)

On a machine with an NVIDIA GPU the jobs run on it; otherwise on simgpu. The jobs run as
plain processes registered as tgs-runtime registers a container's processes.
"""
from __future__ import annotations

import selectors
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from tgs_runtime import sim
from tgs_runtime.childd import ChildTgsd, ProcessContainer, merge, own_config
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


def _stream(procs: dict[str, subprocess.Popen], echo: Echo, phase: str) -> dict[str, Report]:
    """Shows each job's progress lines as they arrive; returns each job's summary."""
    sel = selectors.DefaultSelector()
    for role, p in procs.items():
        sel.register(p.stdout, selectors.EVENT_READ, role)
    last: dict[str, Report] = {}
    open_ = len(procs)
    while open_:
        for key, _ in sel.select(timeout=1):
            line = key.fileobj.readline()
            if not line:
                sel.unregister(key.fileobj)
                open_ -= 1
                continue
            if not line.startswith("{"):
                continue
            rep = parse_line(line)
            role = key.data
            last[role] = rep
            if not rep.summary:
                echo(f"  {phase:<13} {role:<14} {rep.elapsed_s:5.1f}s  {rep.iterations_per_s:7.1f} it/s")
    for role, p in procs.items():
        if p.wait() != 0:
            raise RuntimeError(f"the {role} job failed: {p.stderr.read()[-2000:]}")
    return last


class Demo:
    """The demo's jobs on one GPU: the real one, or simgpu when there is none."""

    def __init__(self, plan: DemoPlan, echo: Echo, workdir: Path, real: bool):
        self.plan = plan
        self.echo = echo
        self.workdir = workdir
        self.settings = None if real else sim.SimSettings(state=workdir / "simgpu.state", memory="8G")

    def _env(self, label: str, container: ProcessContainer | None) -> dict[str, str]:
        return sim.job_env(self.settings, label, container.env(artifacts().shim, "error") if container else None)

    def _busy_ns(self) -> int | None:
        if not self.settings or not self.settings.state.exists():
            return None
        return sim.status(self.settings.state)["devices"][0]["busy_ns"]

    def _run(self, phase: str, jobs: Sequence[tuple[str, Workload]],
             containers: dict[str, ProcessContainer] | None = None) -> PhaseResult:
        before = self._busy_ns()
        t0 = time.monotonic()
        procs = {}
        for role, w in jobs:
            env = self._env(f"{phase}:{role}", (containers or {}).get(role))
            procs[role] = subprocess.Popen(w.argv(), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        summaries = _stream(procs, self.echo, phase)
        wall = time.monotonic() - t0
        after = self._busy_ns()
        res = PhaseResult(phase, {role: s.iterations_per_s for role, s in summaries.items()})
        res.busy_fraction = None if after is None else (after - (before or 0)) / 1e9 / wall
        return res

    def _tgsd(self) -> ChildTgsd:
        config = merge(own_config(self.settings, budget="8G"), {"daemon": {"log": "json"}})
        return ChildTgsd(config, self.workdir / "tgs.toml", self.workdir / "tgsd.log").start()

    def run(self) -> list[PhaseResult]:
        p = self.plan
        results = [
            self._run("exclusive", [("production", p.production)]),
            self._run("exclusive", [("opportunistic", p.opportunistic)]),
            self._run("co-execution", [("production", p.production), ("opportunistic", p.opportunistic)]),
        ]
        self.echo("  (starting tgsd with a temporary config for the TGS phase)")
        tgsd = self._tgsd()
        try:
            containers = {"production": tgsd.register("production", cid="demo-production"),
                          "opportunistic": tgsd.register("opportunistic", cid="demo-opportunistic")}
            results.append(self._run("TGS", [("production", p.production), ("opportunistic", p.opportunistic)],
                                     containers))
        finally:
            tgsd.close()
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


def run_demo(phase_seconds: float, echo: Echo = print) -> list[PhaseResult]:
    plan = DemoPlan.default(phase_seconds)
    real = sim.real_gpu()
    with tempfile.TemporaryDirectory(prefix="tgs-demo-") as d:
        if real:
            echo("Running on this machine's NVIDIA GPU (GPU 0).")
        else:
            echo("No NVIDIA GPU here: running on simgpu, a simulated GPU (results are simulated).")
        echo(f"production: {plan.production.duty * 100:.0f}% GPU duty cycle; opportunistic: GPU-bound; "
             f"{phase_seconds:g} s per phase\n")
        results = Demo(plan, echo, Path(d), real).run()
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
