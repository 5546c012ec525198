"""The in-flight bound of one GPU's opportunistic work under `fast` (docs/daemon.md).

The bound is how many kernels a launching thread of an opportunistic container may have
queued beside production (ARCHITECTURE.md, control block `inflight_max`): production's
next iteration waits behind at most that many. `FastController` owns one and tells it
what production does; the bound answers with its own moves:

- harm (`ease`): the cheap answer first. In a trial of a bound deeper than the one
  production held, back to that one (the controller takes any fall under such a trial for
  harm, even one the shims would call production's own), and the next deeper trial waits twice as long (10 s,
  20 s, up to 320 s). Otherwise down to one kernel; a trial that ends this way doubles
  the wait before the next one (up to 320 s too), and the bound to try is the configured
  one again (what production held before may be too deep for its load now).
- production holds with no rate limit (`holds`): a trial production held long enough
  (10 s, a deeper one 5 s) is settled; a bound lowered to one is tried again at the bound
  production last held once the wait is over; a bound held for 5 s is tried twice as deep,
  up to `[control] inflight_deepest`. A deeper trial is for opportunistic work, and a
  deeper queue costs production a little even where production holds (on simgpu, at 25 %
  duty beside 1 ms kernels, production kept 0.994-0.997 of its solo progress at eight
  against 0.998-1.001 at two, and the opportunistic job gained nothing; with both CPUs
  busy, the dynamics benchmark missed a phase under a deeper bound in 4 of 7 runs). So a
  deeper trial under which opportunistic work did not progress at least DEEPER_GAIN (3 %)
  more than at the bound before goes back as if it had harmed production. On simgpu a job
  that gains by depth (100 us kernels with 3 ms of host work) gained 3.4-7.5 % from two to
  four in 12 trials, and one that does not read -12.8 to +3.8 % with both CPUs busy. A
  reading between half of DEEPER_GAIN and all of it is too close to tell: the trial goes
  on for DEEPEN_S more and is judged on the mean of its two readings (that job read 1.7 %
  and 2.3 % in two of six trials with the hypervisor taking 6 % of the host, and kept two
  for the isolation row's 12 s window: 0.778-0.795 of the idle time, 0.93-0.98 where the
  trial held). Depth
  can also cost opportunistic work: on an H200, a GPT-2-small-sized PyTorch job beside
  ResNet-50 ran at 0.244 of its exclusive speed while the bound deepened from two to
  eight, 0.479 with the bound kept at two. One kernel in flight costs opportunistic work the
  moment between each of its kernels ending and the next launch (a fifth of the idle time
  beside 75 % duty on simgpu), so one blip must not keep it there for good; and a job whose
  host work between launches outlasts a shallow queue leaves the GPU idle meanwhile (on
  simgpu, 100 us kernels with 3 ms of host work mid-iteration got 0.805 of the idle time
  under the default bound of two, 0.983 unbounded).
- a new load (`restore`): the configured bound, with no trials behind it.

Pure logic: times are the samples' own. Every move returns whether the bound changed, so
the controller can start measuring afresh from it.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

RETRY_S = 10.0       # a bound lowered to one is tried again after this ...
RETRY_MAX_S = 320.0  # ... doubled each time the try fails, up to this (the same for deeper trials)
TRY_S = 10.0         # a try that production holds this long has succeeded
DEEPEN_S = 5.0       # a bound production held this long is tried twice as deep; a deeper trial lasts as long
DEEPER_GAIN = 0.03   # a deeper trial under which opportunistic work did not progress this part more than before fails


class Move(enum.Enum):
    """What `InflightBound.holds` did."""
    NONE = "none"      # nothing: the bound stays
    TRIED = "tried"    # a trial started (a deeper bound, or the one held, again)
    BACK = "back"      # a deeper trial cost opportunistic work its progress: back to the bound held
    LONGER = "longer"  # a deeper trial's gain is too close to DEEPER_GAIN to tell: it goes on DEEPEN_S more


@dataclass(frozen=True)
class Verdict:
    """`InflightBound.holds`'s answer: what it did, and why in words where it went back or goes on longer."""
    move: Move
    why: str = ""


@dataclass
class Backoff:
    """How long a trial waits after the last one failed: `base_s` at first, twice as long
    after each failure (up to RETRY_MAX_S), `base_s` again once a trial succeeds. The bound
    keeps two: the retry of a bound lowered to one kernel (base RETRY_S) and the next
    deeper trial (base DEEPEN_S, the calm a deeper trial needs anyway)."""
    base_s: float
    wait_s: float = field(init=False)
    since: float | None = field(init=False)  # waiting since (None: not waiting)

    def __post_init__(self) -> None:
        self.wait_s, self.since = self.base_s, None

    @property
    def waiting(self) -> bool:
        return self.since is not None

    def wait(self, t: float, failed: bool) -> None:
        """Start waiting at t; a failed trial doubles the wait first."""
        if failed:
            self.wait_s = min(2 * self.wait_s, RETRY_MAX_S)
        self.since = t

    def stop(self) -> None:
        """The trial waited for starts: no longer waiting (the wait's length stays, for
        the next failure to double)."""
        self.since = None

    def succeeded(self) -> None:
        self.wait_s, self.since = self.base_s, None

    def over(self, t: float) -> bool:
        return self.since is None or t - self.since >= self.wait_s


