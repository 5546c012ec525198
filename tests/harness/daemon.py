"""A real tgsd for tests: started as its own process on the test's simulated GPU, with a
state directory and config of its own; containers are registered through its admin
socket as tgs-runtime would, with a sleeping process standing in for each container's
init (killing it is the container dying)."""
from __future__ import annotations

import json
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import tomllib

from tgs_runtime.childd import ChildTgsd, merge
from tgs_runtime.control import ControlBlock


@dataclass
class Registration:
    id: str
    cls: str
    dir: Path
    init: subprocess.Popen

    def env(self, shim: Path) -> dict[str, str]:
        return {"TGS_DIR": str(self.dir), "LD_PRELOAD": str(shim)}

    def counters(self, slot: int = 0) -> dict[str, int]:
        cb = ControlBlock.open(self.dir / "control")
        try:
            ctr = cb.counters(slot)
            return {n: getattr(ctr, n) for n, _ in type(ctr)._fields_ if n != "reserved"}
        finally:
            cb.close()


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
        self.inits: list[subprocess.Popen] = []
        self._n = 0

    def kill9(self) -> None:
        self.stop(signal.SIGKILL)

    def register(self, cls: str, gpus: list[str] | None = None, cid: str | None = None) -> Registration:
        self._n += 1
        cid = cid or f"{cls[:4]}{self._n}"
        reply = self.admin.reserve(cid, cls, gpus or ["0"])
        init = subprocess.Popen(["sleep", "3600"])
        self.inits.append(init)
        self.admin.attach(cid, init.pid)
        return Registration(cid, cls, Path(reply["dir"]), init)

    def status(self) -> dict:
        return self.admin.status()

    def container(self, cid: str, gpu: int = 0) -> dict | None:
        for c in self.status()["gpus"][gpu]["containers"]:
            if c["id"] == cid:
                return c
        return None

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

    def close(self) -> None:
        for p in self.inits:
            if p.poll() is None:
                p.kill()
                p.wait()
        super().close()
