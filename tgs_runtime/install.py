"""Installing TGS on a host: the files container specs embed, at stable paths (never inside
a virtualenv), docker's configuration (containerd's is in containerd_config.py), and the
one way every file is replaced. `tgs setup` and `tgs doctor` use this; `prefix` lets tests
install into a directory instead of /."""
from __future__ import annotations

import difflib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tgs_runtime.paths import REPO_ROOT, artifacts

CONFIG = Path("/etc/tgs/config.toml")
DAEMON_JSON = Path("/etc/docker/daemon.json")
RUNTIME_NAME = "tgs"


class InstallError(RuntimeError):
    """Setting up cannot go on; the message says what is wrong and what to do."""


@dataclass(frozen=True)
class Layout:
    prefix: Path = Path("/")

    def at(self, path: Path | str) -> Path:
        return self.prefix / str(path).lstrip("/")

    @property
    def shim(self) -> Path:
        return Path("/usr/lib/tgs/libtgs.so")

    @property
    def runtime(self) -> Path:
        return Path("/usr/bin/tgs-runtime")

    @property
    def runtime_create(self) -> Path:
        return Path("/usr/bin/tgs-runtime-create")

    @property
    def hook(self) -> Path:
        return Path("/usr/bin/tgs-hook")

    @property
    def tgsd(self) -> Path:
        return Path("/usr/bin/tgsd")

    @property
    def unit(self) -> Path:
        return Path("/etc/systemd/system/tgsd.service")


def _script(module: str, func: str = "main") -> str:
    """A launcher for this Python, wherever the package is installed."""
    return f"#!{sys.executable} -I\nfrom {module} import {func}\n{func}()\n"


def fast_script(module: str, func: str = "main") -> str:
    """A launcher that skips site initialisation (-S): tgs-runtime-create may run on a
    container's create path and needs only the standard library and this package, found
    at the path it is installed in now."""
    import tgs_runtime

    where = Path(tgs_runtime.__file__).resolve().parent.parent
    return (f"#!{sys.executable} -IS\nimport sys\nsys.path.insert(0, {str(where)!r})\n"
            f"from {module} import {func}\n{func}()\n")


@dataclass(frozen=True)
class Action:
    path: Path          # where it goes (inside the prefix)
    source: Path | None  # a file to copy
    text: str | None    # or content to write
    mode: int
    keep_existing: bool = False

    def describe(self) -> str:
        what = f"copy {self.source}" if self.source else "write"
        return f"{what} -> {self.path}" + (" (only if missing)" if self.keep_existing else "")


def file_actions(layout: Layout) -> list[Action]:
    a = artifacts()
    for f in (a.shim, a.root / "tgs-runtime", a.root / "tgs-hook"):
        a.require(f)
    return [
        Action(layout.at(layout.shim), a.shim, None, 0o755),
        Action(layout.at(layout.runtime), a.root / "tgs-runtime", None, 0o755),
        Action(layout.at(layout.runtime_create), None, fast_script("tgs_runtime.runtime.main"), 0o755),
        Action(layout.at(layout.hook), a.root / "tgs-hook", None, 0o755),
        Action(layout.at(layout.tgsd), None, _script("tgs_runtime.daemon.main"), 0o755),
        Action(layout.at(CONFIG), REPO_ROOT / "daemon" / "config.toml", None, 0o644, keep_existing=True),
        Action(layout.at(layout.unit), REPO_ROOT / "daemon" / "tgsd.service", None, 0o644),
    ]


def replaceable(path: Path) -> Path:
    """Where a new `path` is written: the file a symlink points to. A directory, a device
    (`--daemon-json /dev/null`) or any other non-file is never replaced."""
    target = path.resolve() if path.is_symlink() else path
    if target.exists() and not target.is_file():
        raise InstallError(f"{path} is not a regular file: it would be replaced by one, so it is left alone; "
                           "nothing was changed")
    return target


def replace_file(path: Path, write: Callable[[Path], object], mode: int | None = None) -> None:
    """Replaces `path` at once (`write` fills a temporary file beside it), keeping the old
    file's mode unless `mode` is given."""
    target = replaceable(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tgs-new")
    write(tmp)
    if mode is not None:
        os.chmod(tmp, mode)
    elif target.exists():
        shutil.copymode(target, tmp)
    os.replace(tmp, target)


def apply_files(actions: list[Action]) -> None:
    for act in actions:
        replaceable(act.path)
    for act in actions:
        if act.keep_existing and act.path.exists():
            continue
        if act.source:
            replace_file(act.path, lambda tmp, src=act.source: shutil.copyfile(src, tmp), act.mode)
        else:
            replace_file(act.path, lambda tmp, text=act.text: tmp.write_text(text or ""), act.mode)


def remove_files(layout: Layout) -> list[Path]:
    removed = []
    for p in (layout.runtime, layout.runtime_create, layout.hook, layout.tgsd, layout.shim, layout.unit):
        target = layout.at(p)
        if target.exists():
            target.unlink()
            removed.append(target)
    return removed


# ------------------------------------------------------------------ docker

def read_daemon_json(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text() or "{}")
    except ValueError as e:
        raise InstallError(f"{path} is not valid JSON ({e}): fix it first; nothing was changed") from None
    if not isinstance(data, dict):
        raise InstallError(f"{path} is not a JSON object: fix it first; nothing was changed")
    return data


def docker_entry(layout: Layout, config: Path) -> dict:
    """daemon.json's tgs runtime. The default config needs no `runtimeArgs` (tgs-runtime
    reads /etc/tgs/config.toml unless told otherwise), and without them dockerd (20.10 at
    least) execs tgs-runtime itself: a runtime with `runtimeArgs` is run through a
    `#!/bin/sh` script dockerd writes (`... $@`, unquoted: an argument with a space in it
    is split), one more program started on each of a container's four runtime calls."""
    if config == CONFIG:
        return {"path": str(layout.runtime)}
    return {"path": str(layout.runtime), "runtimeArgs": ["--tgs-config", str(config)]}


def with_runtime(data: dict, entry: dict | None) -> dict:
    """daemon.json with the tgs runtime set (or removed), every other key kept."""
    out = json.loads(json.dumps(data))
    runtimes = out.setdefault("runtimes", {})
    if not isinstance(runtimes, dict):
        raise InstallError("daemon.json's \"runtimes\" is not an object: fix it first; nothing was changed")
    if entry is None:
        runtimes.pop(RUNTIME_NAME, None)
        if not runtimes:
            out.pop("runtimes")
    else:
        runtimes[RUNTIME_NAME] = entry
    return out


def render(data: dict) -> str:
    return json.dumps(data, indent=2) + "\n"


def diff(path: Path, old: dict, new: dict) -> str:
    a = render(old).splitlines(keepends=True) if path.exists() else []
    return "".join(difflib.unified_diff(a, render(new).splitlines(keepends=True), str(path), str(path) + " (new)"))


def write_daemon_json(path: Path, old: dict, new: dict) -> Path | None:
    """Writes atomically; the previous file is kept beside it. Returns the backup."""
    backup = None
    target = replaceable(path)
    if target.exists():
        backup = target.with_name(f"{target.name}.tgs-backup-{time.strftime('%Y%m%d-%H%M%S')}")
        shutil.copy2(target, backup)
    replace_file(target, lambda tmp: tmp.write_text(render(new)))
    return backup
