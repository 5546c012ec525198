"""`tgs bench start`: what the tgs runtime adds to starting a container.

`docker run --rm` of a trivial command with --runtime=runc, with --runtime=tgs for a
container that does not ask for TGS (the pass-through path), and with --runtime=tgs for
an opportunistic TGS container (reserve, spec edits, hooks, tgsd), interleaved run by
run in one session, on a private dockerd. Medians and ratios to runc. Target: <= 1.15x."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench.common import Echo, Outputs, machine, median, medians_and_samples, pyplot, table
from tgs_runtime import sim
from tgs_runtime.childd import ChildTgsd, own_config
from tgs_runtime.paths import artifacts
from tgs_runtime.privatedocker import AS_INSTALLED, IMAGE, PrivateDocker, need_busybox

# the tgs runtime as `tgs setup docker` sets it up for /etc/tgs/config.toml: no runtimeArgs
# (so no shell script of dockerd's before each call; AS_INSTALLED)
CASES = {
    "runc": ["--runtime=runc"],
    "tgs, not a TGS container": [f"--runtime={AS_INSTALLED}"],
    "tgs, opportunistic container": [f"--runtime={AS_INSTALLED}", "-e", "TGS_CLASS=opportunistic", "-e",
                                     "NVIDIA_VISIBLE_DEVICES=0"],
}


def run(echo: Echo = print, quick: bool = False, json_path: Path | None = None) -> dict:
    runs = 5 if quick else 20
    need_busybox()
    a = artifacts()
    with tempfile.TemporaryDirectory(prefix="tgs-bench-start-") as d:
        work = Path(d)
        settings = sim.SimSettings(state=work / "simgpu.state", memory="2G")
        settings.create()
        tgsd = ChildTgsd(own_config(settings), work / "tgs.toml", work / "tgsd.log").start()
        docker = PrivateDocker(work / "docker", a.root / "tgs-runtime", work / "tgs.toml")
        try:
            docker.start()
            docker.build_image({"/usr/bin/tgs-workload": a.workload}, IMAGE)
            for extra in CASES.values():  # warm: first runs pay for caches
                docker.docker("run", "--rm", "--network", "none", *extra, IMAGE, "true")
            samples = {k: [] for k in CASES}
            for i in range(runs):
                for name, extra in CASES.items():
                    t0 = time.perf_counter()
                    docker.docker("run", "--rm", "--network", "none", *extra, IMAGE, "true")
                    samples[name].append((time.perf_counter() - t0) * 1000)
                echo(f"  run {i + 1}/{runs}: " + ", ".join(f"{k} {v[-1]:.0f} ms" for k, v in samples.items()))
        finally:
            docker.stop()
            tgsd.close()
    base = median(samples["runc"])
    cases = {k: {"median_ms": round(median(v), 1), "ratio_to_runc": round(median(v) / base, 3),
                 "samples_ms": [round(x, 1) for x in v]} for k, v in samples.items()}
    result = {"benchmark": "start", "machine": machine("none needed (simgpu behind tgsd)"), "runs": runs,
              "cases": cases, "target_ratio": 1.15}
    md = (f"### start: `docker run --rm IMAGE true` ({result['machine']['date']}, commit {result['machine']['commit']})\n\n"
          + table(["runtime", "median ms", "ratio to runc"],
                  [[k, f"{c['median_ms']:.0f}", f"{c['ratio_to_runc']:.3f}"] for k, c in cases.items()])
          + f"\n\n{runs} runs of each, interleaved, on a private dockerd (Debian docker.io 20.10, runc); the "
          "tgs runtime without runtimeArgs, as `tgs setup docker` writes it for the default config. "
          "Target: <= 1.15x runc.")
    Outputs("start", json_path).write(result, md, echo, {"start.png": lambda: plot(result)})
    return result


def plot(result: dict):
    """Milliseconds per `docker run` by runtime (each run a dot, the median a bar), with the
    target (runc's median times the ratio allowed)."""
    plt = pyplot()
    cases = result["cases"]
    names = list(cases)
    fig, ax = plt.subplots(figsize=(6, 0.9 + 0.45 * len(names)))
    medians_and_samples(ax, {n: (cases[n]["median_ms"], cases[n]["samples_ms"]) for n in names},
                        cases["runc"]["median_ms"] * result["target_ratio"], f"target: runc x {result['target_ratio']}",
                        "ms per docker run --rm (bar: median; dots: runs)")
    fig.tight_layout()
    return fig
