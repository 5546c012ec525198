"""Unified-memory residency on one GPU (ARCHITECTURE.md, "Memory sharing").

Production's footprint plus what opportunistic containers keep on the GPU must fit the
GPU's budget. When it would not, opportunistic ranges are evicted to host memory, the
largest first (fewest moves); when room returns (with a margin, so nothing flaps), they
are restored, the smallest first. Memory that cannot move (plain device allocations,
cuMemCreate) counts but is never chosen. Pure logic: the daemon sends the orders."""
from __future__ import annotations

from dataclasses import dataclass

from tgs_runtime.proto import OrderOp

MARGIN = 64 << 20  # restore only when this much would still be free afterwards


@dataclass
class Range:
    container: str
    gpu_slot: int
    ptr: int
    size: int
    evictable: bool
    evicted: bool = False
    pending: OrderOp | None = None  # an order sent and not yet acknowledged


@dataclass(frozen=True)
class Plan:
    evict: list[Range]
    restore: list[Range]
    over_by: int  # bytes over budget that no order can fix (0 when it fits)


def plan(budget: int, production_footprint: int, ranges: list[Range]) -> Plan:
    """What to move now. Ranges with an order in flight count where they are going."""
    def on_gpu(r: Range) -> bool:
        if r.pending == OrderOp.EVICT:
            return False
        if r.pending == OrderOp.RESTORE:
            return True
        return not r.evicted

    resident = sum(r.size for r in ranges if on_gpu(r))
    over = production_footprint + resident - budget
    if over > 0:
        chosen, freed = [], 0
        for r in sorted((r for r in ranges if r.evictable and on_gpu(r) and r.pending is None), key=lambda r: -r.size):
            if freed >= over:
                break
            chosen.append(r)
            freed += r.size
        return Plan(chosen, [], max(0, over - freed))
    room = -over - MARGIN
    restore = []
    for r in sorted((r for r in ranges if r.evicted and r.pending is None), key=lambda r: r.size):
        if r.size > room:
            break
        restore.append(r)
        room -= r.size
    return Plan([], restore, 0)
