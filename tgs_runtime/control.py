"""The files tgsd shares with the shims (tgs_proto.h): a container's directory, its
control block, and the per-GPU production activity files. tgsd creates and writes them;
the tests that exercise libtgs.so without tgsd use the same code."""
from __future__ import annotations

import ctypes as C
import mmap
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from tgs_runtime import proto


@dataclass(frozen=True)
class IterationMark:
    """A production container's latest iteration start on a GPU, as its shims marked it
    (tgs_proto.h): CLOCK_MONOTONIC ns; the blocks, the ns of its pauses (tgs_gpu_pauses)
    and of its busy time (mark_busy_ns) before it, the last two 0 from shims before them;
    and its number (the iteration starts marked so far: mark_seq / 2)."""
    ns: int
    blocks: int
    paused_ns: int = 0
    busy_ns: int = 0
    number: int = 0


@dataclass(frozen=True)
class StatePaths:
    """Where everything lives under tgsd's state_dir (ARCHITECTURE.md, "Paths")."""

    state_dir: Path

    @property
    def admin_socket(self) -> Path:
        return self.state_dir / proto.ADMIN_SOCKET_NAME

    def activity(self, uuid: str) -> Path:
        return self.state_dir / proto.ACTIVITY_DIR / uuid

    def container(self, cid: str) -> "ContainerPaths":
        return ContainerPaths(self.state_dir / "c" / cid)

    @property
    def containers(self) -> Path:
        return self.state_dir / "c"


@dataclass(frozen=True)
class ContainerPaths:
    dir: Path

    @property
    def socket(self) -> Path:
        return self.dir / proto.SOCKET_NAME

    @property
    def control(self) -> Path:
        return self.dir / proto.CONTROL_NAME

    @property
    def registration(self) -> Path:
        return self.dir / proto.REGISTRATION_NAME

    def activity(self, uuid: str) -> Path:
        return self.dir / proto.ACTIVITY_DIR / uuid


class ControlFileError(RuntimeError):
    """A control block or activity file that is missing or does not follow the contract."""


class _Mapped:
    """A file mapped shared, seen through a ctypes structure."""

    struct: type[C.Structure]
    size: int

    def __init__(self, path: Path, mm: mmap.mmap):
        self.path = path
        self._mm = mm
        self.view = self.struct.from_buffer(mm)

    @classmethod
    def _map(cls, path: Path, create: bool):
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT | os.O_TRUNC if create else 0)
        fd = os.open(path, flags, 0o644)
        try:
            if create:
                os.ftruncate(fd, cls.size)
            elif os.fstat(fd).st_size < cls.size:
                raise ControlFileError(f"{path} is truncated ({os.fstat(fd).st_size} bytes, expected {cls.size})")
            return cls(path, mmap.mmap(fd, cls.size, mmap.MAP_SHARED))
        finally:
            os.close(fd)

    def close(self) -> None:
        if self._mm is not None:
            del self.view
            self._mm.close()
            self._mm = None


