"""`tgs bench rig`: tgsd's `fast` controller in a model of production and harm, where
production's own load moves within one job (no idle moment, no process starting or ending
to tell): it falls, rises, waves or stalls while opportunistic work harms it; or it works
in bursts with its host between (its rhythm).

The model (`Rig`, also the unit tests' rig): production makes `solo` blocks/s alone; each
opportunistic block/s it runs costs production `harm` blocks/s, `lag` seconds later (work
queued before a cut still runs), up to 100,000 blocks/s. From a settled start (production
at 50,000 blocks/s alone, measured, opportunistic work beside it), its load moves and is
followed for 120 s in 10 s windows: production against its true solo progress, and
opportunistic work against what costs production exactly the tolerance ("allowed", at
most the rig's 100,000). Falls of 10, 30 and 50 % over 0-60 s, rises of 10, 30 and 50 %
over 0.1-30 s, waves of +-5-20 % with periods of 2-60 s, and stalls: pauses of its own
of 0.1, 0.25 and 0.4 s (a data loader's), about every 1, 2.5 and 5 s, at moments on no
control period's boundary, where opportunistic work is allowed the whole GPU, and
rhythms: iterations of 0.1, 0.2 and 0.4 s on the GPU and 0.3, 0.6, 0.7, 1, 1.5, 2, 3 and 4 s
on the host (a slow data loader, an environment's step), where opportunistic work is allowed the
one rate through both that costs production exactly the tolerance, and irregular rhythms:
0.2 s on the GPU and 0.5, 1, 1.5 or 3 s on the host, each spell drawn within +-7, 17 or
33 % of it (its shim expecting twice the shortest of its last eight spells; its marks carry
its busy time, the seconds its bursts took, so tgsd times it by that), and noisy loads:
each 0.1 s iteration's progress off the load's by a part drawn with a standard deviation
of 5, 10 or 15 % (iterations that differ: a 1 s profile is known to 1.6-4.7 %), where the
load holds (three draws of each) or rises or falls by 10 %, and steal: a shared VM's
hypervisor taking 5, 10 or 20 % of the CPU time for 2, 5 or 10 s in every 20, which slows
production alone by half as much (its true solo progress moves with it) while its
opportunistic shims watch it (`Steal`), run side by side with and without the rule that
takes a fall the stolen time explains for the machine's (`WithoutTheMachine`); each at
harm 0.01, 0.03 and 0.1 (full rate costs production 2, 6 and 20 %) and lag 0, 0.3 and 0.6
s. Production's shim marks an iteration start every 0.1 s while it runs, so tgsd times
its progress from them, as it times a job's that synchronises each iteration, and counts
its pauses, which tgsd leaves out of its progress; in its rhythm it marks each iteration's
start, and is measured in each window from its first to its last. Pure logic, no
GPU and no processes: the same figures on any machine, for changes of the controller
side by side with the code before."""
from __future__ import annotations

import bisect
import collections
import itertools
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from bench.common import Echo, Outputs, machine, table
from tgs_runtime.config import ControlConfig
from tgs_runtime.daemon.controllers import UNLIMITED, FastController
from tgs_runtime.daemon.window import Mark, Overlap, Sample

DT = 0.1
GAPS_TO_EXPECT = 3  # production's shim expects its spells once it has seen this many (libshim's TGS_GAPS_TO_EXPECT)


