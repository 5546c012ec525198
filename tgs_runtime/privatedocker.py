"""A private dockerd (for the end-to-end tests and `tgs bench start`): Debian's docker.io with its own data root,
exec root, socket and containerd, no iptables, no bridge, and the tgs runtime in its
daemon.json; and small images made from local files (busybox-static, the workload and
test programs, with the host's dynamic loader and libc so glibc programs and the preload
work; `tgs demo` makes its image the same way)."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from tgs_runtime.childd import ends_with_us

IMAGE = "tgs-test:base"
PRELOAD_IMAGE = "tgs-test:preload"


class DockerUnavailable(RuntimeError):
    pass


BUSYBOX = Path("/bin/busybox")


def need_busybox() -> None:
    """Images that run commands (`true`, `sh`) get them from busybox-static."""
    if not BUSYBOX.exists():
        raise DockerUnavailable(f"{BUSYBOX} is missing: the test images take their commands from it "
                                "(apt-get install busybox-static; make test does)")


def _libs(binary: Path) -> list[Path]:
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split("=>")
        path = (parts[1] if len(parts) > 1 else parts[0]).strip().split(" (")[0].strip()
        if path.startswith("/"):
            libs.append(Path(path))
    return libs


def rootfs_tar(files: dict[str, Path], workdir: Path, tag: str, extra: dict[str, bytes] | None = None) -> Path:
    """The tarball of an image made from local files, for `docker import`: busybox-static,
    `files` (image path -> host file) and every library they need, with the host's loader;
    `extra` (image path -> content) added as they are."""
    root = workdir / f"rootfs-{tag.replace(':', '-')}"
    shutil.rmtree(root, ignore_errors=True)
    for d in ("bin", "usr/bin", "etc", "tmp", "dev", "proc", "sys", "run"):
        (root / d).mkdir(parents=True, exist_ok=True)
    if BUSYBOX.exists():
        shutil.copy2(BUSYBOX, root / "bin/busybox")
        for tool in ("sh", "sleep", "cat", "ls", "echo", "env", "grep", "true", "wc"):
            (root / "bin" / tool).symlink_to("busybox")
    needed: set[Path] = set()
    for dest, src in files.items():
        target = root / dest.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
        needed.update(_libs(src))
    for lib in sorted(needed):
        target = root / str(lib).lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib.resolve(), target)
    for dest, data in (extra or {}).items():
        target = root / dest.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    tar = workdir / f"{tag.replace(':', '-')}.tar"
    with tarfile.open(tar, "w") as t:
        t.add(root, arcname=".")
    shutil.rmtree(root, ignore_errors=True)
    return tar


def end_processes_under(folder: Path, grace_s: float = 30) -> None:
    """Ends what still runs with a path under `folder` in its command line (a private
    dockerd, its containerd and shims): a dockerd is asked first (SIGTERM, `grace_s` to
    stop; killed outright it leaves its overlay mounts behind), then whatever remains is
    killed. Paths under `folder`, not the folder's name alone: `docker1` is part of
    `docker10`."""
    under = f"{str(folder).rstrip('/')}/"

    def named() -> list[psutil.Process]:
        return [p for p in psutil.process_iter(["cmdline"])
                if p.pid != os.getpid() and under in " ".join(p.info["cmdline"] or [])]

    def signal_each(procs: list[psutil.Process], sig: signal.Signals) -> None:
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(sig)

    daemons = [p for p in named() if Path((p.info["cmdline"] or [""])[0]).name == "dockerd"]
    signal_each(daemons, signal.SIGTERM)
    psutil.wait_procs(daemons, timeout=grace_s)
    signal_each(named(), signal.SIGKILL)


# The tgs runtime as `tgs setup docker` writes it for the default config: no runtimeArgs
# (install.docker_entry). Here it finds its config in dockerd's environment (TGS_CONFIG,
# which containerd and its shims pass on), not at /etc/tgs/config.toml.
AS_INSTALLED = "tgs-as-installed"


@dataclass
class PrivateDocker:
    workdir: Path
    runtime: Path           # tgs-runtime (the launcher)
    tgs_config: Path        # what daemon.json's runtimeArgs name (and dockerd's TGS_CONFIG)
    path_first: Path | None = None  # searched before PATH by dockerd (and what it runs): tools it looks for

    def __post_init__(self):
        self.sock = self.workdir / "docker.sock"
        self.host = f"unix://{self.sock}"
        self.exec_root = self.workdir / "exec"
        self.proc: subprocess.Popen | None = None

    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.host}

    def start(self, timeout: float = 60) -> "PrivateDocker":
        if not shutil.which("dockerd"):
            raise DockerUnavailable("dockerd is not installed (apt-get install docker.io; .ci/run does)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        daemon_json = self.workdir / "daemon.json"
        daemon_json.write_text(json.dumps({"runtimes": {
            "tgs": {"path": str(self.runtime), "runtimeArgs": ["--tgs-config", str(self.tgs_config)]},
            AS_INSTALLED: {"path": str(self.runtime)}}}))
        self.log = open(self.workdir / "dockerd.log", "w")
        self.proc = subprocess.Popen(
            ["dockerd", "--data-root", str(self.workdir / "data"), "--exec-root", str(self.exec_root),
             "-H", self.host, "--pidfile", str(self.workdir / "docker.pid"), "--iptables=false",
             "--ip6tables=false", "--bridge=none", "--ip-masq=false", "--userland-proxy=false",
             "--config-file", str(daemon_json)],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, env=self._daemon_env(),
            preexec_fn=ends_with_us(signal.SIGTERM))  # stops its containers and containerd as it goes
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise DockerUnavailable(f"dockerd exited: {(self.workdir / 'dockerd.log').read_text()[-3000:]}")
            if self.docker("version", check=False).returncode == 0:
                return self
            time.sleep(0.2)
        raise DockerUnavailable(f"dockerd did not start in {timeout}s")

    def _daemon_env(self) -> dict[str, str]:
        env = {**os.environ, "TGS_CONFIG": str(self.tgs_config)}  # what AS_INSTALLED reads
        if self.path_first:
            env["PATH"] = f"{self.path_first}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        return env

    def docker(self, *args: str, check: bool = True, timeout: float = 120, input: str | None = None):
        proc = subprocess.run(["docker", *args], env=self.env(), capture_output=True, text=True, timeout=timeout,
                              input=input)
        if check and proc.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)} failed: {proc.stderr}")
        return proc

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(["docker", *args], env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def build_image(self, files: dict[str, Path], tag: str, extra: dict[str, bytes] | None = None) -> None:
        """An image from local files (`rootfs_tar`), imported into this dockerd."""
        tar = rootfs_tar(files, self.workdir, tag, extra)
        with open(tar, "rb") as f:
            subprocess.run(["docker", "import", "-", tag], env=self.env(), stdin=f, check=True, capture_output=True)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            running = self.docker("ps", "-q", check=False).stdout.split()
            if running:
                self.docker("rm", "-f", *running, check=False)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        end_processes_under(self.workdir)  # containerd and its shims must not outlive the tests
        if getattr(self, "log", None):
            self.log.close()
