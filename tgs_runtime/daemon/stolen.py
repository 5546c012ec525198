"""The host's CPU time taken by its hypervisor (the `steal` of /proc/stat, through psutil),
for the controllers (`Sample.stolen_s`): on a shared VM, stretches in which the hypervisor
runs other guests slow every process on the host, production's included, and a fall of
production's progress then is the machine's, not sharing's harm (`FastController._fell`).
On bare metal, and where the kernel does not tell, it reads 0."""
from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import psutil


def steal_seconds(times: Any) -> float:
    """All CPUs' stolen seconds in a psutil `cpu_times()` reading (0 where it has none:
    not Linux, or a kernel without the field)."""
    return float(getattr(times, "steal", 0.0) or 0.0)


class StolenTime:
    """Reads the host's stolen CPU time at most every READ_EVERY_S seconds (a reading of
    /proc/stat costs tens of microseconds, and the control period may be 10 ms): each
    reading's growth since the last goes to the period it is read in, as seconds per CPU,
    and the periods between read 0. A window of a second or more sums them to the part of
    its time stolen, off by at most one reading's stretch at its start."""
    READ_EVERY_S = 0.25
    RECENT_S = 3.0  # `recent` is over this long (the controllers' longest window but a long rhythm's)

    def __init__(self, read: Callable[[], Any] = psutil.cpu_times, cpus: int | None = None):
        self._read = read
        self._cpus = max(cpus or psutil.cpu_count() or 1, 1)
        # the readings of the last RECENT_S, the latest last: (monotonic at, stolen seconds per CPU)
        self._readings: collections.deque[tuple[float, float]] = collections.deque()

    def recent(self) -> float | None:
        """The part of the host's CPU time stolen over the last RECENT_S seconds of readings
        (`tgs status`); None before two readings."""
        if len(self._readings) < 2:
            return None
        (t0, s0), (t1, s1) = self._readings[0], self._readings[-1]
        return max(0.0, (s1 - s0) / (t1 - t0)) if t1 > t0 else None

    def since_last(self, now: float) -> float:
        """Seconds per CPU stolen since the last reading, where one is due at monotonic
        `now`; else 0. The first reading sets the start and reads 0; a counter that goes
        back (a CPU taken offline takes its share with it) reads 0 and starts again."""
        last = self._readings[-1] if self._readings else None
        if last is not None and now - last[0] < self.READ_EVERY_S:
            return 0.0
        try:
            seconds = steal_seconds(self._read()) / self._cpus
        except OSError:  # (/proc unreadable: nothing is known to be stolen)
            return 0.0
        grown = 0.0 if last is None else seconds - last[1]
        if grown < 0:
            self._readings.clear()
        self._readings.append((now, seconds))
        while now - self._readings[0][0] > self.RECENT_S + 1e-9:
            self._readings.popleft()
        return max(grown, 0.0)
