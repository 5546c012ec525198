"""`tgs`: the operator CLI."""
from __future__ import annotations

import signal

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


def _terminated(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)


def unwind_on_sigterm() -> None:
    """`timeout`, systemd and `docker stop` end a command with SIGTERM: from now on it
    unwinds as Ctrl-C does (exit 143), so that what the command started (the demo's or a
    benchmark's own tgsd, its jobs, a private dockerd) is stopped and its folders removed;
    killed outright, the demo left its tgsd running with its state under /tmp."""
    signal.signal(signal.SIGTERM, _terminated)


def main() -> None:
    unwind_on_sigterm()
    cli(prog_name="tgs")
