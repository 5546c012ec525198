"""`tgs bench dynamics`: production's load changes mid-run; how fast each controller follows.

One production container runs a schedule of phases (25 % duty, then 75 %, then nothing,
then 50 %), one GPU-bound opportunistic job runs throughout. After each change: seconds
until production is back within 3 % of its solo throughput at the new duty (and stays),
and seconds until opportunistic work has >= 0.8 of the idle time (and keeps it), for
`fast` and `tgs-paper`, side by side in one run (TGS_BENCH_CONTROLLERS=fast: one).
Target: <= 5 s."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import Echo, Outputs, controllers, machine, table
from bench.lab import Job, Lab, opportunistic, production

TOLERANCE = 0.03
IDLE_SHARE = 0.8
STEP = 0.25   # seconds between evaluations
REPORT_S = 0.25  # the jobs report this often
SPAN = 1.0    # the rolling window throughput is judged on


@dataclass(frozen=True)
class Phase:
    name: str
    duty: float | None  # None: no production job


SCHEDULE = (Phase("25 % duty", 0.25), Phase("75 % duty", 0.75), Phase("idle", None), Phase("50 % duty", 0.5))


def settle(job: Job, start: float, end: float, ok) -> float | None:
    """Seconds from `start` until the job's rolling throughput is ok for the rest of [start, end]."""
    if job.arrivals:
        end = min(end, job.arrivals[-1])  # a job killed at the end reports no further
    t, last_bad = start + SPAN, None
    while t <= end - 1e-9:
        r = job.rate_between(t - SPAN, t)
        if not (r == r) or not ok(r):  # NaN: no report yet counts as not ok
            last_bad = t
        t += STEP
    if last_bad is None:
        return SPAN  # fine from the first full window on
    return None if last_bad >= end - STEP - 1e-9 else last_bad + STEP - start


def run(echo: Echo = print, quick: bool = False, json_path: Path | None = None) -> dict:
    phase_s = 10.0 if quick else 20.0
    wanted = [c for c in ("fast", "tgs-paper") if c in controllers()]
    solo: dict[str, float] = {}
    with Lab() as lab:
        gpu = lab.gpu_label
        echo(f"dynamics on {gpu}: solo throughputs")
        j = lab.run(opportunistic(4, report_s=REPORT_S), "solo-opp")
        j.wait()
        solo["opportunistic"] = j.rate(1, 4)
        for d in sorted({p.duty for p in SCHEDULE if p.duty}):
            j = lab.run(production(d, 4, report_s=REPORT_S, warmup_s=0), f"solo-{d}")
            j.wait()
            solo[str(d)] = j.rate(1, 4)
        echo("  " + ", ".join(f"{k}: {v:.1f} it/s" for k, v in solo.items()))
    runs: dict = {}
    for controller in wanted:
        with Lab(tgsd={"control": {"controller": controller}}) as lab:
            prod_c, opp_c = lab.container("production"), lab.container("opportunistic")
            total = phase_s * len(SCHEDULE) + 60  # outlives the schedule; killed at its end
            opp = lab.run(opportunistic(total, report_s=REPORT_S), f"{controller}-opp", opp_c)
            time.sleep(2)
            t0 = time.monotonic()
            phases = []
            for ph in SCHEDULE:
                start = time.monotonic()
                job = lab.run(production(ph.duty, phase_s, report_s=REPORT_S, warmup_s=0), f"{controller}-{ph.name}",
                                 prod_c) if ph.duty else None
                if job:
                    job.wait(phase_s + 60)
                else:
                    time.sleep(phase_s)
                phases.append((ph, start, time.monotonic(), job))
            opp.kill()
            opp.wait()
            out = []
            for ph, start, end, job in phases:
                idle = 1 - (ph.duty or 0)
                row = {"phase": ph.name, "start_s": round(start - t0, 2),
                       "production_s": None if job is None else settle(
                           job, start, end, lambda r, d=ph.duty: r >= (1 - TOLERANCE) * solo[str(d)]),
                       "opportunistic_s": settle(opp, start, end,
                                                 lambda r, i=idle: r >= IDLE_SHARE * i * solo["opportunistic"])}
                out.append(row)
            series = {"production": [[(t - t0, r.iterations_per_s / solo[str(ph.duty)])
                                      for t, r in zip(job.arrivals, job.reports) if not r.summary]
                                     for ph, _, _, job in phases if job],  # one segment per job
                      "opportunistic": [(t - t0, r.iterations_per_s / solo["opportunistic"])
                                        for t, r in zip(opp.arrivals, opp.reports) if not r.summary]}
            runs[controller] = {"phases": out, "series": series}
            echo(f"  {controller}: " + "; ".join(
                f"{r['phase']}: production {fmt(r['production_s'])}, opportunistic {fmt(r['opportunistic_s'])}"
                for r in out))
    rows = [[c, r["phase"], "-" if r["phase"] == "idle" else fmt(r["production_s"]), fmt(r["opportunistic_s"])]
            for c, v in runs.items() for r in v["phases"]]
    result = {"benchmark": "dynamics", "simulated": gpu != "real GPU", "machine": machine(gpu), "quick": quick,
              "phase_s": phase_s, "solo": solo, "runs": runs, "target_s": 5}
    md = (f"### dynamics: seconds until each side settles after production's load changes ({gpu}, "
          f"{result['machine']['date']}, commit {result['machine']['commit']})\n\n"
          + table(["controller", "phase", "production back within 3 %", "opportunistic >= 0.8 of idle"], rows)
          + f"\n\nPhases of {phase_s:g} s; throughput judged on a rolling {SPAN:g} s window every {STEP:g} s; "
          "'never' = not settled by the end of the phase; '-' = no production job. Target: <= 5 s.")
    Outputs("dynamics", json_path).write(result, md, echo, {"dynamics.png": lambda: plot(runs, phase_s)})
    return result


def fmt(s: float | None) -> str:
    return "never" if s is None else f"{s:.1f} s"


def plot(runs: dict, phase_s: float):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(len(runs), 1, figsize=(10, 2.8 * len(runs)), sharex=True, squeeze=False)
    axes = grid[:, 0]  # one controller or two
    for ax, (controller, v) in zip(axes, runs.items()):
        for i, seg in enumerate(v["series"]["production"]):
            ax.plot([p[0] for p in seg], [p[1] for p in seg], color="C0", lw=1,
                    label="production / solo" if i == 0 else None)
        pts = v["series"]["opportunistic"]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], color="C1", lw=1, label="opportunistic / solo")
        for r in v["phases"]:
            ax.axvline(r["start_s"], color="gray", lw=0.6, ls=":")
            ax.text(r["start_s"] + 0.3, 1.12, r["phase"], fontsize=7)
        ax.axhline(1 - TOLERANCE, color="gray", lw=0.6, ls="--")
        ax.set_ylim(0, 1.25)
        ax.set_title(controller, fontsize=9)
        ax.set_ylabel("throughput / solo")
    axes[0].legend(fontsize=7, loc="lower right")
    axes[-1].set_xlabel("seconds")
    fig.tight_layout()
    return fig
