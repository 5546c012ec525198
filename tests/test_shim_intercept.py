"""How calls reach libtgs.so: cuGetProcAddress as cudart uses it, dlsym, RTLD_NEXT, and a
real cudart program over the shim."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tgs_runtime import proto
from tgs_runtime.paths import REPO_ROOT, cuda_include_dir

DATA = Path(__file__).resolve().parent / "data" / "cudart-13.0-getprocaddress.txt"


def _gen():
    spec = importlib.util.spec_from_file_location("gen_cuda_abi", REPO_ROOT / "libshim" / "tools" / "gen_cuda_abi.py")
    gen = importlib.util.module_from_spec(spec)
    sys.modules["gen_cuda_abi"] = gen
    spec.loader.exec_module(gen)
    return gen


def abi_rows():
    gen = _gen()
    inc = cuda_include_dir()
    rows = gen.parse_rows((inc / "cudaTypedefs.h").read_text())
    for h in gen.FOREIGN_HEADERS:
        rows += gen.parse_rows((inc / h).read_text(), foreign=True)
    return rows


def expected_symbol(rows, base, version, flags):
    """The ABI a request means (the rule in libshim/include/cu_abi_lookup.h)."""
    cands = [r for r in rows if r.base == base and r.version <= version]
    default = max((r for r in cands if not r.variant), key=lambda r: r.version, default=None)
    if default is None:
        return None
    pt = max((r for r in cands if r.variant), key=lambda r: r.version, default=None)
    if flags & 2 and pt and pt.symbol in (default.symbol + "_ptds", default.symbol + "_ptsz"):
        return pt.symbol
    return default.symbol


def hooked():
    text = (REPO_ROOT / "libshim" / "src" / "hooks.h").read_text()
    body = text[text.index("#define TGS_HOOKS(X)"):]
    return set(re.findall(r"X\((\w+)\)", body[: body.index("\n\n")]))


def replay(simgpu, c_programs, extra_env):
    exe = c_programs("getproc_replay.c")
    proc = subprocess.run([str(exe), str(DATA)], env=simgpu.env("replay", extra_env), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    return lines[0].split()[1:], [l.split() for l in lines[1:]]


def test_cudart_requests_reach_the_wrappers(simgpu, c_programs, container, libshim):
    c = container(proto.Class.OPPORTUNISTIC)
    entry, answers = replay(simgpu, c_programs, c.env(libshim.shim))
    assert entry == ["libtgs.so", "cuGetProcAddress_v2"], "dlsym hands out the shim's cuGetProcAddress_v2"
    assert len(answers) == 440
    rows, hooks = abi_rows(), hooked()
    wrapped = 0
    for sym, ver, flags, r, st, lib, sname in answers:
        if sym == '""':
            assert (r, st, lib) == ("500", "1", "-"), "the empty probe gets the driver's own answer"
            continue
        want = expected_symbol(rows, sym, int(ver), int(flags))
        assert (r, st) == ("0", "0"), f"{sym} {ver} {flags}: status {r}/{st}"
        assert sname == want, f"{sym} {ver} {flags}: got {sname}, the ABI is {want}"
        assert lib == ("libtgs.so" if want in hooks else "libcuda.so.1"), f"{sym} {ver} {flags} came from {lib}"
        wrapped += want in hooks
    assert wrapped >= 25, f"only {wrapped} requests went to wrappers"


def test_without_tgs_every_answer_is_the_drivers(simgpu, c_programs, libshim):
    entry, answers = replay(simgpu, c_programs, {"LD_PRELOAD": str(libshim.shim)})
    assert entry == ["libcuda.so.1", "cuGetProcAddress_v2"]
    assert all(a[5] in ("libcuda.so.1", "-") for a in answers)


def test_rtld_next_keeps_working_for_another_preloaded_library(simgpu, libshim, c_programs, tmp_path, container):
    c = container(proto.Class.PRODUCTION)
    other = tmp_path / "libnext.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(other), str(Path(__file__).parent / "c" / "rtld_next.c"),
                    "-ldl"], check=True)
    exe = c_programs("getpid_twice.c", link_cuda=True)
    env = c.env(libshim.shim)
    env["LD_PRELOAD"] = f"{libshim.shim} {other}"
    proc = subprocess.run([str(exe)], env=simgpu.env("next", env), capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "getpid ok" in proc.stdout


def test_a_real_cudart_program_makes_the_same_requests_over_the_shim(simgpu, libshim, container, tmp_path):
    """A program built by nvcc (static cudart 13.0) over simgpu as a logging driver: with
    the shim preloaded in a TGS container it asks the driver exactly what it asks without."""
    from harness.toolkit import nvcc

    try:
        compiler = nvcc()
    except RuntimeError as e:
        pytest.skip(f"needs nvcc to build a cudart program: {e}")
    src = tmp_path / "count.cu"
    src.write_text('#include <cstdio>\n#include <cuda_runtime.h>\nint main() { int n = -1; '
                   'cudaError_t e = cudaGetDeviceCount(&n); printf("%s\\n", cudaGetErrorName(e)); return 0; }\n')
    exe = tmp_path / "count"
    subprocess.run([str(compiler), "-o", str(exe), str(src)], check=True, capture_output=True, timeout=300)
    c = container(proto.Class.OPPORTUNISTIC)
    logs = []
    for name, extra in (("plain", {}), ("shim", c.env(libshim.shim))):
        log = tmp_path / f"{name}.log"
        env = simgpu.env(name, {**extra, "SIMGPU_LOG_GETPROC": str(log)})
        subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=60)
        logs.append(log.read_text().splitlines())
    plain, shimmed = logs
    expected = [l for l in DATA.read_text().splitlines() if not l.startswith("#")]
    assert plain == expected, "cudart 13.0 makes the captured requests"
    assert shimmed == plain
