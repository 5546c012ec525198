"""`tgs demo`: TGS at work on this machine's GPU, or on simgpu when there is none."""
from __future__ import annotations

import click

from tgs_runtime.paths import MissingArtifact


@click.command("demo")
@click.option("--seconds", type=click.FloatRange(2, 600), default=10, show_default=True,
              help="Length of each phase.")
@click.option("--via", type=click.Choice(["auto", "docker", "processes"]), default="auto", show_default=True,
              help="How the TGS phase runs its jobs: docker run --runtime=tgs (needs a docker daemon with the tgs "
                   "runtime and its tgsd running), plain processes with the shim and a tgsd of the demo's own, or "
                   "docker when it can.")
def demo_cmd(seconds: float, via: str) -> None:
    """Run a production and an opportunistic job side by side and show what each got:
    alone, together without control, and together under TGS."""
    from tgs_runtime.demo import Via, run_demo

    try:
        run_demo(seconds, click.echo, Via(via))
    except (MissingArtifact, RuntimeError) as e:
        raise click.ClickException(str(e)) from e


def register(group: click.Group) -> None:
    group.add_command(demo_cmd)
