"""Building the C parts (once per session) and small C test programs."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from tgs_runtime.paths import REPO_ROOT, Artifacts, cuda_include_dir

TESTS_C = Path(__file__).resolve().parent.parent / "c"


def build_libshim() -> Artifacts:
    """`make -C libshim`, as the README says; fails the session with make's output."""
    proc = subprocess.run(
        ["make", "-C", str(REPO_ROOT / "libshim"), "-j2"], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"building libshim failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return Artifacts(REPO_ROOT / "libshim" / "build")


def compile_c(source: str, out_dir: Path, *, link_cuda: Artifacts | None = None, extra: list[str] | None = None) -> Path:
    """Compiles tests/c/<source> into out_dir (cached by content); with link_cuda, links
    it directly against that build's simgpu libcuda.so.1."""
    src = TESTS_C / source
    flags = ["-O1", "-g", "-Wall", "-pthread"]
    inc = cuda_include_dir()
    if inc is None:
        raise RuntimeError("the CUDA headers are missing: pip install 'nvidia-cuda-runtime==13.0.*'")
    flags += [f"-I{inc}"]
    libs = ["-ldl"]
    if link_cuda is not None:
        libs = [f"-L{link_cuda.simgpu_dir}", "-lcuda"] + libs
    flags += extra or []
    digest = hashlib.sha256(src.read_bytes() + " ".join(flags + libs).encode()).hexdigest()[:12]
    exe = out_dir / f"{src.stem}-{digest}"
    if not exe.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        cc = os.environ.get("CC") or shutil.which("cc") or "gcc"
        proc = subprocess.run([cc, *flags, str(src), "-o", str(exe), *libs], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"compiling {src} failed:\n{proc.stderr[-4000:]}")
    return exe
