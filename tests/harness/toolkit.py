"""The CUDA toolkit's tools (nvcc, ptxas): on these machines in /usr/local/cuda, or from the
nvidia-cuda-nvcc wheel that .ci/run installs when no toolkit is there."""
from __future__ import annotations

import os
import shutil
from pathlib import Path


def find_tool(name: str) -> Path:
    candidates = []
    if os.environ.get("CUDA_HOME"):
        candidates.append(Path(os.environ["CUDA_HOME"]) / "bin" / name)
    candidates.append(Path("/usr/local/cuda/bin") / name)
    found = shutil.which(name)
    if found:
        candidates.append(Path(found))
    try:
        import nvidia.cu13 as cu13

        candidates.append(Path(list(cu13.__path__)[0]) / "bin" / name)
    except ImportError:
        pass
    for c in candidates:
        if c.exists():
            return c
    raise RuntimeError(f"{name} not found (CUDA_HOME, /usr/local/cuda, PATH, nvidia-cuda-nvcc wheel): "
                       "install the CUDA 13.0 toolkit or `pip install 'nvidia-cuda-nvcc==13.0.*'`")


def ptxas() -> Path:
    return find_tool("ptxas")


def nvcc() -> Path:
    return find_tool("nvcc")
