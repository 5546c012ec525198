"""Splitting a GPU's opportunistic budget among its opportunistic containers
(ARCHITECTURE.md, "Compute sharing"): the controller (controllers.py) gives the GPU's
total, a sharing policy (`split`: `fair`, `las`) divides it, and behind production the
containers take turns at it (`take_turns`). Pure logic: no clocks, no I/O."""
from __future__ import annotations

from dataclasses import dataclass, field

from tgs_runtime.config import Share
from tgs_runtime.proto import RATE_UNLIMITED as UNLIMITED


@dataclass
class Claimant:
    id: str
    attained: int          # blocks it has launched, over its lifetime (LAS)
    achieved: float        # blocks/s over the last window
    budget: int = UNLIMITED  # what it was given last
    order: int = 0         # arrival order (tgs-paper serves the first)
    bound_wait: float = 0.0  # s/s its launching threads waited for its own kernels at the in-flight bound (smoothed)


@dataclass
class Turn:
    holder: str | None = None  # the container whose turn it is
    held_s: float = 0.0        # how long it has held it
    owed: dict[str, float] = field(default_factory=dict)  # seconds of turn each container is owed
    paused: set[str] = field(default_factory=set)  # waiting for their turn in the last period


@dataclass
class ShareState:
    las_leader: str | None = None
    underuse: dict[str, int] = field(default_factory=dict)  # periods in a row a container used < half its budget
    peak: float = 0.0        # the most opportunistic work the GPU has been seen to take, blocks/s
    turn: Turn = field(default_factory=Turn)

    def needs_less(self, cid: str) -> bool:
        """The container is known to use less than its share (for a second or more)."""
        return self.underuse.get(cid, 0) >= UNDERUSE_PERIODS


UNDERUSE_PERIODS = 10  # a container is known to need less after this many periods (about a second)
BOUND_WAIT_LIGHT = 0.05  # s/s: an unlimited share under an in-flight bound is used in part while its
                         # threads wait at the bound less than this (on simgpu, beside production busy
                         # half the time: a GPU-bound container 0.15-0.4, one busy 5 % of the time alone
                         # 0.00 under a bound of two, 0.01-0.03 under one, its two kernels a burst)
LIGHT_STAYS = 0.75     # and stays known so while it uses less than this part of what it is given
                       # (given twice what it uses, a growing job's part tends to 0.65; one that
                       # has reached its fair part uses all of it)
PEAK_DECAY = 0.999     # per period: what the GPU took long ago counts for less


def _observe(state: ShareState, claimants: list[Claimant], bounded: bool) -> None:
    """Counts the periods each container has used less than half of what it was given. An
    unlimited budget under an in-flight bound (`bounded`: behind production) is used in
    part while the container's threads do not wait at the bound: the GPU keeps up with
    all it launches. Judged by its blocks against the most the GPU has been seen to take
    opportunistic work, a GPU-bound container holding the turn behind a busy production
    used less than half (it gets what production leaves), and all of them were taken to
    need little (docs/results/history.md, the forty-fifth session). Without a bound an
    unlimited budget counts as that most. A container that waited for its turn is not
    judged on that period; one that held it is judged against its share, of which it then
    uses several times over if it can."""
    for c in claimants:
        if c.id in state.turn.paused:
            continue
        if c.budget == UNLIMITED and bounded:
            low = c.bound_wait < BOUND_WAIT_LIGHT
        else:
            given = state.peak if c.budget == UNLIMITED else c.budget
            low = given > 0 and c.achieved < (LIGHT_STAYS if state.needs_less(c.id) else 0.5) * given
        state.underuse[c.id] = state.underuse.get(c.id, 0) + 1 if low else 0
    for gone in set(state.underuse) - {c.id for c in claimants}:
        del state.underuse[gone]


def _demand_of(state: ShareState):
    """What a container could use: unlimited, unless it has used less than half of what it
    was given for a second (then twice what it uses, until it uses three quarters of
    that): a newcomer or a ramping job is never judged on its first moments."""
    def demand(c: Claimant) -> float:
        if state.needs_less(c.id):
            return c.achieved * 2.0 + 1.0
        return float("inf")
    return demand


def _water_fill(total: float, claimants: list[Claimant], floor: dict[str, float], _demand) -> dict[str, float]:
    """Equal shares, unused parts handed on; each starts from its floor."""
    out = dict(floor)
    left = total - sum(floor.values())
    active = [c for c in claimants]
    while active and left > 1e-6:
        each = left / len(active)
        still = []
        for c in active:
            room = _demand(c) - out[c.id]
            give = min(each, room)
            out[c.id] += give
            left -= give
            if room > each:
                still.append(c)
        if len(still) == len(active):
            break
        active = still
    return out


