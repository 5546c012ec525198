"""`tgsd`: the TGS host daemon (started by systemd: daemon/tgsd.service)."""
from __future__ import annotations

import asyncio
import dataclasses
import sys
from pathlib import Path

import click

from tgs_runtime import config as configmod, logs
from tgs_runtime.config import ConfigError, LogFormat


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Config file (default: $TGS_CONFIG, else /etc/tgs/config.toml; built-in defaults if absent).")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Override [daemon] state_dir.")
@click.option("--log", "log_format", type=click.Choice([f.value for f in LogFormat]),
              help="Override [daemon] log: json for journald, console for a terminal.")
@click.option("--check", is_flag=True, help="Validate the config, print it, and exit.")
def main(config_path: Path | None, state_dir: Path | None, log_format: str | None, check: bool) -> None:
    """The TGS host daemon: adaptive rate control per GPU and unified-memory residency
    between containers. Logs go to stdout (JSON under systemd)."""
    try:
        cfg = configmod.load(config_path)
    except ConfigError as e:
        click.echo(f"tgsd: {e}", err=True)
        sys.exit(2)
    if state_dir:
        cfg = dataclasses.replace(cfg, daemon=dataclasses.replace(cfg.daemon, state_dir=state_dir))
    if log_format:
        cfg = dataclasses.replace(cfg, daemon=dataclasses.replace(cfg.daemon, log=LogFormat(log_format)))
    if check:
        click.echo(f"config {cfg.path or '(built-in defaults)'} is valid:")
        for section in ("daemon", "control", "memory", "runtime", "sim"):
            for f in dataclasses.fields(getattr(cfg, section)):
                value = getattr(getattr(cfg, section), f.name)
                click.echo(f"  {section}.{f.name} = {getattr(value, 'value', getattr(value, 'text', value))}")
        return
    logs.configure(cfg.daemon.log, cfg.daemon.log_level)
    log = logs.get()
    from tgs_runtime.daemon.gpus import GpuError, GpuInventory, use_simgpu
    from tgs_runtime.daemon.service import Daemon

    try:
        if cfg.sim.enabled:
            use_simgpu(cfg.sim)
        inventory = GpuInventory()
    except GpuError as e:
        log.error("tgsd cannot start", error=str(e))
        sys.exit(1)
    if not inventory.gpus:
        log.error("tgsd cannot start", error="NVML reports no GPUs")
        sys.exit(1)

    async def run() -> None:
        daemon = Daemon(cfg, inventory)
        try:
            await daemon.start()
        except OSError as e:
            log.error("tgsd cannot start", error=f"{e.filename or cfg.daemon.state_dir}: {e.strerror or e}")
            sys.exit(1)
        await daemon.run()

    asyncio.run(run())


if __name__ == "__main__":  # pragma: no cover
    main()
