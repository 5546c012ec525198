"""A GPU of this host given to containers as CDI gives it, and a production and an
opportunistic container sharing it through docker: the real-GPU test's body, which
test_docker.py also runs on simgpu so that it is known to work before a GPU is lent."""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tgs_runtime.childd import ChildTgsd
from tgs_runtime.paths import Artifacts
from tgs_runtime.privatedocker import PrivateDocker, need_busybox
from tgs_runtime.workload import Workload, summary


def gpu_node(directory: Path) -> Path:
    """A device node of the NVIDIA driver's major, minor 0: GPU 0's /dev/nvidia0 to a spec."""
    node = directory / "nvidia0"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(195, 0))
    return node


DRIVER_LIBRARIES = ("libcuda.so.*", "libnvidia-ptxjitcompiler.so.*", "libnvidia-gpucomp.so.*", "libnvidia-nvvm.so.*")
CONTAINER_LIBDIR = "/usr/lib/x86_64-linux-gnu"


@dataclass
class HostGpu:
    """One of this host's GPUs given to a container the way CDI gives it, which needs no
    NVIDIA Container Toolkit and works with any docker: the GPU's and the driver's device
    nodes, the driver's libraries mounted read-only, and NVIDIA_VISIBLE_DEVICES=void."""

    uuid: str
    nodes: list[str]
    libraries: list[Path]

    @classmethod
    def real(cls, index: int = 0) -> "HostGpu":
        from tgs_runtime.daemon.gpus import GpuInventory

        gpu = GpuInventory().gpus[index]
        nodes = [f"/dev/nvidia{gpu.minor}", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
        ctypes.CDLL("libcuda.so.1")
        maps = Path("/proc/self/maps").read_text().split()
        libcuda = Path(next(w for w in maps if "/libcuda.so" in w))
        # the driver's other libraries beside libcuda, else where the loader would look
        dirs = [libcuda.parent, *map(Path, filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(":"))),
                Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/lib64")]
        libraries = sorted(lib for pattern in DRIVER_LIBRARIES for lib in _first_match(dirs, pattern))
        return cls(gpu.uuid, [n for n in nodes if os.path.exists(n)], libraries)

    @classmethod
    def simulated(cls, simgpu, node_dir: Path) -> "HostGpu":
        """simgpu's GPU 0 (its own driver reaches it, not the node)."""
        return cls(simgpu.uuids()[0], [f"{gpu_node(node_dir)}:/dev/nvidia0"], [simgpu.artifacts.libcuda])

    def docker_args(self) -> list[str]:
        args = ["-e", "NVIDIA_VISIBLE_DEVICES=void"]
        for node in self.nodes:
            args += ["--device", node]
        for lib in self.libraries:
            args += ["-v", f"{lib.resolve()}:{CONTAINER_LIBDIR}/{lib.name}:ro"]
        return args


def _first_match(dirs: list[Path], pattern: str) -> list[Path]:
    return next((found for found in (sorted(d.glob(pattern)) for d in dirs) if found), [])


def share_one_gpu_through_docker(gpu: HostGpu, tgsd_config: dict, libshim: Artifacts, maps: Path, work: Path) -> None:
    """A production container and an opportunistic one on `gpu`, through a private dockerd
    with the tgs runtime and a tgsd of the test's own: both register, production keeps its
    pace, the opportunistic job runs in the idle time, every checksum is right, and both
    are gone from tgsd afterwards."""
    need_busybox()
    tgsd = ChildTgsd(tgsd_config, work / "tgs.toml", work / "tgsd.log").start()
    # containerd's socket path under the work dir must fit AF_UNIX's 108 bytes
    d = PrivateDocker(Path(tempfile.mkdtemp(prefix="tgs-docker-", dir="/tmp")), libshim.root / "tgs-runtime",
                      work / "tgs.toml")
    libcuda = next(lib for lib in gpu.libraries if lib.name == "libcuda.so.1")
    try:
        d.start()
        # the driver's library goes in for what it links (glibc's parts), not on the search path
        d.build_image({"/usr/bin/tgs-workload": libshim.workload, "/usr/bin/maps": maps,
                       "/usr/lib/tgs-deps/libtgs.so": libshim.shim, "/usr/lib/tgs-deps/libcuda.so.1": libcuda},
                      "tgs-gpu:test")

        def run(cls: str, w: Workload) -> list[str]:
            return ["run", "--rm", "--network", "none", "--runtime=tgs", "-e", f"TGS_CLASS={cls}", *gpu.docker_args(),
                    "tgs-gpu:test", "tgs-workload", *w.args()]

        maps = d.docker("run", "--rm", "--network", "none", "--runtime=tgs", "-e", "TGS_CLASS=opportunistic",
                        *gpu.docker_args(), "tgs-gpu:test", "maps").stdout
        assert "/usr/lib/tgs/libtgs.so" in maps, maps
        solo = summary(d.docker(*run("production", Workload.with_duty(0.5, seconds=4, report_s=0.5))).stdout)
        p = d.popen(*run("production", Workload.with_duty(0.5, seconds=12, report_s=0.5, verify=True)))
        o = d.popen(*run("opportunistic", Workload(kernel_us=1000, kernels=10, seconds=10, report_s=0.5,
                                                   verify=True)))
        deadline = time.monotonic() + 30
        classes: set[str] = set()
        while classes != {"production", "opportunistic"} and time.monotonic() < deadline:
            classes = {c["class"] for c in tgsd.admin.status()["gpus"][0]["containers"]}
            time.sleep(0.2)
        pout, perr = p.communicate(timeout=120)
        oout, oerr = o.communicate(timeout=120)
        assert p.returncode == 0 and o.returncode == 0, perr + oerr
        assert classes == {"production", "opportunistic"}, f"tgsd saw {classes or 'no containers'}"
        prod, opp = summary(pout), summary(oout)
        assert prod.checksum_ok is True and opp.checksum_ok is True
        assert prod.iterations_per_s >= 0.9 * solo.iterations_per_s, \
            f"production {prod.iterations_per_s:.1f}/s beside opportunistic, {solo.iterations_per_s:.1f}/s alone"
        assert opp.iterations_per_s > 0
        reserved = [json.loads(line) for line in tgsd.log_path.read_text().splitlines() if '"container reserved"' in line]
        assert len(reserved) == 4 and all(e["gpus"] == [gpu.uuid] for e in reserved), reserved
        time.sleep(0.5)
        assert tgsd.admin.status()["gpus"][0]["containers"] == [], "both containers were deregistered"
    finally:
        d.stop()
        tgsd.close()
        shutil.rmtree(d.workdir, ignore_errors=True)

