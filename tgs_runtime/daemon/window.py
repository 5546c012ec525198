"""What tgsd knows of production's progress on one GPU (ARCHITECTURE.md, "Compute
sharing"): the iteration starts its shims mark (`Mark`), one control period's counts
(`Sample`, with the `Overlap` the opportunistic shims saw), and the window of recent
samples that times production's progress from iteration start to iteration start, less
its pauses, and tells how noisy that is (`Window`). The controllers (controllers.py)
judge production by it. Pure logic: no clocks, no I/O."""
from __future__ import annotations

import bisect
import collections
import itertools
import math
from dataclasses import dataclass, field
from typing import Iterator


@dataclass(frozen=True)
class Mark:
    """The start of one of production's iterations, as its shim marked it."""
    source: str   # the production container
    t: float      # monotonic seconds
    blocks: int   # the container's production blocks launched before it
    paused_s: float = 0.0  # the container's pauses of its own before it (tgs_proto.h's mark_paused_ns)
    # the container's busy time before it (tgs_proto.h's mark_busy_ns; None: not known, as
    # for a container of several processes on the GPU), and its iteration starts so far
    busy_s: float | None = None
    number: int = 0


def unpaused_between(a: Mark, b: Mark) -> float:
    """The seconds from a container's mark `a` to its later mark `b`, less its pauses of
    its own that ended between."""
    return (b.t - a.t) - (b.paused_s - a.paused_s)


def busy_between(a: Mark, b: Mark) -> float | None:
    """A container's busy seconds from its mark `a` to its later mark `b`; None where its
    shims do not tell (older ones leave it 0) or no iteration started between."""
    if a.busy_s is None or b.busy_s is None or b.number <= a.number or b.busy_s <= a.busy_s:
        return None
    return b.busy_s - a.busy_s


@dataclass(frozen=True)
class Overlap:
    """What sharing did to production in a stretch (tgs_proto.h's busy_ns, gated_ns,
    overlap_ns): seconds production had unfinished work (the most of any one production
    container: two jobs' busy spells may coincide), seconds opportunistic launching threads
    waited behind it, and the part of those in which their own queued work still ran;
    over `span_s` seconds."""
    busy_s: float = 0.0
    gated_s: float = 0.0
    overlap_s: float = 0.0
    span_s: float = 0.0

    @property
    def watched(self) -> bool:
        """Opportunistic work waited behind production for most of the time production was
        busy, so little of its overlap with production went unseen (a job that waits for
        its own kernels, or is not GPU-bound, is not watching: its overlap is unknown)."""
        return self.busy_s > 0 and self.gated_s >= WATCHED * self.busy_s

    @property
    def per_s(self) -> float | None:
        """Seconds of opportunistic work beside production per second; None where it was
        not watched."""
        return self.overlap_s / self.span_s if self.watched and self.span_s > 0 else None


WATCHED = 0.8  # Overlap.watched: the part of production's busy time opportunistic work must have waited


@dataclass(frozen=True)
class Sample:
    t: float                   # monotonic seconds at the end of the period
    dt: float                  # the period's length
    production_blocks: int     # launched by production containers on the GPU in the period
    opportunistic_blocks: int  # launched by opportunistic containers
    production: bool           # a production container is attached to the GPU
    opportunistic: bool        # an opportunistic container is
    # the latest iteration start of each production container with processes, when all have one
    marks: tuple[Mark, ...] = ()
    # production's processes on the GPU (tgsd's ids of those with an activity slot): one
    # that starts or ends changes production's load, and the moment of the change is no
    # measure of sharing's harm
    production_processes: frozenset[int] = frozenset()
    overlap: Overlap = Overlap()  # in the period (its span is dt)
    # the longest idle spell production's processes now expect to take (twice the shortest
    # of their recent ones, or of their spells between steps: tgs_proto.h's expectations;
    # 0: none expected): within it, a job
    # that spends that long on its host every iteration is not idle (`FastController._idle_after`)
    production_rhythm_s: float = 0.0
    # the host's CPU time its hypervisor took in the period, seconds per CPU (`StolenTime`,
    # stolen.py): it slows every process on the host, production's too, with no sharing in it
    stolen_s: float = 0.0


