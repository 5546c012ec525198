"""`tgs bench oversubscription`: production plus opportunistic memory above the budget.

A production job (a third of each iteration busy) and a GPU-bound opportunistic one, each
holding more than half of the GPU memory they share, with --verify (every kernel's
touches are checked at the end). Settings, side by side in one run:
  exclusive       each alone, plain device memory (the reference throughputs)
  co-execution    both on plain managed memory, no TGS: the driver's eviction decides (thrashing)
  advice only     TGS with `[memory] orders = false`: allocations become managed memory with
                  the class's advice, nothing is moved explicitly (the original TGS code's way)
  TGS             TGS as shipped: tgsd orders opportunistic memory to the host and back
Figures: throughput of each / its exclusive, pages moved, and whether anything failed;
on simgpu, a twin of the production job alone on a second simulated GPU, started at the
same moment and measured over the same window (a control for the machine: production
alone moved by up to 8 % from run to run on a 2-core VM, and the exclusive runs are
taken once, before the others), and the host's CPUs over that window.
Targets: production >= 0.95 with TGS; opportunistic >= 10x co-execution's where
co-execution thrashes.

On a real GPU only the TGS setting runs, under a tgsd budget far below the card's memory:
the driver thrashes only past the card's own memory, which these runs never ask for."""
from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path

from bench.common import Echo, HostCpu, Outputs, machine, pyplot, table
from bench.lab import Job, Lab, twin_gpu
from tgs_runtime import sim
from tgs_runtime.workload import Workload

SIM_MEMORY = "2G"


def shapes(real: bool, seconds: float) -> tuple[Workload, Workload]:
    # each job holds 60 % of the memory: together 120 %
    param, act = (9000, 3000) if real else (800, 400)  # real: of a 20G budget
    prod = Workload(kernel_us=500, kernels=4, gap_us=4000, seconds=seconds, param_mb=param, act_mb=act,
                    verify=True, report_s=0.5)
    opp = Workload(kernel_us=500, kernels=4, seconds=seconds, param_mb=param, act_mb=act, verify=True,
                   report_s=0.5)
    return prod, opp


def pair(lab: Lab, prod: Workload, opp: Workload, name: str, containers: tuple[dict | None, dict | None],
         twin: Lab | None = None, twin_prod: Workload | None = None) -> dict:
    """Opportunistic first (it fills the GPU), production a second later, as in a shared
    cluster. The opportunistic job runs until production has ended, then is stopped (SIGINT:
    it still verifies), so that the two iterate together however long either one's set-up
    takes: on an H200, with both running for the same time, the opportunistic job's
    iterations were over before production had written its 12,000 MiB pattern, and there was
    no time together to measure. Rates are taken over the time both iterated (`together`).
    With a `twin` Lab, `twin_prod` (production as the exclusive run had it) starts there
    at the same moment as production, alone, runs until production has ended, and is
    measured over the same window; with it, the host's CPUs over that window."""
    o = lab.run(replace(opp, seconds=opp.seconds + OUTLAST_S), f"{name}-opp", containers[1])
    time.sleep(1.0)
    p = lab.run(prod, f"{name}-prod", containers[0])
    tw = (twin.run(replace(twin_prod or prod, seconds=prod.seconds + OUTLAST_S), f"twin-{name}")
          if twin else None)
    due = p.started + prod.seconds + 120  # then production, still running, has hung
    # (when, simgpu's accounting, the host's CPUs) every half second while it runs: none on a real GPU
    marks: list[tuple[float, dict, HostCpu]] = []
    while p.proc.poll() is None and time.monotonic() < due:
        snap = lab.snapshot()
        if snap is None:
            break
        marks.append((time.monotonic(), snap, HostCpu.now()))
        time.sleep(0.5)
    out = {"prod": outcome(p, max(0.1, due - time.monotonic()))}
    o.stop()
    out["opp"] = outcome(o, 120)
    jobs = {"prod": p, "opp": o}
    span = together(list(jobs.values()), SETTLE)
    if tw:
        tw.stop()
        out["twin"] = outcome(tw, 120)
        jobs["twin"] = tw
    for k, j in jobs.items():
        out[k]["rate"] = rate_over(j, span)
    after = lab.snapshot()
    within = [(snap, cpu) for t, snap, cpu in marks if span and span[0] <= t <= span[1]]
    inside = [snap for snap, _ in within]
    if len(within) >= 2:
        out["host_cpu"] = within[0][1].share(within[-1][1])
    if after is not None:
        ctx = sim.contexts(after)
        bus, busy = ((sim.between(inside[0], inside[-1], field) if len(inside) >= 2 else {})
                     for field in ("migrate_ns", "busy_ns"))
        for k, label in (("prod", f"{name}-prod"), ("opp", f"{name}-opp")):
            c = ctx.get(label, {})
            out[k]["pages_in"] = c.get("pages_in")
            out[k]["pages_out"] = c.get("pages_out")
            # of its engine time while both ran, the part its kernels spent moving or reading memory over the bus
            out[k]["bus_share"] = round(bus[label] / busy[label], 3) if busy.get(label) else None
    return out