class Rig:
    """Production at `solo` blocks/s alone; opportunistic work costs production `harm`
    blocks/s per opportunistic block/s it runs, up to `capacity` blocks/s (or, where
    `harm_upto` is set, for its first `harm_upto` blocks/s only, and nothing more above:
    harm that a cut from above does not shrink, as of long kernels production waits behind
    however few there are), `lag_s` after it runs (work queued before a cut still runs),
    and the fraction `queue_harm` of its
    progress while it runs with more than one kernel in flight. An opportunistic job that
    needs `queue_need` kernels in flight to keep the GPU busy (host work between its
    launches) runs at bound / queue_need of its speed under a shallower bound (0: any bound
    keeps it busy, and a deeper one gains it nothing); a rate limit holds it to the rate
    where that is lower (the two do not compound), and it harms production by what it
    runs. Production pauses on its own for the part `pause` of each step (and throughout
    while `solo` is 0: idle), launching nothing then, and its shim counts the pauses
    (`paused_s`: by the step, where a shim counts each at the launch that ends it; the
    marks, taken only in steps where production runs, read the same). Production in its
    `rhythm` works in bursts instead, its host work between them no pause. Its progress in
    each step is off its mean by a part drawn with a standard deviation of `noise`
    (iterations that differ: sequences of different lengths; 0: none)."""

    def __init__(self, ctl, solo=50_000.0, harm=0.0, capacity=100_000.0, lag_s=0.0, queue_harm=0.0,
                 overlap: float | None = None, deep_harm=0.0, beside=0.0, deep_slow=0.0, queue_need=0,
                 marked=False, harm_upto=math.inf):
        self.ctl, self.solo, self.harm, self.capacity, self.t = ctl, solo, harm, capacity, 0.0
        self.queue_harm = queue_harm
        self.harm_upto = harm_upto
        self.deep_harm = deep_harm  # the fraction of its progress lost with more than four kernels in flight
        self.deep_slow = deep_slow  # the fraction of opportunistic progress lost likewise
        self.queue_need = queue_need
        self.opportunistic_done = 0.0  # opportunistic blocks so far
        # opportunistic shims that watch production (busy half the time) and see their work
        # beside it for the part of its progress it lost, times `overlap` (None: no shim
        # counts it, as before the counters)
        self.overlap = overlap
        self.beside = beside  # ... and, harm or not, this much of it beside production per second
        self.budget = None
        self.processes = frozenset({1})  # production's processes, as tgsd tells them
        self.queued = collections.deque([capacity] * round(lag_s / DT))  # opportunistic work still to hurt
        self.produced = 0.0  # production's blocks so far
        self.marked = marked  # production's shim marks an iteration start every DT (tgsd times its progress)
        self.pause = 0.0  # the part of each step production pauses on its own (a data loader's stall)
        self.paused_s = 0.0  # production's pauses so far, idle spells included (what its shim counts)
        self.mark: Mark | None = None  # production's latest iteration start
        self.rhythm: Rhythm | None = None  # production's iterations, where it works in bursts
        self.burst_left = 0.0  # ... the blocks left of the one under way (0: on its host)
        self.host_left = 0.0   # ... the seconds left of its host work
        self.iterations = 0
        self.busy_s = 0.0  # ... and the seconds its bursts have taken so far (its shim's busy time)
        self.spell_draws = random.Random(0)  # its host spells, drawn so where its rhythm has a spread ...
        self.spell_after: dict[int, float] = {}  # ... the one after each iteration's burst, by its number
        self.noise = 0.0  # (set with its draws' seed by `settled`)
        self.noise_draws = random.Random(0)  # (seeded: the same draws on any machine)
        self.stolen = 0.0  # the part of the host's CPU time its hypervisor takes (`Sample.stolen_s`)

    def _spell(self) -> float:
        """The host spell after a burst of its rhythm: `host_s`, or where the rhythm has a
        `spread`, drawn within it (`spell_after`)."""
        r = self.rhythm
        spell = r.host_s * self.spell_draws.uniform(1 - r.spread, 1 + r.spread) if r.spread else r.host_s
        self.spell_after[self.iterations] = spell
        return spell

    def _iterate(self, speed: float) -> tuple[float, float | None, float, float]:
        """Production's rhythm through the step ending now at `speed` blocks/s (harm
        lengthens its bursts): the part of the step it runs, when in the step the latest
        iteration started (None: none did), and the blocks and the seconds run of the step
        before that start."""
        rem, running, start, before, ran = DT, 0.0, None, 0.0, 0.0
        while rem > 1e-12:
            if self.burst_left > 0:
                spent = min(rem, self.burst_left / speed) if speed > 0 else rem
                self.burst_left -= speed * spent
                running += spent
                rem -= spent
                if self.burst_left <= 1e-9:
                    self.burst_left, self.host_left = 0.0, self._spell()
            elif self.host_left > 1e-12:
                spent = min(rem, self.host_left)
                self.host_left -= spent
                rem -= spent
            else:
                self.burst_left = self.solo * self.rhythm.busy_s
                if self.burst_left <= 0:
                    break
                start, before, ran = DT - rem, running * speed, running
                self.iterations += 1
        return running / DT, start, before, ran

    def run(self, seconds, production=True, opportunistic=True):
        for _ in range(round(seconds / DT)):
            self.t += DT
            b = self.budget
            rate = b.rate if b else UNLIMITED
            speed = self.capacity if opportunistic else 0.0  # what the job runs at under its in-flight bound
            if b and 0 < b.inflight < self.queue_need:
                speed *= b.inflight / self.queue_need
            deep = b is not None and (b.inflight > 4 or b.inflight == 0)
            if deep:
                speed *= 1 - self.deep_slow
            opp = min(speed, float(rate))  # the rate limit or the bound, whichever holds it back more
            self.queued.append(opp)
            hurts = self.queued.popleft()  # what ran lag_s ago (without production too: the lag stays lag_s)
            prod = max(0.0, self.solo - self.harm * min(hurts, self.harm_upto)) if production else 0.0
            if self.noise and prod:
                prod *= max(0.0, 1 + self.noise_draws.gauss(0.0, self.noise))
            if opp and b and b.inflight != 1:
                prod *= 1 - self.queue_harm
            if opp and deep:
                prod *= 1 - self.deep_harm
            started = None
            if self.rhythm and production:
                running, started, before, ran = self._iterate(prod)
                self.pause = 1 - running
            idle = not self.solo or self.pause >= 1
            seen = Overlap()
            if self.overlap is not None and production and opportunistic and not idle:
                lost = 1 - prod / self.solo  # (while it runs: harm, not its pause)
                busy = 0.5 * DT * (1 - self.pause)
                seen = Overlap(busy, busy, (self.overlap * lost + self.beside) * DT * (1 - self.pause))
            prod *= 1 - self.pause
            self.opportunistic_done += opp * DT
            self.produced += prod * DT
            # production's shim marks the first launch after an idle spell, and a job paused
            # on its host launches nothing: in a step without production's work tgsd reads
            # the mark before it again
            # (a job in its rhythm: its host spells are not pauses, and it marks each
            # iteration's start, expecting spells of up to twice its host work once it has
            # come back from GAPS_TO_EXPECT of them: twice the shortest of its last eight)
            self.paused_s += 0.0 if self.rhythm else DT if idle else self.pause * DT
            if not production:
                self.mark = None  # production that comes back is a new container, unmarked
            elif self.rhythm:
                if started is not None:
                    self.mark = Mark("production", self.t - DT + started, int(self.produced - prod * DT + before),
                                     self.paused_s, self.busy_s + ran, self.iterations)
                self.busy_s += running * DT
            elif self.marked and not idle:
                self.mark = Mark("production", self.t, int(self.produced), self.paused_s)
            marks = (self.mark,) if self.marked and production and self.mark else ()
            rhythm_s = 2 * min(itertools.islice(reversed(self.spell_after.values()), 8)) \
                if self.rhythm and self.iterations > GAPS_TO_EXPECT and self.spell_after else 0.0
            self.budget = self.ctl.step(Sample(self.t, DT, int(prod * DT), int(opp * DT), production, opportunistic,
                                               marks, production_processes=self.processes, overlap=seen,
                                               production_rhythm_s=rhythm_s, stolen_s=self.stolen * DT))
        return self.budget


