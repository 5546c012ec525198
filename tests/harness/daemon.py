"""A real tgsd for tests: started as its own process on the test's simulated GPU, with a
state directory and config of its own; containers are registered through its admin
socket as tgs-runtime would, with a sleeping process standing in for each container's
init (killing it is the container dying)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import tomllib

from tgs_runtime.admin import AdminClient, DaemonUnavailable
from tgs_runtime.control import ControlBlock


def merge(base: dict, extra: dict) -> dict:
    out = {k: dict(v) for k, v in base.items()}
    for section, values in extra.items():
        out.setdefault(section, {}).update(values)
    return out


def to_toml(data: dict) -> str:
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'
    lines = []
    for section, values in data.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


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


class Tgsd:
    def __init__(self, simgpu, workdir: Path, toml: str = ""):
        self.simgpu = simgpu
        self.workdir = workdir
        self.state_dir = workdir / "state"
        self.config = workdir / "config.toml"
        self.log_path = workdir / "tgsd.log"
        workdir.mkdir(parents=True, exist_ok=True)
        simgpu.uuids()  # the simulated card exists before tgsd reads it
        self.config.write_text(to_toml(merge(
            {"daemon": {"state_dir": str(self.state_dir), "log": "json", "log_level": "debug"},
             "sim": {"enabled": True, "state": str(simgpu.state), "lib_dir": str(simgpu.artifacts.simgpu_dir)}},
            tomllib.loads(toml))))
        self.proc: subprocess.Popen | None = None
        self.admin = AdminClient(self.state_dir, timeout=10)
        self.inits: list[subprocess.Popen] = []
        self._n = 0

    def start(self, timeout: float = 20) -> "Tgsd":
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SIMGPU_", "TGS_"))}
        self._log = open(self.log_path, "a")
        self.proc = subprocess.Popen([sys.executable, "-m", "tgs_runtime.daemon.main", "--config", str(self.config)],
                                     env=env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tgsd exited with {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}")
            try:
                self.admin.status()
                return self
            except DaemonUnavailable:
                time.sleep(0.05)
        raise TimeoutError(f"tgsd did not answer in {timeout}s:\n{self.log_path.read_text()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> int:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout)
        self._log.close()
        return self.proc.returncode if self.proc else 0

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
        if self.proc and self.proc.poll() is None:
            self.stop()