def outcome(j: Job, timeout: float) -> dict:
    """How one job ended: exit status (None: it hung, and was killed `timeout` s after it
    started waiting), checksum, last error and stderr."""
    rc = j.finish(timeout)
    s = j.summary
    return {"rc": rc, "checksum_ok": None if s is None else s.checksum_ok,
            "error": (j.errors or [""])[-1][:300], "stderr": j.stderr[-600:]}


# The part of the jobs' time together that is skipped: the controller's start, and the
# opportunistic job's memory being moved out as production's arrives.
SETTLE = 0.3
OUTLAST_S = 600.0  # how much longer than production the opportunistic job may run: it is stopped when production ends


def together(jobs: list[Job], settle: float) -> tuple[float, float] | None:
    """The wall-clock span in which every job was iterating (from the latest first report
    to the earliest last periodic one), less its first `settle` part; None if there was
    none. Each job's own clock will not do: production writes its memory's pattern before
    it iterates (seconds, under thrashing), and the job that ends first leaves the other
    alone, so a window on each job's clock took in moments when only one ran (in
    co-execution, 11.2 it/s measured for a production job that made 1.6 while both ran)."""
    runs = [[t for t, r in zip(j.arrivals, j.reports) if not r.summary] for j in jobs]
    if not all(runs):
        return None
    start, end = max(r[0] for r in runs), min(r[-1] for r in runs)
    if end <= start:
        return None
    return start + settle * (end - start), end


def rate_over(j: Job, span: tuple[float, float] | None) -> float | None:
    """A job's iterations per second over `span` (`together`); None where there is no span,
    or the job did not report through it (a twin whose run ended first)."""
    rate = j.rate_between(*span) if span else math.nan
    return None if math.isnan(rate) else rate


def failed(r: dict) -> bool:
    return r["rc"] != 0 or r["checksum_ok"] is not True


def ratio(rate: float | None, exclusive: float) -> float | None:
    """A rate as a fraction of the exclusive one; None where there is none (the jobs never
    iterated together)."""
    return None if rate is None or not exclusive else round(rate / exclusive, 3)


