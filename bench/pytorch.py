"""`tgs bench pytorch`: real PyTorch training through libtgs.so (needs a GPU and torch).

Production: ResNet-50 training with a CPU gap after each step (a data loader's time), so
the GPU idles part of each iteration. Opportunistic: a GPT-2-small-sized decoder training
flat out. Settings, side by side in one run: exclusive (each alone, no shim), co-execution
(both, no shim), MPS (both clients of a private MPS daemon, no shim: production at normal
priority, opportunistic at below-normal priority on the idle share of the SMs; where
nvidia-cuda-mps-control exists, else the table says why not; bench/mps.py), TGS fast (both
in TGS containers of their class, tgsd of our own with a memory budget far below the
card's), TGS fast with the in-flight bound kept at two (`inflight_deepest = 2`: what
the bound's deepening does for the pair), and kept at eight (`inflight = inflight_deepest =
8`: what a deeper queue itself does for it, without tgsd's trials); each TGS setting in
two windows (one when quick), in turn with the others; and TGS fast beside a ResNet-50 whose
data loader keeps it on its host 2 s a step (a rhythm of its own: tgsd learns it from
production's idle spells and lets opportunistic work run while it is away), against that
job alone, over windows twice as long. TGS_BENCH_PYTORCH_SETTINGS=a,b picks settings by
their short names (co-execution, mps, fast, bound-two, bound-eight, slow-loader; default
all). Figures: production / exclusive,
opportunistic / exclusive, share of idle time (opportunistic ratio / (1 - production's
duty)), a TGS setting's the mean of its windows, with each window's share; the
exclusive ResNet-50's own noise (the spread of its half-second rates, against which tgsd
follows its load); and, for
each TGS window, what tgsd showed (`tgs status` every 0.5 s): how much of each second production's shims counted it
busy and the opportunistic ones waited behind it, whether they watched production, how
much of their work ran beside it, the in-flight bound and the rate."""
from __future__ import annotations

import importlib.util
import os
import sys
import textwrap
import time
from pathlib import Path

from bench import mps
from dataclasses import dataclass, field

from bench.common import Echo, Outputs, chosen, machine, pyplot, table
from bench.lab import ControllerTrace, Job, Lab

HERE = Path(__file__).resolve().parent


def argv(model: str, seconds: float, gap_ms: float = 0, batch: int | None = None) -> list[str]:
    out = [sys.executable, str(HERE / "torch_train.py"), "--model", model, "--seconds", f"{seconds:g}",
           "--warmup-s", "4", "--gap-ms", f"{gap_ms:g}", "--report-s", "0.5"]
    if batch:
        out += ["--batch", str(batch)]
    return out


def window(jobs: dict[str, Job], seconds: float, timeout: float = 240,
           trace: ControllerTrace | None = None, late_s: float = 30,
           spreads: dict[str, float | None] | None = None) -> dict[str, float]:
    """Waits until every job reports, then measures each over the same wall-clock window
    (which `trace`, if given, is told to sum up), once each has reported after its end
    (up to `late_s` later): a job reports after a step, and one whose steps are long (2 s
    on its host) or that was paused at the end (tgsd profiling production gates
    opportunistic work for about a second) had no report there, and read NaN (TGS fast's
    first window on the H200 on 2026-11-30, its end in a profile). `spreads`, where given,
    gets each job's `Job.rate_spread` over the window."""
    deadline = time.monotonic() + timeout
    while any(not j.arrivals for j in jobs.values()):
        dead = [k for k, j in jobs.items() if j.proc.poll() is not None and not j.arrivals]
        if dead or time.monotonic() > deadline:
            for j in jobs.values():
                j.kill()
                j.wait()
            raise RuntimeError("PyTorch job(s) " + ", ".join(dead or list(jobs)) + " did not start: "
                               + " | ".join((jobs[k].errors or [jobs[k].stderr[-800:]])[-1] for k in (dead or jobs)))
        time.sleep(0.2)
    w0 = time.monotonic() + 2
    w1 = w0 + seconds
    if trace is not None:
        trace.span = (w0, w1)
    time.sleep(max(0.0, w1 + 1 - time.monotonic()))
    late = time.monotonic() + late_s
    while not all(j.reported_since(w1) for j in jobs.values()) and time.monotonic() < late:
        time.sleep(0.1)
    rates = {k: j.rate_between(w0, w1) for k, j in jobs.items()}
    if spreads is not None:
        spreads.update({k: j.rate_spread(w0, w1) for k, j in jobs.items()})
    for j in jobs.values():
        j.kill()
        j.wait()
    return rates