@dataclass
class Sums:
    """A window's samples summed as they come and go (`Window.whole`): seconds covered,
    blocks launched, and their Overlap's parts."""
    dt: float = 0.0
    production: int = 0
    opportunistic: int = 0
    busy_s: float = 0.0
    gated_s: float = 0.0
    overlap_s: float = 0.0
    stolen_s: float = 0.0

    def add(self, s: Sample, sign: int = 1) -> None:
        self.dt += sign * s.dt
        self.production += sign * s.production_blocks
        self.opportunistic += sign * s.opportunistic_blocks
        self.busy_s += sign * s.overlap.busy_s
        self.gated_s += sign * s.overlap.gated_s
        self.overlap_s += sign * s.overlap.overlap_s
        self.stolen_s += sign * s.stolen_s


@dataclass
class Stretch:
    """The samples of a window from the first whose period began at or after `since`:
    seconds covered, blocks launched and CPU time stolen, summed (`Window.measure`,
    `Window.stolen`). Samples added since are
    added on in turn, so the sums stay those of a walk over the stretch from its start
    (the controller's boundaries have no tolerance, and sums taken in another order move
    them), until its first sample leaves the window."""
    since: float
    first: int  # the number of its first sample (`Window.dropped` counts them) ...
    end: int    # ... and of the sample after the last summed
    dt: float = 0.0
    production: float = 0.0
    opportunistic: float = 0.0
    stolen_s: float = 0.0


@dataclass
class Starts:
    """A container's iteration starts at or after `since`, as `Window._marks` found them
    walking the samples from number `first` to `end`: samples added since are walked on
    from there, until the first leaves the window."""
    since: float
    first: int
    end: int
    marks: list[Mark] = field(default_factory=list)


