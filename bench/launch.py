"""`tgs bench launch`: what libtgs.so adds to one kernel launch.

Zero-length kernels from one thread, on simgpu (or the real GPU when there is one), with
and without the shim, interleaved round by round in one run: nanoseconds inside
cuLaunchKernel per launch (medians, and each mode's fastest run against the fastest
without the shim: a shared machine's speed can change from one run to the next), and on
simgpu instructions per launch counted by callgrind beside them (repeatable whatever the
machine is doing). Modes: without the shim;
the shim outside a TGS container; production; opportunistic with no limit; opportunistic
with tgsd's default in-flight bound (2: the kernel's length looked up, one event per
batch of launches, the oldest queried at the bound, one launch in 32 to 256 timed);
opportunistic anticipating an idle production's next launch (gate, expectation and the
kernel's length read on every launch, one launch in 32 to 256 timed between two events);
opportunistic beside an idle production as tgsd sets it up (the last two together: gate,
anticipation and the bound, the rate unlimited as tgsd lifts it while production keeps
its pace).
Under callgrind the bounded mode closes its batches sooner than at full speed: simgpu
times a zero-length kernel by the wall clock, which valgrind slows, so the kernels read
15-40 us instead of 0.3-0.4 and a quarter of the bound's work is reached in 6-17 launches
instead of 32; and the shim's clock is clock_gettime there (no TSC and clock_gettime pair
is read within 170 ns: docs/shim.md, the clock). Target: <= 100 ns added."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import (Echo, HostCpu, Outputs, machine, median, medians_and_samples, pyplot, standalone_containers,
                          table)
from tgs_runtime import proto, sim
from tgs_runtime.control import ActivityFile, ContainerPaths
from tgs_runtime.daemon.gpus import GpuInventory
from tgs_runtime.paths import artifacts

MODES = ["without the shim", "shim, no TGS", "production", "opportunistic, unlimited",
         "opportunistic, bounded", "opportunistic, anticipating", "opportunistic, beside idle production"]
# The last two behind an idle production that expects to launch again in an hour: every
# launch reads the gate and the expectation, and one in 32 to 256 is timed between two events.
_DIRS = {"production": "production", "opportunistic, unlimited": "opportunistic", "opportunistic, bounded": "bounded",
         "opportunistic, anticipating": "anticipating", "opportunistic, beside idle production": "beside"}
HOUR_NS = 3600 * 10**9


def _env(settings: sim.SimSettings | None, mode: str, dirs: dict[str, Path]) -> dict[str, str]:
    env = sim.job_env(settings, mode)
    if mode != "without the shim":
        env["LD_PRELOAD"] = str(artifacts().require(artifacts().shim))
    if mode in _DIRS:
        env["TGS_DIR"] = str(dirs[_DIRS[mode]])
    env["TGS_LOG_LEVEL"] = "error"  # no tgsd here on purpose: say nothing about it
    return env


def _ns(env: dict, launches: int) -> float:
    exe = str(artifacts().require(artifacts().root / "tgs-launchbench"))
    out = subprocess.run([exe, str(launches)], env=env, capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout)["ns_per_launch"]


def _instructions(env: dict, launches: int, workdir: Path) -> int:
    exe = str(artifacts().root / "tgs-launchbench")
    out = workdir / "callgrind.out"
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", exe, str(launches)], env=env,
                   capture_output=True, text=True, timeout=600, check=True)
    m = re.search(r"^(?:summary|totals):\s+(\d+)", out.read_text(), re.M)
    return int(m.group(1))


def run(echo: Echo = print, quick: bool = False, json_path: Path | None = None) -> dict:
    rounds, launches = (3, 50_000) if quick else (9, 200_000)
    with tempfile.TemporaryDirectory(prefix="tgs-bench-launch-") as d:
        real = sim.real_gpu()
        if real:
            settings = None
            gpus = GpuInventory()
            uuid = gpus.gpus[0].uuid
            gpus.close()
        else:
            settings = sim.SimSettings(state=Path(d) / "simgpu.state", memory="2G")
            settings.create()
            uuid = sim.status(settings.state)["devices"][0]["uuid"]

        def budgets(name, cb):  # no rate limit; only the last two are gated
            gated = name in ("anticipating", "beside")
            cb.set_budget(0, rate=proto.RATE_UNLIMITED, inflight=2 if name in ("bounded", "beside") else 0, gate=gated,
                          anticipate=gated)

        classes = {name: proto.Class.PRODUCTION if name == "production" else proto.Class.OPPORTUNISTIC
                   for name in _DIRS.values()}
        with standalone_containers([uuid], classes, budgets) as dirs:
            expect = ActivityFile.open(ContainerPaths(dirs["anticipating"]).activity(uuid))  # the GPU's: all see it
            now = time.monotonic_ns()
            expect.expect(0, now, now + HOUR_NS, now + 2 * HOUR_NS)
            expect.close()
            samples = {m: [] for m in MODES}
            host = []  # each round's HostCpu.share: a slow round may be the hypervisor's
            for r in range(rounds):
                cpu = HostCpu.now()
                for mode in MODES:
                    samples[mode].append(_ns(_env(settings, mode, dirs), launches))
                host.append(cpu.share(HostCpu.now()))
                echo(f"  round {r + 1}/{rounds}: " + ", ".join(f"{m} {samples[m][-1]:.0f} ns" for m in MODES)
                     + f"; host CPUs busy / stolen {HostCpu.in_words(host[-1])}")
            instr: dict[str, float | None] = {m: None for m in MODES}
            reason = None
            if real:
                reason = "not counted on a real GPU"
            elif shutil.which("valgrind"):
                n1, n2 = (2_000, 6_000) if quick else (4_000, 24_000)
                for mode in MODES:
                    env = _env(settings, mode, dirs)
                    a, b = _instructions(env, n1, Path(d)), _instructions(env, n2, Path(d))
                    instr[mode] = (b - a) / (n2 - n1)
            else:
                reason = "valgrind is not installed"
    base_ns, base_fastest = median(samples["without the shim"]), min(samples["without the shim"])
    base_ir = instr["without the shim"]
    rows, modes = [], {}
    for m in MODES:
        ns, fastest = median(samples[m]), min(samples[m])
        ir = instr[m]
        modes[m] = {"ns_per_launch_median": round(ns, 2), "ns_samples": [round(x, 2) for x in samples[m]],
                    "added_ns": round(ns - base_ns, 2), "added_ns_fastest": round(fastest - base_fastest, 2),
                    "instructions_per_launch": None if ir is None else round(ir, 1),
                    "added_instructions": None if ir is None or base_ir is None else round(ir - base_ir, 1)}
        rows.append([m, f"{ns:.1f}", f"{ns - base_ns:+.1f}", f"{fastest - base_fastest:+.1f}",
                     "-" if ir is None else f"{ir:.0f}",
                     "-" if ir is None or base_ir is None else f"{ir - base_ir:+.0f}"])
    gpu = "real GPU" if real else "simgpu (simulated)"
    result = {"benchmark": "launch", "simulated": not real, "machine": machine(gpu),
              "rounds": rounds, "launches_per_run": launches, "modes": modes, "host_cpu_by_round": host,
              "callgrind": reason or "ok",
              "target_added_ns": 100}
    md = (f"### launch: cost of one kernel launch ({gpu}, {result['machine']['date']}, "
          f"commit {result['machine']['commit']})\n\n"
          + table(["mode", "ns/launch (median)", "added ns", "added ns, fastest runs", "instructions/launch",
                   "added instructions"], rows)
          + f"\n\n{rounds} interleaved rounds of {launches} zero-length launches; instructions by callgrind"
          + (f" ({reason})" if reason else "") + ". Fastest runs: each mode's fastest run against the fastest "
          "without the shim (a shared machine's speed can change from one run to the next: on an Intel Xeon VM "
          "the same launches read 120-230 ns, the medians then mixing fast runs and slow ones). Host CPUs busy / "
          "stolen by its hypervisor, round by round: " + ", ".join(HostCpu.in_words(h) for h in host) + ". "
          "Target: <= 100 ns added (the medians).")
    Outputs("launch", json_path).write(result, md, echo, {"launch.png": lambda: plot(result)})
    return result


def plot(result: dict):
    """Nanoseconds per launch by mode (each round a dot, the median a bar), with the target
    (the launch without the shim plus 100 ns); and, where callgrind counted them, the
    instructions each mode adds."""
    plt = pyplot()
    modes = result["modes"]
    names = list(modes)
    counted = [n for n in names if modes[n]["added_instructions"] is not None]
    fig, grid = plt.subplots(1, 2 if counted else 1, figsize=(11 if counted else 6, 3.4), squeeze=False)
    medians_and_samples(grid[0, 0], {n: (modes[n]["ns_per_launch_median"], modes[n]["ns_samples"]) for n in names},
                        modes[names[0]]["ns_per_launch_median"] + result["target_added_ns"],
                        f"target: {names[0]} + {result['target_added_ns']} ns", "ns per launch (bar: median; dots: rounds)")
    if counted:
        ax = grid[0, 1]
        ax.barh(range(len(counted)), [modes[n]["added_instructions"] for n in counted], color="C1")
        ax.set_yticks(range(len(counted)), counted, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("instructions added per launch (callgrind)")
    fig.tight_layout()
    return fig
