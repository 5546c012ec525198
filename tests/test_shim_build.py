"""libtgs.so as built: loadable into any glibc image, and one table behind every export."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest

from tgs_runtime.paths import REPO_ROOT, cuda_include_dir

HOOKS_H = REPO_ROOT / "libshim" / "src" / "hooks.h"


def dynsyms(lib) -> list[tuple[str, str, str]]:
    """(name, version, defined?) from the dynamic symbol table."""
    out = subprocess.run(["readelf", "--dyn-syms", "-W", str(lib)], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 8 and parts[0].rstrip(":").isdigit():
            name = parts[7]
            sym, _, ver = name.partition("@")
            rows.append((sym, ver.lstrip("@"), parts[6] != "UND"))
    return rows


def table(macro: str) -> list[str]:
    text = HOOKS_H.read_text()
    body = text[text.index(f"#define {macro}(X)"):]
    body = body[: body.index("\n\n")]
    return re.findall(r"X\((\w+)\)", body)


def test_no_glibc_symbol_newer_than_2_17(libshim):
    versions = {v for _, v, defined in dynsyms(libshim.shim) if not defined and v.startswith("GLIBC_")}
    assert versions, "expected versioned glibc references"
    too_new = [v for v in versions if tuple(map(int, v[6:].split("."))) > (2, 17)]
    assert not too_new, f"libtgs.so needs {too_new}: pin them in libshim/src/glibc_compat.h"


def test_links_only_libc_libdl_libpthread(libshim):
    out = subprocess.run(["readelf", "-d", str(libshim.shim)], capture_output=True, text=True, check=True).stdout
    needed = set(re.findall(r"NEEDED\).*\[(.+)\]", out))
    assert needed == {"libc.so.6", "libdl.so.2", "libpthread.so.0"}


def test_table_wrappers_and_exports_agree(libshim):
    exported = {n for n, _, defined in dynsyms(libshim.shim) if defined and re.match(r"(cu|nvml)[A-Z]", n)}
    hooks = set(table("TGS_HOOKS")) | set(table("TGS_NVML_HOOKS"))
    assert exported == hooks
    assert {n for n, _, d in dynsyms(libshim.shim) if d and n == "dlsym"} == {"dlsym"}


@pytest.fixture(scope="module")
def abi_rows():
    spec = importlib.util.spec_from_file_location("gen_cuda_abi", REPO_ROOT / "libshim" / "tools" / "gen_cuda_abi.py")
    gen = importlib.util.module_from_spec(spec)
    sys.modules["gen_cuda_abi"] = gen
    spec.loader.exec_module(gen)
    return {r.symbol: r for r in gen.parse_rows((cuda_include_dir() / "cudaTypedefs.h").read_text())}


def test_every_wrapper_has_the_prototype_of_its_abi(libshim, abi_rows, tmp_path):
    """Each hooked symbol is a row of cudaTypedefs.h, and the wrapper's type is that row's
    PFN typedef (the wrappers are compiled against cuda.h's own declarations)."""
    hooks = table("TGS_HOOKS") + table("TGS_NEEDS")
    missing = [h for h in hooks if h not in abi_rows]
    assert not missing, f"not ABI rows of cudaTypedefs.h: {missing}"
    lines = ["#define __CUDA_API_VERSION_INTERNAL 1", "#include <cuda.h>", "#include <cudaTypedefs.h>"]
    lines += [f"{abi_rows[h].pfn} check_{h} = &{h};" for h in hooks]
    src = tmp_path / "protos.c"
    src.write_text("\n".join(lines) + "\n")
    proc = subprocess.run(["cc", "-c", "-Werror=incompatible-pointer-types", f"-I{cuda_include_dir()}", str(src),
                           "-o", str(tmp_path / "protos.o")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_a_non_cuda_program_is_left_alone(libshim, tmp_path, container):
    """Preloaded into a program that never calls CUDA, the shim does nothing: no driver is
    loaded, no connection is made."""
    from tgs_runtime import proto

    c = container(proto.Class.OPPORTUNISTIC)
    env = {"PATH": "/usr/bin:/bin", **c.env(libshim.shim)}
    out = subprocess.run(["cat", "/proc/self/maps"], env=env, capture_output=True, text=True, check=True).stdout
    assert "libtgs.so" in out and "libcuda" not in out
    assert not c.conns
