"""Production that holds the gate without using the GPU (ARCHITECTURE.md, "Gating").

A production shim sets its activity byte at the first launch after it was last found idle
and clears it when it is found idle again (a completed synchronisation, or a query that
finds all its streams done: docs/shim.md). A job frozen in between
(`docker pause`, SIGSTOP, a debugger) or in a long host phase keeps the byte set with
nothing on the GPU, and opportunistic shims would wait behind it for as long. tgsd lifts
the gate for the GPU when production's byte has been held for STALL_S with no production
launch and the GPU idle (NVML's utilization, of which opportunistic work has none while it
waits), and puts it back at production's first launch. Pure logic: the daemon reads the
byte, the launches and the utilization."""
from __future__ import annotations

from dataclasses import dataclass

STALL_S = 1.0       # held, unused, for this long: the gate is lifted
IDLE_PERCENT = 5    # NVML utilization at or below this: nothing runs on the GPU


@dataclass
class HeldGate:
    since: float | None = None  # when the byte was first seen held with nothing launched
    lifted: bool = False

    def step(self, now: float, held: bool, launched: bool, utilization: int | None) -> bool:
        """Whether the gate is lifted now. `held`: a production activity byte is set;
        `launched`: production launched work this period; `utilization`: the GPU's, in
        percent (None: unknown, and the gate stays)."""
        if not held or launched:
            self.since, self.lifted = None, False
            return False
        if self.lifted:
            return True
        if utilization is None or utilization > IDLE_PERCENT:
            self.since = None
            return False
        if self.since is None:
            self.since = now
        self.lifted = now - self.since >= STALL_S
        return self.lifted
