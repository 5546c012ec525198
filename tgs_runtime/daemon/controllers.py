"""Rate control, one controller per GPU (ARCHITECTURE.md, "Compute sharing").

Every control period the daemon feeds a controller one Sample (the thread blocks
production and opportunistic containers launched on the GPU in that period) and gets
the GPU's opportunistic budget back: a total rate in blocks per second, the in-flight
bound and whether opportunistic launches wait for production. A sharing policy then
splits the total among the GPU's opportunistic containers, and behind production they
take turns at it (sharing.py). Pure logic: no clocks, no I/O.

- `fast` (the default): without production on the GPU, opportunistic work has no limit, no
  gate and no in-flight bound. Production's solo progress S comes from periods when it runs alone,
  or from a short profile (opportunistic paused, <= 1 s; a job on its host for seconds
  every iteration is profiled over one or two of them, and opportunistic work runs while
  it is on its host: `_on_its_host`). Progress is timed from iteration
  start to iteration start where the shim marks them, less production's pauses of its own
  (see `Window`, window.py), else counted, which knows S only to about one iteration; the periodic
  profiles of one run of production are
  averaged (the last 8, while they agree within 10 %; a load change, an idle spell, an
  accepted fall or production measured alone starts afresh), but for one above S by more
  than the tolerance: a rise of production's own that the harm it takes hides from P,
  followed as below. Opportunistic
  work starts unthrottled (the shims' gating already keeps it out of production's way);
  when production's progress P falls below (1 - tolerance) * S, the rate is cut
  multiplicatively (by 30 %, deeper after a deeper fall:
  `_cut`) and then ramped back while P holds (1.4-fold, or short of 0.8 of the tolerance
  where harm grows with the rate, and after 10 s held there 1.4-fold again: `_step_up`; the
  limit goes at once when opportunistic work uses less than half of it: it holds nothing
  back; the shim spends a launch's tokens once, however long production makes it wait, so
  a rate left unused is one the job does not need). P is judged over 1-2 s; but a
  marginal violation (P above (1 - 2 * tolerance) * S) that would start cutting counts
  only when 2.5-3 s of data show it: counted, a second's progress is known only to about
  one iteration, and sharing's own small cost (production waiting behind one
  opportunistic kernel) can sit just inside the tolerance, so a short window takes noise
  for harm (the isolation bench's 75 % duty lost a fifth of its idle time to
  that). Production's own load growing (P above S by 10 % for half a second) or falling
  (cuts that do not bring P back) triggers a new profile, unless the shims tell (below);
  so does P timed above S by the tolerance for 2.5-3 s and half a second more (beside
  work that costs it, the figure is low: a rise the harm hides), once per figure (`_rose`).
  Production launching nothing for half a second (or, where its shims expect longer spells every iteration, up to 8.5 s:
  its rhythm, `_idle_after`) lifts the limit at once and brings back the configured in-flight bound
  (and ends a profile under way, which measured nothing), and its return is profiled (it
  may be a new job);
  one attached beside opportunistic work before its first launch is idle from the start.
  Production alone that idles keeps the figure it launched at, and launching again is
  measured from its return (a figure over a window holding the idle spell was a fraction
  of its progress); opportunistic work arriving before a second of that profiles it, and
  arriving while it idles pauses nothing until it launches (its return is profiled). A
  pair that ends takes the rate it was cut to, its run of violations and its in-flight
  bound with it: the next starts unlimited, afresh.
  A production process that starts or ends (a new job; tgsd tells) restarts the
  measurement: the moment of the change, when production does less, is not taken for harm;
  a second after it, progress outside [1 - tolerance, 1.1] times the solo figure says the
  load changed with no idle moment to tell (one of two production jobs ended, a lighter or
  heavier job took over, jobs starting together were profiled unsettled), and production is
  profiled at once, from no rate limit. The first violation eases the in-flight bound
  instead (and cuts the rate too when P fell more than four tolerances): back from a
  deeper trial to the bound production held, else down to one kernel; where production
  holds with no rate limit the bound is tried again, and tried deeper (`InflightBound`,
  inflight.py; a change of load, job or pair starts afresh from the configured bound);
  if two cuts still do not help soon after a profile (one, whose effect
  may not show within a second, proves nothing even against a large fall), and none of
  the run's decisions found them helping, production's
  present progress is taken as its solo progress and the rate and the in-flight bound go
  back to where they were. Where the opportunistic shims watched production (waited
  behind it for most of its busy time) and saw their own work beside it for under a
  quarter of the change (`Overlap`), a fall is taken as production's own at once, at any
  violation before the run's first cut (its start may be too small to tell) and not under a
  deeper in-flight trial (a fall there is the trial's cost), nothing cut (falls so taken
  one within 3 s of another are one fall, judged from the figure before the first,
  unless a profile or a production process starting or ending comes between),
  and a rise of 10 % likewise, raised by that overlap (what sharing may hide), unprofiled;
  a profile that finds production alone above such a figure by more than the tolerance
  ends that for the load. A fall no deeper than the part of the host's CPU time its
  hypervisor took over the window (`Sample.stolen_s`) beyond what it took while the figure
  was measured, with what the shims saw beside production under half of it, is the
  machine's: nothing is done, for 15 s at most against one figure (`_the_machine_s`). If
  cuts that help a little have taken the rate to a tenth of what opportunistic work ran at
  and production is still below, production is profiled once more (a check, again at each
  further tenth: the rate stays where the cuts left it, and little opportunistic work is
  queued to slow the profile down); a profile below the figure by more than half the
  tolerance replaces it (its own load fell slowly within one job). Without the check a
  figure it could no longer reach starved opportunistic work for good. A figure taken from
  a load that was moving (so replaced, or taken after two cuts that brought nothing back)
  is followed: profiled again 5 s later, and replaced again while it moves on the same
  way, or where it is found above by the tolerance (`_followed`); once it settles, the
  periodic profile comes sooner, 10, 20 and 40 s later, then every reprofile_s. Decisions
  every 0.5 s on windows of up to 3 s: it reacts in seconds. A job of long iterations
  (over half a second) is judged on two of them, and profiled until two of its
  iteration starts time it (`_profiled_enough`); where its rhythm is over 1.5 s (more than 0.75 s on its host
  every iteration), the window grows to 10 s, or 2.5 rhythms (about 21 s at most), to hold
  them (`_span`), and its periodic profile waits until it is due back from its host
  (`_about_to_return`, for up to a window), to last one of its iterations. There, a first
  violation the shims cannot tell (below) whose latest iteration did less work (blocks)
  than the one the figure was profiled over, by enough to explain the fall, is
  production's own load falling (harm lengthens an iteration, not its work): profiled at
  once, not cut (`_less_work`).
- `tgs-paper` reproduces the original TGS code's controller for comparison: 5 s samples,
  a profile sample with the opportunistic job paused, slow start (x1.5 per sample), then
  additive increase, 8 % decrease when production falls more than 3 % below its solo
  progress; no gating, no in-flight bound; one opportunistic job per GPU.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from tgs_runtime.config import ControlConfig, Controller
from tgs_runtime.daemon.inflight import InflightBound, Move
from tgs_runtime.daemon.window import Overlap, Sample, Window
from tgs_runtime.proto import RATE_UNLIMITED

UNLIMITED = RATE_UNLIMITED
MACHINE_WHY = "the machine's slowness, not sharing's harm"  # the decision log's words for `_the_machine_s`


@dataclass(frozen=True)
class Budget:
    rate: int       # total opportunistic blocks/s on the GPU; UNLIMITED; 0 pauses
    inflight: int   # per process; 0 = unbounded
    gate: bool      # opportunistic launches wait while production has unfinished work
    state: str
    solo: float | None       # production's solo progress estimate, blocks/s
    overlap: float | None = None  # opportunistic work beside production, seconds per second
                                  # over the last window (None: not watched; `Overlap.watched`)
    why: str = ""  # what the latest change of the budget answered (tgsd's decision log)


@dataclass
class Violations:
    """A run of violations: decisions in a row that found production below its figure by
    more than the tolerance (`FastController._fell`); a decision that finds it holding, a
    profile's end, an idle spell or a turnover ends it."""
    start_p: float      # production's progress at its first violation
    check_below: float  # the solo figure is checked when cuts take the rate below this
    best_p: float = 0.0  # the highest progress of its violations
    count: int = 0
    cuts: int = 0       # rate cuts made in it


@dataclass(frozen=True)
class OwnFalls:
    """A run of falls taken as production's own (`FastController._fallen_from`)."""
    before: float  # the solo figure before the first of them
    latest_at: float  # when the latest was taken


@dataclass(frozen=True)
class Profiled:
    """A profile of production's present load: its progress alone, blocks/s, and each
    container's host spell per iteration that it measured (`Window.host_spells`)."""
    rate: float
    spells: dict[str, float]


@dataclass(frozen=True)
class Turnover:
    """A production process started or ended (`FastController.step`): the load after it is
    judged a second later."""
    at: float
    figure_before: float | None  # the solo figure before it (None: judged against the figure then)


class Phase(str, enum.Enum):
    FREE = "free"          # no production on the GPU: opportunistic work takes it all
    SOLO = "solo"          # production alone: its progress is its solo progress
    PROFILE = "profile"    # opportunistic paused to measure production alone (but `host_spell`)
    RUN = "run"            # sharing


class Purpose(str, enum.Enum):
    """What a profile is for, which says what its end does with the figure."""
    MEASURE = "measure"  # production's solo progress: replaces the figure, or averages with those of its load
    CHECK = "check"      # a lasting violation that cuts eased: replaces the figure if below it (`_checked`)
    FOLLOW = "follow"    # a load that was moving: replaces the figure if it moved on (`_followed`)
    PERIODIC = "periodic"  # every reprofile_after of one load: replaces the figure if above it by the tolerance


