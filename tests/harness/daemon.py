"""A real tgsd for tests: started as its own process on the test's simulated GPU, with a
state directory and config of its own; containers are registered through its admin
socket as tgs-runtime would, with a sleeping process standing in for each container's
init (killing it is the container dying)."""
from __future__ import annotations

import dataclasses
import json
import signal
import time
from pathlib import Path

import tomllib

from tgs_runtime.childd import ChildTgsd, ProcessContainer, merge
from tgs_runtime.control import ControlBlock


class Registration(ProcessContainer):
    def counters(self, slot: int = 0) -> dict[str, int]:
        cb = ControlBlock.open(self.dir / "control")
        try:
            ctr = cb.counters(slot)
            return {n: getattr(ctr, n) for n, _ in type(ctr)._fields_ if n != "reserved"}
        finally:
            cb.close()


@dataclasses.dataclass
class StatusWindow:
    """Two simgpu snapshots `seconds` apart, and tgsd's status of the GPU every 0.1 s between."""
    before: dict
    after: dict
    samples: list[dict]
    quiet: bool  # tgsd neither profiled nor (where asked) held a rate or moved the in-flight bound in it
    unquiet: str = "a profile"  # what a window was to be without, for `caveat`

    @property
    def seconds(self) -> float:
        """How long the window was by simgpu's clock (a little over what was asked: tgsd's
        status is read between the samples)."""
        return (self.after["time_ns"] - self.before["time_ns"]) / 1e9

    @property
    def caveat(self) -> str:
        """For a failure message: what it means where no quiet window was found."""
        return "" if self.quiet else f" (every window searched had {self.unquiet})"


class Tgsd(ChildTgsd):
    """A ChildTgsd on the test's simulated GPU, with the test conveniences."""

    def __init__(self, simgpu, workdir: Path, toml: str = "", config: Path | None = None):
        self.simgpu = simgpu
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        simgpu.uuids()  # the simulated card exists before tgsd reads it
        base = {"daemon": {"log": "json", "log_level": "debug"},
                "sim": {"enabled": True, "state": str(simgpu.state), "lib_dir": str(simgpu.artifacts.simgpu_dir)},
                "runtime": {"shim_path": str(simgpu.artifacts.shim), "hook_path": str(simgpu.artifacts.root / "tgs-hook")}}
        super().__init__(merge(base, tomllib.loads(toml)), config or workdir / "config.toml", workdir / "tgsd.log")

    def kill9(self) -> None:
        self.stop(signal.SIGKILL)

    def register(self, cls: str, gpus: list[str] | None = None, cid: str | None = None,
                 convert: bool | None = None) -> Registration:
        c = super().register(cls, gpus, cid, convert)
        return Registration(c.id, c.cls, c.dir, c.init)

    def status(self) -> dict:
        return self.admin.status()

    def container(self, cid: str, gpu: int = 0) -> dict | None:
        for c in self.status()["gpus"][gpu]["containers"]:
            if c["id"] == cid:
                return c
        return None

    def quiet_window(self, seconds: float, within_s: float, *, unlimited: bool = False,
                     bound: int | None = None) -> StatusWindow:
        """A window of `seconds` in which tgsd did not profile (and, with `unlimited`, held
        no rate; with `bound`, kept that in-flight bound), measured again until one is
        found or `within_s` has passed (then the last, with quiet False). A profile gates
        opportunistic work for about a second whatever a test is about: one after a
        production process started, or a check of a figure taken under a loaded CI
        machine's noise, took a third of a 4 s window."""
        deadline = time.monotonic() + within_s
        while True:
            before, samples = self.simgpu.status(), []
            for _ in range(round(seconds / 0.1)):
                samples.append(self.status()["gpus"][0])
                time.sleep(0.1)
            ctl = [g["controller"] for g in samples]
            quiet = not any(c["state"] == "profile" or (unlimited and c["rate_blocks_per_s"] is not None)
                            or (bound is not None and c["inflight_max"] != bound) for c in ctl)
            if quiet or time.monotonic() > deadline:
                unquiet = " or ".join(["a profile"] + ["a rate limit"] * unlimited
                                      + [f"an in-flight bound other than {bound}"] * (bound is not None))
                return StatusWindow(before, self.simgpu.status(), samples, quiet, unquiet)

    def events(self) -> list[dict]:
        out = []
        for line in self.log_path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def wait_event(self, event: str, timeout: float = 10, **match) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.events():
                if e.get("event") == event and all(e.get(k) == v for k, v in match.items()):
                    return e
            time.sleep(0.05)
        raise TimeoutError(f"tgsd logged no {event!r} {match} in {timeout}s")
