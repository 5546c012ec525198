"""What every benchmark shares: the machine it ran on, outputs, tables, standalone
containers for measuring the shim without tgsd."""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import socket
import statistics
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import psutil

from tgs_runtime import proto
from tgs_runtime.control import ActivityFile, ControlBlock, StatePaths
from tgs_runtime.daemon.stolen import steal_seconds
from tgs_runtime.paths import REPO_ROOT

RESULTS = REPO_ROOT / "bench" / "results"
Echo = Callable[[str], None]


def commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except OSError:
        return "unknown"


def machine(gpu: str) -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"host": socket.gethostname(), "cpu": cpu, "cores": os.cpu_count(), "gpu": gpu,
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit()}


@dataclass(frozen=True)
class HostCpu:
    """The host's CPU seconds so far, all CPUs together (psutil): busy, stolen (given by
    the hypervisor to other guests) and in all. On a shared VM a benchmark's figures move
    with the host (the same zero-length launch read 120-250 ns on a 2-core VM); `share`
    says how busy the CPUs were over a stretch and how much of their time was stolen."""
    busy: float
    stolen: float
    total: float

    @classmethod
    def now(cls) -> "HostCpu":
        t = psutil.cpu_times()
        idle = t.idle + getattr(t, "iowait", 0.0)
        stolen = steal_seconds(t)
        # guest time is counted in user time already (Linux): not added again
        total = sum(getattr(t, k, 0.0) for k in ("user", "nice", "system", "idle", "iowait", "irq", "softirq",
                                                 "steal"))
        return cls(total - idle - stolen, stolen, total)

    def share(self, later: "HostCpu") -> dict[str, float | None]:
        """The part of all CPU time from this to `later` that was busy, and stolen."""
        span = later.total - self.total
        if span <= 0:
            return {"busy": None, "stolen": None}
        return {"busy": round((later.busy - self.busy) / span, 3), "stolen": round((later.stolen - self.stolen) / span, 3)}

    @staticmethod
    def in_words(share: dict) -> str:
        """`share` in a table cell: "0.97 / 0.01" (busy / stolen)."""
        return "-" if share.get("busy") is None else f"{share['busy']:.2f} / {share['stolen']:.2f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
    return "\n".join([line(cells[0]), "| " + " | ".join("-" * w for w in widths) + " |", *map(line, cells[1:])])


CONTROLLERS = ("tgs-paper", "fast")


class BadSetting(ValueError):
    """A TGS_BENCH_* environment variable that cannot be used; says what was expected."""


def chosen(var: str, known: Sequence[str]) -> list[str]:
    """The names an environment variable picks (a comma list of some of `known`, in the
    order given), else all of `known`."""
    wanted = [c.strip() for c in os.environ.get(var, ",".join(known)).split(",") if c.strip()]
    if not wanted or any(c not in known for c in wanted):
        raise BadSetting(f"{var}={os.environ.get(var)!r}: expected a comma list of {', '.join(known)}")
    return wanted


def controllers() -> list[str]:
    """The controllers a benchmark compares: TGS_BENCH_CONTROLLERS (a comma list), else both."""
    return chosen("TGS_BENCH_CONTROLLERS", CONTROLLERS)


SHIM_LOG_LEVELS = ("error", "warn", "info", "debug")


def shim_log_level() -> str:
    """The log level of the benchmarks' TGS containers' shims: TGS_BENCH_SHIM_LOG (default
    error; the shims' logs are kept beside tgsd's, under TGS_BENCH_LOGS)."""
    level = os.environ.get("TGS_BENCH_SHIM_LOG", "error").strip().lower()
    if level not in SHIM_LOG_LEVELS:
        raise BadSetting(f"TGS_BENCH_SHIM_LOG={os.environ.get('TGS_BENCH_SHIM_LOG')!r}: "
                         f"expected one of {', '.join(SHIM_LOG_LEVELS)}")
    return level


def pyplot():
    """matplotlib's pyplot, drawing to files only (no display is needed or used). Raises
    ImportError without matplotlib: `Outputs.write` then says how to get the plots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def medians_and_samples(ax, rows: dict[str, tuple[float, Sequence[float]]], target: float, target_label: str,
                        unit: str) -> None:
    """One horizontal bar a row, its median, with each of its samples a dot on it, and a
    dashed line at `target`; the first row on top."""
    for i, (median_value, samples) in enumerate(rows.values()):
        ax.barh(i, median_value, color="C0", alpha=0.5)
        ax.plot(samples, [i] * len(samples), "k.", ms=3)
    ax.axvline(target, color="gray", ls="--", lw=0.8, label=target_label)
    ax.set_yticks(range(len(rows)), list(rows), fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.legend(fontsize=7, loc="lower right")


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


@dataclass
class Outputs:
    name: str
    json_path: Path | None = None

    @property
    def dir(self) -> Path:
        return RESULTS / self.name

    def write(self, result: dict, markdown: str, echo: Echo,
              plots: dict[str, Callable[[], object]] | None = None) -> list[Path]:
        """JSON and Markdown first (never lost), then each plot, drawn only now: without
        matplotlib the plots are skipped with a line that says how to get them."""
        self.dir.mkdir(parents=True, exist_ok=True)
        paths = []
        jp = self.json_path or self.dir / f"{self.name}.json"
        jp.parent.mkdir(parents=True, exist_ok=True)
        jp.write_text(json.dumps(result, indent=2) + "\n")
        paths.append(jp)
        md = self.dir / f"{self.name}.md"
        md.write_text(markdown + "\n")
        paths.append(md)
        skipped = None
        for fname, draw in (plots or {}).items():
            try:
                fig = draw()
            except ImportError as e:
                skipped = f"no plots: {e.name or 'matplotlib'} is not installed (pip install 'tgs-runtime[bench]')"
                break
            p = self.dir / fname
            fig.savefig(p, dpi=110, bbox_inches="tight")
            paths.append(p)
        echo("\n" + markdown)
        if skipped:
            echo("\n" + skipped)
        echo("\nwrote " + ", ".join(str(p) for p in paths))
        return paths


@contextlib.contextmanager
def standalone_containers(uuids: list[str], classes: dict[str, proto.Class],
                          budget: Callable[[str, ControlBlock], None] | None = None) -> Iterator[dict[str, Path]]:
    """Container directories made as tgsd makes them, with a fresh heartbeat and no socket:
    for measuring the shim's own cost where tgsd's behaviour does not matter. `budget(name,
    block)` sets each container's budgets."""
    with tempfile.TemporaryDirectory(prefix="tgs-bench-") as d:
        paths = StatePaths(Path(d))
        acts = []
        for u in uuids:
            paths.activity(u).parent.mkdir(parents=True, exist_ok=True)
            acts.append(ActivityFile.create(paths.activity(u)))
        blocks, dirs = [], {}
        for name, klass in classes.items():
            cp = paths.container(name)
            (cp.dir / proto.ACTIVITY_DIR).mkdir(parents=True)
            for u in uuids:
                os.link(paths.activity(u), cp.activity(u))
            cb = ControlBlock.create(cp.control, klass, uuids)
            if budget:
                budget(name, cb)
            blocks.append(cb)
            dirs[name] = cp.dir
        def beat() -> None:
            for cb in blocks:
                cb.heartbeat()

        try:
            with every(0.1, beat):
                yield dirs
        finally:
            for x in blocks + acts:
                x.close()


@contextlib.contextmanager
def every(period: float, fn: Callable[[], None]) -> Iterator[None]:
    """Calls `fn` every `period` seconds, in a thread of its own, while the block runs."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            fn()
            stop.wait(period)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(15)
