"""`tgs status`: what tgsd is doing, per GPU."""
from __future__ import annotations

import json
from pathlib import Path

import click

from tgs_runtime import config as configmod, proto
from tgs_runtime.config import Controller
from tgs_runtime.admin import AdminClient, DaemonUnavailable, Refused
from tgs_runtime.daemon.controllers import FastController
from tgs_runtime.units import format_size


def _mem(n) -> str:
    return "-" if n is None else format_size(int(n))


def _waited(c: dict) -> str:
    """An opportunistic container's launching threads' waits since it started, by cause."""
    return "since it started, " + proto.waits_in_words(
        {cause: c.get(proto.wait_key(cause), 0) for cause in proto.WAIT_CAUSES}, "s", ".1f")


def stolen_words(share: float | None, controller: str = Controller.FAST.value) -> str | None:
    """What `tgs status` says of the host's CPU time its hypervisor took over the last 3 s
    (the daemon's `host_cpu_stolen`); None under 1 % (or not known): nothing worth saying.
    Under `fast`, tgsd does not take a fall of production that it explains for harm (for
    15 s at most against one figure: docs/daemon.md); `tgs-paper` has no such rule."""
    if share is None or share < 0.01:
        return None
    said = f"the host's hypervisor took {share:.1%} of its CPU time over the last 3 s: it slows production too"
    return said + (", and a fall of production that it explains is not taken for harm"
                   if controller == Controller.FAST.value else "")


def rhythm_words(rhythm_s: float, controller: str = Controller.FAST.value) -> str | None:
    """A production container's rhythm (the longest idle spell its processes expect), in
    words, where it is longer than the idle rule's half second: within it production is on
    its host, not idle, up to FastController.RHYTHM_MAX_S; beyond, each spell is idle. The
    `tgs-paper` controller judges no idle spell (its samples are 5 s), so of it nothing
    is said of idleness."""
    if rhythm_s <= FastController.IDLE_S:
        return None
    said = f"on its host up to {rhythm_s:.2f} s between its bursts (its rhythm)"
    if controller != Controller.FAST.value:
        return said + f"; the {controller} controller does not read it"
    said += ": "
    if rhythm_s <= FastController.RHYTHM_MAX_S:
        return said + "not idle within it"
    return said + (f"longer than tgsd's {FastController.RHYTHM_MAX_S:g} s, so idle in each spell, and each return "
                   "profiled")


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print tgsd's status document (schema: docs/status.md).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Config file naming tgsd's state_dir (default /etc/tgs/config.toml).")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), help="tgsd's state_dir.")
def status_cmd(as_json: bool, config_path: Path | None, state_dir: Path | None) -> None:
    """Show each GPU: its containers, class, budget, progress, memory resident and evicted,
    what each opportunistic container has waited for (behind production, at the in-flight
    bound, anticipating production, for tokens), and how long each production container
    paused on its own (left out of its progress) or spends on its host between bursts
    (its rhythm, where longer than the idle rule's half second; up to 8.5 s, not idle
    within it)."""
    try:
        if state_dir is None:
            state_dir = configmod.load(config_path).daemon.state_dir
        st = AdminClient(state_dir).status()
    except (configmod.ConfigError, DaemonUnavailable, Refused) as e:
        raise click.ClickException(str(e)) from e
    st.pop("ok", None)
    if as_json:
        click.echo(json.dumps(st, indent=2))
        return
    d = st["daemon"]
    click.echo(f"tgsd {d['version']} (pid {d['pid']}, up {d['uptime_s']:.0f}s): controller {d['controller']}, "
               f"share {d['share']}, state {d['state_dir']}")
    stolen = stolen_words(d.get("host_cpu_stolen"), d["controller"])
    if stolen:
        click.echo(stolen)
    for g in st["gpus"]:
        ctl = g["controller"]
        rate = "unlimited" if ctl["rate_blocks_per_s"] is None else f"{ctl['rate_blocks_per_s']:.0f} blocks/s"
        solo = "-" if ctl["solo_blocks_per_s"] is None else f"{ctl['solo_blocks_per_s']:.0f}"
        beside, bound = ctl.get("opportunistic_beside_production"), ctl.get("inflight_max")
        more = ("" if beside is None else f", opportunistic work beside it {beside:.1%} of the time") + (
            "" if bound is None else ", no in-flight bound" if bound == 0 else f", in-flight bound {bound}")
        click.echo(f"\nGPU {g['index']} {g['uuid']} {g['name']}: memory budget {_mem(g['memory_budget'])} of "
                   f"{_mem(g['memory_total'])}\n  controller {ctl['state']}: opportunistic {rate}, production "
                   f"{ctl['production_progress_blocks_per_s']:.0f} blocks/s (solo {solo}){more}")
        decision = ctl.get("decision")
        if decision and decision["why"]:
            click.echo(f"  its latest decision, {decision['age_s']:.1f} s ago: {decision['why']}")
        if not g["containers"]:
            click.echo("  no containers")
            continue
        click.echo(f"  {'container':<20} {'class':<14} {'procs':>5} {'budget/s':>10} {'progress/s':>11} "
                   f"{'footprint':>10} {'resident':>9} {'evicted':>8}")
        for c in g["containers"]:
            budget = "-" if c["class"] == "production" else (
                "unlimited" if c["budget_blocks_per_s"] is None else f"{c['budget_blocks_per_s']:.0f}")
            m = c["memory"]
            click.echo(f"  {c['id'][:20]:<20} {c['class']:<14} {c['processes']:>5} {budget:>10} "
                       f"{c['progress_blocks_per_s']:>11.0f} {_mem(m['footprint']):>10} {_mem(m['resident']):>9} "
                       f"{_mem(m['evicted']):>8}")
            if c["class"] == "opportunistic":
                click.echo("    " + _waited(c))
            else:
                rhythm = rhythm_words(c.get("rhythm_s") or 0.0, d["controller"])
                if rhythm:
                    click.echo("    " + rhythm)
                if c.get("paused_s"):
                    click.echo(f"    since it started, paused on its own {c['paused_s']:.1f} s (a data loader's "
                               "stall, say), left out of its progress")


def register(group: click.Group) -> None:
    group.add_command(status_cmd)
