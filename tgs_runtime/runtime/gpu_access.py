"""How a TGS container gets its GPUs on a real host. TGS decides a container's GPUs; the
lower runtime or the engine puts them in: the NVIDIA runtime from NVIDIA_VISIBLE_DEVICES
(as `--runtime=nvidia` does); under runc, docker's `--gpus` (dockerd adds the NVIDIA
Container Toolkit's hook, which it finds on its PATH); or a CDI device (`docker run --device
nvidia.com/gpu=0`, containerd or CRI-O with CDI), which the engine resolves from a CDI spec
the toolkit wrote. On simgpu tgs-runtime mounts the simulated driver itself, and none of this
applies. Used by `tgs doctor` and `tgs demo`."""
from __future__ import annotations

import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from tgs_runtime.runtime.spec import CDI_KIND

NVIDIA_RUNTIME = "nvidia-container-runtime"
NVIDIA_HOOK = "nvidia-container-runtime-hook"
CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))  # where docker, containerd and CRI-O look by default
FIX = "install the NVIDIA Container Toolkit (nvidia-container-toolkit)"


class Route(Enum):
    NVIDIA_RUNTIME = "nvidia runtime"  # NVIDIA_VISIBLE_DEVICES is enough
    GPUS_FLAG = "--gpus"               # docker's device request; NVIDIA_VISIBLE_DEVICES alone gives nothing
    CDI = "cdi"                        # a CDI device: the engine puts the GPU's device node in the spec
    NONE = "none"                      # the container would not see the GPU


def cdi_spec(dirs: Iterable[Path] = CDI_DIRS) -> Path | None:
    """The first CDI spec that defines NVIDIA GPUs (nvidia-ctk cdi generate writes one)."""
    for d in dirs:
        try:
            files = sorted(f for f in Path(d).iterdir() if f.suffix in (".yaml", ".yml", ".json"))
        except OSError:
            continue
        for f in files:
            try:
                if CDI_KIND in f.read_text(errors="replace"):
                    return f
            except OSError:
                continue
    return None


def cdi_driver_versions(spec: Path) -> set[str]:
    """The driver versions whose libraries a CDI spec mounts (libcuda.so.<version>): a spec
    generated before a driver upgrade names the old one, and every container given a GPU
    by it fails to start."""
    try:
        return set(re.findall(r"libcuda\.so\.(\d+(?:\.\d+)+)", spec.read_text(errors="replace")))
    except OSError:
        return set()


def docker_cdi_off(info: dict) -> str | None:
    """Why dockerd, as `docker info` describes it, would not give containers CDI devices
    (None: it would; docker 27 and later list their CDI spec directories when CDI is on)."""
    if info.get("CDISpecDirs"):
        return None
    return (f"dockerd {info.get('ServerVersion', '?')} has CDI off (it needs docker 25 or later, with "
            "\"features\": {\"cdi\": true} in daemon.json where it is not on by default)")


@dataclass(frozen=True)
class GpuAccess:
    route: Route
    lower: str               # the lower runtime, as found
    hook: str | None = None  # the NVIDIA hook, where found
    cdi: Path | None = None  # the CDI spec of NVIDIA GPUs, where found

    @classmethod
    def of(cls, lower: str, cdi_dirs: Iterable[Path] = CDI_DIRS) -> "GpuAccess":
        spec = cdi_spec(cdi_dirs)  # a route of its own, and usable beside the others
        if Path(lower).name.startswith(NVIDIA_RUNTIME):
            return cls(Route.NVIDIA_RUNTIME, lower, cdi=spec)
        hook = shutil.which(NVIDIA_HOOK)
        if hook:
            return cls(Route.GPUS_FLAG, lower, hook, spec)
        return cls(Route.CDI if spec else Route.NONE, lower, cdi=spec)

    def describe(self) -> str:
        if self.route == Route.NVIDIA_RUNTIME:
            return f"TGS containers get the GPUs NVIDIA_VISIBLE_DEVICES names from {self.lower}"
        if self.route == Route.GPUS_FLAG:
            return (f"TGS containers run on {self.lower}: they get GPUs with `docker run --gpus` (through "
                    f"{self.hook}), not from NVIDIA_VISIBLE_DEVICES alone")
        if self.route == Route.CDI:
            return (f"TGS containers run on {self.lower}: they get GPUs as CDI devices ({self.cdi}), e.g. "
                    f"`docker run --device {CDI_KIND}=0` (docker 25 or later, CDI on), not from "
                    "NVIDIA_VISIBLE_DEVICES alone")
        return (f"TGS containers would not see the GPU: their lower runtime is {self.lower}, neither "
                f"{NVIDIA_RUNTIME} nor {NVIDIA_HOOK} (for docker run --gpus) is installed, and no CDI spec "
                f"defines {CDI_KIND}")
