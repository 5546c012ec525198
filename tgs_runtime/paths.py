"""Where TGS's files are: the built C parts (libshim/build) and the stable host paths
that container specs embed (never inside a virtualenv)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
INSTALL_LIB_DIR = Path("/usr/lib/tgs")


class MissingArtifact(RuntimeError):
    """A built file TGS needs is not there; the message says how to build it."""


@dataclass(frozen=True)
class Artifacts:
    """The C parts, as `make -C libshim` lays them out."""

    root: Path

    @property
    def simgpu_dir(self) -> Path:
        return self.root / "simgpu"

    @property
    def libcuda(self) -> Path:
        return self.simgpu_dir / "libcuda.so.1"

    @property
    def libnvml(self) -> Path:
        return self.simgpu_dir / "libnvidia-ml.so.1"

    @property
    def workload(self) -> Path:
        return self.root / "tgs-workload"

    @property
    def shim(self) -> Path:
        return self.root / "libtgs.so"

    def require(self, path: Path) -> Path:
        if not path.exists():
            raise MissingArtifact(
                f"{path} is missing: build the C parts with `make -C {REPO_ROOT / 'libshim'}` "
                "(or set TGS_LIBSHIM_BUILD to where they were built)"
            )
        return path


def artifacts() -> Artifacts:
    """TGS_LIBSHIM_BUILD if set, else the checkout's libshim/build, else the installed copy."""
    env = os.environ.get("TGS_LIBSHIM_BUILD")
    if env:
        return Artifacts(Path(env))
    built = REPO_ROOT / "libshim" / "build"
    if built.is_dir():
        return Artifacts(built)
    return Artifacts(INSTALL_LIB_DIR)


def cuda_include_dir() -> Path | None:
    """The CUDA 13.0 headers the C parts build against (libshim/Makefile's rule)."""
    home = os.environ.get("CUDA_HOME")
    if home and (Path(home) / "include" / "cuda.h").exists():
        return Path(home) / "include"
    try:
        import nvidia.cu13 as cu13  # the nvidia-cuda-runtime wheel
    except ImportError:
        return None
    inc = Path(list(cu13.__path__)[0]) / "include"
    return inc if (inc / "cuda.h").exists() else None
