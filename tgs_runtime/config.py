"""/etc/tgs/config.toml: one file for tgsd, tgs-runtime and tgs-hook (ARCHITECTURE.md,
"Config"). daemon/config.toml is the shipped default and documents every key.

Every error names the key, the value and what is allowed. Sections and keys not listed
here are refused, so a typo never silently does nothing."""
from __future__ import annotations

import enum
import os
import re
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from tgs_runtime.units import parse_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_PATH = Path("/etc/tgs/config.toml")


class ConfigError(ValueError):
    """A config file that cannot be used: the message names the key and what is allowed."""


class Controller(str, enum.Enum):
    FAST = "fast"
    TGS_PAPER = "tgs-paper"


class Share(str, enum.Enum):
    FAIR = "fair"
    LAS = "las"


class LogFormat(str, enum.Enum):
    AUTO = "auto"
    JSON = "json"
    CONSOLE = "console"


class ProductionPolicy(str, enum.Enum):
    ANY = "any"                # -e TGS_CLASS=production (or the annotation) is enough
    ANNOTATION = "annotation"  # only the tgs.class annotation, which an image cannot set


@dataclass(frozen=True)
class Amount:
    """A memory amount: bytes, or a fraction of something (the GPU's memory, the budget)."""

    text: str
    bytes: int | None = None
    fraction: float | None = None

    def of(self, whole: int) -> int:
        return self.bytes if self.bytes is not None else int(whole * (self.fraction or 0.0))


def parse_amount(key: str, value: Any) -> Amount:
    text = str(value).strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*%", text)
    if m and 0 <= float(m.group(1)) <= 100:
        return Amount(text, fraction=float(m.group(1)) / 100)
    try:
        return Amount(text, bytes=parse_size(text))
    except ValueError:
        raise ConfigError(f"{key} = {value!r}: expected a size (e.g. 40G, 512M) or a percentage (e.g. 90%)") from None


@dataclass(frozen=True)
class DaemonConfig:
    state_dir: Path = Path("/run/tgs")
    control_period_ms: int = 100
    log: LogFormat = LogFormat.AUTO
    log_level: str = "info"
    reservation_timeout_s: float = 60.0
    stale_ms: int = 2000


@dataclass(frozen=True)
class ControlConfig:
    controller: Controller = Controller.FAST
    share: Share = Share.FAIR
    tolerance: float = 0.03
    profile_s: float = 1.0
    reprofile_s: float = 60.0
    inflight: int = 2
    inflight_deepest: int = 8  # where production holds, the bound is tried twice as deep, up to this
    anticipate: bool = True
    floor_fraction: float = 0.1
    burst_ms: float = 20.0
    las_min_share: float = 0.05
    max_ranges: int = 65536
    max_messages_per_s: int = 20000


@dataclass(frozen=True)
class MemoryConfig:
    budget: Amount = Amount("100%", fraction=1.0)
    reserve: Amount = Amount("0", bytes=0)
    opportunistic_quota: Amount = Amount("100%", fraction=1.0)
    convert_production: bool = True
    orders: bool = True

    def budget_of(self, gpu_total: int) -> int:
        return max(0, min(self.budget.of(gpu_total), gpu_total) - self.reserve.of(gpu_total))


@dataclass(frozen=True)
class RuntimeConfig:
    # the first that exists: the NVIDIA runtime (GPUs from NVIDIA_VISIBLE_DEVICES, as with
    # --runtime=nvidia) where the NVIDIA Container Toolkit is installed, else runc
    # the NVIDIA runtime on PATH (the toolkit's packages), where the GPU Operator installs it, then runc
    lower_runtime: tuple[str, ...] = ("nvidia-container-runtime", "/usr/local/nvidia/toolkit/nvidia-container-runtime",
                                      "runc")
    shim_path: Path = Path("/usr/lib/tgs/libtgs.so")
    hook_path: Path = Path("/usr/bin/tgs-hook")
    default_class: str = ""
    production: ProductionPolicy = ProductionPolicy.ANY
    hook_timeout_s: int = 10


@dataclass(frozen=True)
class SimConfig:
    enabled: bool = False
    state: Path = Path("/dev/shm/simgpu.state")
    lib_dir: Path | None = None  # where libcuda.so.1 and libnvidia-ml.so.1 of simgpu are


@dataclass(frozen=True)
class Config:
    path: Path | None = None
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    sim: SimConfig = field(default_factory=SimConfig)