def run(echo: Echo = print, quick: bool = False, json_path: Path | None = None) -> dict:
    picked = chosen("TGS_BENCH_PYTORCH_SETTINGS", list(SHORT))
    if importlib.util.find_spec("torch") is None:  # (its jobs import it; found, not loaded here: seconds)
        raise SystemExit("tgs bench pytorch needs PyTorch (pip install torch) and an NVIDIA GPU")
    seconds = 8 if quick else 20
    gap_ms = GAP_MS
    long = 1000  # the jobs run until the window is measured
    tgs = {name: t for name, t in TGS_SETTINGS.items() if t.short in picked}
    res: dict = {}
    with Lab() as lab:
        if not lab.real:
            raise SystemExit("tgs bench pytorch needs an NVIDIA GPU (simgpu runs no PyTorch kernels)")
        echo("pytorch on a real GPU: exclusive runs")
        spread: dict[str, float | None] = {}
        res["excl_prod"] = window({"prod": lab.run(argv("resnet50", long, gap_ms), "excl-prod")}, seconds,
                                  spreads=spread)["prod"]
        res["excl_prod_spread"] = spread["prod"]
        res["excl_opp"] = window({"opp": lab.run(argv("gpt2", long, 0, 8), "excl-opp")}, seconds)["opp"]
        res["excl_prod_nogap"] = window({"prod": lab.run(argv("resnet50", long, 0), "excl-prod-nogap")},
                                        seconds)["prod"]
        echo(f"  resnet50 (gap {gap_ms:g} ms) {res['excl_prod']:.2f} it/s, no gap {res['excl_prod_nogap']:.2f} it/s;"
             f" gpt2 {res['excl_opp']:.2f} it/s; {spread_words(res.get('excl_prod_spread'))}")
        # Production's duty alone: the GPU's share of one step with the gap.
        duty = min(1.0, res["excl_prod"] / res["excl_prod_nogap"])
        for host_ms in sorted({t.host_ms for t in tgs.values()} - {gap_ms}):
            res[alone_key(host_ms)] = window(
                {"prod": lab.run(argv("resnet50", long, host_ms), f"excl-prod-host-{host_ms:g}")},
                seconds * LONG_WINDOWS)["prod"]
            echo(f"  resnet50 on its host {host_ms:g} ms a step: {res[alone_key(host_ms)]:.3f} it/s")
        if "co-execution" in picked:
            r = window({"prod": lab.run(argv("resnet50", long, gap_ms), "co-prod"),
                        "opp": lab.run(argv("gpt2", long, 0, 8), "co-opp")}, seconds)
            res["co-execution"] = r
            echo(f"  co-execution: {r}")
        res["mps_percent"] = mps.opportunistic_percent(duty)
        res["mps_not_run"] = mps.unavailable(lab.real) if "mps" in picked else "not in TGS_BENCH_PYTORCH_SETTINGS"
        if res["mps_not_run"] is None:
            try:
                keep = os.environ.get("TGS_BENCH_LOGS")
                with mps.Mps(lab.dir, Path(keep) if keep else None) as m:
                    res["mps"] = window({
                        "prod": lab.run(argv("resnet50", long, gap_ms), "mps-prod", m.client(mps.Client())),
                        "opp": lab.run(argv("gpt2", long, 0, 8), "mps-opp",
                                       m.client(mps.Client(res["mps_percent"], below_normal=True)))}, seconds)
                echo(f"  MPS (opportunistic on {res['mps_percent']} % of the SMs): {res['mps']}")
            except (RuntimeError, OSError) as e:  # mps.MpsError, or a PyTorch job that did not start
                res["mps_not_run"] = f"failed: {e}"
        if res["mps_not_run"]:
            echo(f"  MPS: not run, {res['mps_not_run']}")
    for i in range(1 if quick else WINDOWS):
        for name, t in tgs.items():
            if i >= t.windows:
                continue
            long_rhythm = t.host_ms != gap_ms
            with Lab(tgsd={"control": {"controller": "fast", **t.control}}) as lab:
                prod_c, opp_c = lab.container("production"), lab.container("opportunistic")
                jobs = {"prod": lab.run(argv("resnet50", long, t.host_ms), "tgs-prod", prod_c),
                        "opp": lab.run(argv("gpt2", long, 0, 8), "tgs-opp", opp_c)}
                # let the controller profile production first (and learn a long rhythm)
                time.sleep((0 if quick else 5) * (2 if long_rhythm else 1))
                with lab.trace() as trace:
                    r = window(jobs, seconds * (LONG_WINDOWS if long_rhythm else 1), trace=trace)
                res.setdefault(f"{name}_windows", []).append(r)
                res.setdefault(f"{name}_tgsd", []).append(trace.summary())
                echo(f"  TGS {name}, window {i + 1}: {r}; tgsd: {ControllerTrace.describe(res[f'{name}_tgsd'][-1])}")
    for name in tgs:
        each = res[f"{name}_windows"]
        res[name] = {k: sum(w[k] for w in each) / len(each) for k in ("prod", "opp")}
    result, md = report(res, duty, gap_ms, quick)
    Outputs("pytorch", json_path).write(result, md, echo, {"pytorch.png": lambda: plot(result)})
    return result


