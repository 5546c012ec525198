"""`tgs bench isolation`: the TGS paper's main experiment.

A production job at 25/50/75 % duty beside a GPU-bound opportunistic one, under four
settings, each measured in the same run: exclusive (each alone), co-execution (both, no
control), tgs-paper (the original TGS controller) and fast (ours). Figures: production
ratio (shared / solo), opportunistic / its exclusive, share of idle time (opportunistic
ratio / (1 - duty)), GPU busy fraction, on simgpu a twin of the production job alone on a
second simulated GPU at the same moments (a control for the machine), and the host's CPUs
(busy, and stolen by its hypervisor: a shared VM's slow stretches). Targets (fast):
production >= 0.97 while opportunistic gets >= 0.8 of the idle time. Four more rows,
`fast` at 50 % duty beside an opportunistic job of 20 us kernels (as short as most of a
PyTorch job's), beside one of 10 us kernels whose iterations end in ten of 2 ms (a
backward pass's matmuls), and beside each of those on 5,000 grid sizes in turn (a
framework's dynamic shapes: every kernel new to the shim), show that the in-flight bound
neither starves short kernels nor lets a run of long ones queue up behind production, and
that anticipation does not start a long kernel it has never timed just before production
is due. A fifth, beside 100 us kernels
with 3 ms of host work in the middle of each iteration (a framework's Python between its
launches), shows the bound deepening where production holds, so that the GPU runs what
was queued while the job works on the host. TGS_BENCH_CONTROLLERS=fast (a comma list)
runs only those controllers, for a shorter run."""
from __future__ import annotations

import time
from pathlib import Path

from bench.common import Echo, HostCpu, Outputs, controllers, machine, pyplot, table
from bench.lab import Lab, opportunistic, production, twin_gpu
from tgs_runtime.workload import Workload

DUTIES = (0.25, 0.5, 0.75)
REPORT_S = 0.25
SHORT_DUTY = 0.5


def short_kernels(seconds: float, **kw) -> Workload:
    """GPU-bound, 500 kernels of 20 us per iteration."""
    return Workload(kernel_us=20, kernels=500, seconds=seconds, **kw)


def dynamic_shapes(seconds: float, **kw) -> Workload:
    """GPU-bound, 500 kernels of 20 us per iteration, on 5,000 grid sizes in turn."""
    return Workload(kernel_us=20, kernels=500, shapes=5000, seconds=seconds, **kw)


def mixed_kernels(seconds: float, **kw) -> Workload:
    """GPU-bound, 490 kernels of 10 us and then 10 of 2 ms per iteration."""
    return Workload(kernel_us=10, kernels=500, long_kernels=10, long_us=2000, seconds=seconds, **kw)


def mixed_dynamic_shapes(seconds: float, **kw) -> Workload:
    """The mixed job, each kind of kernel on 5,000 grid sizes in turn."""
    return mixed_kernels(seconds, shapes=5000, **kw)


def host_work(seconds: float, **kw) -> Workload:
    """100 kernels of 100 us per iteration, with 3 ms of host work after the first 50."""
    return Workload(kernel_us=100, kernels=100, host_us=3000, seconds=seconds, **kw)


# rows of `fast` at SHORT_DUTY beside other opportunistic jobs: name, the job, and the
# window measured (seconds into the run; None: the last two thirds of `fast`'s run). The
# host-work row is measured from 12 s to 24 s in either mode: its subject, the in-flight
# bound deepening where production holds, takes about 11 s to reach eight (a profile,
# then 5 s at each of two and four).
KERNEL_ROWS = (("fast, 20 us kernels", short_kernels, None),
               ("fast, 20 us kernels, 5,000 shapes", dynamic_shapes, None),
               ("fast, 10 us + 2 ms kernels", mixed_kernels, None),
               ("fast, 10 us + 2 ms kernels, 5,000 shapes", mixed_dynamic_shapes, None),
               ("fast, 100 us kernels + 3 ms host work", host_work, (12.0, 24.0)))


def measure(lab: Lab, jobs: dict, t0: float, t1: float) -> dict:
    """Runs until t1 seconds into the jobs, returns their rates over [t0, t1], the engine's
    busy fraction and the host's CPUs (`HostCpu.share`: a shared VM's slow stretch shows
    as time stolen)."""
    start = min(j.started for j in jobs.values())
    time.sleep(max(0.0, start + t0 - time.monotonic()))
    before, cpu = lab.snapshot(), HostCpu.now()
    time.sleep(max(0.0, start + t1 - time.monotonic()))
    after, host = lab.snapshot(), cpu.share(HostCpu.now())
    for j in jobs.values():
        j.wait()
    busy = lab.busy(before, after)
    return {"rates": {k: j.rate(t0, t1) for k, j in jobs.items()},
            "busy_fraction": busy.get("(all)", 0.0) / (t1 - t0) if busy else None, "host_cpu": host}


