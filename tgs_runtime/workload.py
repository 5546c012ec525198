"""The workload program (`tgs-workload`, also `tgs workload`): its flags and its JSON
lines, as ARCHITECTURE.md's contract gives them. Tests, the demo and bench all use this."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tgs_runtime.paths import artifacts


@dataclass(frozen=True)
class Workload:
    """One run of the workload: K kernels per iteration, a sync, a CPU gap."""

    kernel_us: float = 1000
    kernels: int = 10
    gap_us: float = 0
    gap_spread: float = 0           # each gap drawn within gap_us * (1 +- this), the same draws every run
    seconds: float = 10
    param_mb: float = 16
    act_mb: float = 16
    device: int = 0
    report_s: float = 1
    warmup_s: float | None = None
    verify: bool = False
    managed: bool = False
    iterations: int | None = None  # a job of fixed work: stop after this many
    long_kernels: int = 0           # the last this many kernels of each iteration run long_us
    long_us: float | None = None
    shapes: int = 1                 # kernel i of the run is on grid size i % shapes
    host_us: float = 0              # host work once the first half of an iteration's kernels is queued
    host_sync: bool = False         # the GPU caught up before that host work: an idle spell inside each iteration
    host_sync_s: float = 0          # ... only for this long into the run (0: throughout)
    stall_us: float = 0             # more CPU time after every stall_every-th iteration (a data loader's stall)
    stall_every: int = 0
    stall_inside: bool = False      # ... each with the host work inside its iteration instead (a collector's pause)
    phase_s: float = 0              # from this far into the run ...
    phase_kernels: int = 0          # ... this many kernels per iteration (its own load moving within one process)
    phase_gap_us: float | None = None  # ... and/or this gap (None: gap_us throughout)

    @property
    def duty(self) -> float:
        """Fraction of an iteration the GPU is busy when the job runs alone."""
        gpu = (self.kernels - self.long_kernels) * self.kernel_us + self.long_kernels * (
            self.kernel_us if self.long_us is None else self.long_us)
        return gpu / (gpu + self.gap_us) if gpu + self.gap_us else 0.0

    @classmethod
    def with_duty(cls, duty: float, period_ms: float = 20, kernels: int = 10, **kw) -> "Workload":
        """A workload busy `duty` of each `period_ms` iteration (1.0: GPU-bound)."""
        if not 0 < duty <= 1:
            raise ValueError(f"duty {duty}: expected a fraction in (0, 1]")
        gpu_us = period_ms * 1000 * duty
        return cls(kernel_us=gpu_us / kernels, kernels=kernels, gap_us=period_ms * 1000 - gpu_us, **kw)

    def args(self) -> list[str]:
        out = [
            "--kernel-us", f"{self.kernel_us:g}",
            "--kernels", str(self.kernels),
            "--gap-us", f"{self.gap_us:g}",
            "--seconds", f"{self.seconds:g}",
            "--param-mb", f"{self.param_mb:g}",
            "--act-mb", f"{self.act_mb:g}",
            "--device", str(self.device),
            "--report-s", f"{self.report_s:g}",
            "--json",
        ]
        if self.warmup_s is not None:
            out += ["--warmup-s", f"{self.warmup_s:g}"]
        if self.verify:
            out.append("--verify")
        if self.managed:
            out.append("--managed")
        if self.iterations:
            out += ["--iterations", str(self.iterations)]
        if self.long_kernels:
            out += ["--long-kernels", str(self.long_kernels)]
        if self.long_us is not None:
            out += ["--long-us", f"{self.long_us:g}"]
        if self.shapes != 1:
            out += ["--shapes", str(self.shapes)]
        if self.gap_spread:
            out += ["--gap-spread", f"{self.gap_spread:g}"]
        if self.host_us:
            out += ["--host-us", f"{self.host_us:g}"]
        if self.host_sync:
            out.append("--host-sync")
        if self.host_sync_s:  # (without host_sync the workload says what is missing)
            out += ["--host-sync-s", f"{self.host_sync_s:g}"]
        if self.stall_every or self.stall_us:  # one without the other: the workload says what is missing
            out += ["--stall-us", f"{self.stall_us:g}", "--stall-every", str(self.stall_every)]
        if self.stall_inside:  # (without the stalls the workload says what is missing)
            out.append("--stall-inside")
        if self.phase_s:  # (without what changes then, or without this, the workload says what is missing)
            out += ["--phase-s", f"{self.phase_s:g}"]
        if self.phase_kernels:
            out += ["--phase-kernels", str(self.phase_kernels)]
        if self.phase_gap_us is not None:
            out += ["--phase-gap-us", f"{self.phase_gap_us:g}"]
        return out

    def argv(self, binary: Path | None = None) -> list[str]:
        exe = binary or artifacts().require(artifacts().workload)
        return [str(exe), *self.args()]


@dataclass(frozen=True)
class Report:
    """One JSON line of the workload."""

    iterations_per_s: float
    iterations: int
    kernels: int
    elapsed_s: float
    summary: bool = False
    checksum_ok: bool | None = None
    raw: dict = field(default_factory=dict, compare=False)


class WorkloadError(RuntimeError):
    """The workload reported a CUDA error (the line it printed is in .raw)."""

    def __init__(self, raw: dict):
        super().__init__(f"{raw.get('error')}: {raw.get('cuda_error')}")
        self.raw = raw

    @property
    def cuda_error(self) -> str:
        return str(self.raw.get("cuda_error"))


def parse_line(line: str) -> Report:
    raw = json.loads(line)
    if "error" in raw:
        raise WorkloadError(raw)
    return Report(
        iterations_per_s=float(raw["iterations_per_s"]),
        iterations=int(raw["iterations"]),
        kernels=int(raw["kernels"]),
        elapsed_s=float(raw["elapsed_s"]),
        summary=bool(raw.get("summary", False)),
        checksum_ok=raw.get("checksum_ok"),
        raw=raw,
    )


def parse_output(text: str) -> list[Report]:
    """Every JSON line of a run's stdout, in order (the last is the summary when it finished)."""
    return [parse_line(line) for line in text.splitlines() if line.strip().startswith("{")]


def summary(text: str) -> Report:
    reports = parse_output(text)
    if not reports or not reports[-1].summary:
        raise ValueError(f"the workload did not finish (no summary line in {text[-500:]!r})")
    return reports[-1]
