"""`tgs demo`'s TGS phase through `docker run --runtime=tgs`: each job in a container of
its class, set up by the tgs runtime and the tgsd it talks to, as an operator's would be.

Used when a docker daemon answers and has the tgs runtime, that runtime's tgsd answers,
and there is a GPU for it: a real one its containers can reach (through the NVIDIA runtime,
or docker's --gpus or a CDI device, which the containers then ask for:
runtime/gpu_access.py), or simgpu when the runtime's config enables [sim]. `find` says
which, or in one line why not. The image holds tgs-workload and the libraries it needs,
made from this machine's files (no registry is needed)."""
from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tgs_runtime import config as configmod, dockerd
from tgs_runtime.admin import AdminClient, DaemonUnavailable, Refused
from tgs_runtime.config import Config
from tgs_runtime.paths import artifacts
from tgs_runtime.privatedocker import rootfs_tar
from tgs_runtime.runtime.create import Failure
from tgs_runtime.runtime.gpu_access import CDI_KIND, GpuAccess, Route, docker_cdi_off
from tgs_runtime.runtime.main import lower_runtime
from tgs_runtime.workload import Workload

WORKLOAD_IN_IMAGE = "/usr/bin/tgs-workload"


@dataclass(frozen=True)
class DockerTgs:
    client: Any      # docker.DockerClient
    cfg: Config      # the tgs runtime's config (its tgsd, its [sim])
    where: str       # the daemon, in words
    route: Route | None = None  # how a real GPU reaches containers (gpu_access.py); None on simgpu

    @property
    def simulated(self) -> bool:
        return self.cfg.sim.enabled


def _runtime_config(runtime: dict) -> Path | None:
    args = list(runtime.get("runtimeArgs") or [])
    for i, a in enumerate(args):
        if a == "--tgs-config" and i + 1 < len(args):
            return Path(args[i + 1])
        if a.startswith("--tgs-config="):
            return Path(a.partition("=")[2])
    return None


def find(real_gpu: bool) -> tuple[DockerTgs | None, str]:
    """The docker way to run the TGS phase, or None and why not."""
    try:
        client, info = dockerd.connect(timeout=10)
    except dockerd.Unreachable as e:
        return None, f"{e}: {e.fix}"
    runtime = (info.get("Runtimes") or {}).get("tgs")
    if not runtime:
        return None, "dockerd has no tgs runtime (`tgs setup docker`, then `systemctl reload docker`)"
    try:
        cfg = configmod.load(_runtime_config(runtime))
    except configmod.ConfigError as e:
        return None, f"the tgs runtime's config is bad: {e}"
    try:
        AdminClient(cfg.daemon.state_dir, timeout=5).status()
    except (DaemonUnavailable, Refused) as e:
        return None, f"the tgsd behind the tgs runtime does not answer: {e}"
    if not cfg.sim.enabled and not real_gpu:
        return None, f"there is no GPU here and the tgs runtime's config ({cfg.path}) does not enable [sim]"
    route = None
    if not cfg.sim.enabled:
        try:
            access = GpuAccess.of(lower_runtime(cfg.runtime.lower_runtime))
        except Failure as e:
            return None, f"the tgs runtime cannot run containers: {e}"
        if access.route == Route.NONE:
            return None, access.describe()
        if access.route == Route.CDI and (off := docker_cdi_off(info)):
            return None, f"{access.describe()}; but {off}"
        route = access.route
    return DockerTgs(client, cfg, f"dockerd {info.get('ServerVersion', '?')} ({info.get('Name', '?')})",
                     route), ""


def image(d: DockerTgs) -> str:
    """The demo image, made and imported once per build of what it holds."""
    import docker

    a = artifacts()
    # the workload, and the libraries that the shim and simgpu (mounted from the host at
    # run time) need: a real image has them, this minimal one must bring them
    files = {WORKLOAD_IN_IMAGE: a.require(a.workload), "/usr/lib/tgs-deps/libtgs.so": a.require(a.shim),
             "/usr/lib/tgs-deps/libcuda.so.1": a.require(a.libcuda)}
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files.values())).hexdigest()[:12]
    tag = f"tgs-demo:{digest}"
    try:
        d.client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    with tempfile.TemporaryDirectory(prefix="tgs-demo-image-") as work:
        tar = rootfs_tar(files, Path(work), tag)
        repo, _, version = tag.partition(":")
        d.client.api.import_image_from_file(str(tar), repository=repo, tag=version)
    return tag


@dataclass
class ContainerJob:
    """One job in a TGS container; its progress lines come from the container's stdout."""

    container: Any

    @classmethod
    def start(cls, d: DockerTgs, tag: str, role: str, label: str, w: Workload) -> "ContainerJob":
        import docker

        env = {"TGS_CLASS": role, "NVIDIA_VISIBLE_DEVICES": "0", "SIMGPU_LABEL": label, "TGS_LOG_LEVEL": "error"}
        gpus = None
        if d.route == Route.GPUS_FLAG:  # --gpus '"device=0"': the same variable, and dockerd adds the NVIDIA hook
            gpus = [docker.types.DeviceRequest(device_ids=["0"], capabilities=[["gpu"]])]
        elif d.route == Route.CDI:  # --device nvidia.com/gpu=0: dockerd puts GPU 0's device node in the spec
            gpus = [docker.types.DeviceRequest(driver="cdi", device_ids=[f"{CDI_KIND}=0"])]
            del env["NVIDIA_VISIBLE_DEVICES"]
        c = d.client.containers.run(tag, [WORKLOAD_IN_IMAGE, *w.argv()[1:]], runtime="tgs", environment=env,
                                    network_mode="none", detach=True, labels={"tgs.demo": role},
                                    device_requests=gpus)
        return cls(c)

    def lines(self) -> Iterator[str]:
        buf = b""
        for chunk in self.container.logs(stream=True, follow=True, stdout=True, stderr=False):
            buf += chunk
            *done, buf = buf.split(b"\n")
            for line in done:
                yield line.decode(errors="replace") + "\n"
        if buf:
            yield buf.decode(errors="replace")

    def finish(self) -> str | None:
        code = self.container.wait(timeout=60).get("StatusCode", -1)
        return None if code == 0 else f"exit status {code}: " + self.container.logs(stdout=False, stderr=True).decode()[-2000:]

    def stop(self) -> None:
        try:
            self.container.remove(force=True)
        except Exception:  # already gone
            pass