def split(policy: Share, total: int, claimants: list[Claimant], state: ShareState, min_share: float,
          one_only: bool = False, bounded: bool = False) -> dict[str, int]:
    """Each opportunistic container's rate. `one_only` (tgs-paper): the first gets it all.
    `bounded`: their launches are held to an in-flight bound (behind production)."""
    if not claimants:
        return {}
    if one_only:
        first = min(claimants, key=lambda c: c.order)
        return {c.id: (total if c is first else 0) for c in claimants}
    if total == 0:
        return {c.id: 0 for c in claimants}
    if len(claimants) == 1:
        return {claimants[0].id: total}
    state.peak = max(state.peak * PEAK_DECAY, sum(c.achieved for c in claimants))
    _observe(state, claimants, bounded)
    demand = _demand_of(state)
    if policy == Share.FAIR:
        if total == UNLIMITED:
            return {c.id: UNLIMITED for c in claimants}
        rates = _water_fill(float(total), claimants, {c.id: 0.0 for c in claimants}, demand)
        return {k: max(int(v), 1) for k, v in rates.items()}
    order = _las_order(state, claimants)
    if total == UNLIMITED:
        return _las_unlimited(order, state.peak, min_share, demand)
    floor = {c.id: min_share * total for c in claimants}
    rates = dict(floor)
    left = total - sum(floor.values())
    for c in order:
        give = min(left, max(demand(c) - rates[c.id], 0.0))
        rates[c.id] += give
        left -= give
    if left > 0:
        rates[order[0].id] += left
    return {k: max(int(v), 1) for k, v in rates.items()}


def _las_order(state: ShareState, claimants: list[Claimant]) -> list[Claimant]:
    """Least attained service first; the leader keeps its place on near-ties (no flapping)."""
    ranked = sorted(claimants, key=lambda c: c.attained)
    leader = ranked[0]
    current = next((c for c in claimants if c.id == state.las_leader), None)
    if current is not None and leader.attained >= 0.98 * current.attained:
        leader = current
    state.las_leader = leader.id
    return [leader] + [c for c in ranked if c is not leader]


def _las_unlimited(order: list[Claimant], seen: float, min_share: float, demand) -> dict[str, int]:
    """LAS while the GPU's opportunistic rate is unlimited: the leader runs unlimited, and so
    does each next one while those before it are known to leave part of the GPU unused; the
    rest get `min_share` of what the GPU has been seen to take. No finite total is guessed
    for the leader: a guess taken from use shrinks whenever use falls short of it (behind
    production's gate, for one), and the jobs then crawl."""
    if seen <= 0:
        return {c.id: UNLIMITED for c in order}
    floor = max(int(min_share * seen), 1)
    out, room = {}, seen
    for c in order:
        out[c.id] = UNLIMITED if room > 0 else floor
        room -= demand(c)
    return out


TURN_S = 0.2      # a turn lasts at least this long before the next container may take it
OWED_MAX_S = 1.0  # no container is owed (or owes) more than this


def take_turns(state: ShareState, shares: dict[str, int], total: int, dt: float) -> dict[str, int]:
    """While production is on the GPU, opportunistic containers launch in turns: one at a
    time, with the GPU's budget, so that production waits behind at most one container's
    in-flight bound however many there are (each container's own bound is per process:
    three containers launching at once put three kernels ahead of production, and the
    multi bench's production fell to 0.95 of its solo progress). Each container is owed
    turn time in proportion to its share (deficit round robin), so over a few turns the
    split is the policy's. A container known to use less than its share (see
    `_demand_of`) takes no turns: it launches beside the holder at its share, which turns
    would otherwise shrink to nothing. Returns the rates to write: the budget left after
    those for the holder, 0 for the others waiting; `shares` unchanged when fewer than
    two take turns."""
    t = state.turn
    light = {k for k in shares if state.needs_less(k)}
    weight = {k: (state.peak or 1.0) if v == UNLIMITED else float(v) for k, v in shares.items()
              if v > 0 and k not in light}
    for gone in set(t.owed) - set(weight):
        del t.owed[gone]
    if len(weight) < 2:
        state.turn = Turn()
        return shares
    whole = sum(weight.values())
    for k, w in weight.items():
        t.owed[k] = t.owed.get(k, 0.0) + dt * w / whole
    if t.holder in weight:
        t.owed[t.holder] -= dt
        t.held_s += dt
    for k in t.owed:
        t.owed[k] = min(max(t.owed[k], -OWED_MAX_S), OWED_MAX_S)
    most = max(weight, key=lambda k: t.owed[k])
    if t.holder not in weight or (t.held_s >= TURN_S - 1e-9 and t.owed[most] > t.owed[t.holder]):
        t.holder, t.held_s = most, 0.0
    t.paused = set(weight) - {t.holder}
    rest = total if total == UNLIMITED else max(total - sum(shares[k] for k in light), 1)
    return {k: rest if k == t.holder else 0 if k in t.paused else v for k, v in shares.items()}
