"""The ABI table generated from cudaTypedefs.h (libshim/tools/gen_cuda_abi.py)."""
from __future__ import annotations

import importlib.util
import sys

import pytest

from tgs_runtime.paths import REPO_ROOT, cuda_include_dir

spec = importlib.util.spec_from_file_location("gen_cuda_abi", REPO_ROOT / "libshim" / "tools" / "gen_cuda_abi.py")
gen = importlib.util.module_from_spec(spec)
sys.modules["gen_cuda_abi"] = gen
spec.loader.exec_module(gen)


@pytest.fixture(scope="module")
def rows():
    inc = cuda_include_dir()
    return {(r.base, r.version, r.variant): r.symbol for r in gen.parse_rows((inc / "cudaTypedefs.h").read_text())}


@pytest.mark.parametrize("key,symbol", [
    (("cuMemAlloc", 2000, ""), "cuMemAlloc"),
    (("cuMemAlloc", 3020, ""), "cuMemAlloc_v2"),
    (("cuCtxCreate", 12050, ""), "cuCtxCreate_v4"),
    (("cuLaunchKernel", 7000, "_ptsz"), "cuLaunchKernel_ptsz"),
    (("cuMemcpyHtoD", 7000, "_ptds"), "cuMemcpyHtoD_v2_ptds"),
    (("cuStreamBeginCapture", 10010, "_ptsz"), "cuStreamBeginCapture_v2_ptsz"),
    (("cuGetProcAddress", 12000, ""), "cuGetProcAddress_v2"),
    (("cuCtxSynchronize", 13000, ""), "cuCtxSynchronize_v2"),
    (("cuGraphInstantiate", 11000, ""), "cuGraphInstantiate_v2"),
])
def test_symbol_names(rows, key, symbol):
    assert rows[key] == symbol


def test_synthetic_typedefs():
    text = """
    typedef CUresult (CUDAAPI *PFN_cuFoo_v2000)(int a);
    typedef CUresult (CUDAAPI *PFN_cuFoo_v3020)(long a);
    typedef CUresult (CUDAAPI *PFN_cuFoo_v7000_ptds)(long a);
    typedef CUresult(CUDAAPI *PFN_cuBar_v12010)(void);
    """
    got = {(r.base, r.version, r.variant): r.symbol for r in gen.parse_rows(text)}
    assert got == {("cuFoo", 2000, ""): "cuFoo", ("cuFoo", 3020, ""): "cuFoo_v2",
                   ("cuFoo", 7000, "_ptds"): "cuFoo_v2_ptds", ("cuBar", 12010, ""): "cuBar"}
