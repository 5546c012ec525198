"""A private podman for tests: its own storage and run roots (vfs storage, cgroupfs,
events to a file), images imported from local files, tgs-runtime given as the runtime
for each container (`podman run --runtime PATH --runtime-flag tgs-config=FILE`), as
oci-hook/README.md tells operators."""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tgs_runtime.privatedocker import rootfs_tar


def podman_reason() -> str | None:
    """Why podman cannot be used here (None: it can)."""
    return None if shutil.which("podman") else "podman is not installed (scripts/bootstrap test installs it)"


@dataclass
class PrivatePodman:
    workdir: Path
    runtime: Path      # tgs-runtime
    tgs_config: Path   # the config tgs-runtime is given (the tgsd of the test writes it)

    def argv(self, *args: str) -> list[str]:
        return ["podman", "--root", str(self.workdir / "root"), "--runroot", str(self.workdir / "run"),
                "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--events-backend", "file", *args]

    def podman(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        proc = subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)} failed: {proc.stderr}")
        return proc

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(self.argv(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def run_args(self, *extra: str, tgs: bool = True) -> list[str]:
        """`podman run` through tgs-runtime (or podman's own runtime). Explicit limits:
        podman asks by default for the highest it could raise itself to, which a sandbox's
        hard limits may refuse inside the container."""
        runtime = ["--runtime", str(self.runtime), "--runtime-flag", f"tgs-config={self.tgs_config}"] if tgs else []
        return ["run", "--rm", "--network", "none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096",
                *runtime, *extra]

    def build_image(self, files: dict[str, Path], tag: str) -> None:
        tar = rootfs_tar(files, self.workdir, tag)
        self.podman("import", str(tar), tag)

    def close(self) -> None:
        for cid in self.podman("ps", "-aq", check=False).stdout.split():
            self.podman("rm", "-f", cid, check=False)
