"""simgpu from Python: the environment that puts a program on the simulated GPU, and
the simulator's own accounting (docs/simgpu.md, "Accounting")."""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from tgs_runtime.paths import artifacts
from tgs_runtime.units import parse_size

DEFAULT_STATE = Path("/dev/shm/simgpu.state")


@dataclass(frozen=True)
class SimSettings:
    """The SIMGPU_* settings; they take effect when the state file is created."""

    state: Path = DEFAULT_STATE
    devices: int | None = None
    memory: str | None = None
    timeslice_us: int | None = None
    time_scale: float | None = None
    sm_count: int | None = None
    extra: Mapping[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        if self.devices is not None and not 1 <= self.devices <= 8:
            raise ValueError(f"devices={self.devices}: simgpu simulates 1 to 8 devices")
        if self.memory is not None and parse_size(self.memory) < (2 << 20):
            raise ValueError(f"memory={self.memory}: a device needs at least 2M")

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """`base` (default: this process's environment) with simgpu in front of the real driver."""
        self.validate()
        env = dict(os.environ if base is None else base)
        libdir = str(artifacts().require(artifacts().libcuda).parent)
        old = env.get("LD_LIBRARY_PATH", "")
        env["LD_LIBRARY_PATH"] = libdir + (":" + old if old else "")
        env["SIMGPU_STATE"] = str(self.state)
        for key, value in (
            ("SIMGPU_DEVICES", self.devices),
            ("SIMGPU_MEMORY", self.memory),
            ("SIMGPU_TIMESLICE_US", self.timeslice_us),
            ("SIMGPU_TIME_SCALE", self.time_scale),
            ("SIMGPU_SM_COUNT", self.sm_count),
        ):
            if value is not None:
                env[key] = str(value)
        env.update(self.extra)
        return env

    def create(self) -> None:
        """Makes the state file now (one short workload run), so that the simulated card
        exists before tgsd, NVML or a status reader looks for it."""
        a = artifacts()
        subprocess.run([str(a.require(a.workload)), "--seconds", "0.01", "--param-mb", "0", "--act-mb", "0"],
                       env=self.env(), capture_output=True, check=True)


class SimStateError(RuntimeError):
    """The simgpu state file cannot be read."""


_lib: ctypes.CDLL | None = None


def _library() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(str(artifacts().require(artifacts().libcuda)))
        lib.simgpu_status_json.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.simgpu_status_json.restype = ctypes.c_int
        _lib = lib
    return _lib


def status(state: Path | str = DEFAULT_STATE) -> dict:
    """The simulator's view of `state`: devices, live processes, and per-context accounting
    (engine busy time, kernels, memory, migrations), read under the device locks."""
    path = str(state).encode()
    if not Path(str(state)).exists():
        on = "" if Path(str(state)) == Path(DEFAULT_STATE) else f" --state {state}"
        raise SimStateError(f"{state} does not exist: no program has used this simulated GPU yet "
                            f"(`tgs sim run{on} -- CMD` runs one on it)")
    size = 1 << 16
    lib = _library()
    for _ in range(8):
        buf = ctypes.create_string_buffer(size)
        n = lib.simgpu_status_json(path, buf, size)
        if n < 0:
            raise SimStateError(f"cannot read the simgpu state {state} (see the message above)")
        if n < size:
            return json.loads(buf.value.decode())
        size = n + 1024
    raise SimStateError(f"the status of {state} keeps growing")


def contexts(snapshot: dict, device: int = 0) -> dict[str, dict]:
    """Contexts of one device by label (the newest context wins a shared label)."""
    out: dict[str, dict] = {}
    for ctx in snapshot["devices"][device]["contexts"]:
        out[ctx["label"]] = ctx
    return out


def between(before: dict, after: dict, field: str, device: int = 0) -> dict[str, int]:
    """How much a per-context count ("kernels", "waited_ns", ...) grew for each label
    between two snapshots (labels live in both)."""
    a, b = contexts(before, device), contexts(after, device)
    return {label: b[label][field] - a[label][field] for label in b if label in a}


def busy_between(before: dict, after: dict, device: int = 0) -> dict[str, float]:
    """Engine seconds each label got between two snapshots (labels live in both)."""
    return {label: ns / 1e9 for label, ns in between(before, after, "busy_ns", device).items()}


def real_gpu_reason() -> str | None:
    """Why this machine's NVIDIA GPU cannot be used (None: it can, and the demo and bench
    use it instead of simgpu)."""
    if not os.path.exists("/dev/nvidiactl"):
        return "no NVIDIA GPU on this machine (/dev/nvidiactl is missing)"
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return f"no NVIDIA driver library: {e}"
    if lib.cuInit(0) != 0:
        return "the NVIDIA driver did not initialise"
    return None


def real_gpu() -> bool:
    return real_gpu_reason() is None


def job_env(settings: SimSettings | None, label: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of one job: on simgpu with `settings`, else on the real GPU; this
    process's TGS_ variables never leak in (`extra` sets a container's); SIMGPU_LABEL names
    the job's context in simgpu's accounting."""
    env = settings.env() if settings else dict(os.environ)
    for k in [k for k in env if k.startswith("TGS_")]:
        del env[k]
    env["SIMGPU_LABEL"] = label
    env.update(extra or {})
    return env
