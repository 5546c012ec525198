"""`tgs workload`: the workload program, run in place."""
from __future__ import annotations

import os

import click

from tgs_runtime.paths import MissingArtifact, artifacts


@click.command("workload", context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def workload_cmd(args: tuple[str, ...]) -> None:
    """Run tgs-workload (a GPU job shaped like training); `tgs workload --help` lists its flags."""
    try:
        exe = str(artifacts().require(artifacts().workload))
    except MissingArtifact as e:
        raise click.ClickException(str(e)) from e
    os.execv(exe, [exe, *args])


def register(group: click.Group) -> None:
    group.add_command(workload_cmd)
