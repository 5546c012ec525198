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
