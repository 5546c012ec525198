"""`tgs bench overhead`: what TGS costs a job that is not throttled, in one table.

Runs `launch` (nanoseconds added to one kernel launch) and `start` (what the tgs runtime
adds to `docker run --rm`) one after the other and puts their figures side by side.
`start` needs root and docker.io; where they are missing its rows say why."""
from __future__ import annotations

from pathlib import Path

from bench import launch, start
from bench.common import Echo, Outputs, machine, table


def run(echo: Echo = print, quick: bool = False, json_path: Path | None = None) -> dict:
    quiet = lambda _line: None  # noqa: E731 - the parts' own tables would repeat this one's
    echo("overhead: launch")
    lr = launch.run(echo=quiet, quick=quick)
    echo("overhead: start")
    try:
        sr, why = start.run(echo=quiet, quick=quick), None
    except Exception as e:  # no docker, not root: say so in the table instead
        sr, why = None, f"{type(e).__name__}: {e}"
    rows = []
    for mode, m in lr["modes"].items():
        if mode == "without the shim":
            continue
        extra = "" if m["added_instructions"] is None else f", {m['added_instructions']:+.0f} instructions"
        added = f"{m['added_ns']:+.1f} ns (fastest runs {m['added_ns_fastest']:+.1f}){extra}"
        rows.append(["kernel launch", mode, added, "<= +100 ns", "yes" if m["added_ns"] <= 100 else "no"])
    if sr:
        for case, c in sr["cases"].items():
            if case == "runc":
                continue
            rows.append(["docker run --rm", case, f"{c['ratio_to_runc']:.3f}x runc ({c['median_ms']:.0f} ms)",
                         "<= 1.15x", "yes" if c["ratio_to_runc"] <= 1.15 else "no"])
    else:
        rows.append(["docker run --rm", "-", f"not measured ({why})", "<= 1.15x", "-"])
    gpu = lr["machine"]["gpu"]
    result = {"benchmark": "overhead", "machine": machine(gpu), "quick": quick, "launch": lr, "start": sr,
              "start_not_measured": why}
    md = (f"### overhead: what TGS adds ({gpu}, {result['machine']['date']}, commit {result['machine']['commit']})\n\n"
          + table(["what", "case", "added", "target", "met"], rows)
          + "\n\nKernel launch: the medians of interleaved runs, and each mode's fastest run against the fastest "
          "without the shim (a shared machine's speed can change from one run to the next). "
          "Details: bench/results/launch/launch.md and bench/results/start/start.md.")
    Outputs("overhead", json_path).write(result, md, echo)
    return result