class FastController:
    DECIDE_S = 0.5     # between decisions
    WINDOW_S = 3.0     # the longest window a decision looks at (a marginal violation's; but `_span`)
    QUICK_S = 2.0      # the window of every other decision
    MIN_DATA_S = 1.0   # a decision needs this much data since the last change
    CONFIRM_S = 2.5    # a marginal violation needs this much
    SETTLE_S = 0.15    # after a change, this much is not measured
    CUT = 0.7          # multiplicative decrease on a violation (the most it keeps) ...
    CUT_MIN = 0.25     # ... and the least: a deeper fall is cut deeper (`_cut`)
    RAMP = 1.4         # multiplicative increase while production holds ...
    AIM = 0.8          # ... by less where that would take its shortfall past this part of the tolerance
    STEP_MIN = 1.05    # a smaller raise is none: the rate holds where it is ...
    HOLD_S = 10.0      # ... for this long, and then is raised RAMP-fold again (`_step_up`)
    LOAD_CHANGE = 0.10 # production's own load moved by this much: profile again
    ACCEPT_AFTER_PROFILE_S = 15.0  # cuts that do not help this soon after a profile, far below: accept P
    FAR_BELOW = 4      # tolerances: a fall deeper than this is more than waiting behind a kernel explains
    CHECK_PART = 0.1   # cuts down to this part of opportunistic work's rate leave production below: check S
    IDLE_S = 0.5       # production quiet this long (`Window.quiet_s`): it is idle, opportunistic takes all ...
    RHYTHM_MAX_S = 8.5  # ... or, within its rhythm up to this (`_idle_after`), that long: host spells of up
                        # to 4 s (a spell is timed from its process found idle to its next launch, a
                        # little over its host time: a job sleeping 4 s read a rhythm just over 8 s)
    LONG_WINDOW_S = 10.0  # the window while a rhythm over half WINDOW_S stands in it (`_span`) ...
    WINDOW_RHYTHMS = 2.5  # ... or this many times the rhythm, where longer
    TURNOVER_S = 1.0   # a production process started or ended: its load is judged this long after
    PROFILES_KEPT = 8  # the solo figure is the mean of the last profiles of one load
    FOLLOW_S = 5.0     # a figure taken from a load that was moving is measured again this much later
    FOLLOW_MOVE = 0.5  # a followed or checked load moved: its profile is off the figure by more than this part
                       # of the tolerance (the periodic profile: the whole tolerance) ...
    NOISE_Z = 2.0      # ... and by more than this many standard errors of the two (`_followed`)
    OWN_FALL_PART = 0.25          # overlap below this part of a fall: the fall is production's own
    MACHINE_FALL_PART = 0.5       # ... below this, with as much more of the CPU time stolen: the machine's (`_the_machine_s`) ...
    MACHINE_HOLD_S = 15.0         # ... for this long at most against one figure, from the first such fall
    FREE_WHY = "no production on the GPU"  # why it is free: where it starts, and where production leaves

    def __init__(self, cfg: ControlConfig):
        self.cfg = cfg
        self.window = Window(self.WINDOW_S)
        self.phase = Phase.FREE
        self.changed_at = float("-inf")
        # the part of the host's CPU time stolen while the solo figure was measured, and the
        # first fall taken as the machine's against it (`solo`, `_the_machine_s`)
        self.figure_stolen = 0.0
        self.machine_since: float | None = None
        self.solo = None
        self.profiles: list[Profiled] = []  # of production's present load
        self.rate = UNLIMITED
        self.rate_good = UNLIMITED
        self.decided_at = float("-inf")
        self.profile_from = 0.0
        self.profile_first: float | None = None  # the profile under way was extended: its first part's figure
        self.violations: Violations | None = None  # the run of violations under way, if any
        self.purpose = Purpose.MEASURE  # of the profile under way
        self.follow_at: float | None = None  # profile then: the figure was taken while the load moved
        self.follow_sign = 0  # the way the followed load last moved (1 up, -1 down; 0: not followed)
        self.drift_since: float | None = None
        self.profiled_at = float("-inf")
        self.reprofile_after = cfg.reprofile_s  # the periodic profile comes this long after the last (`_followed`)
        self.bound = InflightBound(cfg.inflight, cfg.inflight_deepest)
        self.idle = False  # production attached but launching nothing
        self.processes: frozenset[int] = frozenset()  # production's, as of the last sample
        self.turnover: Turnover | None = None  # the load after it is still to be judged
        self.resume_at: int | None = None  # the rate two fruitless cuts left, for the profile they called (`_fell`)
        self.own_figure: float | None = None  # a solo figure taken from a change seen as production's own
        self.own_falls: OwnFalls | None = None  # the run of falls taken as production's own, if any
        self.overlap_trusted = True  # no profile of this load has caught the overlap signal out
        self.why = self.FREE_WHY  # what the latest change answered (it starts free)
        self.long_rhythm_at = float("-inf")  # the latest sample of a rhythm that grows the window (`_span`) ...
        self.long_span = self.LONG_WINDOW_S  # ... and the window it grew to
        self.rise_checked = False  # a rise under LOAD_CHANGE was profiled against this figure (`_rose`)
        # the figure a profile left, and the blocks of production's latest iteration in it (`_less_work`)
        self.figure_work: tuple[float, int] | None = None
        # production of a long rhythm is on its host in the profile under way, not due back
        # within a decision: opportunistic work runs at the rate meanwhile (`_on_its_host`)
        self.host_spell = False
        self.machine_fall = False  # the latest decision found production's fall the machine's (`_the_machine_s`)

    @property
    def solo(self) -> float | None:
        """Production's solo progress, blocks/s (None: not known)."""
        return self._solo

    @solo.setter
    def solo(self, figure: float | None) -> None:
        """A new figure (a profile's, production's alone, a change taken as its own): it
        notes the part of the host's CPU time stolen over the stretch it was measured on
        (since the last change), which a fall must be explained by more than, and it has
        MACHINE_HOLD_S of falls to take for the machine's (`_the_machine_s`)."""
        self._solo = figure
        self.figure_stolen = self.window.stolen(self.changed_at + self.SETTLE_S)
        self.machine_since = None

    def _change(self, t: float, why: str, phase: Phase | None = None, rate: int | None = None) -> None:
        if phase is not None:
            self.phase = phase
            if phase is not Phase.RUN:
                # production's progress alone is timed from start to start (a profile, or
                # production alone: the figure and the host spells it sets, `_profiled`)
                self.window.spells = {}
        if rate is not None:
            self.rate = rate
        self.changed_at = t
        self.why = why
        self.machine_fall = False

    def _of_solo(self, p: float) -> str:
        return f"production at {p / self.solo:.3f} of its solo progress" if self.solo else f"production at {p:,.0f} blocks/s"

    def _not_own(self, p: float, solo: float, seen: Overlap) -> str | None:
        """Why a change of production's progress from solo to p (a fall or a rise) is not
        known to be its own, for the decision log; None where it is: opportunistic work
        watched production (`Overlap.watched`) and overlapped it for less than
        OWN_FALL_PART of the change (a second of production delayed behind or beside
        opportunistic work costs it at most that second), and the signal has not been
        caught out for this load (a profile that found production alone above a figure it
        set)."""
        if not self.overlap_trusted:
            return "the overlap signal was caught out for this load"
        if solo <= 0:
            return "no solo figure to judge against"
        if seen.per_s is None:
            waited = f"{seen.gated_s / seen.busy_s:.2f}" if seen.busy_s > 0 else "none"
            return f"opportunistic work not watching (waited behind production for {waited} of its busy time)"
        bar = self.OWN_FALL_PART * abs(1 - p / solo)
        if seen.per_s < bar:
            return None
        return f"opportunistic work beside it {seen.per_s:.4f} s/s (under {bar:.4f} the change would be its own)"

    def _the_machine_s(self, t: float, p: float, solo: float, seen: Overlap, judged_from: float) -> str | None:
        """Why production's fall from solo to p is the machine's, for the decision log; None
        where it is not known to be: the part of the host's CPU time its hypervisor took
        since `judged_from` (`Window.stolen`) is above the part it took while the figure
        was measured (`figure_stolen`: a figure measured on a slowed machine has the
        slowness in it) by at least the fall, and opportunistic work watched production
        and ran beside it for under MACHINE_FALL_PART of the fall (a second beside
        production costs it at most that second: sharing explains under half of it), the
        overlap signal not caught out for this load; and the first fall so taken against
        this figure came under MACHINE_HOLD_S ago. A hypervisor that steals for longer has
        set the machine's speed, and the fall is judged as any other (cuts that bring
        nothing back profile production alone, at that speed); harm the shims do not see
        (through the bus or the caches), or see only in part, taken for the machine's
        meanwhile, is answered then."""
        fall = 1 - p / solo if solo > 0 else 0.0
        stolen = self.window.stolen(judged_from)
        if fall <= 0 or stolen - self.figure_stolen < fall or not self.overlap_trusted:
            return None
        if self.machine_since is not None and t - self.machine_since > self.MACHINE_HOLD_S:
            return None
        if seen.per_s is None or seen.per_s >= self.MACHINE_FALL_PART * fall:
            return None
        return (f"{self._of_solo(p)} with {stolen:.3f} of the host's CPU time stolen by its hypervisor "
                f"({self.figure_stolen:.3f} while its figure was measured) and {seen.per_s:.4f} s/s of "
                f"opportunistic work beside it: {MACHINE_WHY}; nothing changed")

    def _fallen_from(self, t: float, solo: float) -> float:
        """The figure a fall is judged from, for whether it is production's own (`_not_own`):
        the figure before the run of falls taken as its own, where the latest of them came
        within WINDOW_S, else `solo`. A fall that comes in steps is one fall: judged step by
        step, each bar (a quarter of the step) is below the little the shims see beside
        production anyway, and the step after one taken as production's own was taken for
        harm (the dynamics benchmark's pair phase: two production jobs' bursts falling
        together took the pair from 104,236 to 92,327 blocks/s in two steps taken as its
        own, the third, to 0.961 of that, with 0.0104 s/s seen beside it against a bar of
        0.0099, eased the in-flight bound to one kernel for the 10 s to its retry, and
        opportunistic work missed its 0.8 of the idle time by 10 s)."""
        run = self.own_falls
        return run.before if run is not None and t - run.latest_at <= self.WINDOW_S + 1e-9 else solo

    def _budget(self) -> Budget:
        """Without production on the GPU, opportunistic work has no limit at all: not even the
        in-flight bound, which keeps a launching thread waiting for its own kernels (a
        PyTorch job alone on an H100 ran at 0.742 of its speed under the default bound,
        0.990 without it). A production container attaches when it is created, seconds
        before its first kernel: what was queued meanwhile has run by then."""
        if self.phase == Phase.PROFILE:
            rate = self.rate if self.host_spell else 0
        else:
            rate = UNLIMITED if self.phase in (Phase.FREE, Phase.SOLO) else self.rate
        inflight = 0 if self.phase == Phase.FREE else self.bound.kernels
        return Budget(rate, inflight, self.phase != Phase.FREE, self.phase.value, self.solo,
                      self.window.overlap().per_s, self.why)

    @property
    def progress(self) -> float:
        """Production's progress over the window, blocks/s, for tgsd's status and decision
        log: computed when they read it (a walk over the window's iteration starts, half of
        a control step's work at a 10 ms period where it was computed every step)."""
        return self.window.rates()[0]

    def _profile(self, t: float, why: str, same_load: bool = False, purpose: Purpose = Purpose.MEASURE,
                 way: int = 0, resume_at: int | None = None) -> None:
        """Pauses opportunistic work to measure production alone. Only a profile of the same
        load (`same_load`: the periodic one, a check, a follow-up) or one that a fall called
        for (FOLLOW, `way` -1) keeps the earlier ones to average with: any other comes after
        a change (a new pair, a return from idle, a load change), and the load after it
        starts from the configured in-flight bound, as from
        no rate limit: a bound of one, taken against the last load's harm, costs
        opportunistic work the moments between one of its kernels ending and the next being
        launched (a fifth of the idle time beside 75 % duty on simgpu,
        docs/results/history.md, dynamics). A FOLLOW profile of a load that just moved
        gives the way it moved (`way`: 1 up, -1 down), which `_followed` follows; one that
        two fruitless cuts called for gives the rate they left (`resume_at`, `_fell`). The
        end of one that a fall called for (`_followed`) replaces the figure's profiles where
        the load fell, and averages it with them where it finds the load where it was:
        started afresh, the figure that two fruitless cuts of a job whose profiles differ by
        3 % (its iterations by 10 %) called for rested on one profile, in the controller rig
        one 2.8 % low for a minute, and production was held to 0.943 of its solo progress."""
        self.resume_at = resume_at
        if not same_load:
            if not (purpose is Purpose.FOLLOW and way < 0):
                self.profiles = []
            self._unfollow()  # a new load
            self.bound.restore()
            self.own_figure, self.overlap_trusted = None, True
            if self.turnover is not None:
                if t - self.turnover.at >= self.TURNOVER_S - 1e-9:
                    self.turnover = None  # the load after a turnover is measured now (sooner: its start)
                else:  # it is judged against what this measures
                    self.turnover = Turnover(self.turnover.at, None)
        self.own_falls = None  # a fall after it is judged from what it measures
        self.purpose = purpose
        if way:
            self.follow_sign = way
        self.follow_at = None  # this profile measures the load now
        self.host_spell = False
        self.profile_from = t
        self.profile_first = None
        self.profiled_at = t
        self._change(t, f"{why}: profiling production alone", Phase.PROFILE)

    def _unfollow(self) -> None:
        """A load measured afresh (a new one, production alone, or none): nothing of an
        earlier load is followed, and the periodic profile is reprofile_s away."""
        self.follow_at, self.follow_sign = None, 0
        self.reprofile_after = self.cfg.reprofile_s
        self.rise_checked = False

    def _profiled(self, p: float) -> bool:
        """A profile knows production's solo progress only to about one of its iterations;
        profiles of the same load (within LOAD_CHANGE of their mean) are averaged; returns
        whether this one was (else it is the figure of a new load). Their mean is the
        harmonic one: production's progress over their iterations put together, which the
        mean of their host spells times (`_mean_spells`, `Window.spells`). One that
        finds production alone above a figure taken from a change seen as its own by more
        than the tolerance catches the overlap signal out: for this load, changes are judged
        without it (falls by cuts, as where opportunistic work does not watch; rises by a
        profile)."""
        if self.own_figure is not None and p > (1 + self.cfg.tolerance) * self.own_figure:
            self.overlap_trusted = False
        self.own_figure = None
        mean = _harmonic([x.rate for x in self.profiles]) if self.profiles else None
        same = mean is not None and abs(p - mean) <= self.LOAD_CHANGE * mean
        spells = self.window.host_spells(self.changed_at + self.SETTLE_S)
        self.profiles = (self.profiles[-(self.PROFILES_KEPT - 1):] if same else []) + [Profiled(p, spells)]
        self.rise_checked = self.rise_checked and same
        self.solo = _harmonic([x.rate for x in self.profiles])
        self.window.spells = _mean_spells(self.profiles)
        self._note_work()
        return same

    def _followed(self, t: float, p: float, bar: float, way: int, since: float | None = None) -> str:
        """The end of a profile that may find production's load moving within one job,
        where nothing else tells: a profile taken while it still moved (two cuts brought
        nothing back; a check behind a lasting violation; a figure taken beside
        opportunistic work after two cuts soon after a profile), or the periodic profile
        (a rise that the harm production takes hides from its progress). A profile off the
        figure by more than `bar` (a part of it), the way `way` allows (1 up, -1 down, 0
        either), replaces it, and the load is followed: profiled again FOLLOW_S later, and
        followed on while it goes on the same way. Otherwise it is one more profile of the
        load, averaged in (`_profiled`): within the bar it settled; the other way, it may be
        noise (a profile knows production only to about an iteration where it is counted),
        unless it is off the load's profiles by over LOAD_CHANGE: then, as any profile, it
        is the figure of a new load, and the decision log says so. A profile above the
        figure by more than the tolerance replaces it whatever way the load was moving, as
        the periodic profile's does: a figure too low is the one that costs production (a
        load that fell by a tenth over 10 s and came back over the next 10, beside work
        costing production up to 20 %, was found 7 % above the figure of its fall 5 s after
        the bottom, averaged in, and the figure stayed 7 % low for a minute). A load that
        moved may move again once it settles (a slow stretch of a job ends; a load waves):
        each of these profiles that does not find it moving makes the periodic one come
        twice as long after the last, from twice FOLLOW_S up to reprofile_s
        (`reprofile_after`): 10, 20, 40 s after it settled, where the follow-up that found a
        load settled at the bottom of a fall of 10 % over 8 s that came back over the next 8
        left the figure there for the next minute.
        Before, a figure taken while the load moved stayed until the next periodic profile
        (60 s), which was only averaged in: in the controller rig a fall of 10 % over 16 s
        left it 2.1 % high, and opportunistic work at a third of what the tolerance allows
        for a minute; a rise of 8 % over 30 s beside work costing production up to 10 %
        left production at 0.916-0.957 of its solo progress for five minutes. Where
        `since` (the profile's start) is given, as for a follow-up and the periodic
        profile, and the figure has host spells, whether the load moved is judged by the
        profile timed by production's busy time and those spells (`Window.timed_rate`):
        timed from start to start, a profile, about one iteration, of a job whose host
        spells vary reads its spells' noise as its load moving (1 s drawn within +-33 % in
        the controller rig: 10,833 blocks/s after 8,282, followed up 5 s later, five
        profiles a minute, opportunistic work at 0.80 of what the tolerance allows; one
        profile and 0.97 so). A profile below the figure is off it only by more than the
        noise of the two as well (`_noise`): a job whose iterations differ by 10 % is known
        to about 3 % by a profile of a second, and judged against the bar alone, its
        profiles' noise read as its load falling (in the controller rig, 66 profiles in six
        runs of two minutes, 31 of them follow-ups, each pausing opportunistic work for a
        second; 27 and 3 so). One above it is judged by the bar alone: a figure too low is
        the one that costs production (judged against the noise too, a rise of 10 % that
        profiles read 5.6 % up was averaged in, and production ran at 0.948 of its solo
        progress for two minutes). Averaged in or a new load's figure, it is p, as any profile:
        one settled by its busy time but off the load's profiles by over LOAD_CHANGE (its
        host spells moved: a data loader that got faster) is a new load's figure, and the
        decision log says so (it said "settled"). Returns what it found, for the decision
        log."""
        solo = self.solo or 0.0
        q = None if since is None else \
            self.window.timed_rate(since, _mean_spells(self.profiles))
        r = p if q is None else q
        sign = 1 if r > solo else -1
        self.follow_sign = 0
        self.reprofile_after = min(self.cfg.reprofile_s, 2 * self.reprofile_after)
        noise = self._noise(since) if r < solo else 0.0
        if abs(r - solo) <= max(bar, noise) * solo:
            had = bool(self.profiles)  # (none: the figure was not profiled)
            if self._profiled(p) or not had:
                return "settled" if abs(r - solo) <= bar * solo else \
                    f"settled: within the noise of its profiles ({abs(r / solo - 1):.1%} off, up to {noise:.1%})"
            # within the bar by its busy time, but its host spells moved (a loader that got
            # faster): a new load's figure, as any profile off by LOAD_CHANGE
            moved = " (by its busy time it settled: its host spells moved)" if q is not None else ""
            return f"off its profiles by over {self.LOAD_CHANGE:.0%}{moved}: taken as a new load"
        if way and sign != way and r <= (1 + max(self.cfg.tolerance, noise)) * solo:
            not_followed = f"not followed {'up' if sign > 0 else 'down'}"
            if self._profiled(p):
                return f"settled: {not_followed}"
            # a new load's figure, but not a fresh start: the rate goes on from the last one
            # production held (`rate_good`), where the other new loads start from no limit
            # (in the controller rig, starting these from no limit cost production in fast
            # waves: +-20 % over 2 s beside work costing it up to 20 %, 0.977 -> 0.894 of its
            # solo progress)
            return f"{not_followed}, but off its profiles by over {self.LOAD_CHANGE:.0%}: taken as a new load"
        self.reprofile_after = self.FOLLOW_S
        self.profiles = []
        self._profiled(p)  # the figure, and what it says of the overlap signal
        self.follow_sign = sign
        self.follow_at = t + self.FOLLOW_S
        return f"{'rising' if sign > 0 else 'falling'}, measured again in {self.FOLLOW_S:g} s"

    def _noise(self, since: float | None) -> float:
        """How far a profile from `since` may be off the figure by the noise of the two
        alone, as a part of the figure: NOISE_Z of their standard errors together, the
        figure's that of its profiles' mean (each taken to be as noisy as this one); 0
        where the profile's noise is not known (`Window.noise`), or the figure has no
        profiles (taken beside opportunistic work, or by a profile that a change called
        for: this profile is its first, and one moved past the bar is followed up to
        measure it again)."""
        se = None if since is None or not self.profiles else self.window.noise(since)
        return self.NOISE_Z * se * math.sqrt(1 + 1 / max(1, len(self.profiles))) if se else 0.0

    def _reading_noise(self, since: float) -> float:
        """How far production's progress read from `since` may be off its figure by noise
        alone, as a part of the figure: that of the two (`_noise`) where the figure has
        profiles, else NOISE_Z of the reading's standard errors (`Window.noise`)."""
        return self._noise(since) if self.profiles else self.NOISE_Z * (self.window.noise(since) or 0.0)

    def _second_half(self, t: float, covered: float, whole: float | None) -> float | None:
        """Production alone over the ending profile's second half, where it was still coming
        back from opportunistic work through the profile (work queued before the pause
        still ran, or production's memory came back over the bus), so that the whole reads
        it low, a figure that lets opportunistic work take that much more: the second half
        above the whole profile by more than its noise (NOISE_Z of its standard errors,
        `Window.noise`) and, where that is not known or larger, by more than the tolerance;
        else None. Above the whole by more than the tolerance, the profile goes on
        (`_fading`); by less, the second half is the figure. Until that, a second half up
        to the tolerance above was left out: in the controller rig, with work hurting
        production 0.3-0.6 s late, such profiles read production up to 1.5 % low (24,625
        blocks/s for 25,000 after a fall of half), and at a steady load production ran at
        0.960-0.966 of its solo progress (harm 0.03 and 0.1; now 0.964-0.967, as without
        the lag). Where half a profile's noise passes the tolerance (iterations 10-15 %
        apart), the tolerance stays the bar: against twice the noise, the extension that
        noise set off came less often, and opportunistic work beside iterations 15 % apart
        had 0.80 of what is allowed (0.59), but a rise of 10 % beside iterations 10 % apart
        ran production at 0.968 of its solo progress over six draws (0.974). Once per
        profile; only where production's iterations time both stretches (`Window`):
        counted over half a profile, a job's blocks are off by up to one of its
        iterations, a large part of a PyTorch job's few a second. `whole`: the profile's
        timed progress (`Window.measure`)."""
        if self.profile_first is not None or covered <= 0 or whole is None:
            return None
        since = t - covered / 2
        late = self.window.timed_rate(since)
        if late is None or late <= whole:
            return None
        se = self.window.noise(since)
        bar = self.cfg.tolerance if se is None else min(self.cfg.tolerance, self.NOISE_Z * se)
        return late if late > (1 + bar) * whole else None

    def _fading(self, late: float, whole: float) -> str | None:
        """Why the profile ending now goes on for another profile_s; None where it does not:
        production alone over its second half (`_second_half`) above the whole profile's by
        more than the tolerance. The figure is then the higher of the extension's and the
        whole first part's (where production's own load moves through the profile, the
        extension may catch it lower: a figure too low is the one that costs production).
        In the controller rig (bench/rig.py), with work hurting production 0.6 s late, the
        cases whose production averaged under 0.94 of its solo progress went from 12 to 3
        of the 135 at that lag (the periodic profile after a rise of 30 % hidden by harm
        read 60,000 blocks/s for 65,000)."""
        if late <= (1 + self.cfg.tolerance) * whole:
            return None
        return (f"production alone at {late:,.0f} blocks/s over the profile's second half, {late / whole - 1:.1%} above "
                f"the whole ({whole:,.0f}): still coming back from opportunistic work; profiling "
                f"{self.cfg.profile_s:g} s more")

    def _checked(self, t: float, p: float, covered: float, half: str = "") -> None:
        """The end of a profile that checked the solo figure behind a violation that cuts
        eased but did not end. Production alone below the figure by more than half the
        tolerance: its own load fell (slowly, within one job: a turnover of processes is
        judged on its own), and the cuts were aimed at a figure it no longer reaches: the
        figure is replaced, and the load followed down (`_followed`; before, only a profile
        below by the whole tolerance replaced it, and one 2.97 % below, with one check per
        run of violations, left the figure to starve opportunistic work). Otherwise it is
        one more profile of the same load. Either way
        the rate goes on from where the cuts left it: against the figure now known it is
        cut further or ramped back up within seconds. Judged by the bar alone, not against
        the profiles' noise: cuts to a tenth that left production below say more than a
        profile can (judged against the noise too, a fall of 10 % beside iterations 10 %
        apart was averaged in at each check, and opportunistic work had 0.41 of what is
        allowed in the controller rig; 0.51 so)."""
        self.purpose = Purpose.MEASURE
        self.drift_since = None
        why = "checked the solo figure: nothing measured"
        if covered > 0:
            found = self._followed(t, p, self.FOLLOW_MOVE * self.cfg.tolerance, -1)
            if self.follow_sign:
                self.violations = None  # judged afresh against the new figure
            why = f"checked the solo figure: production alone at {p:,.0f} blocks/s{half}; the load {found}"
        self._change(t, why, Phase.RUN)

    def _less_work(self, run: Violations | None, p: float, solo: float) -> float | None:
        """At the first violation of a run that the shims cannot tell (`_not_own`: they did
        not watch, or a deeper bound is on trial), where production's rhythm grew the window
        (over 0.75 s on its host every iteration: its iteration starts are the returns from
        its host), the part of the work (blocks) of its iteration in the profile that set the
        figure that its latest did, where that is less by more than the tolerance and
        explains its fall from the figure to p within the tolerance; else None. Harm
        lengthens an iteration, not its work: less work is its own load falling, measured
        at once (a fall beyond it is harm too, and cut). Cut as harm instead, a job of 0.2 s
        on the GPU and 3 s on its host whose bursts shrank to 0.14 s (0.71 of its figure)
        was cut twice, 6.5 s apart (a decision needs two of its iterations), and profiled
        18 s after the fall: opportunistic work had 0.37-0.49 of what is allowed over the
        40 s after it in the controller rig."""
        if run is not None or not self._window_grown() or self.figure_work is None:
            return None
        figure, work = self.figure_work
        done = self.window.iteration_blocks()
        if figure != self.solo or done is None:  # (the figure has changed since)
            return None
        part, tol = done / work, self.cfg.tolerance
        return part if part < 1 - tol and p >= (1 - tol) * part * solo else None

    def _note_work(self) -> None:
        """Keeps the blocks of production's latest iteration, timed in the profile ending
        now, beside the figure it left (`_less_work`; from `_profiled`, where every profile
        that measured something sets the figure)."""
        work = self.window.iteration_blocks()
        self.figure_work = (self.solo, work) if work and self.solo else None

    def _far_below(self, p: float, solo: float) -> bool:
        """Production's progress p is further below its solo figure than waiting behind an
        opportunistic kernel explains (FAR_BELOW tolerances): easing the in-flight bound
        alone will not bring it back, and two cuts that bring nothing of it back say more
        than a measure's noise."""
        return p < (1 - self.FAR_BELOW * self.cfg.tolerance) * solo

    def _cut(self, p: float, solo: float) -> float:
        """The part of the rate a cut keeps: 70 %, or tolerance / shortfall where production
        fell further (down to a quarter). Harm grows about in proportion to the
        opportunistic rate (in the oversubscription benchmark production lost about 1.5 %
        per 1,000 opportunistic blocks/s), so keeping that part brings a fall of any depth
        back to about the tolerance in one cut, and the ramp then finds the edge from
        below; by 30 % cuts alone, an opportunistic job that started unlimited and cost
        production 12 % took five cuts (6 s) to rein in, with production at 0.88-0.94 all the
        while (0.946 of exclusive over the benchmark's window in one run). Called on a
        violation: p is below (1 - tolerance) * solo, so the shortfall is above the tolerance."""
        return min(self.CUT, max(self.CUT_MIN, self.cfg.tolerance / (1 - p / solo)))

    def _rose(self, t: float, p: float, solo: float, judged_from: float, marginal: bool) -> bool:
        """Production above its solo figure by LOAD_CHANGE, or (`marginal`) by the tolerance
        over CONFIRM_S of timed progress: once it has been for half a second, taken as its own
        load's, or profiled. Whether it acted; until it does, a rate limit is not raised
        (raised in the decision that first saw the rise, the harm it added took the rise
        back out of the next).

        Beside work that costs it, production above its figure by more than the tolerance
        says the figure is low: its own load rose by more than the harm it takes hides (in
        the controller rig, a rise of 30 % beside unlimited work costing production 20 %
        read 1.10 of the figure, under LOAD_CHANGE, and production ran at 0.846 of its solo
        progress for 12 s, until the periodic profile). Such a marginal rise, unless the
        shims saw it as production's own as below, is profiled as a check of the figure (of
        the same load: averaged in where it settled, replaced and followed up where it rose),
        once per figure: a figure that profiles read low (work queued before the pause still
        running) would otherwise call one every few seconds."""
        # production does clearly more than its solo figure: its own load grew (a fall
        # shows up as a violation: `_fell`). Where the shims saw next to no opportunistic
        # work beside it, sharing hides at most the part of each second production spent
        # beside that work: that much above its progress is its solo figure, with no
        # profile, by a tenth or by the tolerance (two production jobs' bursts drawing
        # apart, in the dynamics benchmark's pair phase, paused opportunistic work for a
        # second each time, and a pause near the phase's end missed its 5 s; drawn apart by
        # 7.7-8.6 %, with 0.005-0.012 s/s seen beside them against bars of 0.019-0.022,
        # each was checked by a profile, followed up 5 s later, and opportunistic work had
        # 0.8 of the idle time 14.75 s into one phase and never in the other; a check that
        # found the pair alone above the figure their drawing together had left as their
        # own took that for the overlap signal caught out, and their next fall of their own
        # eased the in-flight bound to one kernel for the phase's last 9 s); else it is
        # measured alone and followed up, as a load that moved (a rise may go on through
        # the profile it set off: in the controller rig, that profile's figure held for a
        # minute, with the rest of a rise of half hidden behind the harm it took and
        # production at 0.867 of its solo progress)
        self.drift_since = self.drift_since if self.drift_since is not None else t
        if t - self.drift_since >= 0.5:
            self.drift_since = None
            seen = self.window.overlap(judged_from)
            not_own = self._not_own(p, solo, seen)
            if not_own is None:
                self.solo = self.own_figure = p * (1 + seen.per_s)
                self.profiles, self.own_falls = [], None
                self._change(t, f"production rose to {p:,.0f} blocks/s with {seen.per_s:.4f} s/s of "
                             f"opportunistic work beside it: its own load, solo figure {self.solo:,.0f}")
                return True
            if marginal:
                self.rise_checked = True
                self._profile(t, f"production above its solo figure by {p / solo - 1:.1%} for 0.5 s (timed, over the "
                              f"tolerance; {not_own}): checking the figure", same_load=True, purpose=Purpose.FOLLOW,
                              way=1)
                return True
            self.solo = p  # at least this much, until the profile says exactly
            self._profile(t, f"production above its solo figure by {self.LOAD_CHANGE:.0%} for 0.5 s; {not_own}",
                          purpose=Purpose.FOLLOW, way=1)
            return True
        return False

    def _unconfirmed(self, p: float, solo: float, judged_from: float, covered: float) -> bool:
        """Whether production, timed above its figure by more than the tolerance (a marginal
        rise, `_rose`), is a rise not confirmed yet, during which a rate limit is not raised:
        over less than CONFIRM_S since the last change, and above the figure by more than
        the noise of the two (`_reading_noise`). Raised, the harm it adds hides
        the rise it may be: in the controller rig, production's load rose by a tenth at once
        as work costing it up to 20 % arrived; after the first cut it read 1.04 of its
        figure, the ramp took that back within 4 s, and production ran at 0.85-0.93 of its
        new solo progress until the periodic profile 12 s later (its worst 10 s window
        0.888). Held, the rise is confirmed and profiled 3.3 s after the cut (0.910). Over
        the rig's rises at harm 0.1, the worst windows averaged 0.913 (0.907). Judged
        against the stretch's noise alone, a figure that a profile read low held the rate
        beside iterations 15 % apart, and opportunistic work had 0.552 of what is allowed
        (0.594 so). Not where the rate is unlimited: nothing is raised."""
        if self.rate == UNLIMITED or covered >= self.CONFIRM_S:
            return False
        return p > solo * (1 + self._reading_noise(judged_from))

    def _fell(self, t: float, p: float, o: float, solo: float, judged_from: float, rhythm: float) -> None:
        """A violation: production's progress p below (1 - tolerance) * solo over the window from
        `judged_from`, opportunistic work at o blocks/s, production's rhythm `rhythm` s
        (`_rhythm`). Its own fall, the machine's, or harm: answered below."""
        tol = self.cfg.tolerance
        seen = self.window.overlap(judged_from)
        fallen_from = self._fallen_from(t, solo)
        not_own = self._not_own(p, fallen_from, seen)
        trial_only = not_own is None and self.bound.deeper
        if trial_only:
            # a deeper in-flight bound on trial is for opportunistic work alone: a fall
            # under it is what the trial costs production, whatever the shims saw (in
            # the dynamics benchmark a fall of 3 % 1.2 s into a trial of eight, with
            # 0.005 s/s seen beside it, was taken as production's own: eight was kept
            # for the phase's last 7 s, judged against a figure 3 % lower, and
            # production's rolling 1 s throughput went down to 0.952 of solo under it,
            # 0.970 under two and four before it). Ending the trial is all it calls
            # for, however deep the fall: the fall is judged again under the bound
            # production held (in the dynamics benchmark with the CPUs busy, two
            # production jobs' bursts drawing together took the pair to 0.866 of its
            # figure 2.4 s into a trial of four, with too little seen beside it to be
            # harm; the rate was cut with the ease, and again, and opportunistic work
            # never had 0.8 of the idle time in that phase)
            not_own = f"under a trial of in-flight bound {self.bound.kernels}"
        run = self.violations
        if (run is None or run.cuts == 0) and not_own is None:
            # production fell with next to no opportunistic work beside it: its own
            # load changed (two jobs' bursts fell together; a PyTorch job's warm-up,
            # which its first profile caught, ended). Its present progress is its solo
            # progress; nothing is cut (two cuts that brought nothing back took 2.4 s
            # to say so, with the in-flight bound at one meanwhile). Judged again while
            # the run of violations has eased only the in-flight bound (which is then
            # undone): a fall that comes over a second or two is marginal at first,
            # where the bar (a quarter of the fall) is below the little the shims see
            # beside production anyway, and the cuts that followed took 5-6 s to say so
            if run is not None:
                self.violations = None
                self.bound.restore()
            self.own_falls = OwnFalls(fallen_from, t)
            steps = f" (from {fallen_from:,.0f}, in steps)" if fallen_from != solo else ""
            self.solo, self.profiles, self.own_figure = p, [], p
            self._change(t, f"production fell to {p:,.0f} blocks/s{steps} with {seen.per_s:.4f} s/s of "
                         "opportunistic work beside it: its own load, the new solo figure")
            return
        machine = None if trial_only or (run is not None and run.cuts) else \
            self._the_machine_s(t, p, solo, seen, judged_from)
        if machine is not None:
            # the host's hypervisor took more of its CPU time than while the figure was
            # measured, by at least the fall, and what ran beside production explains
            # under half of the fall: the machine slowed it, and production's twin alone on
            # a second simulated GPU fell with it (the dynamics benchmark with 0.04-0.12 of the CPU time stolen: the
            # pair phase's fall to 0.961 of its figure, 0.11 stolen and 0.0104 s/s beside
            # production, eased the in-flight bound to one kernel, and opportunistic work
            # was at 0.8 of the idle time only 15.5 s into the phase). Nothing is cut or
            # eased, and nothing ramped: judged again at the next decision, when what is
            # stolen may no longer explain it; for MACHINE_HOLD_S at most against one
            # figure. The periodic profile still comes when due. Not once the run has cut
            # the rate: that answered harm (seen only in part, or the fall would have been
            # production's own or too deep for the machine), which a hypervisor that starts
            # stealing meanwhile does not undo
            if self.machine_since is None:
                self.machine_since = t
            if not self.machine_fall:
                self.machine_fall, self.why = True, machine
            self._periodic(t, rhythm)
            return
        less = self._less_work(run, p, solo)
        if less is not None:  # (where the shims cannot tell, or under a deeper trial)
            self._profile(t, f"{self._of_solo(p)}, its iterations doing {less:.0%} of the work of those its figure "
                          f"was profiled over: its own load fell", purpose=Purpose.FOLLOW, way=-1)
            return
        if run is None:
            self.rate_good = self.rate
            run = self.violations = Violations(p, self.CHECK_PART * o)
        run.count += 1
        self.bound.unsettled()
        # a cut brings back about the part of the harm it takes off the rate, and may
        # not show within a second (work queued before it still runs: long kernels
        # reading evicted memory over the bus): two cuts that bring back nothing say
        # that production's own progress changed, against a large fall as against a few
        # percent (one was taken for proof against a large fall: production was held at
        # 0.88 of its solo progress in the oversubscription benchmark)
        run.best_p = max(run.best_p, p)
        fruitless = run.cuts >= 2 and p <= run.start_p * (1 + tol / 2)
        if fruitless and self._far_below(run.start_p, solo) \
                and run.best_p <= run.start_p * (1 + tol / 2) \
                and t - self.profiled_at <= self.ACCEPT_AFTER_PROFILE_S:
            # just measured, far below, and no decision of the run found the cuts helping:
            # take what production does now as its solo progress and undo what was tried,
            # the in-flight bound with the rate (on an H100, every start of a PyTorch
            # production job, whose warm-up its first profile caught, left the
            # opportunistic job at one kernel in flight for the 10 s to the bound's retry).
            # Cuts that brought production back once are not fruitless: a dip after them
            # (a slow stretch of the host) is profiled below. Taken so, a dip to 0.84 of
            # the figure became it in an oversubscription run on simgpu, and opportunistic
            # work ran unlimited against it for 5 s: production at 0.872 of exclusive
            self.solo = p
            self.profiles = []
            self.violations = None
            self.bound.restore()
            self.follow_at = t + self.FOLLOW_S  # taken beside opportunistic work, from a load that moved
            self._change(t, f"two cuts soon after a profile brought nothing back: production's own "
                         f"progress, {p:,.0f} blocks/s, is its solo figure, measured again in "
                         f"{self.FOLLOW_S:g} s", rate=self.rate_good)
            return
        if fruitless:
            # what was tried did not help: production's own progress changed, or harm
            # that does not shrink with the rate (or not yet) is taken for it; measured
            # alone. A fall within what waiting behind a kernel explains is measured
            # however soon after a profile: two cuts bring back less of it than a
            # measure's noise, and taken as production's own, progress beside
            # opportunistic work became its figure (the oversubscription benchmark: 0.96
            # of the profile, with the rate ramped against it: production at 0.928 of
            # exclusive)
            self._profile(t, f"two cuts brought nothing back ({self._of_solo(p)})", purpose=Purpose.FOLLOW,
                          way=-1, resume_at=self.rate)
            return
        if run.cuts and self.rate <= run.check_below:
            # the cuts have helped (else the rules above) and left at most a tenth of the
            # harm opportunistic work did, and production is still below: is the solo
            # figure still production's? (one it can no longer reach starved
            # opportunistic work for good: every cut helped a little, so none was taken
            # as not helping; measured now, with little opportunistic work queued, the
            # profile is not one it slows down). Checked again at each further tenth:
            # a load that goes on falling after a check is below the figure the check
            # left, and cuts that then start from a deep fall in the same run (its
            # first violations) are each above the run's start, so none is taken as not
            # helping (the controller rig, a fall of 10 % over 30 s beside work that
            # cost production 20 % at full rate: after one check that averaged, cut to 1
            # block/s for good, no cut taken as not helping and no periodic profile)
            run.check_below = self.CHECK_PART * self.rate
            self._profile(t, f"cuts to a tenth left {self._of_solo(p)}: is the figure still its own?",
                          same_load=True, purpose=Purpose.CHECK)
            return
        # first, the in-flight bound: back from a deeper trial, else fewer kernels for
        # production to wait behind
        harm = f"{self._of_solo(p)}; {not_own}" if run.count == 1 else self._of_solo(p)
        if self.bound.ease(t):
            self._change(t, f"{harm}: in-flight bound {self.bound.kernels}")
            if trial_only or not self._far_below(run.start_p, solo):
                return
        # far below (more than waiting behind a kernel can explain), or nothing left to
        # ease: cut the rate
        base = o if self.rate == UNLIMITED else min(float(self.rate), max(o, 1.0))
        self._change(t, f"{harm}: rate cut", rate=max(int(base * self._cut(p, solo)), 1))
        run.cuts += 1

    def _afresh(self) -> None:
        """What the last pair, or production's load before an idle spell, found is not what
        comes next's: the rate it found good (a profile went back to it: a new production
        job or a new opportunistic one started at the last pair's cut rate, 21,001 blocks/s
        in the controller rig, and ramped from there), its run of violations (the next
        pair's first was judged as its third: "two cuts brought nothing back", and two
        profiles where production's own fall, nothing beside it, was its figure at once), a
        rise it was timing, and its in-flight bound (eased or on trial: one eased against
        the last load's harm held opportunistic work at one kernel in flight for a whole
        idle spell, 15 s in the controller rig)."""
        self.rate_good = UNLIMITED
        self.violations = self.drift_since = None
        self.bound.restore()

    def _idle(self, t: float, why: str) -> None:
        """Production launches nothing: opportunistic work runs with no limit (the gate and
        the configured in-flight bound protect production when it comes back, and its
        return is profiled); what it comes back to starts afresh (`_afresh`)."""
        self.idle = True
        self._afresh()
        self._change(t, why, Phase.RUN, UNLIMITED)

    def _idle_why(self, idle_after: float) -> str:
        """The decision log's words for production found idle, by what it was doing."""
        if self.phase == Phase.FREE:
            return "production attached, launching nothing yet: no limit"
        if self.phase == Phase.SOLO:
            return "opportunistic work arrived beside production launching nothing: no limit"
        ended = "; the profile under way measured nothing" if self.phase == Phase.PROFILE else ""
        return f"production launched nothing for {idle_after:.2g} s: no limit{ended}"

    def _rhythm(self, s: Sample) -> float:
        """Production's rhythm as the controller honours it (`Sample.production_rhythm_s`:
        a job that spends 0.6 s on its host every iteration, a slow data loader's, an
        environment's step): up to RHYTHM_MAX_S (host spells of up to 4 s: the window grows
        to time two of its iterations, `_span`); 0 beyond it, or where none stands. Beyond
        it each spell is idle and each return profiled: a profile of under a second every
        iteration costs such a job's opportunistic work little (0.85-0.90 of what is
        allowed with 6 s on the host, in the controller rig), and the window would grow
        past 21 s. (In the rig, beside 0.1-0.4 s of kernels, opportunistic work had 0.775
        and 0.828 of what is allowed with 3 and 4 s on the host while the bound was 4 s,
        0.937 and 0.921 with it 8.5 s.)"""
        rhythm = s.production_rhythm_s
        return rhythm if rhythm <= self.RHYTHM_MAX_S else 0.0

    def _idle_after(self, s: Sample) -> float:
        """How long production must launch nothing to be idle: IDLE_S, or where its
        processes expect a longer spell, its rhythm (`_rhythm`). Taken as idle each time,
        each of its returns was profiled: on simgpu a GPU-bound job beside 0.2 s of kernels
        and 0.6 s on the host an iteration had 0.40 of the idle time, 49 profiles in 40 s."""
        return max(self.IDLE_S, self._rhythm(s))

    def _span(self, s: Sample) -> float:
        """The window's span: WINDOW_S, or while a rhythm honoured (`_rhythm`) and longer
        than half WINDOW_S stands in it or in `s` (host spells over 0.75 s every
        iteration), LONG_WINDOW_S or WINDOW_RHYTHMS times the latest such rhythm, whichever
        is longer (20 s for 4 s on the host, about 21 s at most). Two iterations of such a job (a second
        on its host and 0.2 s on the GPU: 2.4 s; 2 s and 2 s: 8 s; 4 s and up to 6 s on the
        GPU: 20 s) time its progress, and WINDOW_S is too short to hold them with the idle
        spell its rhythm allows: each of its returns was taken for one from idle and
        profiled (on simgpu, beside 0.2 s of kernels and 1 s on the host an iteration, a
        GPU-bound job had 0.63 of the idle time; 0.87 with the window grown). Held while
        such a rhythm is in the window (its shims write it only while the job is on its
        host): the window is WINDOW_S again once the window it grew to has passed since the
        last."""
        rhythm = self._rhythm(s)
        if rhythm > self.WINDOW_S / 2:
            self.long_rhythm_at = s.t
            self.long_span = max(self.LONG_WINDOW_S, self.WINDOW_RHYTHMS * rhythm)
        return self.long_span if s.t - self.long_rhythm_at < self.long_span else self.WINDOW_S

    def _window_grown(self) -> bool:
        """Whether production's rhythm grew the window (`_span`: over 0.75 s on its host
        every iteration), which the rules for a long rhythm ask."""
        return self.window.span > self.WINDOW_S

    def _data_s(self) -> float:
        """The data a decision, or production's figure measured alone, needs since the
        last change: MIN_DATA_S, or two of its iterations where they take longer."""
        return max(self.MIN_DATA_S, self._two_iterations_s())

    def _two_iterations_s(self) -> float:
        """How long two of production's latest iterations take, up to the window's span: a stretch
        that long holds two of its iteration starts, which time its progress over the
        stretch (`Window`). A decision needs that much data where it is more than
        MIN_DATA_S, and a profile lasts up to that much after it settles where that is
        more than profile_s (`_profiled_enough`; a job of one iteration every 0.7 s:
        profiled for a second, one start or two, its count read 25,160 blocks/s for 28,571,
        taken as a new load)."""
        return min(self.window.span, 2 * self.window.iteration_s())

    def _profiled_enough(self, t: float, elapsed: float, since: float, timed: float | None) -> bool:
        """Whether the profile under way, `elapsed` seconds long at `t`, has measured
        production alone since it settled (`since`): profile_s has passed, and production's
        iteration starts since then time its progress (`timed`, `Window.measure`: two of
        each container's),
        or, where they do not, two of its latest iterations have passed since then
        (`_two_iterations_s`; counted from the profile's start, that came a control period
        short: a job of 1.7 s iterations, its second start due just then, was read over
        one burst, 4,545 blocks/s for 5,882, and taken for a new load); where the window has
        grown for a long rhythm (`_span`), the window's span instead: such a job's starts
        time it once the profile holds two, and its latest iteration may be one whose host
        spell was cut short (a count of one burst over a second then read 2.6-6.6 times its
        progress alone, in the controller rig). Waiting for
        two iterations where the first two starts already timed one held opportunistic work
        up to an iteration longer than the measure needed: a periodic profile of a job of
        0.1 s on the GPU and 2 s on its host lasted 4.35 s, and in the controller rig such
        jobs' cases had 0.915 of what is allowed (0.943 now), production as before. (At harm
        0.1, lag 0.6 s, the rhythms' lowest case went from 0.9468 to 0.9674: its periodic
        profile of two iterations had read production alone 9 % low, a burst slowed by work
        queued before the pause; which bursts a profile holds decides how much of such a
        lag it reads.)"""
        if elapsed <= self.cfg.profile_s + 1e-9:
            return False
        if timed is not None:
            return True
        counted_after = self.window.span if self._window_grown() else self._two_iterations_s()
        return t - since >= counted_after - 1e-9

    def _held(self, t: float, o: float, long_o: float, rhythm: float, p: float, judged_from: float) -> None:
        """Production holds, at p blocks/s from `judged_from`: the rate ramps back (`_step_up`;
        or goes where it is unused), else the in-flight bound is tried (`InflightBound.holds`),
        and the periodic profile comes when due."""
        self.violations = None
        self.machine_fall = False
        if self.rate != UNLIMITED:
            cap = max(2.0 * o, 1.0)
            if int(self.rate * self.RAMP) + 1 > cap and o < 0.5 * self.rate:
                self._change(t, "production holds: limit unused, lifted", rate=UNLIMITED)
            elif (step := self._step_up(t, p, judged_from)) == self.RAMP:
                self._change(t, "production holds: rate raised", rate=int(self.rate * step) + 1)
            elif step > 1:
                self._change(t, f"production holds, at {p / (self.solo or p):.3f} of its solo progress: rate raised "
                                f"x{step:.2f}, towards {self.AIM:.0%} of the tolerance", rate=int(self.rate * step) + 1)
            self.rate_good = self.rate
        else:
            verdict = self.bound.holds(t, long_o)
            if verdict.move is Move.TRIED:
                self._change(t, f"production holds: in-flight bound {self.bound.kernels} tried")
                return
            if verdict.move in (Move.BACK, Move.LONGER):  # (LONGER: the second reading starts now)
                self._change(t, verdict.why)
                return
        self._periodic(t, rhythm)

    def _periodic(self, t: float, rhythm: float) -> None:
        """The periodic profile, where it is due (`reprofile_after` since the last), and for a
        long rhythm production is about to return from its host."""
        overdue = t - self.profiled_at - self.reprofile_after
        if self.follow_at is None and overdue > 0 and self._about_to_return(rhythm, overdue):
            # (a follow-up is due anyway)
            self._profile(t, "periodic", same_load=True, purpose=Purpose.PERIODIC)

    def _step_up(self, t: float, p: float, since: float) -> float:
        """The factor a rate limit is raised by while production holds, at p blocks/s from
        `since`: RAMP, or less where harm growing in proportion to the rate (as `_cut` takes
        it) would take production's shortfall from its figure past AIM of the tolerance,
        the shortfall read less its noise (`_reading_noise`: a reading that noise may have
        put there says nothing of the edge); a step under STEP_MIN is none (1), until the
        rate has held for HOLD_S, when it is raised RAMP-fold (harm may not grow with the
        rate: long kernels production waits behind however few there are). Raised RAMP-fold
        from anywhere under the edge, the rate went past it, and a marginal violation needs
        CONFIRM_S to show: in the controller rig, at a steady load, production averaged
        0.967-0.968 of solo over two minutes (harm 0.03 and 0.1, lag 0-0.6 s), under the 0.97
        the tolerance allows; so, 0.971-0.975, opportunistic work 0.84-0.97 of what the
        tolerance allows (1.06-1.09)."""
        solo = self.solo or 0.0
        if not solo:
            return self.RAMP
        aim = self.AIM * self.cfg.tolerance
        shortfall = 1 - p / solo
        if shortfall > aim / self.RAMP:
            shortfall -= self._reading_noise(since)
        if shortfall <= aim / self.RAMP:
            return self.RAMP
        step = aim / shortfall
        if step >= self.STEP_MIN:
            return step
        return self.RAMP if t - self.changed_at >= self.HOLD_S else 1.0

    def _on_its_host(self, s: Sample) -> bool:
        """Whether production of a long rhythm (the window grown, `_span`), in a profile, is
        on its host (it has launched nothing for IDLE_S) and not due back within a decision
        and the profile's first SETTLE_S (`_due_back_in`). Opportunistic work runs then
        (`host_spell`): the profile times production from iteration start to iteration
        start, and needs it alone only on the GPU. Paused throughout, a profile of such a
        job held opportunistic work for one to two of its iterations, 3.7-5.8 s beside
        0.14 s on the GPU and 3 s on the host; in the controller rig, beside jobs of
        0.1-0.4 s on the GPU and 1.5-4 s on the host whose bursts grew or shrank by a third
        to a half, opportunistic work had 0.789 of what is allowed over the 40 s after the
        change (0.655-0.682 after the falls of 30 %), 0.915 now (0.835-0.892), production's
        progress the same in each case. Production back sooner (its spell shorter than the
        shortest of those gone by) restarts the profile's measure (`step`)."""
        if not self._window_grown() or self.window.quiet_s() < self.IDLE_S - 1e-9:
            return False
        rhythm = self._rhythm(s)
        return rhythm > 0 and self._due_back_in(rhythm) > self.DECIDE_S + 1e-9

    def _set_host_spell(self, on_host: bool) -> None:
        """Opportunistic work runs in the profile under way while production is on its host
        (`_on_its_host`), and is paused again before it is due back; the decision log says
        which, with the profile's measure going on through both (`changed_at` stays)."""
        if on_host != self.host_spell:
            self.host_spell = on_host
            self.why = ("production on its host, not due back within a decision: opportunistic work runs in the "
                        "profile" if on_host else "production due back from its host: profiling production alone")

    def _due_back_in(self, rhythm: float) -> float:
        """Seconds until production of a long rhythm, on its host, is due back (its shortest
        spell is half its `rhythm`, `_rhythm`; tgsd's quiet time counts its spell so far),
        less a profile's first SETTLE_S and a control period (`quiet_s` leaves out the
        period its burst ended in)."""
        return rhythm / 2 - self.window.quiet_s() - (self.SETTLE_S + self.window.items[-1].dt)

    def _about_to_return(self, rhythm: float, waited: float) -> bool:
        """Whether production of a long rhythm (the window grown, `_span`) is on its host and
        due back within a decision: its shortest spell is half its `rhythm` (`_rhythm`: 0
        while it runs a burst). A profile started then lasts one of its iterations; started
        at any moment, one to two (2.7-4.3 s for 0.1 s on the GPU and 2 s on the host; in
        the controller rig, opportunistic work beside jobs 1, 1.5, 2, 3 and 4 s on their
        host had 0.969, 0.963, 0.941, 0.923 and 0.893 of what is allowed, 0.980, 0.969,
        0.955, 0.937 and 0.921 now, the 4 s cases no longer with a window under half). The
        periodic profile waits for it, and so does a follow-up (`_followed`), which measures
        again a load it has measured: in the rig, beside jobs of 0.1-0.4 s on the GPU and
        1.5-4 s on the host whose bursts grew or shrank by a third to a half, the seven
        follow-ups lasted 2.4-5.3 s, not 2.4-9.0 s, and opportunistic work had 0.728 of what is allowed
        over the 40 s after the change (0.712 before), production's progress as before but
        in one case of 21 (0.9485 against 0.9502: one burst alone in the profile, not two).
        The profiles that answer a change (a rise, a fall that cuts did not mend) come at
        once. A profile that has `waited` a window's span comes at once: tgsd's quiet time
        counted from production's last launch (now from the end of its busy spell where
        later: `Window.quiet_s`), so a job whose queued work runs on after it may seem due
        back only between two decisions, every iteration."""
        if not self._window_grown() or waited > self.window.span:
            return True
        return rhythm > 0 and -1e-9 <= self._due_back_in(rhythm) <= self.DECIDE_S + 1e-9

    def step(self, s: Sample) -> Budget:
        self.window.span = self._span(s)
        self.window.add(s)
        t = s.t
        since = self.changed_at + self.SETTLE_S
        p, o, covered, timed = self.window.measure(since)
        if not (s.production and s.opportunistic):
            self._afresh()  # no pair: what the last one found is not the next one's
        if not s.production:
            self.turnover = None
            self.idle = False  # the next production is profiled once, as it arrives
            self._unfollow()
            if self.phase != Phase.FREE:
                self.solo, self.profiles = None, []
                self._change(t, self.FREE_WHY, Phase.FREE, UNLIMITED)
            return self._budget()
        if s.production_processes != self.processes:
            # a production process started or ended (a job's turnover takes a moment in
            # which production does less: not harm): judge from what follows, starting from
            # the configured in-flight bound
            self.processes = s.production_processes
            # production's load may have changed with no idle moment to say so: judged once
            # the change has settled (without processes production is idle, and its return
            # is profiled)
            # a run of turnovers is judged against the figure before the first
            before = self.solo if self.turnover is None else self.turnover.figure_before
            self.turnover = Turnover(t, before) if self.processes else None
            self.own_falls = None  # falls of the load before are not steps of a fall of the next
            if self.phase in (Phase.RUN, Phase.SOLO):
                # nothing is judged in this period either: production is timed from the
                # marks of the containers that still have processes, and the window so far
                # then reads as theirs alone (one job of two: half the pair's figure). A
                # decision due now took that for harm and cut opportunistic work (CI, the
                # thirty-third session: "production at 0.494 of its solo progress ...: rate
                # cut", 30 ms after the process went)
                self.bound.restore()
                self.violations = None
                self._change(t, "a production process started or ended: measured afresh")
                return self._budget()
        idle_after = self._idle_after(s)
        quiet = self.window.quiet_s() >= idle_after - 1e-9
        if s.opportunistic and quiet:
            # production is idle (between jobs, evaluating on the CPU): no limit; the gate
            # and the in-flight bound protect it when it comes back, and its return is
            # profiled. One attached before its first launch (at its container's creation,
            # seconds before its first kernel) is idle until then: a profile at the attach
            # measured nothing, paused opportunistic work for a second, read production alone
            # at 0 blocks/s, and its first launches were profiled again (every start of the
            # oversubscription benchmark's production). A profile under way ends: it measured
            # nothing, and held opportunistic work while production idled (to its end, a
            # second; its figure then production alone at 0 blocks/s). Production alone
            # and idle when opportunistic work arrives is not profiled until it launches
            # (a profile of it measured nothing for two seconds, and was extended)
            if not (self.idle and self.phase == Phase.RUN):
                self._idle(t, self._idle_why(idle_after))
            return self._budget()
        if self.phase == Phase.FREE:
            self._change(t, "production arrived", Phase.SOLO if not s.opportunistic else Phase.PROFILE)
            if self.phase == Phase.PROFILE:
                self._profile(t, "production arrived")
            return self._budget()
        if self.phase == Phase.SOLO:
            if quiet:
                # alone and idle (attached before its first launch, or between jobs): its
                # figure stays what it was while it launched (an idle spell is no load)
                self.idle = True
                return self._budget()
            if self.idle:
                # back, perhaps as a new job: measured from its return alone. The window
                # before it held the idle spell, and the figure it gave (8,621 blocks/s for
                # 50,000 half a second after an idle spell in the controller rig) was held
                # against production by opportunistic work arriving then, with no profile
                # (one came within a minute of the last): the rise rule raised it to
                # production's progress beside unlimited work, and the rate was cut
                # against that (production 0.916 of solo over 30 s at harm 0.1)
                self.idle = False
                self.solo, self.profiles = None, []
                self._change(t, "production launching, alone: measured from now")
                return self._budget()
            if not s.opportunistic and covered >= self.MIN_DATA_S and covered >= self._data_s():
                # measured alone: the figure; profiles of the load before are not averaged
                # with later ones (they pulled the figure back towards a load production no
                # longer ran at the next periodic profile). Not from the period in which
                # opportunistic work arrived: its harm was taken into the figure (49,643
                # blocks/s for 50,000 in the controller rig, held against production until
                # the periodic profile). Nor is a figure taken from a change seen as
                # production's own what a later profile judges the overlap signal by: a
                # load that rose again while alone was taken for the signal caught out, and
                # production's next fall of its own for harm (the in-flight bound at one,
                # the rate cut)
                self.solo, self.profiles, self.own_figure = p, [], None
                self.turnover = None  # measured alone since the change
                self._unfollow()
            if s.opportunistic:
                if self.solo is None:
                    self._profile(t, "opportunistic work arrived")
                else:  # a new pair whose production is known: no profile
                    self._change(t, "opportunistic work arrived beside production measured alone", Phase.RUN,
                                 UNLIMITED)
                    self.window.spells = self.window.host_spells(since)  # (those of the stretch its figure is of)
            return self._budget()
        if self.phase == Phase.PROFILE:
            if self.host_spell and s.production_blocks:
                # back before it was due, beside opportunistic work, which its burst now
                # runs beside: the profile starts again, and times it from its next iteration
                self._profile(t, "production came back from its host before it was due, with opportunistic work "
                                 "running in the profile", same_load=True, purpose=self.purpose,
                              resume_at=self.resume_at)
                return self._budget()
            self._set_host_spell(self._on_its_host(s))
            elapsed = t - self.profile_from + s.dt
            if self._profiled_enough(t, elapsed, since, timed):
                late = self._second_half(t, covered, timed)
                fading = None if late is None else self._fading(late, timed)
                if fading:
                    self.profile_first = p
                    self.profile_from = t
                    self._change(t, fading, Phase.PROFILE)
                    return self._budget()
                half = ""
                if self.profile_first is not None:
                    p = max(p, self.profile_first)
                elif late is not None:
                    half = (f", over the profile's second half: {late / timed - 1:.2%} above the whole, still coming back "
                            "from opportunistic work")
                    p = late
                if self.purpose is Purpose.CHECK and s.opportunistic:
                    self._checked(t, p, covered, half)
                    return self._budget()
                found, rate = "", self.rate_good
                if covered > 0:
                    tol = self.cfg.tolerance
                    if self.purpose is Purpose.FOLLOW and s.opportunistic:
                        found = f"; the load {self._followed(t, p, self.FOLLOW_MOVE * tol, self.follow_sign, since)}"
                        if self.resume_at is not None and self.follow_sign >= 0:
                            # after two fruitless cuts, production alone not found falling:
                            # the fall was opportunistic work's harm, which did not shrink with
                            # them (long kernels, or harm that does not scale with the rate);
                            # the rate goes on from where they left it. From the rate before
                            # them, each such profile came back to the same fall: in the
                            # controller rig, work costing production 10 % at any rate above
                            # 5,000 blocks/s held it at 0.917 of its solo progress, with a
                            # profile every 6 s (0.969 now)
                            rate = min(self.resume_at, self.rate_good)
                            found += f"; the cuts stay: the fall was opportunistic work's, rate {rate:,}"
                    elif self.purpose is Purpose.PERIODIC and s.opportunistic:
                        found = f"; the load {self._followed(t, p, tol, 1, since)}"
                    else:
                        self._profiled(p)
                self.purpose = Purpose.MEASURE
                self.violations = None
                self.drift_since = None
                self.resume_at = None
                self._change(t, f"profiled: production alone at {p:,.0f} blocks/s (solo figure {self.solo or 0:,.0f})"
                             f"{half}{found}", Phase.RUN if s.opportunistic else Phase.SOLO, rate)
            return self._budget()
        # RUN
        if not s.opportunistic:
            self._change(t, "no opportunistic work on the GPU", Phase.SOLO)
            return self._budget()
        if self.idle:  # back, perhaps as a new job with a load of its own: measure it
            self.idle = False
            self._profile(t, "production back from idle")
            return self._budget()
        if self.turnover is not None and t - self.turnover.at >= self.TURNOVER_S - 1e-9 \
                and covered >= self.TURNOVER_S / 2:
            # a second after a production process started or ended: progress outside what
            # the solo figure before it allows says the load changed (one of two production
            # jobs ended, or a lighter or heavier job took over); measured alone at once,
            # before cuts aimed at the old figure (or none where it grew) set the rate. The
            # figure before, not the one now: a profile of the same load that came
            # meanwhile (a follow-up due as the process ended, or under way) measured the
            # new load and went back to the rate the old one held, and opportunistic work
            # ramped from it for seconds (both CPUs busy: cuts against the pair's noise left
            # it 7,475 blocks/s after one of two production jobs ended, 0.114 and 0.175 of
            # the engine over the next 10 s)
            before, self.turnover = self.turnover.figure_before, None
            solo = before if before is not None else self.solo or 0.0
            if not (1 - self.cfg.tolerance) * solo <= p <= (1 + self.LOAD_CHANGE) * solo:
                self.rate_good = UNLIMITED  # a new load starts afresh, as after an idle spell
                of = f"production at {p / solo:.3f} of the solo figure before it" if solo else self._of_solo(p)
                self._profile(t, f"a second after a production process started or ended, {of}")
                return self._budget()
        if self.follow_at is not None and t >= self.follow_at - 1e-9 \
                and self._about_to_return(self._rhythm(s), t - self.follow_at):
            self._profile(t, "the solo figure was taken while production's load moved", same_load=True,
                          purpose=Purpose.FOLLOW)
            return self._budget()
        if t - self.decided_at < self.DECIDE_S:
            return self._budget()
        need = self._data_s()
        if covered < need:
            return self._budget()
        reach = self.window.second_start(since)
        if reach is None and self.window.spells and self.window.marking(t):
            return self._budget()  # (timed by its busy time: its next iteration start is awaited)
        self.decided_at = t
        solo = self.solo or 0.0
        tol = self.cfg.tolerance
        long_p, long_o, long_covered = p, o, covered
        judged_from = max(since, t - max(self.QUICK_S, need))
        if reach is not None:
            # timed by its busy time, production is judged over two iteration starts at least:
            # over a quick window that held one, a count of its blocks read a burst, or none
            # (0.54-0.87 of the figure, 1.5 s +-33 % on its host, in the controller rig)
            judged_from = min(judged_from, reach)
        p, o, _ = self.window.rates(judged_from)
        cutting = self.rate < self.rate_good  # cut since production last held
        if (1 - 2 * tol) * solo <= p < (1 - tol) * solo and self.bound.kernels == 1 and not cutting:
            # marginal, and the cheap answer (one kernel in flight) is given: a rate cut
            # needs the longer window to show it
            if long_covered < self.CONFIRM_S:
                return self._budget()
            p, judged_from = long_p, since
        rose = p > solo * (1 + self.LOAD_CHANGE)
        # timed above its figure by the tolerance: a marginal rise, once the longer window
        # confirms it (`_rose`); until then a rate limit is not raised (`_unconfirmed`)
        over = not rose and not self.rise_checked and timed is not None and p > solo * (1 + tol)
        marginal = over and long_covered >= self.CONFIRM_S and long_p > solo * (1 + tol)
        if rose or marginal:
            if self._rose(t, p, solo, judged_from, marginal) or self.rate != UNLIMITED:
                return self._budget()  # (a limit is not raised while a rise is confirmed)
        else:
            self.drift_since = None
        if over and self._unconfirmed(p, solo, judged_from, long_covered):
            return self._budget()
        if p < (1 - tol) * solo:
            self._fell(t, p, o, solo, judged_from, self._rhythm(s))
        else:
            self._held(t, o, long_o, self._rhythm(s), p, judged_from)
        return self._budget()


