"""Fixtures shared by every test (the harness lives in tests/harness/)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.build import build_libshim, compile_c  # noqa: E402
from harness.daemon import Tgsd  # noqa: E402
from tgs_runtime.privatedocker import IMAGE, PRELOAD_IMAGE, PrivateDocker, need_busybox  # noqa: E402
from harness.shimside import Host, ShimContainer  # noqa: E402
from harness.simgpu import SimGPU  # noqa: E402
from tgs_runtime import proto  # noqa: E402


@pytest.fixture(scope="session")
def libshim():
    """The C parts, built once per session with `make -C libshim`."""
    return build_libshim()


@pytest.fixture(scope="session")
def c_programs(tmp_path_factory, libshim):
    """Compiles tests/c programs: c_programs("x.c", link_cuda=True)."""
    out = tmp_path_factory.mktemp("c-programs")

    def build(source: str, link_cuda: bool = False, extra: list[str] | None = None) -> Path:
        return compile_c(source, out, link_cuda=libshim if link_cuda else None, extra=extra)

    return build


@pytest.fixture
def simgpu(libshim, tmp_path):
    """A fresh simulated GPU (4G, one device) for one test; programs left running are killed."""
    gpu = SimGPU(libshim, tmp_path / "simgpu.state")
    yield gpu
    gpu.close()


@pytest.fixture
def host(tmp_path):
    """A state_dir with its activity files, without tgsd (tests/harness/shimside.py)."""
    h = Host(tmp_path / "state")
    yield h
    h.close()


@pytest.fixture
def container(host, simgpu):
    """Makes TGS containers on the simulated GPU: container(proto.Class.PRODUCTION, "id")."""
    made = []

    def make(klass: proto.Class, cid: str | None = None, **kw) -> ShimContainer:
        c = ShimContainer(host, cid or f"c{len(made)}", klass, kw.pop("uuids", None) or simgpu.uuids()[:1], **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keeps whether the test itself failed (`item.failed_call`), for fixtures that say
    more then."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.failed_call = report.failed


TGSD_LOG_LINES = 400  # of each tgsd's log, printed where a test with tgsd failed


@pytest.fixture
def tgsd(simgpu, tmp_path, request):
    """Starts a real tgsd on the test's simulated GPU: tgsd() or tgsd(toml="[control]\nshare = \"las\"").
    Where the test fails, the end of each tgsd's log (its decisions) is printed in the
    teardown's captured output: a failure in CI, whose files are gone, can be read from it."""
    started = []

    def start(toml: str = "") -> Tgsd:
        d = Tgsd(simgpu, tmp_path / f"tgsd{len(started)}", toml)
        d.workdir.mkdir(parents=True, exist_ok=True)
        started.append(d)
        return d.start()

    yield start
    for d in started:
        d.close()
    if getattr(request.node, "failed_call", False):
        for d in started:
            lines = d.log_path.read_text(errors="replace").splitlines() if d.log_path.exists() else []
            print(f"--- {d.log_path}: its last {min(len(lines), TGSD_LOG_LINES)} of {len(lines)} lines ---")
            print("\n".join(lines[-TGSD_LOG_LINES:]))


NVIDIA_HOOK_RECORDS = "nvidia-hook-records"


def fake_nvidia_hook(work: Path) -> Path:
    """A stand-in for the NVIDIA Container Toolkit's nvidia-container-runtime-hook, on
    dockerd's PATH so that `docker run --gpus` works (dockerd adds the hook to the spec as a
    prestart hook, and sets NVIDIA_VISIBLE_DEVICES). It keeps the OCI state it is given."""
    bin_dir, records = work / "toolkit-bin", work / NVIDIA_HOOK_RECORDS
    bin_dir.mkdir()
    records.mkdir()
    hook = bin_dir / "nvidia-container-runtime-hook"
    hook.write_text(f'#!/bin/sh\n[ "$1" = prestart ] || exit 1\ncat > {records}/state.$$\n')
    hook.chmod(0o755)
    return bin_dir


@pytest.fixture(scope="session")
def docker_host(tmp_path_factory, libshim, c_programs):
    """A private dockerd with the tgs runtime, and the test images (started once)."""
    work = tmp_path_factory.mktemp("docker")
    need_busybox()
    d = PrivateDocker(work, libshim.root / "tgs-runtime", work / "tgs.toml", path_first=fake_nvidia_hook(work))
    d.start()
    try:
        files = {"/usr/bin/tgs-workload": libshim.workload, "/usr/bin/maps": c_programs("maps.c"),
                 "/usr/lib/tgs-deps/libtgs.so": libshim.shim, "/usr/lib/tgs-deps/libcuda.so.1": libshim.libcuda}
        d.build_image(files, IMAGE)
        hello = c_programs("imagehello.c", extra=["-shared", "-fPIC"])
        d.build_image({**files, "/usr/lib/libimagehello.so": hello}, PRELOAD_IMAGE,
                      extra={"/etc/ld.so.preload": b"/usr/lib/libimagehello.so\n"})
        yield d
    finally:
        d.stop()


@pytest.fixture
def docker(docker_host, simgpu, tmp_path):
    """The private dockerd with a tgsd of this test behind its tgs runtime:
    docker() -> (docker_host, tgsd); docker(toml=...) for extra config."""
    started = []

    def start(toml: str = "", run_tgsd: bool = True):
        t = Tgsd(simgpu, tmp_path / "tgsd", toml, config=docker_host.tgs_config)
        started.append(t)
        if run_tgsd:
            t.start()
        return docker_host, t

    yield start
    for t in started:
        t.close()
    for cid in docker_host.docker("ps", "-aq", check=False).stdout.split():
        docker_host.docker("rm", "-f", cid, check=False)