def spread_words(spread: float | None) -> str:
    """The exclusive ResNet-50's spread in words: its own noise over half a second, against
    which tgsd follows its load once a profile moves 1.5 % (on the H200 on 2026-11-30
    profiles moved 2.1-3.4 % from one to the next)."""
    if spread is None:
        return "the ResNet-50's half-second rates: too few to spread"
    return f"the ResNet-50 alone, its half-second rates spread {spread:.1%} (standard deviation over the mean)"


GAP_MS = 40.0  # production's data loader: CPU time after each ResNet-50 step
WINDOWS = 2
LONG_WINDOWS = 2  # a window beside production on its host seconds a step is this many times as long


@dataclass(frozen=True)
class TgsSetting:
    short: str                  # its name in TGS_BENCH_PYTORCH_SETTINGS
    control: dict = field(default_factory=dict)  # tgsd's [control] beyond controller = "fast"
    host_ms: float = GAP_MS     # production's CPU time after each step
    windows: int = WINDOWS      # how many windows it runs in a full run (one when quick)


# TGS as shipped; with the in-flight bound kept at the configured two (no deeper trials
# where production holds); and kept at eight from the start (no trials either): side by
# side, what deepening does for this pair, and whether a deeper queue helps or slows it.
# Each runs its windows (once when quick) in turn with the others: on an H200 two windows
# of one bound gave the opportunistic job 0.505 and 0.380 of its exclusive speed
# (2026-11-27), more than the bound changed it. Last, TGS as shipped beside production
# whose data loader takes 2 s a step: a long rhythm (docs/daemon.md), one window twice as long.
TGS_SETTINGS = {
    "fast": TgsSetting("fast"),
    "fast, bound kept at two": TgsSetting("bound-two", {"inflight_deepest": 2}),
    "fast, bound kept at eight": TgsSetting("bound-eight", {"inflight": 8, "inflight_deepest": 8}),
    "fast, production 2 s on its host a step": TgsSetting("slow-loader", host_ms=2000, windows=1),
}
SETTINGS = ("co-execution", "mps", *TGS_SETTINGS)
SHORT = {"co-execution": "co-execution", "mps": "mps", **{t.short: name for name, t in TGS_SETTINGS.items()}}


def alone_key(host_ms: float) -> str:
    """Where `res` keeps production's rate alone on its host `host_ms` a step (other than
    the usual GAP_MS: that one is `excl_prod`)."""
    return f"excl_prod_host_{host_ms:g}"


def alone(res: dict, duty: float, host_ms: float, gap_ms: float) -> tuple[float, float]:
    """Production's rate alone with `host_ms` on its host a step, and its duty then (the GPU's
    share of a step: that rate against the rate with no gap)."""
    if host_ms == gap_ms:
        return res["excl_prod"], duty
    rate = res[alone_key(host_ms)]
    return rate, min(1.0, rate / res["excl_prod_nogap"])