SOLO = 50_000.0
TOLERANCE = ControlConfig().tolerance
WINDOW_S = 10.0
RUN_S = 120.0
HARMS = (0.01, 0.03, 0.1)
LAGS = (0.0, 0.3, 0.6)
Load = Callable[[float], float]  # production's solo progress at t s, a part of SOLO


def ramp(change: float, seconds: float) -> Load:
    return lambda t: 1 + change * (min(1.0, t / seconds) if seconds > 0 else 1.0)


def wave(amplitude: float, period: float) -> Load:
    return lambda t: 1 + amplitude * math.sin(2 * math.pi * t / period)


@dataclass(frozen=True)
class Pauses:
    """Production pausing on its own, where its load holds: the part of the step ending
    at t it pauses (`Rig.pause`)."""
    part: Callable[[float], float]

    def __call__(self, t: float) -> float:
        return self.part(t)


def stalls(length: float, every: float, seed: int) -> Pauses:
    """Production pausing on its own for `length` s (a data loader's stall, a log written
    synchronously), the next pause 0.5-1.5 times `every` s after one ends, at moments on
    no control period's boundary."""
    rnd = random.Random(seed)
    starts, at = [], rnd.uniform(0.0, every)
    while at < RUN_S + DT:
        starts.append(at)
        at += length + every * rnd.uniform(0.5, 1.5)

    def part(t: float) -> float:
        i = bisect.bisect_right(starts, t) - 1  # the latest pause to start before t
        paused = sum(max(0.0, min(t, a + length) - max(t - DT, a)) for a in starts[max(i - 1, 0):i + 1])
        return 1.0 if paused >= DT - 1e-9 else paused / DT

    return Pauses(part)


