"""The GPU layer: the host's GPUs through NVML (pynvml, the nvidia-ml-py package), typed,
by index and by UUID. Tolerant of NVML functions a driver lacks; runs unchanged against
simgpu's NVML (which tgsd loads in place of the real one when [sim] is enabled)."""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

import pynvml

from tgs_runtime.config import SimConfig
from tgs_runtime.runtime.spec import GPU_NODE, is_mig_instance, mig_refusal


class GpuError(RuntimeError):
    """NVML cannot be used, or a GPU asked for does not exist."""


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_total: int
    minor: int | None = None  # of its device node, /dev/nvidia<minor>


def _optional(fn, *args):
    """A value from an NVML function, or None where the driver lacks it or it fails."""
    try:
        return fn(*args)
    except (pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_NotSupported):
        return None
    except pynvml.NVMLError:
        return None


def use_simgpu(sim: SimConfig) -> None:
    """Makes this process's NVML simgpu's (before pynvml loads libnvidia-ml.so.1)."""
    lib = Path(sim.lib_dir or "") / "libnvidia-ml.so.1"
    if not lib.exists():
        raise GpuError(f"[sim] is enabled but {lib} does not exist: build it with `make -C libshim`")
    os.environ["SIMGPU_STATE"] = str(sim.state)
    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)  # pynvml's dlopen("libnvidia-ml.so.1") now finds it


class GpuInventory:
    def __init__(self) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise GpuError(f"NVML cannot be initialised ({e}): is the NVIDIA driver loaded? "
                           "(without a GPU, enable [sim] to use simgpu)") from None
        self.gpus: list[Gpu] = []
        self._handles = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            name = _optional(pynvml.nvmlDeviceGetName, h) or "unknown"
            name = name.decode() if isinstance(name, bytes) else name
            mem = _optional(pynvml.nvmlDeviceGetMemoryInfo, h)
            minor = _optional(pynvml.nvmlDeviceGetMinorNumber, h)
            self.gpus.append(Gpu(i, uuid, name, int(mem.total) if mem else 0, minor))
            self._handles.append(h)
        self.driver = _optional(pynvml.nvmlSystemGetDriverVersion) or "unknown"

    def by_uuid(self, uuid: str) -> Gpu | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)

    def resolve(self, spec: str) -> Gpu:
        """A GPU named as NVIDIA_VISIBLE_DEVICES names them (an index or a UUID, or a prefix),
        or by its device node, /dev/nvidia<minor> (a spec's device nodes name them so)."""
        spec = spec.strip()
        if spec.isdigit():
            i = int(spec)
            if i < len(self.gpus):
                return self.gpus[i]
            raise GpuError(f"GPU {spec}: this host has {len(self.gpus)} GPU(s) (indexes 0 to {len(self.gpus) - 1})")
        if spec.startswith(GPU_NODE.format("")):
            nodes = {GPU_NODE.format(g.minor): g for g in self.gpus if g.minor is not None}
            if spec in nodes:
                return nodes[spec]
            raise GpuError(f"GPU device {spec}: no GPU on this host has that device node "
                           f"(known: {', '.join(nodes) or 'none'})")
        if is_mig_instance(spec):
            raise GpuError(mig_refusal(f"GPU {spec!r}"))
        matches = [g for g in self.gpus if g.uuid.startswith(spec)] if spec.startswith("GPU-") else []
        if len(matches) == 1:
            return matches[0]
        known = ", ".join(g.uuid for g in self.gpus) or "none"
        raise GpuError(f"GPU {spec!r}: no such GPU on this host (known: {known})")

    def utilization(self, index: int) -> int | None:
        u = _optional(pynvml.nvmlDeviceGetUtilizationRates, self._handles[index])
        return None if u is None else int(u.gpu)

    def memory_used(self, index: int) -> int | None:
        m = _optional(pynvml.nvmlDeviceGetMemoryInfo, self._handles[index])
        return None if m is None else int(m.used)

    def close(self) -> None:
        _optional(pynvml.nvmlShutdown)
