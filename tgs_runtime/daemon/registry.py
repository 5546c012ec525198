"""What tgsd knows of each container: its files, its processes (connections on its own
socket), the memory they hold, and registration.json, which lets a restarted tgsd take
every running container back."""
from __future__ import annotations

import asyncio
import enum
import json
import os
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

from tgs_runtime import proto
from tgs_runtime.control import ContainerPaths, ControlBlock
from tgs_runtime.daemon.residency import Move, Range


@dataclass(frozen=True)
class Tally:
    """A container's counters on one GPU that tgsd takes per control period: the blocks it
    launched, what tells sharing's harm from production's own change (tgs_proto.h,
    busy_ns, gated_ns, overlap_ns), and how long its launching threads waited for their own
    kernels at the in-flight bound (the shim part's inflight_wait_ns: all its GPUs
    together), which tells a container the GPU holds back from one that needs little."""
    blocks: int = 0
    busy_ns: int = 0
    gated_ns: int = 0
    overlap_ns: int = 0
    inflight_wait_ns: int = 0

    @classmethod
    def of(cls, ctr: proto.GpuCounters, shim: proto.ShimPart) -> Tally:
        return cls(ctr.blocks, ctr.busy_ns, ctr.gated_ns, ctr.overlap_ns, shim.inflight_wait_ns)

    def since(self, earlier: Tally) -> Tally:
        """What was added since `earlier` (a counter that went back, as after a reset,
        counts nothing). Field by field, not by `dataclasses.astuple`, which deep-copies: this
        runs for every container on every GPU every control period (a fifth of tgsd's CPU
        under cProfile at 10 ms; measured without, tgsd went from 0.077-0.081 to 0.072 CPU
        seconds a second with the busy bytes read at once, `ActivityFile.busy_slots`)."""
        return Tally(*(max(0, getattr(self, f) - getattr(earlier, f)) for f in TALLY_FIELDS))


TALLY_FIELDS = tuple(f.name for f in fields(Tally))


class Phase(str, enum.Enum):
    RESERVED = "reserved"  # tgs-runtime asked; the container has not started yet
    ATTACHED = "attached"  # its init process is known (createRuntime hook)


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot): with the pid, an identity
    that survives pid reuse across a tgsd restart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[19])


@dataclass
class Process:
    """One shim's connection to its container's socket."""

    id: int
    host_pid: int | None
    uid: int | None
    writer: asyncio.StreamWriter
    pid: int = 0            # in the container's namespace (from hello; informational)
    comm: str = ""
    cuda_version: int = 0
    slot: int = proto.NO_SLOT
    said_hello: bool = False
    tokens: float = 0.0     # message-rate bucket
    tokens_at: float = 0.0
    pending: dict[int, Move] = field(default_factory=dict)  # order id -> the move it orders
    gpus: set[str] = field(default_factory=set)  # the GPUs (UUIDs) it was seen using, if production

    def allow_message(self, now: float, per_s: int) -> bool:
        self.tokens = min(float(per_s), self.tokens + (now - self.tokens_at) * per_s)
        self.tokens_at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


@dataclass
class Container:
    id: str
    cls: proto.Class
    gpus: list[str]                       # UUIDs, in control-block slot order
    paths: ContainerPaths
    created: float = field(default_factory=time.time)
    reserved_at: float = field(default_factory=time.monotonic)
    phase: Phase = Phase.RESERVED
    init_pid: int | None = None
    pid_start: int | None = None
    control: ControlBlock | None = None
    server: asyncio.AbstractServer | None = None
    pidfd: int | None = None
    processes: dict[int, Process] = field(default_factory=dict)
    ranges: dict[tuple[int, int, int], Range] = field(default_factory=dict)  # (process, gpu slot, ptr)
    range_owner: dict[tuple[int, int, int], int] = field(default_factory=dict)
    last: list[Tally] = field(default_factory=list)       # per GPU slot, for deltas
    achieved: list[float] = field(default_factory=list)   # blocks/s per GPU slot (smoothed)
    bound_wait: list[float] = field(default_factory=list)  # s/s waited at the in-flight bound, per GPU slot
                                                          # (smoothed; opportunistic containers only)
    budget: list[int] = field(default_factory=list)       # the last rate written per GPU slot
    warned_ranges: bool = False
    order: int = 0                                        # arrival order

    def gpu_slot(self, uuid: str) -> int:
        return self.gpus.index(uuid)

    @property
    def label(self) -> str:
        return self.cls.name.lower()

    def attained(self) -> int:
        """Blocks launched over the container's life (LAS). The counters live in the control
        block, which outlives a tgsd restart."""
        if not self.control:
            return 0
        return sum(self.control.counters(i).blocks for i in range(len(self.gpus)))

    def converts(self) -> bool:
        """Whether its device allocations become managed memory (its control block says)."""
        return bool(self.control and self.control.daemon.convert)

    def footprint(self, slot: int) -> int:
        """Device memory the container holds on a GPU (tgs_proto.h: counted less released)."""
        if not self.control:
            return 0
        return max(0, self.control.counters(slot).footprint_bytes - self.control.budget(slot).released_bytes)

    def registration(self) -> dict:
        return {"id": self.id, "class": self.label, "gpus": self.gpus, "created": self.created,
                "phase": self.phase.value, "init_pid": self.init_pid, "pid_start": self.pid_start,
                "order": self.order, "attained_blocks": self.attained()}

    def save(self) -> None:
        tmp = self.paths.registration.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.registration(), indent=1))
        os.replace(tmp, self.paths.registration)


def load_registration(paths: ContainerPaths) -> dict:
    data = json.loads(paths.registration.read_text())
    for key in ("id", "class", "gpus", "phase"):
        if key not in data:
            raise ValueError(f"{paths.registration} has no {key!r}")
    return data
