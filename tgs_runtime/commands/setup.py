"""`tgs setup docker|containerd`: install TGS on this host."""
from __future__ import annotations

from pathlib import Path

import click

from tgs_runtime import containerd_config, install
from tgs_runtime.paths import MissingArtifact


@click.group("setup")
def setup_group() -> None:
    """Install TGS into docker or containerd on this host."""


@setup_group.command("docker")
@click.option("--daemon-json", type=click.Path(dir_okay=False, path_type=Path), default=install.DAEMON_JSON,
              show_default=True, help="docker's daemon configuration.")
@click.option("--config", "config", type=click.Path(dir_okay=False, path_type=Path), default=install.CONFIG,
              show_default=True, help="The TGS config the runtime is pointed at.")
@click.option("--prefix", type=click.Path(file_okay=False, path_type=Path), default=Path("/"),
              help="Install under this directory instead of / (for packaging and tests).")
@click.option("--dry-run", is_flag=True, help="Show what would change; change nothing.")
@click.option("--undo", is_flag=True, help="Remove the tgs runtime from daemon.json, and the installed programs "
              "unless containerd's config still has its tgs handler.")
def setup_docker(daemon_json: Path, config: Path, prefix: Path, dry_run: bool, undo: bool) -> None:
    """Install libtgs.so, tgs-runtime, tgs-hook and tgsd at stable paths and add the `tgs`
    runtime to docker's daemon.json (every other key kept, the old file backed up).

    Afterwards: `systemctl enable --now tgsd`, then make dockerd re-read its runtimes
    with SIGHUP (`systemctl reload docker` or `kill -HUP $(pidof dockerd)`), and run
    containers with `docker run --runtime=tgs -e TGS_CLASS=production|opportunistic ...`.
    """
    layout = install.Layout(prefix)
    djson = layout.at(daemon_json)
    try:
        install.replaceable(djson)
        old = install.read_daemon_json(djson)
        new = install.with_runtime(old, None if undo else install.docker_entry(layout, config))
        actions = [] if undo else install.file_actions(layout)
    except (install.InstallError, MissingArtifact) as e:
        raise click.ClickException(str(e)) from e
    change = install.diff(djson, old, new) if new != old else ""
    keep = undo and _containerd_uses_them(layout)
    if dry_run:
        for a in actions:
            click.echo(f"would {a.describe()}")
        if undo:
            click.echo(keep or f"would remove the installed programs under {prefix}")
        click.echo(change or f"{djson}: no change")
        return
    if undo:
        _remove_programs(layout, keep)
    else:
        install.apply_files(actions)
        for a in actions:
            click.echo(f"installed {a.path}")
    if change:
        backup = install.write_daemon_json(djson, old, new)
        click.echo(change)
        if backup:
            click.echo(f"the previous {djson} is kept as {backup}")
    else:
        click.echo(f"{djson} already {'has no' if undo else 'has the'} tgs runtime")
    if not undo:
        click.echo("\nnext: systemctl daemon-reload && systemctl enable --now tgsd\n"
                   "      systemctl reload docker    (dockerd re-reads runtimes on SIGHUP)\n"
                   "      tgs doctor                 (checks it all, and how TGS containers get their GPUs)\n"
                   "      docker run --runtime=tgs -e TGS_CLASS=opportunistic -e NVIDIA_VISIBLE_DEVICES=0 IMAGE ...")


@setup_group.command("containerd")
@click.option("--write", "write_to", type=click.Path(dir_okay=False, path_type=Path),
              help="Add the handler to this file, and install the programs, instead of printing the handler: the "
                   "main config, or a file it imports (e.g. /etc/containerd/conf.d/tgs.toml), where containerd "
                   "reads it for the file's version.")
@click.option("--containerd-config", "main", type=click.Path(dir_okay=False, path_type=Path),
              default=containerd_config.CONTAINERD_TOML, show_default=True,
              help="containerd's main config, whose version a new file gets and whose imports are checked.")
@click.option("--containerd-config-version", "version", type=click.IntRange(1, 3), metavar="1|2|3",
              help="The containerd config version to print the handler for, or to give a new file: 1 (no version "
                   "line), 2 (containerd 1.3-1.7) or 3 (containerd 2). [default: with --write, the file's; for a new "
                   "file and when printing, the main config's, else the installed containerd's, else 2]")
@click.option("--config", "config", type=click.Path(dir_okay=False, path_type=Path), default=install.CONFIG,
              show_default=True, help="The TGS config tgs-runtime reads.")
@click.option("--prefix", type=click.Path(file_okay=False, path_type=Path), default=Path("/"),
              help="Install, and read and write the containerd configs, under this directory instead of / (for "
                   "packaging and tests).")
