"""tgsd as a child process with a config of its own: for `tgs demo` when no tgsd runs,
for the benchmarks, and for the tests (tests/harness/daemon.py builds on it)."""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tgs_runtime.admin import AdminClient, DaemonUnavailable
from tgs_runtime.paths import REPO_ROOT, artifacts
from tgs_runtime.sim import SimSettings

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def ends_with_us(sig: int):
    """A Popen `preexec_fn`: the child is sent `sig` when this process ends, however it
    ends (SIGKILL included; Linux's PR_SET_PDEATHSIG), so that what a demo or a benchmark
    started for itself does not outlive it. Linux takes the thread that starts the child
    for its parent: start it from one that outlives it (the main thread here)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # we ended before the signal was asked for
            os._exit(1)
    return preexec


@dataclass
class ProcessContainer:
    """A container registered as tgs-runtime registers one, made of plain processes: a
    sleeping process stands in for its init (killing it is the container dying)."""

    id: str
    cls: str
    dir: Path
    init: subprocess.Popen

    def env(self, shim: Path, log_level: str | None = None) -> dict[str, str]:
        """What a process of this container runs with (tgs-runtime puts the same in the spec);
        `log_level` sets the shim's TGS_LOG_LEVEL."""
        env = {"TGS_DIR": str(self.dir), "LD_PRELOAD": str(shim)}
        if log_level:
            env["TGS_LOG_LEVEL"] = log_level
        return env


def own_config(settings: SimSettings | None, budget: str = "24G") -> dict:
    """The config of a tgsd of our own (demo, bench): this checkout's shim and hook; on
    simgpu with `settings`, else on the real GPU with unified memory capped at `budget`,
    far below the card's size."""
    a = artifacts()
    config = {"runtime": {"shim_path": str(a.require(a.shim)), "hook_path": str(a.root / "tgs-hook")}}
    if settings:
        config["sim"] = {"enabled": True, "state": str(settings.state), "lib_dir": str(a.simgpu_dir)}
    else:
        config["memory"] = {"budget": budget}
    return config


def merge(base: dict, extra: dict) -> dict:
    out = {k: dict(v) for k, v in base.items()}
    for section, values in extra.items():
        out.setdefault(section, {}).update(values)
    return out


def to_toml(data: dict) -> str:
    """The small TOML the config needs: tables of strings, numbers, booleans and lists."""
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


class ChildTgsd:
    """A tgsd of our own. Its state_dir is short (a container socket's path must fit
    AF_UNIX's 108 bytes with a 64-character container id)."""

    def __init__(self, config: dict, config_path: Path, log_path: Path):
        self.state_dir = Path(tempfile.mkdtemp(prefix="tgs-", dir="/tmp"))
        self.config = config_path.resolve()  # tgsd runs elsewhere (`start`)
        self.log_path = log_path
        self.config.parent.mkdir(parents=True, exist_ok=True)
        self.config.write_text(to_toml(merge({"daemon": {"state_dir": str(self.state_dir)}}, config)))
        self.admin = AdminClient(self.state_dir, timeout=10)
        self.proc: subprocess.Popen | None = None
        self._log = None
        self.inits: list[subprocess.Popen] = []

    def start(self, timeout: float = 20) -> "ChildTgsd":
        """Starts tgsd and waits until it answers; where it does not, stops it and removes
        its state directory before raising (the log stays, for the error to point at). It
        runs in the folder this process's tgs_runtime comes from, where `python -m` finds
        that copy first: from the working directory, a side-by-side run started from one
        checkout with PYTHONPATH naming another ran the first's tgsd in both arms."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SIMGPU_", "TGS_"))}
        self._log = open(self.log_path, "a")
        self.proc = subprocess.Popen([sys.executable, "-m", "tgs_runtime.daemon.main", "--config", str(self.config)],
                                     cwd=REPO_ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     preexec_fn=ends_with_us(signal.SIGTERM))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._abandon()
                raise RuntimeError(f"tgsd exited with {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}")
            try:
                self.admin.status()
                return self
            except DaemonUnavailable:
                time.sleep(0.05)
        self._abandon()
        raise TimeoutError(f"tgsd did not answer in {timeout}s:\n{self.log_path.read_text()[-3000:]}")

    def _abandon(self) -> None:
        """A start that failed: tgsd killed where it still runs, the state directory removed."""
        self.stop(signal.SIGKILL)
        self.close()

    def register(self, cls: str, gpus: list[str] | None = None, cid: str | None = None,
                 convert: bool | None = None) -> ProcessContainer:
        """Reserves and attaches a container of plain processes (`reserve`, then `attach`)."""
        cid = cid or f"{cls[:4]}{len(self.inits) + 1}"
        reply = self.admin.reserve(cid, cls, gpus or ["0"], convert)
        init = subprocess.Popen(["sleep", "86400"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL,  # holds no pipe of ours open
                                preexec_fn=ends_with_us(signal.SIGKILL))
        self.inits.append(init)
        self.admin.attach(cid, init.pid)
        return ProcessContainer(cid, cls, Path(reply["dir"]), init)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> int:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout)
        if self._log:
            self._log.close()
            self._log = None
        return self.proc.returncode if self.proc else 0

    def close(self) -> None:
        for p in self.inits:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.stop()
        shutil.rmtree(self.state_dir, ignore_errors=True)
