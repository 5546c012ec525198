"""`tgs sim`: run programs on the simulated GPU and read its accounting."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from tgs_runtime import sim
from tgs_runtime.paths import MissingArtifact
from tgs_runtime.units import format_size, parse_size


def _state_option(f):
    return click.option(
        "--state",
        type=click.Path(dir_okay=False, path_type=Path),
        default=lambda: os.environ.get("SIMGPU_STATE", str(sim.DEFAULT_STATE)),
        show_default="$SIMGPU_STATE or /dev/shm/simgpu.state",
        help="The simulated card's shared state file.",
    )(f)


@click.group("sim")
def sim_group() -> None:
    """The simulated GPU (simgpu): a CUDA driver and NVML for machines without a GPU."""


def _mismatch(snapshot: dict, devices: int | None, memory: str | None) -> list[str]:
    have = snapshot["settings"]
    out = []
    if devices is not None and have["devices"] != devices:
        out.append(f"{have['devices']} device(s), not {devices}")
    if memory is not None and have["memory"] != parse_size(memory) // (2 << 20) * (2 << 20):
        out.append(f"{format_size(have['memory'])} per device, not {memory}")
    return out


@sim_group.command("run", context_settings={"ignore_unknown_options": True})
@click.option("--devices", type=click.IntRange(1, 8), help="Simulated devices (default 1).")
@click.option("--memory", help="Memory per device, e.g. 16G (default 16G).")
@click.option("--timeslice-us", type=click.IntRange(50, 1_000_000), help="Engine time slice (default 2000).")
@click.option("--time-scale", type=click.FloatRange(0.001, 1000), help="Multiplies every kernel's duration.")
@_state_option
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def sim_run(devices, memory, timeslice_us, time_scale, state: Path, command: tuple[str, ...]) -> None:
    """Run COMMAND with simgpu as its CUDA driver and NVML.

    Settings apply when the state file is made; a state file made with other settings
    is replaced if no process uses it. Example:

        tgs sim run --memory 8G -- tgs-workload --seconds 5
    """
    try:
        if memory is not None:
            parse_size(memory)
        if state.exists() and (devices is not None or memory is not None):
            try:
                snap = sim.status(state)
            except sim.SimStateError:
                snap = None
            if snap is not None:
                differ = _mismatch(snap, devices, memory)
                if differ and snap["processes"]:
                    raise click.ClickException(
                        f"{state} holds a simulated GPU with {', '.join(differ)}, and "
                        f"{len(snap['processes'])} process(es) still use it; stop them, or pass another --state"
                    )
                if differ:
                    state.unlink()
        env = sim.SimSettings(
            state=state, devices=devices, memory=memory, timeslice_us=timeslice_us, time_scale=time_scale
        ).env()
    except (ValueError, MissingArtifact) as e:
        raise click.ClickException(str(e)) from e
    try:
        os.execvpe(command[0], list(command), env)
    except OSError as e:
        raise click.ClickException(f"cannot run {command[0]}: {e.strerror}") from e


@sim_group.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the accounting as JSON (schema: docs/simgpu.md).")
@_state_option
def sim_status(as_json: bool, state: Path) -> None:
    """Show the simulated devices, their memory and each context's engine time."""
    try:
        snap = sim.status(state)
    except (sim.SimStateError, MissingArtifact) as e:
        raise click.ClickException(str(e)) from e
    if as_json:
        click.echo(json.dumps(snap, indent=2))
        return
    s = snap["settings"]
    click.echo(
        f"simgpu state {snap['state']}: {s['devices']} device(s) of {format_size(s['memory'])}, "
        f"time slice {s['timeslice_us']} us, time scale {s['time_scale']:g}, "
        f"{len(snap['processes'])} live process(es)"
    )
    for d in snap["devices"]:
        click.echo(
            f"\n[{d['index']}] {d['uuid']}  {d['name']}\n"
            f"    memory {format_size(d['memory_used'])} used of {format_size(d['memory_total'])} "
            f"(device {format_size(d['device_bytes'])}, managed resident {format_size(d['resident_bytes'])})\n"
            f"    engine busy {d['busy_ns'] / 1e9:.2f} s, utilization {d['utilization'] * 100:.0f}% (last 1 s)"
        )
        if not d["contexts"]:
            continue
        click.echo(
            f"    {'slot':>4} {'state':<6} {'pid':>7} {'label':<20} {'busy s':>8} {'kernels':>9} "
            f"{'device':>8} {'resident':>9} {'in':>6} {'out':>6}"
        )
        for c in d["contexts"]:
            click.echo(
                f"    {c['slot']:>4} {c['state']:<6} {c['pid']:>7} {c['label'][:20]:<20} "
                f"{c['busy_ns'] / 1e9:>8.2f} {c['kernels']:>9} {format_size(c['device_bytes']):>8} "
                f"{format_size(c['resident_bytes']):>9} {c['pages_in']:>6} {c['pages_out']:>6}"
            )


def register(group: click.Group) -> None:
    group.add_command(sim_group)


if __name__ == "__main__":  # pragma: no cover
    sim_group(sys.argv[1:])