@click.option("--dry-run", is_flag=True, help="Show what --write or --undo would change; change nothing.")
@click.option("--undo", is_flag=True, help="Remove the tgs handler that tgs setup wrote from the main config and "
              "the files it imports, and the installed programs unless docker's daemon.json still names them.")
def setup_containerd(write_to: Path | None, main: Path, version: int | None, config: Path, prefix: Path,
                     dry_run: bool, undo: bool) -> None:
    """The runtime handler for containerd's CRI (Kubernetes RuntimeClass `tgs`), with the
    tgs.class annotation passed through, placed where containerd reads it for the config's
    version (containerd ignores a handler under another version's plugin name). With
    --write, it is added to a containerd config and libtgs.so, tgs-runtime, tgs-hook and
    tgsd are installed at stable paths, as `tgs setup docker` does.

    Afterwards: `systemctl enable --now tgsd`, restart containerd, and give pods the
    RuntimeClass `tgs` (docs/runtime.md has an example)."""
    layout = install.Layout(prefix)
    if undo:
        return _undo_containerd(layout, layout.at(main), dry_run)
    try:
        if not write_to:
            files = containerd_config.configs(layout.at(main), containerd_config.installed_release())
            version = version or containerd_config.new_file_version(files[0])
            systemd = containerd_config.systemd_cgroup(files)
            click.echo(containerd_config.stanza(version, layout.runtime, config, systemd))
            return
        change = containerd_config.add_handler(layout.at(write_to), layout.runtime, config, version, layout.at(main))
        actions = install.file_actions(layout)
        if dry_run:
            for a in actions:
                click.echo(f"would {a.describe()}")
            click.echo(f"would add {change.message}" if change.text is not None else change.message)
            return
        install.apply_files(actions)
        containerd_config.write(change)
    except (install.InstallError, MissingArtifact) as e:
        raise _refused(e) from e
    for a in actions:
        click.echo(f"installed {a.path}")
    click.echo(f"added {change.message}" if change.text is not None else change.message)
    click.echo("\nnext: systemctl daemon-reload && systemctl enable --now tgsd\n"
               "      systemctl restart containerd   (it reads runtime handlers when it starts)\n"
               "      tgs doctor                     (checks it all, and how TGS containers get their GPUs)\n"
               "      a RuntimeClass with handler: tgs, and pods with runtimeClassName: tgs and the tgs.class "
               "annotation")


def _refused(e: Exception) -> click.ClickException:
    said = "nothing was changed" in str(e)
    return click.ClickException(f"{e}{'' if said else '; nothing was changed'}")


def _undo_containerd(layout: install.Layout, main: Path, dry_run: bool) -> None:
    try:
        found = [c for c in containerd_config.configs(main, containerd_config.installed_release()) if c.handlers]
        changes = [containerd_config.remove_handler(c.path) for c in found]
    except install.InstallError as e:
        raise _refused(e) from e
    keep = _docker_uses_them(layout)
    if dry_run:
        for change in changes:
            click.echo(f"would remove {change.message}")
        click.echo(keep or f"would remove the installed programs under {layout.prefix}")
        return
    for change in changes:
        containerd_config.write(change)
        click.echo(f"removed {change.message}")
    if not changes:
        click.echo(f"{main} and the files it imports have no tgs runtime handler")
    _remove_programs(layout, keep)
    if changes:
        click.echo("next: systemctl restart containerd")


def _containerd_uses_them(layout: install.Layout) -> str:
    """Why the programs stay (containerd's config still runs them), or ''."""
    main = layout.at(containerd_config.CONTAINERD_TOML)
    try:
        found = [c for c in containerd_config.configs(main, containerd_config.installed_release()) if c.handlers]
    except install.InstallError:
        return f"kept the installed programs: {main} cannot be read, and may still run them"
    return f"kept the installed programs: {found[0].path} still has the tgs runtime handler" if found else ""


def _docker_uses_them(layout: install.Layout) -> str:
    """Why the programs stay (docker's daemon.json still runs them), or ''."""
    djson = layout.at(install.DAEMON_JSON)
    try:
        named = install.RUNTIME_NAME in install.read_daemon_json(djson).get("runtimes", {})
    except install.InstallError:
        named = True  # unreadable: it may name them
    return f"kept the installed programs: {djson} still names the tgs runtime" if named else ""


def _remove_programs(layout: install.Layout, keep: str) -> None:
    if keep:
        click.echo(keep)
        return
    for p in install.remove_files(layout):
        click.echo(f"removed {p}")


def register(group: click.Group) -> None:
    group.add_command(setup_group)