def twinned(jobs: dict, twin: Lab | None, duty: float, seconds: float, label: str) -> dict:
    """`jobs`, with production's twin (the same job, alone on a second simulated GPU) under
    the key "twin" where there is one (`twin_gpu`)."""
    if twin:
        jobs["twin"] = twin.run(production(duty, seconds, report_s=REPORT_S), f"twin-{label}")
    return jobs


def run(echo: Echo = print, quick: bool = False, json_path: Path | None = None) -> dict:
    scale = 0.4 if quick else 1.0
    ex_s, co_s, fast_s, paper_s = 12 * scale, 14 * scale, 18 * scale, 45 * scale
    results: dict = {"settings": {}, "solo": {}}
    wanted = controllers()
    gpu = None
    with twin_gpu() as twin:  # production's twin alone beside each shared setting
        with Lab() as lab:
            gpu = lab.gpu_label
            echo(f"isolation on {gpu}: exclusive runs")
            opp = measure(lab, {"opp": lab.run(opportunistic(ex_s, report_s=REPORT_S), "excl-opp")}, ex_s / 4, ex_s)
            results["solo"]["opportunistic"] = opp["rates"]["opp"]
            for name, job, _ in KERNEL_ROWS if "fast" in wanted else ():
                r = measure(lab, {"opp": lab.run(job(ex_s, report_s=REPORT_S), f"excl-{job.__name__}")}, ex_s / 4, ex_s)
                results["solo"][name] = r["rates"]["opp"]
                echo(f"  opportunistic job of the row '{name}' alone: {results['solo'][name]:.1f} it/s")
            for d in DUTIES:
                r = measure(lab, {"prod": lab.run(production(d, ex_s, report_s=REPORT_S), f"excl-prod-{d}")},
                            ex_s / 4, ex_s)
                results["solo"][str(d)] = {"production": r["rates"]["prod"], "busy_fraction": r["busy_fraction"]}
                echo(f"  production at {d:.0%} duty alone: {r['rates']['prod']:.1f} it/s")
            echo(f"  opportunistic alone: {results['solo']['opportunistic']:.1f} it/s")
            for d in DUTIES:
                jobs = twinned({"prod": lab.run(production(d, co_s, report_s=REPORT_S), f"co-prod-{d}"),
                                "opp": lab.run(opportunistic(co_s, report_s=REPORT_S), f"co-opp-{d}")},
                               twin, d, co_s, f"co-{d}")
                results["settings"].setdefault("co-execution", {})[str(d)] = measure(lab, jobs, co_s / 4, co_s)
                echo(f"  co-execution at {d:.0%}: {results['settings']['co-execution'][str(d)]['rates']}")
        for name, controller, seconds, warm in (("tgs-paper", "tgs-paper", paper_s, 0.5),
                                                ("fast", "fast", fast_s, 1 / 3)):
            if name not in wanted:
                continue
            for d in DUTIES:
                with Lab(tgsd={"control": {"controller": controller}}) as lab:
                    prod_c, opp_c = lab.container("production"), lab.container("opportunistic")
                    jobs = twinned({"prod": lab.run(production(d, seconds, report_s=REPORT_S), f"{name}-prod-{d}",
                                                    prod_c),
                                    "opp": lab.run(opportunistic(seconds, report_s=REPORT_S), f"{name}-opp-{d}",
                                                   opp_c)},
                                   twin, d, seconds, f"{name}-{d}")
                    results["settings"].setdefault(name, {})[str(d)] = measure(lab, jobs, seconds * warm, seconds)
                    echo(f"  {name} at {d:.0%}: {results['settings'][name][str(d)]['rates']}")
        for name, job, window in KERNEL_ROWS if "fast" in wanted else ():
            t0, t1 = window or (fast_s / 3, fast_s)
            with Lab(tgsd={"control": {"controller": "fast"}}) as lab:
                prod_c, opp_c = lab.container("production"), lab.container("opportunistic")
                jobs = twinned({"prod": lab.run(production(SHORT_DUTY, t1, report_s=REPORT_S), f"{job.__name__}-prod",
                                                prod_c),
                                "opp": lab.run(job(t1, report_s=REPORT_S), f"{job.__name__}-opp", opp_c)},
                               twin, SHORT_DUTY, t1, job.__name__)
                results["settings"][name] = {str(SHORT_DUTY): measure(lab, jobs, t0, t1)}
                echo(f"  {name} at {SHORT_DUTY:.0%}: {results['settings'][name][str(SHORT_DUTY)]['rates']}")
    rows, summary = [], {}
    for name, per in results["settings"].items():
        for d in [d for d in DUTIES if str(d) in per]:
            m = per[str(d)]
            prod_ratio = m["rates"]["prod"] / results["solo"][str(d)]["production"]
            opp_ratio = m["rates"]["opp"] / results["solo"].get(name, results["solo"]["opportunistic"])
            idle = opp_ratio / (1 - d)
            twin = m["rates"].get("twin")
            twin_ratio = None if twin is None else round(twin / results["solo"][str(d)]["production"], 3)
            summary.setdefault(name, {})[str(d)] = {"production_ratio": round(prod_ratio, 3),
                                                    "twin_ratio": twin_ratio,
                                                    "opportunistic_ratio": round(opp_ratio, 3),
                                                    "idle_share": round(idle, 3),
                                                    "busy_fraction": None if m["busy_fraction"] is None else round(m["busy_fraction"], 3),
                                                    "host_cpu": m["host_cpu"]}
            s = summary[name][str(d)]
            rows.append([name, f"{d:.0%}", f"{prod_ratio:.3f}", f"{opp_ratio:.3f}", f"{idle:.3f}",
                         "-" if s["busy_fraction"] is None else f"{s['busy_fraction']:.2f}",
                         "-" if twin_ratio is None else f"{twin_ratio:.3f}", HostCpu.in_words(s["host_cpu"])])
    result = {"benchmark": "isolation", "simulated": gpu != "real GPU", "machine": machine(gpu), "quick": quick,
              "raw": results, "summary": summary,
              "targets": {name: {"production_ratio": 0.97, "idle_share": 0.8}
                          for name in ("fast", *(n for n, _, _ in KERNEL_ROWS))}}
    md = (f"### isolation: production protection and idle time reclaimed ({gpu}, {result['machine']['date']}, "
          f"commit {result['machine']['commit']})\n\n"
          + table(["setting", "production duty", "production / solo", "opportunistic / exclusive",
                   "share of idle time", "GPU busy", "a twin alone / solo", "host CPUs busy / stolen"], rows)
          + "\n\nProduction: 10 kernels per 20 ms iteration at the duty shown; opportunistic: GPU-bound 1 ms kernels "
          "(the last five rows: 500 kernels of 20 us per iteration; the same on 5,000 grid sizes in turn; "
          "490 of 10 us and then 10 of 2 ms; the same on 5,000 grid sizes of each kind; 100 of 100 us with "
          "3 ms of host work after the first 50, measured from 12 s to 24 s, once the in-flight bound has "
          "deepened). "
          "A twin alone (simgpu only): the production job started at the same moment on a second simulated GPU "
          "with nothing beside it, no shim and no tgsd, measured over the same window: where it reads low too, "
          "the machine slowed production, not the work beside it. "
          "Host CPUs: the part of all the machine's CPU time in the measured window that was busy, and that its "
          "hypervisor gave to other guests (a shared VM's slow stretch). "
          "Targets for fast: production >= 0.97, share of idle time >= 0.8.")
    Outputs("isolation", json_path).write(result, md, echo, {"isolation.png": lambda: plot(summary)})
    return result


def plot(summary: dict):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    names = list(summary)
    width = 0.8 / len(names)
    for k, (key, title) in enumerate((("production_ratio", "production / solo"), ("idle_share", "share of idle time"))):
        ax = axes[k]
        for i, name in enumerate(names):
            ys = [summary[name][str(d)][key] if str(d) in summary[name] else float("nan") for d in DUTIES]
            ax.bar([j + i * width for j in range(len(DUTIES))], ys, width, label=name)
        ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(DUTIES))], [f"{d:.0%}" for d in DUTIES])
        ax.set_xlabel("production duty")
        ax.set_title(title)
        ax.axhline(0.97 if key == "production_ratio" else 0.8, color="gray", ls="--", lw=0.8)
        ax.set_ylim(0, 1.15)
    axes[0].legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return fig