def _number(key: str, value: Any, lo: float, hi: float, integer: bool = False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{key} = {value!r}: expected {kind} from {lo:g} to {hi:g}")
    if not lo <= value <= hi:
        raise ConfigError(f"{key} = {value!r}: expected {'an integer' if integer else 'a number'} from {lo:g} to {hi:g}")
    return value


def _choice(key: str, value: Any, enum_type):
    try:
        return enum_type(value)
    except ValueError:
        allowed = ", ".join(repr(e.value) for e in enum_type)
        raise ConfigError(f"{key} = {value!r}: expected one of {allowed}") from None


def _one_of(key: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ConfigError(f"{key} = {value!r}: expected one of {', '.join(repr(a) for a in allowed)}")
    return value


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key} = {value!r}: expected true or false")
    return value


def _path(key: str, value: Any) -> Path:
    if not isinstance(value, str) or not value.startswith("/"):
        raise ConfigError(f"{key} = {value!r}: expected an absolute path")
    return Path(value)


def _string(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{key} = {value!r}: expected a string")
    return value


CLASSES = ("production", "opportunistic")

RULES: dict[str, dict[str, Any]] = {
    "daemon": {
        "state_dir": _path,
        "control_period_ms": lambda k, v: _number(k, v, 10, 1000, integer=True),
        "log": lambda k, v: _choice(k, v, LogFormat),
        "log_level": lambda k, v: _one_of(k, v, ("debug", "info", "warning", "error")),
        "reservation_timeout_s": lambda k, v: float(_number(k, v, 1, 3600)),
        "stale_ms": lambda k, v: _number(k, v, 200, 60000, integer=True),
    },
    "control": {
        "controller": lambda k, v: _choice(k, v, Controller),
        "share": lambda k, v: _choice(k, v, Share),
        "tolerance": lambda k, v: float(_number(k, v, 0.001, 0.5)),
        "profile_s": lambda k, v: float(_number(k, v, 0.1, 1.0)),
        "reprofile_s": lambda k, v: float(_number(k, v, 5, 3600)),
        "inflight": lambda k, v: _number(k, v, 0, 64, integer=True),
        "inflight_deepest": lambda k, v: _number(k, v, 0, 64, integer=True),
        "anticipate": _bool,
        "floor_fraction": lambda k, v: float(_number(k, v, 0, 1)),
        "burst_ms": lambda k, v: float(_number(k, v, 1, 1000)),
        "las_min_share": lambda k, v: float(_number(k, v, 0, 0.5)),
        "max_ranges": lambda k, v: _number(k, v, 16, 10_000_000, integer=True),
        "max_messages_per_s": lambda k, v: _number(k, v, 10, 10_000_000, integer=True),
    },
    "memory": {
        "budget": parse_amount,
        "reserve": parse_amount,
        "opportunistic_quota": parse_amount,
        "convert_production": _bool,
        "orders": _bool,
    },
    "runtime": {
        "lower_runtime": lambda k, v: _runtimes(k, v),
        "shim_path": _path,
        "hook_path": _path,
        "default_class": lambda k, v: _class_or_empty(k, v),
        "production": lambda k, v: _choice(k, v, ProductionPolicy),
        "hook_timeout_s": lambda k, v: _number(k, v, 1, 120, integer=True),
    },
    "sim": {
        "enabled": _bool,
        "state": _path,
        "lib_dir": _path,
    },
}


def _runtimes(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(x, str) and x for x in value):
        raise ConfigError(f"{key} = {value!r}: expected a runtime name or path, or a list of them (e.g. [\"runc\"])")
    return tuple(value)


def _class_or_empty(key: str, value: Any) -> str:
    if value not in ("",) + CLASSES:
        raise ConfigError(f"{key} = {value!r}: expected \"\", \"production\" or \"opportunistic\"")
    return value


SECTIONS = {"daemon": DaemonConfig, "control": ControlConfig, "memory": MemoryConfig, "runtime": RuntimeConfig,
            "sim": SimConfig}


def from_dict(data: dict, path: Path | None = None) -> Config:
    cfg = Config(path=path)
    for section, values in data.items():
        if section not in SECTIONS:
            raise ConfigError(f"[{section}]: unknown section (expected one of {', '.join(SECTIONS)})")
        if not isinstance(values, dict):
            raise ConfigError(f"{section} = {values!r}: expected a [{section}] table")
        rules = RULES[section]
        known = {f.name for f in fields(SECTIONS[section])}
        parsed = {}
        for key, value in values.items():
            if key not in rules:
                raise ConfigError(f"{section}.{key}: unknown key (expected one of {', '.join(sorted(known))})")
            parsed[key] = rules[key](f"{section}.{key}", value)
        cfg = replace(cfg, **{section: replace(getattr(cfg, section), **parsed)})
    if cfg.sim.enabled and cfg.sim.lib_dir is None:
        from tgs_runtime.paths import artifacts

        cfg = replace(cfg, sim=replace(cfg.sim, lib_dir=artifacts().simgpu_dir))
    return cfg


def load(path: Path | str | None = None, named: bool | None = None) -> Config:
    """The config at `path`, else $TGS_CONFIG, else /etc/tgs/config.toml; defaults if that
    default file does not exist (a named file must; `named` says whether `path` was named,
    for a caller that resolved the default itself)."""
    if named is None:
        named = path is not None or bool(os.environ.get("TGS_CONFIG"))
    p = Path(path) if path is not None else Path(os.environ.get("TGS_CONFIG") or DEFAULT_PATH)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        if named:
            raise ConfigError(f"{p}: no such config file") from None
        return Config()
    except OSError as e:
        raise ConfigError(f"{p}: cannot read it: {e.strerror}") from None
    try:
        data = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from None
    try:
        return from_dict(data, p)
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None


def changes(old: Config, new: Config) -> dict[str, tuple[Any, Any]]:
    """Keys whose value differs, as "section.key" -> (old, new)."""
    out = {}
    for section in SECTIONS:
        a, b = getattr(old, section), getattr(new, section)
        for f in fields(a):
            if getattr(a, f.name) != getattr(b, f.name):
                out[f"{section}.{f.name}"] = (getattr(a, f.name), getattr(b, f.name))
    return out


# What a running tgsd can change on SIGHUP; the rest needs a restart.
LIVE = {"daemon.control_period_ms", "daemon.log_level", "daemon.reservation_timeout_s", "daemon.stale_ms"} | {
    f"control.{f.name}" for f in fields(ControlConfig)} | {f"memory.{f.name}" for f in fields(MemoryConfig)} | {
    f"runtime.{f.name}" for f in fields(RuntimeConfig)}
