"""`tgs bench NAME`: the experiments in bench/ (they run from a source checkout)."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import click

from tgs_runtime.paths import REPO_ROOT, MissingArtifact
from tgs_runtime.privatedocker import DockerUnavailable

BENCHMARKS = {
    "isolation": "production protection and idle time reclaimed (the paper's main one)",
    "dynamics": "production load changes mid-run (duty, idle, a handover): seconds until settled",
    "oversubscription": "memory above the budget: the driver's eviction, advice only, TGS eviction",
    "multi": "1 production + 3 opportunistic jobs: JCTs, fair vs las",
    "launch": "what libtgs.so adds to a kernel launch",
    "start": "what the tgs runtime adds to docker run (root, docker.io)",
    "overhead": "launch and start in one table",
    "pytorch": "ResNet-50 beside a GPT-2-small-sized model (GPU + torch)",
    "suite": "all of the above within 10 minutes, unattended (TGS_SUITE_MINUTES)",
    "rig": "the fast controller where production's own load falls, rises, waves or stalls, or comes in bursts "
           "with host work between (a model: no GPU)",
}

HELP = ("Run benchmark NAME side by side in one run, and write JSON, a Markdown table and plots (PNG, with\n"
        "matplotlib; overhead's are launch's and start's, the suite's its benchmarks', the rig has none) under\n"
        "bench/results/NAME/.\n\n\b\n"
        + "\n".join(f"{name:<17}{what}" for name, what in BENCHMARKS.items())
        + "\n\nOn a machine with an NVIDIA GPU the GPU benchmarks use it, else simgpu.\n\n\b\n"
        "Environment:\n"
        "TGS_BENCH_CONTROLLERS=fast  isolation and dynamics run only these (default tgs-paper,fast)\n"
        "TGS_BENCH_PYTORCH_SETTINGS=fast,slow-loader  pytorch runs only these (default co-execution,mps,fast,\n"
        "                            bound-two,bound-eight,slow-loader)\n"
        "TGS_BENCH_LOGS=DIR          keep each benchmark tgsd's log there, and its jobs' stderr\n"
        "TGS_BENCH_SHIM_LOG=debug    the TGS containers' shims log at this level (default error)\n"
        "TGS_BENCH_BUDGET=24G        the benchmark tgsd's memory budget on a real GPU\n"
        "TGS_SUITE_MINUTES=10        the suite's whole time")


@click.command("bench", help=HELP)
@click.argument("name", type=click.Choice(sorted(BENCHMARKS)))
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the JSON result here (default bench/results/NAME/NAME.json).")
@click.option("--quick", is_flag=True, help="A short run, to check that it works; not for figures.")
def bench_cmd(name: str, json_path: Path | None, quick: bool) -> None:
    if not (REPO_ROOT / "bench" / "__init__.py").exists():
        raise click.ClickException(f"the benchmarks live in a source checkout's bench/ ({REPO_ROOT / 'bench'} is missing)")
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    module = importlib.import_module(f"bench.{name}")
    from bench.common import BadSetting, shim_log_level
    try:
        shim_log_level()  # a bad setting is told before anything runs
        module.run(echo=click.echo, quick=quick, json_path=json_path)
    except (MissingArtifact, DockerUnavailable, BadSetting) as e:
        raise click.ClickException(str(e)) from e


def register(group: click.Group) -> None:
    group.add_command(bench_cmd)