@dataclass(frozen=True)
class Noisy:
    """Production whose load follows `load`, each of its 0.1 s iterations off it by a part
    drawn with a standard deviation of `noise`, the draws seeded with `seed` (`Rig.noise`)."""
    load: Load
    noise: float
    seed: int

    def __call__(self, t: float) -> float:
        return self.load(t)


@dataclass(frozen=True)
class Rhythm:
    """Production whose every iteration is `busy_s` of work on the GPU (at its solo
    progress, longer where harm slows it) and then `host_s` on its host (a slow data
    loader, an environment's step): launching nothing, not idle (`Rig.rhythm`)."""
    busy_s: float
    host_s: float
    spread: float = 0.0  # each host spell drawn uniformly within host_s * (1 +- spread) (`Rig._spell`)

    def progress(self, solo: float) -> float:
        """Its blocks/s alone (over many iterations, where its spells vary)."""
        return solo * self.busy_s / (self.busy_s + self.host_s)

    def allowed(self, solo: float, harm: float, capacity: float) -> float:
        """The opportunistic rate (the same through its bursts and its host work, as
        tgsd's is) that lengthens its bursts enough to cost it exactly the tolerance."""
        stretch = ((self.busy_s + self.host_s) / (1 - TOLERANCE) - self.host_s) / self.busy_s
        return min(capacity, solo * (1 - 1 / stretch) / harm)


@dataclass(frozen=True)
class Steal:
    """A shared VM's hypervisor taking the part `stolen` of the host's CPU time for
    `burst_s` in every `every_s` (from half-way through the first), which slows production
    alone by SLOWS of that part (a job partly on its host; on the 2-core VM production's
    twin alone on simgpu fell 3-4 % with 0.09-0.10 of the CPU time stolen): its true solo
    progress is the slowed machine's (`Rig.stolen`). Its opportunistic shims watch it and
    see BESIDE s/s of their work beside it, harm or not (a poll's resolution), and what
    harm costs it besides."""
    stolen: float
    burst_s: float
    every_s: float = 20.0
    SLOWS = 0.5
    BESIDE = 0.01

    def at(self, t: float) -> float:
        """The part of the CPU time stolen in the period ending at t."""
        return self.stolen if (t - self.every_s / 2) % self.every_s < self.burst_s and t >= self.every_s / 2 else 0.0

    def __call__(self, t: float) -> float:
        return 1 - self.SLOWS * self.at(t)


WITHOUT = "steal, without the machine's rule"  # the steal group's loads under `WithoutTheMachine`


class WithoutTheMachine(FastController):
    """The `fast` controller without the rule that takes a fall the stolen time explains
    for the machine's (`FastController._the_machine_s`): the steal group's side by side."""
    def _the_machine_s(self, *args, **kw) -> str | None:
        return None


