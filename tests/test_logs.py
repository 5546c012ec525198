"""Logging helpers: a failure that repeats every control period is logged once a minute."""
from __future__ import annotations

from tgs_runtime.logs import RepeatLimiter


def test_a_repeating_failure_is_logged_once_a_minute_with_what_was_left_out():
    r = RepeatLimiter(every_s=60)
    assert r.check("KeyError: 'x'", 0.0) == 0, "the first one is logged"
    assert [r.check("KeyError: 'x'", t / 10) for t in range(1, 600)] == [None] * 599, "ten a second, for a minute"
    assert r.check("KeyError: 'x'", 60.0) == 599, "then one line saying how many were not"
    assert r.check("OSError: gone", 60.1) == 0, "a different failure is logged at once"
    r.check("OSError: gone", 60.2)
    assert r.ok() == 1, "when periods work again: how many went unlogged"
    assert r.ok() is None, "nothing was failing"
    assert r.check("OSError: gone", 60.3) == 0, "and the next failure is logged at once"
