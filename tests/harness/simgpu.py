"""A fresh simulated GPU per test, and workloads running on it."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from tgs_runtime import sim
from tgs_runtime.paths import Artifacts
from tgs_runtime.workload import Report, Workload, parse_output, summary


SM_COUNT = 108  # simgpu's SMs (libshim/simgpu/state.c): the workload launches one block per SM per kernel


def threads_in_words(pid: int) -> str:
    """Where each thread of process `pid` is, for a failure message: its state and the
    kernel function it sleeps in (/proc's wchan), e.g. "4101 S futex_wait_queue"; what
    cannot be read (the process gone) is left out."""
    out = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*"), key=lambda t: int(t.name)):
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            out.append(f"{task.name} {state} {(task / 'wchan').read_text().strip() or '-'}")
        except (OSError, IndexError):
            continue
    return ", ".join(out) or "no threads to read"


@dataclass
class Proc:
    """A program started by the harness; its output is collected when it ends."""

    popen: subprocess.Popen
    label: str
    stdout: str = ""
    stderr: str = ""

    def wait(self, timeout: float = 120) -> int:
        out, err = self.popen.communicate(timeout=timeout)
        self.stdout += out or ""
        self.stderr += err or ""
        return self.popen.returncode

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def reports(self) -> list[Report]:
        return parse_output(self.stdout)

    def summary(self) -> Report:
        return summary(self.stdout)


@dataclass
class SimGPU:
    """One simulated card (its own state file) and the programs run on it."""

    artifacts: Artifacts
    state: Path
    devices: int = 1
    memory: str = "4G"
    timeslice_us: int | None = None
    procs: list[Proc] = field(default_factory=list)

    def settings(self) -> sim.SimSettings:
        return sim.SimSettings(
            state=self.state, devices=self.devices, memory=self.memory, timeslice_us=self.timeslice_us
        )

    def env(self, label: str | None = None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = self.settings().env()
        env.pop("SIMGPU_FAULT", None)
        env["SIMGPU_LOG"] = env.get("SIMGPU_LOG", "warn")
        env["TGS_LIBSHIM_BUILD"] = str(self.artifacts.root)
        if label:
            env["SIMGPU_LABEL"] = label
        env.update(extra or {})
        return env

    def spawn(self, argv: Sequence[str], label: str = "", extra_env: Mapping[str, str] | None = None) -> Proc:
        popen = subprocess.Popen(
            list(argv), env=self.env(label, extra_env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        proc = Proc(popen, label)
        self.procs.append(proc)
        return proc

    def workload(self, w: Workload, label: str, extra_env: Mapping[str, str] | None = None) -> Proc:
        return self.spawn(w.argv(self.artifacts.workload), label, extra_env)

    def run(self, w: Workload, label: str, extra_env: Mapping[str, str] | None = None, timeout: float = 120) -> Proc:
        p = self.workload(w, label, extra_env)
        p.wait(timeout)
        return p

    def uuids(self) -> list[str]:
        """The devices' UUIDs (the state file is made first if no program has run yet)."""
        if not self.state.exists():
            self.run(Workload(seconds=0.01, param_mb=0, act_mb=0), "uuid-probe")
        return [d["uuid"] for d in self.status()["devices"]]

    def status(self) -> dict:
        return sim.status(self.state)

    def answers(self, within_s: float = 1.0) -> bool:
        """Whether the simulated GPU answers a status read within `within_s`. A process
        stopped or frozen (SIGSTOP, `docker pause`) while one of its threads held simgpu's
        device lock (mid-call: a launch under way) stops the simulated GPU for every process, where a
        real driver goes on serving the others: a test that stops a job checks this, and
        stops it elsewhere (a read left waiting ends once the job goes on)."""
        probe = threading.Thread(target=self.status, daemon=True)
        probe.start()
        probe.join(within_s)
        return not probe.is_alive()

    def snapshots(self, seconds: float) -> tuple[dict, dict]:
        """The accounting now and `seconds` later."""
        before = self.status()
        time.sleep(seconds)
        return before, self.status()

    def context(self, label: str, device: int = 0) -> dict:
        return sim.contexts(self.status(), device)[label]

    def wait_for_contexts(self, labels: Sequence[str], timeout: float = 20, device: int = 0, kernels: int = 1) -> dict:
        """Waits until every label has a live context that has run `kernels` kernels (one:
        it has started; a whole iteration: every kernel of it has touched its memory);
        returns the snapshot."""
        deadline = time.monotonic() + timeout
        while True:
            if self.state.exists():
                snap = self.status()
                ctxs = sim.contexts(snap, device)
                if all(l in ctxs and ctxs[l]["state"] == "live" and ctxs[l]["kernels"] >= kernels for l in labels):
                    return snap
            if time.monotonic() > deadline:
                raise TimeoutError(f"contexts {labels} did not start on the simulated GPU in {timeout}s")
            time.sleep(0.05)

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.unlink(self.state)
        except FileNotFoundError:
            pass