def shown(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def summarise(res: dict) -> tuple[list[list[str]], dict]:
    """The table's rows and the summary of each setting's raw results against the
    exclusive runs. The opportunistic job's multiple of co-execution's comes from the two
    rates themselves: taken from the ratios as rounded for the table (co-execution's about
    0.003), it was off by up to a fifth (3.7x for 3.3x, 5.7x for 4.9x)."""
    ex = res["exclusive"]
    rows, summary = [], {}
    for name in [k for k in res if k != "exclusive"]:
        r = res[name]
        s = {"production_ratio": ratio(r["prod"]["rate"], ex["prod"]["rate"]),
             "opportunistic_ratio": ratio(r["opp"]["rate"], ex["opp"]["rate"]),
             "failed": [k for k in ("prod", "opp") if failed(r[k])],
             "pages_moved": {k: (r[k].get("pages_in") or 0) + (r[k].get("pages_out") or 0) for k in ("prod", "opp")},
             "opportunistic_bus_share": r["opp"].get("bus_share"),
             "twin_ratio": ratio(r.get("twin", {}).get("rate"), ex["prod"]["rate"]),
             "host_cpu": r.get("host_cpu")}
        summary[name] = s
        failures = ", ".join(k + (" (hung)" if r[k]["rc"] is None else "") for k in s["failed"]) or "none"
        rows.append([name, shown(s["production_ratio"]), shown(s["opportunistic_ratio"]), failures,
                     str(s["pages_moved"]["prod"]), str(s["pages_moved"]["opp"]),
                     shown(s["opportunistic_bus_share"], 2), shown(s["twin_ratio"]),
                     HostCpu.in_words(s["host_cpu"] or {})])
    co = res.get("co-execution")
    if co and "TGS" in res and co["opp"]["rate"] and res["TGS"]["opp"]["rate"] is not None:
        summary["TGS"]["opportunistic_vs_co_execution"] = round(res["TGS"]["opp"]["rate"] / co["opp"]["rate"], 1)
    return rows, summary


def run(echo: Echo = print, quick: bool = False, json_path: Path | None = None) -> dict:
    seconds = 8.0 if quick else 16.0
    window = (seconds * 0.3, seconds * 0.95)
    res: dict = {}
    lab = Lab(memory=SIM_MEMORY)
    real = lab.real
    gpu = lab.gpu_label
    prod, opp = shapes(real, seconds)
    settings = ([("TGS", {"memory": {"budget": "20G"}})] if real
                else [("advice only", {"memory": {"orders": False}}), ("TGS", {})])
    with twin_gpu() as twin:  # production's twin alone beside each pair
        with lab:
            echo(f"oversubscription on {gpu}: exclusive runs")
            for k, w in (("prod", prod), ("opp", opp)):
                j = lab.run(w, f"excl-{k}")
                res.setdefault("exclusive", {})[k] = {**outcome(j, seconds + 120),
                                                      "rate": j.rate(*window) if j.reports else 0.0}
            echo(f"  exclusive: production {res['exclusive']['prod']['rate']:.1f} it/s, "
                 f"opportunistic {res['exclusive']['opp']['rate']:.1f} it/s")
            if not real:
                res["co-execution"] = pair(lab, replace(prod, managed=True),
                                           replace(opp, managed=True), "co", (None, None), twin, prod)
                echo(f"  co-execution (plain managed memory): {brief(res['co-execution'])}")
        for name, cfg in settings:
            with Lab(memory=SIM_MEMORY, tgsd=cfg) as lab:
                containers = (lab.container("production"), lab.container("opportunistic"))
                res[name] = pair(lab, prod, opp, name.split()[0], containers, twin)
                echo(f"  {name}: {brief(res[name])}")
    rows, summary = summarise(res)
    result = {"benchmark": "oversubscription", "simulated": not real, "machine": machine(gpu), "quick": quick,
              "memory": "20G tgsd budget" if real else f"{SIM_MEMORY} simulated GPU",
              "workloads": {"production": prod.args(), "opportunistic": opp.args()}, "raw": res, "summary": summary,
              "targets": {"TGS": {"production_ratio": 0.95, "opportunistic_vs_co_execution": 10}}}
    vs = summary["TGS"].get("opportunistic_vs_co_execution")
    md = (f"### oversubscription: both jobs hold 60 % of {result['memory']} ({gpu}, {result['machine']['date']}, "
          f"commit {result['machine']['commit']})\n\n"
          + table(["setting", "production / exclusive", "opportunistic / exclusive", "failed",
                   "production pages moved", "opportunistic pages moved", "opportunistic on the bus",
                   "production's twin alone / exclusive", "host CPUs busy / stolen"], rows)
          + ("" if vs is None else f"\n\nTGS opportunistic throughput: {vs}x co-execution's.")
          + "".join(f"\n\n{name}: the two jobs never iterated together, so there is no rate to compare ('-')."
                    for name, r in res.items() if name != "exclusive" and r["prod"]["rate"] is None)
          + "".join(f"\n\n{name}, {k} failed: {r[k]['error'] or 'rc ' + str(r[k]['rc'])}" for name, r in res.items()
                    if name != "exclusive" for k in ("prod", "opp") if failed(r[k]))
          + "\n\nFailed: non-zero exit, a checksum mismatch (--verify), or hung (killed 120 s after it was due to "
          "end). Pages: 2 MiB, both directions "
          "(simgpu's accounting; '0' on a real GPU, where they are not counted). "
          "Rates: while both jobs iterated, less the first 30 % of that time. "
          "On the bus: the share of the opportunistic job's engine time in that window that its "
          "kernels spent moving or reading its memory over the bus (simgpu's accounting; '-' on a real GPU). "
          "Production's twin alone (simgpu only): the production job as the exclusive run had it, started at the "
          "same moment on a second simulated GPU with nothing beside it, no shim and no tgsd, measured over the "
          "same window: where it reads low too, the machine slowed production, not the work beside it. "
          "Host CPUs (simgpu only): the part of all the machine's CPU time in that window that was busy, and that "
          "its hypervisor gave to other guests. "
          "Targets: production >= 0.95, opportunistic >= 10x co-execution's.")
    Outputs("oversubscription", json_path).write(result, md, echo,
                                                 {"oversubscription.png": lambda: plot(result)})
    return result


def plot(result: dict):
    """Each setting's throughput against exclusive, production's and the opportunistic
    job's, on a log scale (co-execution thrashes to a hundredth), with the targets; and on
    simgpu the pages each job moved."""
    plt = pyplot()
    summary = result["summary"]
    names = list(summary)
    simulated = result["simulated"]
    fig, grid = plt.subplots(1, 2 if simulated else 1, figsize=(10 if simulated else 5.5, 3.6), squeeze=False)
    axes = grid[0]
    x = range(len(names))

    def pairs(ax, production: list[float], opportunistic: list[float]) -> None:  # two bars a setting
        for k, (ys, label) in enumerate(((production, "production"), (opportunistic, "opportunistic"))):
            ax.bar([i + (k - 0.5) * 0.4 for i in x], ys, 0.4, label=label, color=f"C{k}")

    def ratios(key: str) -> list[float]:
        return [summary[n][key] if summary[n][key] is not None else float("nan") for n in names]

    pairs(axes[0], ratios("production_ratio"), ratios("opportunistic_ratio"))
    axes[0].axhline(0.95, color="C0", ls="--", lw=0.8, label="production's target")
    co = summary.get("co-execution", {}).get("opportunistic_ratio")
    if co:
        axes[0].axhline(10 * co, color="C1", ls="--", lw=0.8, label="10x co-execution's opportunistic")
    axes[0].set_yscale("log")
    axes[0].set_ylim(1e-3, 2)
    axes[0].set_xticks(list(x), names)
    axes[0].set_xlim(-0.75, len(names) - 0.25)  # (a real GPU's one setting is not one wide pair of bars)
    axes[0].set_title("throughput / exclusive")
    axes[0].legend(fontsize=7, loc="lower right")
    if simulated:
        pairs(axes[1], *([max(summary[n]["pages_moved"][key], 0.5) for n in names]  # (0 drawn at the axis)
                         for key in ("prod", "opp")))
        axes[1].set_yscale("log")
        axes[1].set_ylim(0.5, None)
        axes[1].set_xticks(list(x), names)
        axes[1].set_title("2 MiB pages moved over the bus")
        axes[1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def brief(r: dict) -> str:
    return ", ".join(f"{k} {'-' if r[k]['rate'] is None else format(r[k]['rate'], '.1f')} it/s"
                     f"{' FAILED' if failed(r[k]) else ''}" for k in ("prod", "opp", "twin") if k in r)
