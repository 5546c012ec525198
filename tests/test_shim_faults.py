"""libtgs.so when things are missing or wrong: no TGS at all, a bad control block, garbage
from the socket, tgsd away and back, fork(), a misconfigured driver path. It never
crashes or hangs the application; it says what happened once."""
from __future__ import annotations

import json
import struct
import subprocess
import time

import pytest

from test_simgpu_api import CHECKS
from tgs_runtime import proto
from tgs_runtime.workload import Workload

SHORT = Workload(kernel_us=500, kernels=4, seconds=1.5, report_s=0.5, verify=True)


@pytest.fixture(scope="module")
def api(c_programs):
    return c_programs("simgpu_api.c", link_cuda=True)


@pytest.mark.parametrize("check", CHECKS)
def test_without_tgs_the_shim_changes_nothing(simgpu, api, libshim, check):
    plain = subprocess.run([str(api), check], env=simgpu.env("plain"), capture_output=True, text=True, timeout=60)
    shimmed = subprocess.run([str(api), check], env=simgpu.env("shim", {"LD_PRELOAD": str(libshim.shim)}),
                             capture_output=True, text=True, timeout=60)
    assert shimmed.returncode == plain.returncode == 0, shimmed.stdout + shimmed.stderr
    assert shimmed.stdout == plain.stdout
    assert "tgs[" not in shimmed.stderr


def test_a_workload_without_tgs_runs_as_without_the_shim(simgpu, libshim):
    p = simgpu.run(SHORT, "plain", {"LD_PRELOAD": str(libshim.shim)})
    assert p.popen.returncode == 0 and p.summary().checksum_ok and "tgs[" not in p.stderr


def one_line(stderr: str, text: str) -> None:
    lines = [l for l in stderr.splitlines() if l.startswith("tgs[")]
    assert len(lines) == 1 and text in lines[0], stderr


@pytest.mark.parametrize("damage,text", [
    (lambda b: b.__setitem__(slice(0, 4), b"\0\0\0\0"), "bad magic"),
    (lambda b: b.__setitem__(slice(4, 8), struct.pack("<I", 99)), "protocol version 99"),
    (lambda b: b.__setitem__(slice(4096, 4100), struct.pack("<I", 7)), "class 7"),
])
def test_a_bad_control_block_means_pass_through(simgpu, container, libshim, damage, text):
    c = container(proto.Class.OPPORTUNISTIC, serve=False)
    c.control.set_budget(0, rate=1)  # would crawl if it were obeyed
    data = bytearray(c.paths.control.read_bytes())
    damage(data)
    with open(c.paths.control, "r+b") as f:  # in place: the file stays mapped
        f.write(data)
    p = simgpu.run(SHORT, "bad", c.env(libshim.shim))
    assert p.popen.returncode == 0 and p.summary().checksum_ok
    assert p.summary().iterations_per_s > 100, "pass-through runs unthrottled"
    one_line(p.stderr, text)


def test_a_truncated_control_block_means_pass_through(simgpu, container, libshim):
    c = container(proto.Class.PRODUCTION, serve=False, heartbeat=False)
    c.control.close()
    c.paths.control.write_bytes(b"x" * 100)
    p = simgpu.run(SHORT, "short", c.env(libshim.shim))
    assert p.popen.returncode == 0
    one_line(p.stderr, "truncated")


@pytest.mark.parametrize("garbage,text", [
    (struct.pack("<I", 1 << 20), "a frame of 1048576 bytes"),
    (struct.pack("<I", 24) + b"\xff" * 24, "malformed message"),
])
def test_garbage_on_the_socket_means_pass_through(simgpu, container, libshim, garbage, text):
    c = container(proto.Class.OPPORTUNISTIC)
    c.control.set_budget(0, rate=108 * 20, burst=108)
    p = simgpu.workload(Workload(kernel_us=500, kernels=4, seconds=3, report_s=0.5, verify=True), "g",
                        c.env(libshim.shim))
    conn = c.wait_for(lambda: c.conns and c.conns[0].hello and c.conns[0], what="hello")
    # the garbage comes 0.7 s after the job's first kernel, so its first report (0.5 s) is
    # throttled throughout (timed from the hello, which comes before the job's set-up,
    # it came too early beside five busy loops: the first report read 101.9 it/s)
    simgpu.wait_for_contexts(["g"])
    time.sleep(0.7)
    c.send_raw(conn, garbage)
    assert p.wait() == 0
    assert p.summary().checksum_ok
    one_line(p.stderr, text)
    reports = p.reports()
    assert reports[-2].iterations_per_s > 100 > reports[0].iterations_per_s, "throttled, then free"