GROUPS: dict[str, list[tuple[str, Load | Pauses | Rhythm | Noisy | Steal]]] = {
    "falls": [(f"fall {c:.0%} over {s:g} s", ramp(-c, s)) for c in (0.1, 0.3, 0.5) for s in (0, 2, 5, 10, 30, 60)],
    "rises": [(f"rise {c:.0%} over {s:g} s", ramp(c, s)) for c in (0.1, 0.3, 0.5) for s in (0.1, 2, 8, 16, 30)],
    "waves": [(f"wave +-{a:.0%}, period {p:g} s", wave(a, p)) for a in (0.05, 0.1, 0.2) for p in (2, 6, 20, 60)],
    "stalls": [(f"stall {n:g} s every {e:g} s", stalls(n, e, seed)) for seed, (n, e) in
               enumerate(itertools.product((0.1, 0.25, 0.4), (1, 2.5, 5)))],
    "rhythms": [(f"{b:g} s on the GPU, {h:g} s on the host", Rhythm(b, h)) for b in (0.1, 0.2, 0.4)
                for h in (0.3, 0.6, 0.7, 1.0, 1.5, 2.0, 3.0, 4.0)],
    "irregular": [(f"0.2 s on the GPU, {h:g} s +-{sp:.0%} on the host", Rhythm(0.2, h, sp)) for h in (0.5, 1.0, 1.5, 3.0)
                  for sp in (0.07, 0.17, 0.33)],
    "noisy": [(f"steady, iterations +-{n:.0%} (draws {seed})", Noisy(ramp(0.0, 1.0), n, seed)) for n in (0.05, 0.1, 0.15)
              for seed in range(3)]
             + [(f"{name}, iterations +-10%", Noisy(load, 0.1, 0)) for name, load in
                (("rise 10% over 8 s", ramp(0.1, 8.0)), ("fall 10% over 10 s", ramp(-0.1, 10.0)))],
    "steal": [(f"{st:.0%} stolen {b:g} s in every 20 s", Steal(st, b)) for st in (0.05, 0.1, 0.2) for b in (2, 5, 10)],
}


@dataclass(frozen=True)
class Case:
    load: str
    harm: float
    lag_s: float
    production_worst: float  # the worst 10 s window, against production's true solo progress
    production_mean: float
    opportunistic_mean: float  # against what costs production exactly the tolerance
    opportunistic_worst: float

    @classmethod
    def of(cls, load: str, harm: float, lag_s: float, production: list[float], opportunistic: list[float]) -> "Case":
        """A case from its windows' figures."""
        return cls(load, harm, lag_s, round(min(production), 4), round(sum(production) / len(production), 4),
                   round(sum(opportunistic) / len(opportunistic), 3), round(min(opportunistic), 3))


def settled(harm: float, lag_s: float = 0.0, rhythm: Rhythm | None = None, noisy: Noisy | None = None,
            steal: Steal | None = None, controller: type[FastController] = FastController) -> Rig:
    """A rig sharing with a settled bound (no deeper trials): production (in its `rhythm`,
    where it has one) measured alone at SOLO, opportunistic work beside it for 50 s without
    harm; from now on each opportunistic block costs production `harm` blocks, `lag_s` late,
    and its iterations differ as `noisy` draws them, where given. Beside a hypervisor that
    `steal`s, the opportunistic shims watch production (`Steal`)."""
    watch = {} if steal is None else {"overlap": 1.0, "beside": Steal.BESIDE}
    r = Rig(controller(ControlConfig(inflight_deepest=2)), solo=SOLO, lag_s=lag_s, marked=True, **watch)
    r.rhythm = rhythm
    r.run(2, opportunistic=False)
    r.run(50)
    r.harm = harm
    if noisy is not None:
        r.noise, r.noise_draws = noisy.noise, random.Random(noisy.seed)
    return r


def run_case(name: str, load: Load | Pauses | Rhythm | Noisy | Steal, harm: float, lag_s: float,
             controller: type[FastController] = FastController) -> Case:
    if isinstance(load, Rhythm):
        return _run_rhythm(name, load, harm, lag_s)
    steal = load if isinstance(load, Steal) else None
    r = settled(harm, lag_s, noisy=load if isinstance(load, Noisy) else None, steal=steal, controller=controller)
    production, opportunistic = [], []
    p0, o0, solo, allowed = r.produced, r.opportunistic_done, 0.0, 0.0
    per_window = round(WINDOW_S / DT)
    for i in range(round(RUN_S / DT)):
        if isinstance(load, Pauses):
            r.pause = load((i + 1) * DT)
        else:
            r.solo = SOLO * load((i + 1) * DT)
        if steal is not None:
            r.stolen = steal.at((i + 1) * DT)
        r.run(DT)
        solo += r.solo * (1 - r.pause) * DT
        allowed += (r.pause * r.capacity + (1 - r.pause) * min(r.capacity, TOLERANCE * r.solo / harm)) * DT
        if (i + 1) % per_window == 0:
            production.append((r.produced - p0) / solo)
            opportunistic.append((r.opportunistic_done - o0) / allowed)
            p0, o0, solo, allowed = r.produced, r.opportunistic_done, 0.0, 0.0
    return Case.of(name, harm, lag_s, production, opportunistic)