def plot(result: dict):
    """Each setting's production against its exclusive run and the opportunistic job's share
    of the idle time (the bar the mean of its windows, a dot each window), with the targets."""
    plt = pyplot()
    summary = result["summary"]
    names = list(summary)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for ax, key, title, target, color in ((axes[0], "production_ratio", "production / exclusive", 0.97, "C0"),
                                          (axes[1], "idle_share", "opportunistic share of the idle time", 0.8, "C1")):
        bars = [summary[n][key] for n in names]
        dots = [summary[n].get("idle_share_windows", []) if key == "idle_share" else [] for n in names]
        ax.bar(range(len(names)), bars, 0.6, color=color)
        for i, each in enumerate(dots):
            ax.plot([i] * len(each), each, "k.", ms=4)
        ax.axhline(target, color="gray", ls="--", lw=0.8)
        ax.set_xticks(range(len(names)), [textwrap.fill(n, 14) for n in names], fontsize=8)
        ax.set_xlim(-0.75, len(names) - 0.25)  # (one setting alone is not one wide bar)
        tops = [v for v in (*bars, *(v for each in dots for v in each)) if v == v]  # (NaN: a window not measured)
        ax.set_ylim(0, max([1.3, *(1.1 * v for v in tops)]))  # (co-execution's share of the idle time passes 1)
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def report(res: dict, duty: float, gap_ms: float, quick: bool) -> tuple[dict, str]:
    """The result and its Markdown table from the measured rates: a row per setting that
    ran (a TGS setting's figures the mean of its windows, each window's share of the idle
    time beside them); where the MPS baseline did not, the text says why."""
    rows, summary = [], {}
    for name in [n for n in SETTINGS if n in res]:
        # production against itself alone with the same time on its host, and the idle
        # time that leaves
        excl, its_duty = alone(res, duty, TGS_SETTINGS[name].host_ms if name in TGS_SETTINGS else gap_ms, gap_ms)

        def share(rates: dict) -> float:
            return rates["opp"] / res["excl_opp"] / (1 - its_duty) if its_duty < 1 else float("nan")

        p = res[name]["prod"] / excl
        o = res[name]["opp"] / res["excl_opp"]
        idle = share(res[name])
        summary[name] = {"production_ratio": round(p, 3), "opportunistic_ratio": round(o, 3),
                         "idle_share": round(idle, 3)}
        each = res.get(f"{name}_windows", [])
        if len(each) > 1:
            summary[name]["idle_share_windows"] = [round(share(w), 3) for w in each]
        label = f"MPS, opportunistic on {res['mps_percent']} % of the SMs" if name == "mps" else name
        rows.append([label, f"{p:.3f}", f"{o:.3f}", f"{idle:.3f}",
                     " / ".join(f"{x:.3f}" for x in summary[name].get("idle_share_windows", [])) or "-"])
    result = {"benchmark": "pytorch", "simulated": False, "machine": machine("real GPU"), "quick": quick,
              "raw": res, "production_duty": round(duty, 3), "summary": summary}
    md = (f"### pytorch: ResNet-50 (production, {gap_ms:g} ms CPU gap per step, duty {duty:.2f}) beside a "
          f"GPT-2-small-sized decoder (opportunistic), real GPU, {result['machine']['date']}, "
          f"commit {result['machine']['commit']}\n\n"
          + table(["setting", "production / exclusive", "opportunistic / exclusive", "share of idle time",
                   "share in each window"], rows)
          + f"\n\nExclusive: ResNet-50 {res['excl_prod']:.2f} it/s (batch 64), GPT-2-small-sized "
          f"{res['excl_opp']:.2f} it/s (batch 8 x 512 tokens); {spread_words(res.get('excl_prod_spread'))}. "
          + "".join(f"ResNet-50 on its host {t.host_ms / 1000:g} s a step: {alone(res, duty, t.host_ms, gap_ms)[0]:.3f} "
                    f"it/s (duty {alone(res, duty, t.host_ms, gap_ms)[1]:.3f}), the row {name!r} against it. "
                    for name, t in TGS_SETTINGS.items() if name in res and t.host_ms != gap_ms)
          + (f"MPS baseline not run: {res['mps_not_run']}." if res.get("mps_not_run") else
             "MPS: production at normal priority with every SM, opportunistic at below-normal priority "
             "(CUDA_MPS_CLIENT_PRIORITY=1) on the idle share of the SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), "
             "neither with libtgs.so.")
          + "".join(f"\n\ntgsd in TGS {name}'s window {i + 1} (`tgs status`, every 0.5 s): "
                    + ControllerTrace.describe(s) + "." + _starts_per_step(s, res[f"{name}_windows"][i]["prod"])
                    for name in TGS_SETTINGS for i, s in enumerate(res.get(f"{name}_tgsd", []))))
    return result, md


def _starts_per_step(tgsd: dict, steps_per_s: float) -> str:
    """Iteration starts production's shims marked per ResNet-50 step (1: the step's one
    synchronisation; more: it synchronises within the step, and each one opens the gate)."""
    starts = tgsd.get("production_iteration_starts_per_s")
    return "" if not starts or not steps_per_s else f" That is {starts / steps_per_s:.2f} iteration starts per ResNet-50 step."
