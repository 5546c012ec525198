"""`tgs demo`: TGS at work on this machine's GPU, or on simgpu when there is none."""
from __future__ import annotations

import click

from tgs_runtime.paths import MissingArtifact


@click.command("demo")
@click.option("--seconds", type=click.FloatRange(2, 600), default=10, show_default=True,
              help="Length of each phase.")
def demo_cmd(seconds: float) -> None:
    """Run a production and an opportunistic job side by side and show what each got."""
    from tgs_runtime.demo import run_demo

    try:
        run_demo(seconds, click.echo)
    except MissingArtifact as e:
        raise click.ClickException(str(e)) from e


def register(group: click.Group) -> None:
    group.add_command(demo_cmd)