def _run_rhythm(name: str, rhythm: Rhythm, harm: float, lag_s: float) -> Case:
    """A case of production in its rhythm: against its progress alone (in each window, from
    its first iteration start to its last: a count of its blocks is off by up to a burst;
    where its spells vary, alone over those iterations, their spells as drawn), and
    opportunistic work against the rate that costs it exactly the tolerance (where its
    spells vary, by their mean)."""
    r = settled(harm, lag_s, rhythm)
    production, opportunistic = [], []
    solo, allowed = rhythm.progress(SOLO), rhythm.allowed(SOLO, harm, r.capacity) * WINDOW_S
    for _ in range(round(RUN_S / WINDOW_S)):
        o0, starts = r.opportunistic_done, []
        for _ in range(round(WINDOW_S / DT)):
            r.run(DT)
            if r.mark is not None and (not starts or r.mark.t > starts[-1].t):
                starts.append(r.mark)
                if len(starts) == 1:
                    began = r.iterations  # (the first start's iteration)
        first, last = starts[0], starts[-1]
        if rhythm.spread:
            alone = sum(rhythm.busy_s + r.spell_after[i] for i in range(began, began + len(starts) - 1))
            solo = (len(starts) - 1) * rhythm.busy_s * SOLO / alone
        production.append((last.blocks - first.blocks) / (last.t - first.t) / solo)
        opportunistic.append((r.opportunistic_done - o0) / allowed)
    return Case.of(name, harm, lag_s, production, opportunistic)


def summary(cases: list[Case]) -> dict:
    n = len(cases)
    return {"cases": n,
            "production_mean": round(sum(c.production_mean for c in cases) / n, 4),
            "cases_with_a_window_under_0.94": sum(c.production_worst < 0.94 for c in cases),
            "cases_with_a_window_under_0.96": sum(c.production_worst < 0.96 for c in cases),
            "opportunistic_mean": round(sum(c.opportunistic_mean for c in cases) / n, 3),
            "cases_with_opportunistic_under_half_in_a_window": sum(c.opportunistic_worst < 0.5 for c in cases)}


def run(echo: Echo = print, quick: bool = False, json_path: Path | None = None) -> dict:
    harms, lags = ((0.1,), (0.0,)) if quick else (HARMS, LAGS)
    groups: dict[str, list[Case]] = {}
    runs: list[tuple[str, list, type[FastController]]] = []
    for group, loads in GROUPS.items():
        runs.append((group, loads, FastController))
        if group == "steal":  # side by side without the machine's rule
            runs.append((WITHOUT, loads, WithoutTheMachine))
    for group, loads, controller in runs:
        groups[group] = [run_case(name, load, harm, lag, controller) for (name, load), harm, lag in
                         itertools.product(loads, harms, lags)]
        echo(f"  {group}: {summary(groups[group])}")
    sums = {g: summary(cs) for g, cs in groups.items()}
    result = {"benchmark": "rig", "simulated": True, "machine": machine("none (the controller alone)"),
              "quick": quick, "harms": list(harms), "lags_s": list(lags), "summary": sums,
              "cases": {g: [asdict(c) for c in cs] for g, cs in groups.items()}}
    rows = [[g, s["cases"], f"{s['production_mean']:.4f}", s["cases_with_a_window_under_0.94"],
             s["cases_with_a_window_under_0.96"], f"{s['opportunistic_mean']:.3f}",
             s["cases_with_opportunistic_under_half_in_a_window"]] for g, s in sums.items()]
    worst = sorted((c for cs in groups.values() for c in cs), key=lambda c: c.production_worst)[:10]
    md = (f"### rig: the `fast` controller where production's own load moves (no GPU; "
          f"{result['machine']['date']}, commit {result['machine']['commit']})\n\n"
          + table(["loads", "cases", "production / solo", "a 10 s window < 0.94", "< 0.96",
                   "opportunistic / allowed", "opportunistic < half in a window"], rows)
          + "\n\nThe cases with the worst 10 s window of production:\n\n"
          + table(["load", "harm", "lag s", "production: worst window", "mean", "opportunistic / allowed"],
                  [[c.load, c.harm, c.lag_s, f"{c.production_worst:.3f}", f"{c.production_mean:.3f}",
                    f"{c.opportunistic_mean:.2f}"] for c in worst]))
    Outputs("rig", json_path).write(result, md, echo)
    return result
