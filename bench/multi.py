"""`tgs bench multi`: one production job and three opportunistic jobs of mixed lengths.

Production runs at 50 % duty throughout; three opportunistic jobs of fixed work (GPU-bound,
1 ms kernels; 600, 300 and 100 iterations: 6, 3 and 1 s of the whole GPU) arrive 3 s
apart, longest first, each in its own container. `share = fair` (equal split) against
`share = las` (least attained service first, as in Tiresias), side by side in one run.
Figures: each job's completion time (arrival to exit), their mean, the makespan, and
production's throughput against its solo throughput."""
from __future__ import annotations

import time
from pathlib import Path

from bench.common import Echo, Outputs, machine, pyplot, table
from bench.lab import Lab, opportunistic, production

JOBS = (("long", 600, 0.0), ("medium", 300, 3.0), ("short", 100, 6.0))  # name, iterations, arrival s
REPORT_S = 0.5


def run(echo: Echo = print, quick: bool = False, json_path: Path | None = None) -> dict:
    scale = 0.5 if quick else 1.0
    jobs = [(n, max(int(i * scale), 10), a * scale) for n, i, a in JOBS]
    res: dict = {}
    with Lab() as lab:
        gpu = lab.gpu_label
        j = lab.run(production(0.5, 5, report_s=REPORT_S), "solo-prod")
        j.wait()
        solo = j.rate(1, 5)
        j = lab.run(opportunistic(4, report_s=REPORT_S), "solo-opp")
        j.wait()
        solo_opp = j.rate(1, 4)
        echo(f"multi on {gpu}: production alone {solo:.1f} it/s, an opportunistic job alone {solo_opp:.1f} it/s")
    for share in ("fair", "las"):
        with Lab(tgsd={"control": {"share": share}}) as lab:
            prod = lab.run(production(0.5, 600, report_s=REPORT_S), f"{share}-prod", lab.container("production"))
            time.sleep(2)
            t0 = time.monotonic()
            started, ended = {}, {}
            pending = list(jobs)
            while len(ended) < len(jobs):
                now = time.monotonic() - t0
                while pending and pending[0][2] <= now:
                    name, iters, _ = pending.pop(0)
                    started[name] = (lab.run(opportunistic(600, report_s=REPORT_S, iterations=iters), f"{share}-{name}",
                                             lab.container("opportunistic")), time.monotonic())
                for name, (job, at) in started.items():
                    if name not in ended and job.proc.poll() is not None:
                        ended[name] = time.monotonic()
                        if job.proc.returncode != 0:
                            raise RuntimeError(f"{share}: job {name} failed: {(job.errors or [''])[-1]}")
                if time.monotonic() - t0 > 300:
                    raise RuntimeError(f"{share}: jobs did not finish within 300 s")
                time.sleep(0.02)
            end = time.monotonic()
            time.sleep(0.6)  # production's next report, so that the window closes inside its reports
            prod_rate = prod.rate_between(t0, end)
            prod.kill()
            jct = {name: ended[name] - at for name, (_, at) in started.items()}
            res[share] = {"jct_s": {k: round(v, 2) for k, v in jct.items()},
                          "mean_jct_s": round(sum(jct.values()) / len(jct), 2),
                          "makespan_s": round(max(ended.values()) - t0, 2),
                          "production_ratio": round(prod_rate / solo, 3)}
            echo(f"  {share}: {res[share]}")
    names = [n for n, _, _ in jobs]
    rows = [[share, *[f"{r['jct_s'][n]:.1f}" for n in names], f"{r['mean_jct_s']:.1f}", f"{r['makespan_s']:.1f}",
             f"{r['production_ratio']:.3f}"] for share, r in res.items()]
    result = {"benchmark": "multi", "simulated": gpu != "real GPU", "machine": machine(gpu), "quick": quick,
              "jobs": [{"name": n, "iterations": i, "arrival_s": a} for n, i, a in jobs],
              "solo": {"production": solo, "opportunistic": solo_opp}, "results": res}
    md = (f"### multi: one production job (50 % duty) and three opportunistic jobs, fair against las ({gpu}, "
          f"{result['machine']['date']}, commit {result['machine']['commit']})\n\n"
          + table(["share", *[f"{n} JCT s" for n in names], "mean JCT s", "makespan s", "production / solo"], rows)
          + "\n\nJobs (iterations of 10 x 1 ms kernels; arrival): "
          + ", ".join(f"{n} {i} at {a:g} s" for n, i, a in jobs) + ".")
    Outputs("multi", json_path).write(result, md, echo, {"multi.png": lambda: plot(result)})
    return result


def plot(result: dict):
    """Each share policy's jobs from arrival to completion, one panel each."""
    plt = pyplot()
    jobs = result["jobs"]
    shares = result["results"]
    fig, grid = plt.subplots(len(shares), 1, figsize=(8, 1.1 + 0.5 * len(jobs) * len(shares)), sharex=True,
                             squeeze=False)
    for ax, (share, r) in zip(grid[:, 0], shares.items()):
        for i, job in enumerate(jobs):
            jct = r["jct_s"][job["name"]]
            ax.barh(i, jct, left=job["arrival_s"], color=f"C{i + 1}")
            ax.text(job["arrival_s"] + jct + 0.2, i, f"{jct:.1f} s", va="center", fontsize=7)
        ax.set_yticks(range(len(jobs)), [j["name"] for j in jobs])
        ax.invert_yaxis()
        ax.set_title(f"{share}: mean JCT {r['mean_jct_s']:.1f} s, production {r['production_ratio']:.3f} of solo",
                     fontsize=9)
    grid[-1, 0].set_xlabel("seconds from the first arrival")
    fig.tight_layout()
    return fig
