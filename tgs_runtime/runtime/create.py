"""Setting up, at create, a container that asks for TGS: decide from its spec, reserve
with tgsd, edit the spec. Nothing is done for a container that does not ask.

This runs inside tgsd (the admin operation `create`, which tgs-runtime's launcher sends:
no Python starts on a container's create path) and, when tgsd cannot be reached, in
tgs-runtime-create, which then decides exactly and says clearly why a TGS container
cannot start. Both go through `set_up`; only how they reserve differs."""
from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from tgs_runtime.runtime import spec as specmod


class Failure(Exception):
    """Create cannot go on: the message is the one line the user sees."""


class ReserveFailed(Exception):
    """Raised by a `reserve` callable: tgsd said no, or could not be asked. `refused` tells which."""

    def __init__(self, msg: str, refused: bool):
        super().__init__(msg)
        self.refused = refused


@dataclass(frozen=True)
class Asked:
    bundle: Path
    spec: specmod.Spec
    request: specmod.Request


def ask(bundle: Path, cfg) -> Asked | None:
    """What the container in `bundle` asks for, or None when TGS leaves it alone."""
    try:
        spec = specmod.read(bundle)
        request = specmod.classify(spec, cfg.runtime.default_class, cfg.runtime.production.value)
    except specmod.SpecError as e:
        raise Failure(str(e)) from None
    return None if request is None else Asked(bundle, spec, request)


def edit(asked: Asked, reservation: dict, cfg) -> None:
    """Writes the TGS spec of a reserved container into its bundle."""
    setup = specmod.Setup(
        cls=asked.request.cls, gpus=reservation["gpus"], container_dir=Path(reservation["dir"]),
        activity=reservation["activity"], shim_path=cfg.runtime.shim_path, hook_path=cfg.runtime.hook_path,
        config_path=cfg.path, hook_timeout_s=cfg.runtime.hook_timeout_s,
        sim_state=cfg.sim.state if cfg.sim.enabled else None,
        sim_lib_dir=cfg.sim.lib_dir if cfg.sim.enabled else None,
        preload_lines=specmod.image_preload(asked.spec, asked.bundle))
    for path, what in ((setup.shim_path, "libtgs.so"), (setup.hook_path, "tgs-hook")):
        if not os.access(path, os.R_OK):
            raise Failure(f"{what} is not installed at {path} (run `tgs setup docker`, or fix [runtime] in {cfg.path})")
    try:
        specmod.write(asked.bundle, specmod.apply(asked.spec, setup))
    except OSError as e:
        raise Failure(f"cannot edit {asked.bundle}/config.json: {e.strerror or e}") from None


async def set_up(cid: str | None, bundle: Path, cfg, reserve: Callable[[str, specmod.Request], Awaitable[dict]],
                 release: Callable[[str], Awaitable[None]]) -> str | None:
    """Reserves and edits the container if it asks for TGS; returns its class, or None.
    Raises Failure with the user's message; a failed edit releases the reservation."""
    # file work off the caller's event loop (tgsd's control loop must not wait on a bundle's disk)
    asked = await asyncio.to_thread(ask, bundle, cfg)
    if asked is None:
        return None
    cls = asked.request.cls
    if not cid:
        raise Failure("create without a container id")
    try:
        reservation = await reserve(cid, asked.request)
    except ReserveFailed as e:
        raise Failure(f"tgsd refused this {cls} container: {e}" if e.refused
                      else f"cannot set up TGS for this {cls} container: {e}") from None
    try:
        await asyncio.to_thread(edit, asked, reservation, cfg)
    except BaseException:
        await release(cid)  # nothing is left behind
        raise
    return cls
