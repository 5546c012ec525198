"""The MPS baseline: NVIDIA's Multi-Process Service, the OS-layer alternative the TGS paper
compares against ("MPS: manually set appropriate limit").

A private MPS control daemon for one benchmark run (its own pipe and log directories, so
that no other CUDA process on the host connects to it), and the environment of its
clients: production at normal priority with every SM, the opportunistic job at
below-normal priority (CUDA_MPS_CLIENT_PRIORITY=1) limited to a share of the SMs
(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) an operator who knows production's duty would give it.
Neither runs with libtgs.so.

Only `bench pytorch` has an MPS row: under MPS the kernels of both jobs run at once on the
SMs, and tgs-workload's kernels, which spin on the GPU's clock, would not slow each other
down there the way real kernels contending for SMs and memory do."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"
MIN_PERCENT = 10


def unavailable(real: bool) -> str | None:
    """Why the MPS baseline cannot run here, or None."""
    if not real:
        return "needs a real GPU (simgpu has no MPS)"
    if shutil.which(CONTROL) is None:
        return f"{CONTROL} is not installed (it comes with the NVIDIA driver's utilities)"
    return None


def opportunistic_percent(duty: float) -> int:
    """The SMs an operator who knows production's duty would leave the opportunistic job:
    the idle share, in whole percent, at least MIN_PERCENT."""
    return max(MIN_PERCENT, min(100, round(100 * (1 - duty))))


@dataclass(frozen=True)
class Client:
    """One MPS client's limits."""
    thread_percent: int = 100
    below_normal: bool = False

    def env(self) -> dict[str, str]:
        if not 1 <= self.thread_percent <= 100:
            raise ValueError(f"an MPS client's thread percentage is 1-100, not {self.thread_percent}")
        return {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(self.thread_percent),
                "CUDA_MPS_CLIENT_PRIORITY": "1" if self.below_normal else "0"}


class MpsError(RuntimeError):
    """The private MPS daemon did not start or serve; says why, with its log's last lines."""


class Mps:
    """A private MPS control daemon in the foreground, as a child. Use as a context manager."""

    def __init__(self, workdir: Path, keep_logs: Path | None = None, start_s: float = 15.0):
        self.pipe = workdir / "mps-pipe"
        self.logs = workdir / "mps-log"
        self.keep_logs = keep_logs
        self.start_s = start_s
        self.proc: subprocess.Popen | None = None

    def env(self) -> dict[str, str]:
        """What the daemon and every client of it run with."""
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe), "CUDA_MPS_LOG_DIRECTORY": str(self.logs)}

    def client(self, c: Client) -> dict[str, str]:
        return {**self.env(), **c.env()}

    def _command(self, line: str, timeout: float = 10.0) -> subprocess.CompletedProcess:
        """One command to the running daemon, as `echo LINE | nvidia-cuda-mps-control`."""
        return subprocess.run([CONTROL], input=line + "\n", env={**os.environ, **self.env()},
                              capture_output=True, text=True, timeout=timeout)

    def _log_tail(self) -> str:
        lines = []
        for f in sorted(self.logs.glob("*.log")) + [self.logs / "stdout.txt"]:
            if f.exists():
                lines += [f"{f.name}: {line}" for line in f.read_text(errors="replace").splitlines()[-5:]]
        return " | ".join(lines) or "(no log)"

    def start(self) -> "Mps":
        self.pipe.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / "stdout.txt", "w") as out:
            self.proc = subprocess.Popen([CONTROL, "-f"], env={**os.environ, **self.env()}, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.start_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise MpsError(f"{CONTROL} -f exited with {self.proc.returncode}: {self._log_tail()}")
            try:
                if self._command("get_server_list", timeout=5).returncode == 0:
                    return self
            except subprocess.TimeoutExpired:
                pass
            time.sleep(0.2)
        self.stop()
        raise MpsError(f"{CONTROL} did not answer within {self.start_s:g} s: {self._log_tail()}")

    def stop(self) -> None:
        """Asks the daemon to quit (its server goes once its clients have), then makes sure."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self._command("quit")
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None
        if self.keep_logs:
            self.keep_logs.mkdir(parents=True, exist_ok=True)
            for f in self.logs.iterdir():
                shutil.copy(f, self.keep_logs / f"mps-{f.name}")

    def __enter__(self) -> "Mps":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