class ControlBlock(_Mapped):
    struct = proto.Control
    size = proto.CONTROL_SIZE

    @classmethod
    def create(cls, path: Path, klass: proto.Class, gpus: list[str], *, convert: bool = True,
               stale_ms: int = 2000) -> "ControlBlock":
        if len(gpus) > proto.MAX_GPUS:
            raise ControlFileError(f"{len(gpus)} GPUs: a container may use at most {proto.MAX_GPUS}")
        cb = cls._map(Path(path), create=True)
        v = cb.view
        d = v.daemon
        d.cls = int(klass)
        d.ngpus = len(gpus)
        d.stale_ms = stale_ms
        d.convert = 1 if convert or klass == proto.Class.OPPORTUNISTIC else 0
        for i, uuid in enumerate(gpus):
            b = d.gpu[i]
            b.uuid = proto.uuid_bytes(uuid)
            b.rate_blocks_per_s = proto.RATE_UNLIMITED
            b.flags = proto.GPU_GATE
        h = v.header
        h.version = proto.PROTO_VERSION
        h.size = proto.CONTROL_SIZE
        h.header_size = C.sizeof(proto.ControlHeader)
        h.daemon_offset = proto.DAEMON_OFFSET
        h.daemon_size = C.sizeof(proto.DaemonPart)
        h.shim_offset = proto.SHIM_OFFSET
        h.shim_size = C.sizeof(proto.ShimPart)
        h.magic = proto.CONTROL_MAGIC  # last: the block is complete
        return cb

    @classmethod
    def open(cls, path: Path) -> "ControlBlock":
        cb = cls._map(Path(path), create=False)
        h = cb.view.header
        if h.magic != proto.CONTROL_MAGIC or h.size != proto.CONTROL_SIZE:
            cb.close()
            raise ControlFileError(f"{path} is not a TGS control block (magic {h.magic:#x})")
        return cb

    @property
    def version(self) -> int:
        return self.view.header.version

    @property
    def daemon(self) -> proto.DaemonPart:
        return self.view.daemon

    @property
    def shim(self) -> proto.ShimPart:
        return self.view.shim

    def budget(self, slot: int) -> proto.GpuBudget:
        return self.view.daemon.gpu[slot]

    def counters(self, slot: int) -> proto.GpuCounters:
        return self.view.shim.gpu[slot]

    def pauses(self, slot: int) -> proto.GpuPauses:
        """Production's pauses of its own on the GPU (tgs_proto.h's tgs_gpu_pauses)."""
        return self.view.pauses[slot]

    def iteration_mark(self, slot: int) -> IterationMark | None:
        """A production shim's latest iteration start, or None when none was marked or a
        shim is writing one right now."""
        c = self.view.shim.gpu[slot]
        seq = c.mark_seq
        if seq == 0 or seq & 1:
            return None
        m = IterationMark(c.mark_ns, c.mark_blocks, self.pauses(slot).mark_paused_ns, self.view.mark_busy_ns[slot],
                          seq // 2)
        return m if c.mark_seq == seq else None

    def set_budget(self, slot: int, *, rate: int | None = None, burst: int | None = None, floor: int | None = None,
                   inflight: int | None = None, quota: int | None = None, view_total: int | None = None,
                   gate: bool | None = None, anticipate: bool | None = None) -> None:
        b = self.view.daemon.gpu[slot]
        if rate is not None:
            b.ns_per_block_fp = proto.ns_per_block_fp(rate)
            b.rate_blocks_per_s = rate
        if burst is not None:
            b.burst_blocks = burst
        if floor is not None:
            b.floor_blocks_per_s = floor
        if inflight is not None:
            b.inflight_max = inflight
        if quota is not None:
            b.mem_quota_bytes = quota
        if view_total is not None:
            b.mem_view_total_bytes = view_total
        for bit, on in ((proto.GPU_GATE, gate), (proto.GPU_ANTICIPATE, anticipate)):
            if on is not None:
                b.flags = (b.flags | bit) if on else (b.flags & ~bit)
        self.view.daemon.generation += 1

    def heartbeat(self, now_ns: int | None = None) -> None:
        self.view.daemon.heartbeat_ns = time.monotonic_ns() if now_ns is None else now_ns


class ActivityFile(_Mapped):
    struct = proto.Activity
    size = proto.ACTIVITY_SIZE

    @classmethod
    def create(cls, path: Path) -> "ActivityFile":
        """Creates the file if it is missing, keeping a live one's bytes (a restarted tgsd)."""
        path = Path(path)
        if path.exists() and path.stat().st_size >= cls.size:
            try:
                return cls.open(path)
            except ControlFileError:
                pass
        af = cls._map(path, create=True)
        af.view.version = proto.PROTO_VERSION
        af.view.nslots = proto.ACTIVITY_SLOTS
        af.view.magic = proto.ACTIVITY_MAGIC
        return af

    @classmethod
    def open(cls, path: Path) -> "ActivityFile":
        af = cls._map(Path(path), create=False)
        if af.view.magic != proto.ACTIVITY_MAGIC:
            af.close()
            raise ControlFileError(f"{path} is not a TGS activity file")
        return af

    def busy_slots(self) -> list[int]:
        busy = bytes(self.view.busy)  # (a copy at once: a ctypes array read byte by byte is slow)
        return [i for i, b in enumerate(busy) if b] if busy.strip(b"\0") else []

    def clear(self, slot: int, in_use: Iterable[int] = ()) -> None:
        """A process that ended or died: not busy, and nothing expected of it (nor anything
        left that says it used this GPU, for the next process given its slot: `used`).
        Opportunistic shims then read expectations only as far as the slots still `in_use`
        (a shim that writes one raises the count again itself)."""
        self.view.busy[slot] = 0
        if slot < proto.EXPECT_SLOTS:
            e = self.view.expect[slot]
            e.due_until_ns = 0
            e.idle_ns = e.due_ns = self.view.step_spell_ns[slot] = 0
        self.view.expect_slots = min(proto.EXPECT_SLOTS, max(in_use, default=-1) + 1)

    def used(self, slot: int) -> bool:
        """Whether the production process in `slot` has used this GPU: it has work on it
        now, or it has written an expectation here (once it has gone idle three times,
        which is before its shim counts any pause on this GPU). A process of a slot from
        TGS_EXPECT_SLOTS on is seen only while it has work."""
        if slot >= proto.ACTIVITY_SLOTS:
            return False
        return bool(self.view.busy[slot]) or (slot < proto.EXPECT_SLOTS and self.view.expect[slot].idle_ns != 0)

    def rhythm_ns(self, slot: int) -> int:
        """The idle spell a production process now expects to take at most as its rhythm:
        twice the shortest of its recent ones, or of its spells between steps where its
        shim knows them and a step's work is done (where its shim starts counting a pause,
        tgs_proto.h), from the expectation it wrote going idle; 0 where none stands (it
        runs, has not gone idle three times yet, or its slot has none). A read torn by the
        shim rewriting it is 0."""
        if slot >= proto.EXPECT_SLOTS:
            return 0
        e = self.view.expect[slot]
        until = e.due_until_ns
        rhythm = 2 * (e.due_ns - e.idle_ns) if until else 0
        return rhythm if e.due_until_ns == until and rhythm > 0 else 0

    def expect(self, slot: int, idle_ns: int, due_ns: int, due_until_ns: int) -> None:
        """Writes a production process's expectation as its shim does (benchmarks, tests)."""
        e = self.view.expect[slot]
        e.due_until_ns = 0
        self.view.step_spell_ns[slot] = 0  # (a process that knows no steps)
        e.idle_ns, e.due_ns, e.due_until_ns = idle_ns, due_ns, due_until_ns
        self.view.expect_slots = max(self.view.expect_slots, slot + 1)
