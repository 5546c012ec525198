"""Unified-memory residency on one GPU (ARCHITECTURE.md, "Memory sharing").

Production's footprint plus what opportunistic containers keep on the GPU must fit the
GPU's budget. When it would not, opportunistic memory is evicted to host memory: only as
much as the excess (rounded up to PIECE), taken from the end of the range with the most
on the GPU, then the next. Evicted memory is read over the bus on every access, so moving
more than needed only slows the opportunistic job. When room returns (with a margin, so
nothing flaps) it is restored, the piece nearest the resident part first. Each range's
evicted part is its tail, [size - evicted, size), so an order is one contiguous
sub-range. Memory that cannot move (plain device allocations, cuMemCreate) counts but is
never chosen. Pure logic: the daemon sends the orders."""
from __future__ import annotations

from dataclasses import dataclass

from tgs_runtime.proto import OrderOp

MARGIN = 64 << 20  # restore only when this much would still be free afterwards
PIECE = 64 << 20   # orders move multiples of this (from the range's start), or up to its end


@dataclass
class Range:
    container: str
    gpu_slot: int
    ptr: int
    size: int
    evictable: bool
    evicted: int = 0                 # bytes of the tail on the host
    pending: "Move | None" = None    # an order sent and not yet acknowledged

    @property
    def resident(self) -> int:
        return self.size - self.evicted


@dataclass(frozen=True)
class Move:
    range: Range
    op: OrderOp
    offset: int  # from the range's start
    length: int

    @property
    def ptr(self) -> int:
        return self.range.ptr + self.offset

    @property
    def resident_after(self) -> int:
        """Bytes of the range on the GPU once this move is done."""
        return self.offset if self.op == OrderOp.EVICT else self.offset + self.length

    def acknowledged(self, ok: bool) -> None:
        """The shim answered: the range has no order in flight, and its part moved if `ok`."""
        r = self.range
        r.pending = None
        if ok:
            r.evicted = r.size - self.resident_after


@dataclass(frozen=True)
class Plan:
    moves: list[Move]
    over_by: int  # bytes over budget that no order can fix (0 when it fits)


def _on_gpu(r: Range) -> int:
    """Bytes of `r` on the GPU, counting an order in flight where it is going."""
    return r.resident if r.pending is None else r.pending.resident_after


def _down(x: int) -> int:
    return x // PIECE * PIECE


def plan(budget: int, production_footprint: int, ranges: list[Range]) -> Plan:
    """What to move now."""
    over = production_footprint + sum(_on_gpu(r) for r in ranges) - budget
    if over > 0:
        moves = []
        for r in sorted((r for r in ranges if r.evictable and r.pending is None and r.resident > 0),
                        key=lambda r: -r.resident):
            if over <= 0:
                break
            start = max(0, _down(r.resident - over))  # the new end of the resident part
            moves.append(Move(r, OrderOp.EVICT, start, r.resident - start))
            over -= r.resident - start
        return Plan(moves, max(0, over))
    room = -over - MARGIN
    moves = []
    for r in sorted((r for r in ranges if r.evicted and r.pending is None), key=lambda r: r.evicted):
        end = min(r.size, _down(r.resident + room)) if r.resident + room < r.size else r.size
        if end <= r.resident:
            break
        moves.append(Move(r, OrderOp.RESTORE, r.resident, end - r.resident))
        room -= end - r.resident
    return Plan(moves, 0)