@dataclass
class InflightBound:
    configured: int  # [control] inflight: where every load starts (0: none)
    deepest: int     # [control] inflight_deepest: the deepest a trial goes
    kernels: int = field(init=False)  # the bound now
    held: int = field(init=False)     # the deepest bound production has held through a trial (of this load)
    retry: Backoff = field(init=False)             # waiting: harm lowered the bound to one, tried again when over
    deepen: Backoff = field(init=False)            # when a deeper trial may start after one failed
    trying_since: float | None = field(init=False)  # the bound is on trial since
    calm_since: float | None = field(init=False)   # production has held since (no harm, no change of bound)
    before: float = field(init=False)  # opportunistic blocks/s at the bound held, as the deeper trial began
    first: float | None = field(init=False)  # ... and under the trial at its first end, where too close to tell

    def __post_init__(self) -> None:
        self.restore()

    def restore(self) -> None:
        """A new load starts from the configured bound, with no trials behind it."""
        self.kernels = self.held = self.configured
        self.trying_since = self.calm_since = None
        self.before = 0.0
        self.first = None
        self.retry, self.deepen = Backoff(RETRY_S), Backoff(DEEPEN_S)

    @property
    def deeper(self) -> bool:
        """The bound on trial is deeper than the one production held."""
        return self.trying_since is not None and self.kernels > self.held

    def unsettled(self) -> None:
        """Production fell (whatever the answer): it has not held since."""
        self.calm_since = None

    def ease(self, t: float) -> bool:
        """Harm: back from a deeper trial to the bound production held, else down to one
        kernel. Whether the bound changed (not where it is one already)."""
        if self.deeper:
            self._fail_deeper(t)
            return True
        if self.kernels == 1:
            return False
        self.retry.wait(t, failed=self.trying_since is not None)
        self.held = self.configured
        self._set(t, 1)
        return True

    def holds(self, t: float, opportunistic: float) -> Verdict:
        """Production holds and opportunistic work has no rate limit, and progressed at
        `opportunistic` blocks/s since the bound last changed: settles a trial held long
        enough (a deeper one only where opportunistic work gained by it: else back to the
        bound held, and the next deeper trial waits twice as long; one whose gain is too
        close to DEEPER_GAIN to tell goes on, `first`), or starts one (of
        the bound last held, once a bound lowered to one has waited long enough; or twice
        as deep as the bound held for DEEPEN_S)."""
        if self.trying_since is not None:
            if t - self.trying_since < self._trial_s:
                return Verdict(Move.NONE)
            if self.deeper and self.first is None and \
                    (1 + DEEPER_GAIN / 2) * self.before <= opportunistic < (1 + DEEPER_GAIN) * self.before:
                self.first = opportunistic  # a gain, too small to tell from the noise: judged again DEEPEN_S on
                return Verdict(Move.LONGER, f"production holds: {self._against(opportunistic)}: too close to the "
                                            f"{DEEPER_GAIN:.0%} gain a deeper bound needs to tell, tried {DEEPEN_S:g} s more")
            twice = ""
            if self.first is not None:  # (a deeper trial's)
                opportunistic, twice = (self.first + opportunistic) / 2, f" (two readings {DEEPEN_S:g} s apart)"
            if self.deeper and opportunistic < (1 + DEEPER_GAIN) * self.before:
                why = f"{self._against(opportunistic, twice)}: back to {self.held}"
                self._fail_deeper(t)
                return Verdict(Move.BACK, why)
            if self.deeper:
                self.deepen.succeeded()
            self.held, self.calm_since = self.kernels, self.trying_since  # the trial was calm
            self.trying_since = None
            self.retry.succeeded()
        if self.retry.waiting:
            if self.kernels != 1 or not self.retry.over(t):
                return Verdict(Move.NONE)
            self.retry.stop()
            self._set(t, self.held, trial=True)
            return Verdict(Move.TRIED)
        if self.calm_since is None:
            self.calm_since = t
        if 0 < self.kernels < self.deepest and t - self.calm_since >= DEEPEN_S and self.deepen.over(t):
            self.before = opportunistic
            self._set(t, min(2 * self.kernels, self.deepest), trial=True)
            return Verdict(Move.TRIED)
        return Verdict(Move.NONE)

    @property
    def _trial_s(self) -> float:
        """How long the trial under way lasts before it is judged: TRY_S, a deeper one
        DEEPEN_S, or twice that where its first reading was too close to tell (`first`)."""
        if not self.deeper:
            return TRY_S
        return DEEPEN_S if self.first is None else 2 * DEEPEN_S

    def _against(self, opportunistic: float, how: str = "") -> str:
        """A deeper trial's reading against the bound held, for the decision log."""
        return (f"opportunistic work at {opportunistic:,.0f} blocks/s under in-flight bound {self.kernels}{how}, "
                f"{self.before:,.0f} under {self.held}")

    def _fail_deeper(self, t: float) -> None:
        """A deeper trial failed (harm, or opportunistic work gained too little by it): back
        to the bound held, and the next deeper trial waits twice as long."""
        self.deepen.wait(t, failed=True)
        self._set(t, self.held)

    def _set(self, t: float, kernels: int, trial: bool = False) -> None:
        self.kernels = kernels
        self.first = None
        self.trying_since = t if trial else None
        self.calm_since = None
