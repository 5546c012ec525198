"""`tgs`: the operator CLI."""
from __future__ import annotations

import click

from tgs_runtime import __version__
from tgs_runtime.commands import bench, demo, doctor, setup, sim, status, workload


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tgs")
def cli() -> None:
    """TGS: transparent GPU sharing for containers.

    Production containers run as if they had the GPU alone; opportunistic containers
    use the GPU time and memory production leaves idle.
    """


for module in (bench, demo, doctor, setup, sim, status, workload):
    module.register(cli)


def main() -> None:
    cli(prog_name="tgs")