@pytest.mark.parametrize("level,said", [(None, False), ("warn", False), ("info", True), ("debug", True)])
def test_a_healthy_tgs_container_is_quiet_unless_asked(simgpu, container, libshim, level, said):
    """The shim writes to a job's stderr only at warn and above, unless TGS_LOG_LEVEL says
    otherwise: a healthy TGS container's output is the job's own."""
    c = container(proto.Class.PRODUCTION)
    env = {**c.env(libshim.shim), **({"TGS_LOG_LEVEL": level} if level else {})}
    p = simgpu.workload(Workload(kernel_us=500, kernels=4, seconds=1, param_mb=8, act_mb=8, verify=True), "quiet", env)
    assert p.wait() == 0 and p.summary().checksum_ok
    assert ("TGS production container" in p.stderr) == said, p.stderr
    if not said:
        assert "tgs[" not in p.stderr, p.stderr


def test_tgsd_away_then_back(simgpu, container, libshim):
    c = container(proto.Class.PRODUCTION, serve=False)
    p = simgpu.workload(Workload(kernel_us=500, kernels=4, seconds=4, param_mb=8, act_mb=8), "away",
                        {**c.env(libshim.shim), "TGS_LOG_LEVEL": "info"})
    time.sleep(1)
    c.start_serving()
    conn = c.wait_for(lambda: c.conns and c.conns[0].hello and c.conns[0], timeout=10, what="a reconnection")
    c.wait_for(lambda: len(c.ranges()) == 2, what="the allocations resent")
    assert conn.slot != proto.NO_SLOT
    assert p.wait() == 0
    warnings = [l for l in p.stderr.splitlines() if "not reachable" in l]
    assert len(warnings) == 1 and "connected to tgsd again" in p.stderr


def test_fork_does_not_deadlock(simgpu, container, libshim, c_programs):
    c = container(proto.Class.OPPORTUNISTIC)
    c.control.set_budget(0, rate=108 * 300, burst=108, inflight=2)
    exe = c_programs("shim_checks.c", link_cuda=True)
    proc = subprocess.run([str(exe), "fork"], env=simgpu.env("fork", c.env(libshim.shim)), capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    child, parent = (json.loads(l) for l in proc.stdout.splitlines())
    assert child == {"child_init": "CUDA_ERROR_NOT_INITIALIZED", "child_alloc": "CUDA_ERROR_NOT_INITIALIZED"}
    assert parent["child_exit"] == 0 and parent["parent_kernels"] > 50


def test_real_libcuda_pointing_at_the_shim_is_refused_clearly(simgpu, container, libshim):
    c = container(proto.Class.OPPORTUNISTIC)
    env = {**c.env(libshim.shim), "TGS_REAL_LIBCUDA": str(libshim.shim)}
    p = simgpu.run(Workload(seconds=0.2), "loop", env)
    assert p.popen.returncode != 0
    assert "is libtgs.so itself; set TGS_REAL_LIBCUDA" in p.stderr


def test_tgs_dir_without_a_control_block(simgpu, libshim, tmp_path):
    p = simgpu.run(SHORT, "empty", {"LD_PRELOAD": str(libshim.shim), "TGS_DIR": str(tmp_path)})
    assert p.popen.returncode == 0
    one_line(p.stderr, "holds no control block")


def test_a_process_switching_between_contexts_leaks_nothing(simgpu, container, libshim, c_programs):
    """The shim's own events (the in-flight ring, the kernel timer) belong to a context: a
    process that uses two contexts of one GPU in turn must not leave one behind per switch,
    and contexts destroyed and made again (their handles may come back) must still work."""
    c = container(proto.Class.OPPORTUNISTIC)
    c.control.set_budget(0, rate=proto.RATE_UNLIMITED, burst=108, inflight=2, gate=True, anticipate=True)
    exe = c_programs("shim_checks.c", link_cuda=True)
    proc = subprocess.run([str(exe), "contexts", "400"], env=simgpu.env("contexts", c.env(libshim.shim)),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    # 800 switches: when the shim dropped another context's events instead of destroying
    # them, these rounds left 102,432 bytes of simgpu's events behind; now 0
    assert out["heap_growth_bytes"] < 16 * 1024, out
