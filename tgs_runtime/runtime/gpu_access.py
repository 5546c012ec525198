"""How a TGS container gets its GPUs on a real host. TGS decides a container's GPUs; the
lower runtime puts them in: the NVIDIA runtime from NVIDIA_VISIBLE_DEVICES (as
`--runtime=nvidia` does), or, under runc, only `docker run --gpus` (dockerd adds the NVIDIA
Container Toolkit's hook, which it finds on its PATH). On simgpu tgs-runtime mounts the
simulated driver itself, and none of this applies. Used by `tgs doctor` and `tgs demo`."""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

NVIDIA_RUNTIME = "nvidia-container-runtime"
NVIDIA_HOOK = "nvidia-container-runtime-hook"
FIX = "install the NVIDIA Container Toolkit (nvidia-container-toolkit)"


class Route(Enum):
    NVIDIA_RUNTIME = "nvidia runtime"  # NVIDIA_VISIBLE_DEVICES is enough
    GPUS_FLAG = "--gpus"               # docker's device request; NVIDIA_VISIBLE_DEVICES alone gives nothing
    NONE = "none"                      # the container would not see the GPU


@dataclass(frozen=True)
class GpuAccess:
    route: Route
    lower: str               # the lower runtime, as found
    hook: str | None = None  # the NVIDIA hook, where found

    @classmethod
    def of(cls, lower: str) -> "GpuAccess":
        if Path(lower).name.startswith(NVIDIA_RUNTIME):
            return cls(Route.NVIDIA_RUNTIME, lower)
        hook = shutil.which(NVIDIA_HOOK)
        return cls(Route.GPUS_FLAG if hook else Route.NONE, lower, hook)

    def describe(self) -> str:
        if self.route == Route.NVIDIA_RUNTIME:
            return f"TGS containers get the GPUs NVIDIA_VISIBLE_DEVICES names from {self.lower}"
        if self.route == Route.GPUS_FLAG:
            return (f"TGS containers run on {self.lower}: they get GPUs with `docker run --gpus` (through "
                    f"{self.hook}), not from NVIDIA_VISIBLE_DEVICES alone")
        return (f"TGS containers would not see the GPU: their lower runtime is {self.lower}, and neither "
                f"{NVIDIA_RUNTIME} nor {NVIDIA_HOOK} (for docker run --gpus) is installed")
