"""libtgs.so's clock (libshim/src/clock.c): CLOCK_MONOTONIC, the clock tgsd and every
other process read, from the TSC where the kernel keeps that clock by the TSC. Read by
tests/c/clock.c from several threads against clock_gettime just before and just after
each reading; the bounds are loose (the scaled clock keeps within about 100 ns here)."""
from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path

import pytest

SOURCE = Path("/sys/devices/system/clocksource/clocksource0/current_clocksource")
NOT_TSC = "clock_gettime (the kernel's clocksource is not the TSC)"
X86 = platform.machine() in ("x86_64", "AMD64")


def read_clock(c_programs, clocksource: str, ms: int, threads: int, *extra: str) -> dict:
    exe = c_programs("clock.c")
    out = subprocess.run([str(exe), clocksource, str(ms), str(threads), *extra], capture_output=True, text=True,
                         check=True, timeout=60)
    return json.loads(out.stdout)


def test_the_clock_scaled_from_the_tsc_keeps_with_clock_monotonic_and_never_goes_back(c_programs):
    """Four threads for 0.6 s, each pausing up to 8 ms now and then (past an anchor's
    span): every reading lies between clock_gettime just before and just after it, to
    within 20 us, and no thread's reading is below its previous one."""
    seen = read_clock(c_programs, "tsc", 600, 4)
    assert seen["source"] == ("tsc" if X86 else "clock_gettime (no TSC on this architecture)"), seen
    assert seen["reads"] > 1000, seen
    assert seen["backwards"] == 0, seen
    assert seen["max_behind_ns"] < 20_000 and seen["max_ahead_ns"] < 20_000, seen


def test_the_clock_is_clock_gettime_where_the_kernel_keeps_time_by_another_source(c_programs):
    seen = read_clock(c_programs, "kvm-clock", 200, 2)
    assert seen["source"] == (NOT_TSC if X86 else "clock_gettime (no TSC on this architecture)"), seen
    assert seen["backwards"] == 0 and seen["max_behind_ns"] == 0 and seen["max_ahead_ns"] == 0, seen


def test_the_clock_follows_the_kernels_clocksource(c_programs):
    """Without a name given it reads /sys, as libtgs.so does in every process."""
    name = SOURCE.read_text().strip() if SOURCE.exists() else None
    seen = read_clock(c_programs, "-", 200, 2)
    if not X86:
        assert seen["source"] == "clock_gettime (no TSC on this architecture)", seen
    elif name is None:
        assert seen["source"] == "clock_gettime (the kernel's clocksource could not be read)", seen
    else:
        assert seen["source"] == ("tsc" if name == "tsc" else NOT_TSC), (name, seen)
    assert seen["backwards"] == 0, seen


@pytest.mark.skipif(not X86, reason="the TSC is x86's: elsewhere the clock is clock_gettime alone")
def test_after_the_tsc_jumps_the_clock_holds_still_and_then_is_clock_gettime(c_programs):
    """A thread whose scaled time ran 5 ms ahead of CLOCK_MONOTONIC (as after a VM moved
    to a host whose TSC is ahead) turns the process to clock_gettime at its next anchor;
    its clock does not go back, but holds still until clock_gettime passes it."""
    seen = read_clock(c_programs, "tsc", 300, 2, "jump")
    assert seen["source"] == "clock_gettime (the TSC jumped against CLOCK_MONOTONIC)", seen
    assert seen["backwards"] == 0, seen
    assert 4_000_000 < seen["max_ahead_ns"] < 12_000_000, seen
    assert seen["max_ahead_late_ns"] == 0, seen