def _harmonic(rates: list[float]) -> float:
    """The harmonic mean of `rates` (each of the same work: the rate over them all); 0 where
    one is (a profile that found production doing nothing is averaged with none other)."""
    return len(rates) / sum(1 / r for r in rates) if all(rates) else 0.0


def _mean_spells(profiles: list[Profiled]) -> dict[str, float]:
    """Each container's host spell, the mean of those the profiles of production's load
    measured (`FastController._profiled`)."""
    by_source: dict[str, list[float]] = {}
    for x in profiles:
        for source, spell in x.spells.items():
            by_source.setdefault(source, []).append(spell)
    return {source: sum(v) / len(v) for source, v in by_source.items()}


class PaperController:
    """The original TGS code's controller (see the module's docstring)."""

    SAMPLE_S = 5.0
    SLOW_START = 1.5
    DECREASE = 0.92
    REPROFILE_S = 120.0

    def __init__(self, cfg: ControlConfig):
        self.cfg = cfg
        self.phase = "free"
        self.solo: float | None = None
        self.rate = UNLIMITED
        self.step_size = 0
        self.sample_from = 0.0
        self.blocks = 0
        self.opp_blocks = 0
        self.progress = 0.0
        self.profiled_at = float("-inf")

    def _budget(self) -> Budget:
        rate = 0 if self.phase == "profile" else UNLIMITED if self.phase in ("free", "solo") else self.rate
        return Budget(rate, 0, False, self.phase, self.solo)

    def step(self, s: Sample) -> Budget:
        if not s.production:
            self.phase, self.solo, self.rate = "free", None, UNLIMITED
            self.sample_from, self.blocks = s.t, 0
            return self._budget()
        if self.phase == "free" or (self.phase == "solo" and s.opportunistic):
            self.phase = "profile" if s.opportunistic else "solo"
            self.sample_from, self.blocks, self.opp_blocks = s.t, 0, 0
            self.profiled_at = s.t
            return self._budget()
        self.blocks += s.production_blocks
        self.opp_blocks += s.opportunistic_blocks
        if s.t - self.sample_from < self.SAMPLE_S:
            return self._budget()
        p = self.blocks / (s.t - self.sample_from)
        self.progress = p
        self.sample_from, self.blocks, self.opp_blocks = s.t, 0, 0
        tol = self.cfg.tolerance
        if self.phase in ("profile", "solo"):
            self.solo = p
            self.step_size = max(int(p * 0.1), 1)
            if self.phase == "profile" or s.opportunistic:
                self.phase, self.rate = "slow-start", self.step_size
            return self._budget()
        ok = p >= (1 - tol) * (self.solo or 0)
        if self.phase == "slow-start":
            if ok:
                self.rate = int(self.rate * self.SLOW_START) + 1
            else:
                self.rate, self.phase = max(int(self.rate * self.DECREASE), 1), "additive"
        else:
            self.rate = self.rate + self.step_size if ok else max(int(self.rate * self.DECREASE), 1)
        if s.t - self.profiled_at > self.REPROFILE_S:
            self.phase, self.profiled_at = "profile", s.t
        return self._budget()


def make_controller(cfg: ControlConfig):
    return PaperController(cfg) if cfg.controller == Controller.TGS_PAPER else FastController(cfg)
