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
two windows (one when quick), in turn with the others. Figures: production / exclusive,
opportunistic / exclusive, share of idle time (opportunistic ratio / (1 - production's
duty)), a TGS setting's the mean of its windows, with each window's share; and, for
each TGS window, what tgsd showed (`tgs status` every 0.5 s): how much of each second production's shims counted it
busy and the opportunistic ones waited behind it, whether they watched production, how
much of their work ran beside it, the in-flight bound and the rate."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from bench import mps
from bench.common import Echo, Outputs, machine, table
from bench.lab import ControllerTrace, Job, Lab

HERE = Path(__file__).resolve().parent


def argv(model: str, seconds: float, gap_ms: float = 0, batch: int | None = None) -> list[str]:
    out = [sys.executable, str(HERE / "torch_train.py"), "--model", model, "--seconds", f"{seconds:g}",
           "--warmup-s", "4", "--gap-ms", f"{gap_ms:g}", "--report-s", "0.5"]
    if batch:
        out += ["--batch", str(batch)]
    return out


def window(jobs: dict[str, Job], seconds: float, timeout: float = 240,
           trace: ControllerTrace | None = None) -> dict[str, float]:
    """Waits until every job reports, then measures each over the same wall-clock window
    (which `trace`, if given, is told to sum up)."""
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
    rates = {k: j.rate_between(w0, w1) for k, j in jobs.items()}
    for j in jobs.values():
        j.kill()
        j.wait()
    return rates


def run(echo: Echo = print, quick: bool = False, json_path: Path | None = None) -> dict:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise SystemExit("tgs bench pytorch needs PyTorch (pip install torch) and an NVIDIA GPU")
    seconds = 8 if quick else 20
    gap_ms = 40.0
    long = 1000  # the jobs run until the window is measured
    res: dict = {}
    with Lab() as lab:
        if not lab.real:
            raise SystemExit("tgs bench pytorch needs an NVIDIA GPU (simgpu runs no PyTorch kernels)")
        echo("pytorch on a real GPU: exclusive runs")
        res["excl_prod"] = window({"prod": lab.run(argv("resnet50", long, gap_ms), "excl-prod")}, seconds)["prod"]
        res["excl_opp"] = window({"opp": lab.run(argv("gpt2", long, 0, 8), "excl-opp")}, seconds)["opp"]
        res["excl_prod_nogap"] = window({"prod": lab.run(argv("resnet50", long, 0), "excl-prod-nogap")},
                                        seconds)["prod"]
        echo(f"  resnet50 (gap {gap_ms:g} ms) {res['excl_prod']:.2f} it/s, no gap {res['excl_prod_nogap']:.2f} it/s;"
             f" gpt2 {res['excl_opp']:.2f} it/s")
        # Production's duty alone: the GPU's share of one step with the gap.
        duty = min(1.0, res["excl_prod"] / res["excl_prod_nogap"])
        r = window({"prod": lab.run(argv("resnet50", long, gap_ms), "co-prod"),
                    "opp": lab.run(argv("gpt2", long, 0, 8), "co-opp")}, seconds)
        res["co-execution"] = r
        echo(f"  co-execution: {r}")
        res["mps_percent"] = mps.opportunistic_percent(duty)
        res["mps_not_run"] = mps.unavailable(lab.real)
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
        for name, control in TGS_SETTINGS.items():
            with Lab(tgsd={"control": {"controller": "fast", **control}}) as lab:
                prod_c, opp_c = lab.container("production"), lab.container("opportunistic")
                jobs = {"prod": lab.run(argv("resnet50", long, gap_ms), "tgs-prod", prod_c),
                        "opp": lab.run(argv("gpt2", long, 0, 8), "tgs-opp", opp_c)}
                time.sleep(0 if quick else 5)  # let the controller profile production first
                with lab.trace() as trace:
                    r = window(jobs, seconds, trace=trace)
                res.setdefault(f"{name}_windows", []).append(r)
                res.setdefault(f"{name}_tgsd", []).append(trace.summary())
                echo(f"  TGS {name}, window {i + 1}: {r}; tgsd: {ControllerTrace.describe(res[f'{name}_tgsd'][-1])}")
    for name in TGS_SETTINGS:
        each = res[f"{name}_windows"]
        res[name] = {k: sum(w[k] for w in each) / len(each) for k in ("prod", "opp")}
    result, md = report(res, duty, gap_ms, quick)
    Outputs("pytorch", json_path).write(result, md, echo)
    return result


# TGS as shipped; with the in-flight bound kept at the configured two (no deeper trials
# where production holds); and kept at eight from the start (no trials either): side by
# side, what deepening does for this pair, and whether a deeper queue helps or slows it.
# Each runs WINDOWS times (once when quick), in turn with the others: on an H200 two
# windows of one bound gave the opportunistic job 0.505 and 0.380 of its exclusive speed
# (2026-11-27), more than the bound changed it
WINDOWS = 2
TGS_SETTINGS = {"fast": {}, "fast, bound kept at two": {"inflight_deepest": 2},
                "fast, bound kept at eight": {"inflight": 8, "inflight_deepest": 8}}
SETTINGS = ("co-execution", "mps", *TGS_SETTINGS)


def report(res: dict, duty: float, gap_ms: float, quick: bool) -> tuple[dict, str]:
    """The result and its Markdown table from the measured rates: a row per setting that
    ran (a TGS setting's figures the mean of its windows, each window's share of the idle
    time beside them); where the MPS baseline did not, the text says why."""
    rows, summary = [], {}

    def share(rates: dict) -> float:
        return rates["opp"] / res["excl_opp"] / (1 - duty) if duty < 1 else float("nan")

    for name in [n for n in SETTINGS if n in res]:
        p = res[name]["prod"] / res["excl_prod"]
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
          f"{res['excl_opp']:.2f} it/s (batch 8 x 512 tokens). "
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