class Window:
    """The samples of the last `span` seconds. Production's progress over a stretch is
    timed from iteration start to iteration start when the shims mark them: each
    production container's blocks from its first start in the stretch to its last, over
    the time between, summed over the containers, when every container's starts span most
    of the stretch (exact, where counting a stretch's blocks is off by up to one iteration
    of each job: 2 % of a second of a 50 it/s job, far more of a PyTorch job's few
    iterations per second); otherwise it is the blocks counted over the stretch. Timed,
    the time between leaves out the container's pauses of its own that ended between (a
    data loader's stall: `Mark.paused_s`, tgs_proto.h): no opportunistic work slows a job
    that launches nothing, and counted in, a stall read as a fall of its progress, taken
    for harm or for a change of its load (in the controller rig, production pausing 0.1-0.4
    s every 1-5 s held opportunistic work at 0.40 of what the tolerance allows; 0.95 with
    the pauses left out). A container whose starts span less of the stretch times it too
    where the stretch begins and ends within one of its iterations of them (a job of a few
    iterations a second, or one every 0.8 s: counted, a 2 s stretch of it held two or three
    of them, off by a third).

    Where the controller has fixed a container's host spell (`spells`: seconds per
    iteration neither busy nor paused, measured with production alone: `host_spells`) and
    its marks carry its busy time, the time between is its busy time between plus that
    spell for each iteration between: harm lengthens production's busy time, not its time
    on its host, and a job whose host spells vary from one iteration to the next (0.5-3 s
    drawn within +-33 %) read each spell's noise as a fall or a rise of its progress,
    timed from start to start: cuts, and opportunistic work at 0.258 of what the tolerance
    allows in the controller rig."""
    TIMED_SPAN = 0.5  # each container's iteration starts must span this part of the stretch ...
    NOISE_ITERATIONS = 4  # a stretch's noise is told by this many of each container's iterations (`noise`)

    def __init__(self, span: float):
        self.span = span
        self.items: collections.deque[Sample] = collections.deque()
        # all of `items` summed as they come and go: the whole window's figures, which
        # tgsd's status shows every control period, without a walk over up to 1,000 samples
        self.whole = Sums()
        self.dropped = 0  # the samples that have left the window: items[i] is sample dropped + i
        # the latest stretch summed: a control step sums the same one (since its last change)
        # every period, and a walk over it was most of a step's work at a 10 ms period (up to
        # 2,100 samples in a 21 s window)
        self.stretch: Stretch | None = None
        self.starts: dict[str, Starts] = {}  # ... and the latest iteration starts found, by container
        self.quiet: float | None = None  # `quiet_s` of the samples as they stand (None: not walked yet)
        self.spells: dict[str, float] = {}  # each container's host spell per iteration, where fixed (above)

    def add(self, s: Sample) -> None:
        self.quiet = None
        self.items.append(s)
        self.whole.add(s)
        while self.items and self.items[0].t <= s.t - self.span:
            self.whole.add(self.items.popleft(), -1)
            self.dropped += 1

    def _first(self, since: float) -> int:
        """The index of the first sample whose period began at or after `since` (len(items):
        none). Samples come in time order, each period after the one before."""
        return bisect.bisect_left(self.items, since - 1e-9, key=lambda s: s.t - s.dt)

    def _after(self, since: float) -> Iterator[Sample]:
        """The samples whose period began at or after `since`."""
        return itertools.islice(self.items, self._first(since), None)

    def _walk_on(self, run: Stretch | Starts) -> Iterator[Sample]:
        """The samples `run` has not walked yet (all from its first, where it is new); it
        walks them now."""
        start, run.end = run.end - self.dropped, self.dropped + len(self.items)
        return itertools.islice(self.items, start, None)

    def _stretch(self, since: float) -> Stretch:
        """The samples whose period began at or after `since`, summed in turn: the latest
        stretch with those added since, where it is the same."""
        first = self.dropped + self._first(since)
        run = self.stretch
        if run is None or run.since != since or run.first != first:
            run = self.stretch = Stretch(since, first, first)
        dt, p, o, stolen = run.dt, run.production, run.opportunistic, run.stolen_s
        for s in self._walk_on(run):
            dt += s.dt
            p += s.production_blocks
            o += s.opportunistic_blocks
            stolen += s.stolen_s
        run.dt, run.production, run.opportunistic, run.stolen_s = dt, p, o, stolen
        return run

    def rates(self, since: float = float("-inf")) -> tuple[float, float, float]:
        """(production blocks/s, opportunistic blocks/s, seconds covered) after `since`
        (the whole window by default)."""
        return self.measure(since)[:3]

    def measure(self, since: float = float("-inf")) -> tuple[float, float, float, float | None]:
        """`rates`, and production's blocks/s timed from iteration start to iteration start
        (None where the stretch is counted: `_timed`)."""
        if since == float("-inf"):
            dt, p, o = self.whole.dt, self.whole.production, self.whole.opportunistic
        else:
            run = self._stretch(since)
            dt, p, o = run.dt, run.production, run.opportunistic
        if dt <= 1e-9:  # (none: the whole's sum may keep a rounding's trace)
            return 0.0, 0.0, 0.0, None
        timed = self._timed(since, dt)
        return (p / dt if timed is None else timed), o / dt, dt, timed

    def timed_rate(self, since: float, spells: dict[str, float] | None = None) -> float | None:
        """Production's blocks/s after `since`, timed from iteration start to iteration start;
        None where the stretch is counted instead (`_timed`). With `spells` (each
        container's host spell per iteration, as `spells` fixes them), timed by its busy
        time and those, where every container's marks carry its busy time and `spells` has
        its spell; else None."""
        covered = self._stretch(since).dt
        return self._timed(since, covered, spells) if covered > 0 else None

    def noise(self, since: float) -> float | None:
        """The standard error of production's progress after `since`, timed from iteration
        start to iteration start less its pauses (as a profile times it), as a part of it:
        each container's rate over its iterations is the ratio of their blocks to their
        time, and their spread around it tells that ratio's error (sqrt(sum (b_i - R t_i)^2
        / (n (n - 1))) over their mean time, for n iterations of b_i blocks in t_i s at R
        blocks/s); the containers' errors add up. None where a container marked fewer than
        NOISE_ITERATIONS iterations since (a job of long iterations: a profile holds one or
        two of them), or none marks. A job whose iterations differ (sequences of different
        lengths, a data loader that stalls now and then) is known only to this much by a
        profile of one second or so: its profiles differ by as much, whatever its load
        does."""
        latest = self._latest_marks()
        total = var = 0.0
        for source in (m.source for m in latest):
            marks = self._marks(source, since)
            n = len(marks) - 1
            if n < self.NOISE_ITERATIONS:
                return None
            steps = [(b.blocks - a.blocks, unpaused_between(a, b)) for a, b in itertools.pairwise(marks)]
            took = sum(d for _, d in steps)
            if any(d <= 0 for _, d in steps):
                return None
            rate = sum(b for b, _ in steps) / took
            total += rate
            var += sum((b - rate * d) ** 2 for b, d in steps) / (n * (n - 1)) / (took / n) ** 2
        return math.sqrt(var) / total if total > 0 else None

    def overlap(self, since: float = float("-inf")) -> Overlap:
        """The samples' Overlap after `since` (the whole window by default), summed, over
        the samples' length."""
        if since == float("-inf"):
            w = self.whole
            return Overlap(w.busy_s, w.gated_s, w.overlap_s, w.dt)
        seen = list(self._after(since))
        return Overlap(sum(s.overlap.busy_s for s in seen), sum(s.overlap.gated_s for s in seen),
                       sum(s.overlap.overlap_s for s in seen), sum(s.dt for s in seen))

    def stolen(self, since: float) -> float:
        """The part of the host's CPU time its hypervisor took over the samples after
        `since` (`Sample.stolen_s`; 0 where none is covered), from the sums `measure` keeps
        (the controller reads it over the stretch it measures: no walk every period)."""
        run = self.whole if since == float("-inf") else self._stretch(since)
        return run.stolen_s / run.dt if run.dt > 1e-9 else 0.0

    def _latest_marks(self) -> tuple[Mark, ...]:
        """The latest sample's marks: each production container's latest iteration start
        (none where no container marks its iterations)."""
        return self.items[-1].marks if self.items else ()

    def _marks(self, source: str, since: float) -> list[Mark]:
        """A container's iteration starts at or after `since`, each once (every sample
        carries the latest): those found at the last call for the same `since`, and those of
        the samples added since (`Starts`). A start is read in the control step after its
        sample's time was taken, so the first sample to carry one at or after `since` is at
        the latest the one before the first whose time is: the walk starts there."""
        first = self.dropped + max(0, bisect.bisect_left(self.items, since - 1e-9, key=lambda s: s.t) - 1)
        run = self.starts.get(source)
        if run is None or run.since != since or run.first != first:
            run = Starts(since, first, first)
            self.starts = {k: v for k, v in self.starts.items() if v.since == since} | {source: run}
        marks = run.marks
        last = marks[-1].t if marks else since - 1e-9  # (a start before it is left out, one not after the last taken too)
        for s in self._walk_on(run):
            for m in s.marks:
                if m.t >= last and m.source == source and (not marks or m.t > last):
                    marks.append(m)
                    last = m.t
        return list(marks)

    @staticmethod
    def _longest(marks: list[Mark]) -> float:
        """The longest of the iterations between the marks, less the pauses in it (0: none)."""
        return max((unpaused_between(a, b) for a, b in itertools.pairwise(marks)), default=0.0)

    def iteration_s(self) -> float:
        """The length of production's latest iteration: the longest of each container's
        between its last two marks (0: not known). Not the window's longest: one that
        spans a return from idle (or a new process, whose shim counts no pause before
        its eighth idle spell) is no iteration of the job, and is the latest only until
        its next mark."""
        latest = self._latest_marks()
        return max((self._longest(self._last_two(m)) for m in latest), default=0.0)

    def iteration_blocks(self) -> int | None:
        """The blocks of production's latest iteration, between its last two starts, where
        one container marks them (None where more do, or it has not marked two)."""
        latest = self._latest_marks()
        if len(latest) != 1:
            return None
        marks = self._last_two(latest[0])
        return marks[1].blocks - marks[0].blocks if len(marks) == 2 else None

    def _last_two(self, latest: Mark) -> list[Mark]:
        """A container's last two iteration starts in the window, its `latest` the last."""
        for s in reversed(self.items):
            for m in s.marks:
                if m.source == latest.source and m.t < latest.t:
                    return [m, latest]
        return [latest]

    def _timed(self, since: float, covered: float, spells: dict[str, float] | None = None) -> float | None:
        """The containers are those of the latest sample's marks (none: counted); one
        whose starts in the stretch do not span enough of it (a new job, an idle one)
        leaves the stretch counted. With `spells`, each is timed by its busy time and its
        spell there, or the stretch is not timed (None)."""
        latest = self._latest_marks()
        if not latest:
            return None
        end = self.items[-1].t
        total = 0.0
        for source in (m.source for m in latest):
            marks = self._marks(source, since)
            if len(marks) < 2:
                return None
            first, last = marks[0], marks[-1]
            span = last.t - first.t
            by_busy = self._by_busy(source, first, last, self.spells if spells is None else spells)
            if by_busy is None and spells is not None:
                return None
            active = unpaused_between(first, last) if by_busy is None else by_busy
            if last.blocks <= first.blocks or active <= 0:
                return None
            if by_busy is None and span < self.TIMED_SPAN * covered:  # ... or hold the stretch's ends within an iteration
                longest = self._longest(marks)
                if first.t - (end - covered) > longest or end - last.t > longest:
                    return None
            total += (last.blocks - first.blocks) / active
        return total

    def _by_busy(self, source: str, first: Mark, last: Mark, spells: dict[str, float]) -> float | None:
        """The seconds production's iterations from mark `first` to `last` took, timed by
        its busy time and its fixed spell each, where `spells` has the container's and its
        marks carry its busy time (else None: `_timed` takes the time between, less its
        pauses). Where they are, a stretch of any length is timed by two of its iteration
        starts: the host spells at its ends are of no account."""
        spell = spells.get(source)
        busy = busy_between(first, last) if spell is not None else None
        return None if busy is None else busy + (last.number - first.number) * spell

    def host_spells(self, since: float) -> dict[str, float]:
        """Each production container's seconds per iteration neither busy nor paused,
        from its first iteration start after `since` to its last, where its marks carry
        its busy time (those whose marks do not are left out)."""
        spells = {}
        for source in (m.source for m in self._latest_marks()):
            marks = self._marks(source, since)
            if len(marks) < 2:
                continue
            first, last = marks[0], marks[-1]
            busy = busy_between(first, last)
            if busy is not None:
                spells[source] = max(0.0, unpaused_between(first, last) - busy) / (last.number - first.number)
        return spells

    def second_start(self, since: float) -> float | None:
        """Where production is timed by its busy time (`spells`, and marks that carry it):
        the earliest of the second latest iteration starts at or after `since` of the
        containers it times so; None where one has not marked two since, or none is timed
        so."""
        latest = self._latest_marks()
        reach = None
        for source in (m.source for m in latest if m.source in self.spells and m.busy_s):
            marks = self._marks(source, since)
            if len(marks) < 2:
                return None
            if busy_between(marks[-2], marks[-1]) is not None:
                reach = marks[-2].t if reach is None else min(reach, marks[-2].t)
        return reach

    def marking(self, t: float) -> bool:
        """Whether production is still marking its iteration starts at `t`: each container's
        latest within twice its latest iteration (`iteration_s`)."""
        latest = self._latest_marks()
        if not latest:
            return False
        within = 2 * self.iteration_s()
        return all(t - m.t <= within for m in latest)

    def quiet_s(self) -> float:
        """Seconds at the end of the window in which production launched nothing and no
        busy spell of it ended (its shims found it idle: `Overlap.busy_s`, added when each
        ends); infinite where it launched nothing in any of it (at tgsd's start the window
        is shorter than the idle spell a decision needs). Counted from its last launch
        alone, a job that queues its iteration's kernels at once, 10 of 20 ms, was quiet
        for its burst as well as its spell, and its spells, drawn within +-33 % of 1 s,
        beyond its rhythm (twice the shortest, counted by its shims from the moment they
        found it idle) a fifth of the time: each return profiled as one from idle. Walked
        back once per sample added: a step asks whether production is idle, and while a
        long rhythm's profile waits for its return, when it is due back
        (`FastController._about_to_return`)."""
        if self.quiet is None:
            quiet = 0.0
            for s in reversed(self.items):
                if s.production_blocks or s.overlap.busy_s:
                    break
                quiet += s.dt
            else:
                quiet = math.inf
            self.quiet = quiet
        return self.quiet
