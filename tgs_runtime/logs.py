"""Logging for tgsd and the CLI: structlog, JSON lines on stdout under systemd (journald)
or when stdout is not a terminal, readable key=value on a terminal."""
from __future__ import annotations

import logging
import os
import sys

import structlog

from tgs_runtime.config import LogFormat

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def json_wanted(fmt: LogFormat) -> bool:
    if fmt == LogFormat.JSON:
        return True
    if fmt == LogFormat.CONSOLE:
        return False
    return bool(os.environ.get("JOURNAL_STREAM")) or not sys.stdout.isatty()


def configure(fmt: LogFormat = LogFormat.AUTO, level: str = "info") -> None:
    processors = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if json_wanted(fmt):
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer(sort_keys=False)]
    else:
        processors += [structlog.dev.ConsoleRenderer(colors=False, pad_event=28)]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
        cache_logger_on_first_use=False,
    )


def get(**bound) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger().bind(**bound)


class RepeatLimiter:
    """Whether a failure that repeats (every control period, say) should be logged now: the
    first time, whenever it changes, and then once every `every_s` seconds, with how many
    repeats were not logged in between. `ok()` ends a run of failures; the next logs at once."""

    def __init__(self, every_s: float = 60.0):
        self.every_s = every_s
        self.key: str | None = None
        self.logged_at = float("-inf")
        self.unlogged = 0

    def check(self, key: str, now: float) -> int | None:
        """None: do not log this one; else log it, saying this many were not logged before it."""
        if key != self.key or now - self.logged_at >= self.every_s:
            n, self.key, self.logged_at, self.unlogged = self.unlogged, key, now, 0
            return n
        self.unlogged += 1
        return None

    def ok(self) -> int | None:
        """It worked: None if nothing was failing, else the failures stopped now and this
        many went unlogged since the last line."""
        if self.key is None:
            return None
        n, self.key, self.logged_at, self.unlogged = self.unlogged, None, float("-inf"), 0
        return n
