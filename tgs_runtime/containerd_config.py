"""containerd's config and the tgs runtime handler in it (a Kubernetes RuntimeClass `tgs`),
for `tgs setup containerd` and `tgs doctor`.

Where containerd reads a CRI runtime handler depends on the config's `version`, and a
handler written for another version is silently ignored (the pods of RuntimeClass tgs then
fail with "no runtime for tgs is configured"):
  1  no `version` line, containerd 1.x's first format: short plugin names, `plugins.cri`
  2  containerd 1.3 to 1.7: `plugins."io.containerd.grpc.v1.cri"`
  3  containerd 2.x: `plugins."io.containerd.cri.v1.runtime"`
containerd 2 reads versions 1 and 2 too, migrating them when it starts; one file has one
version. A config may import others (`imports`, globs; containerd 2.2 and later also
import conf.d/*.toml beside the main config of themselves), each read with its own version;
newer releases do not load an imported file of a higher version than the main config."""
from __future__ import annotations

import fnmatch
import functools
import glob
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tgs_runtime.install import InstallError, replace_file, replaceable
from tgs_runtime.runtime.spec import CLASS_ANNOTATION, CONVERT_ANNOTATION, NVIDIA_CDI_ANNOTATION

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

CONTAINERD_TOML = Path("/etc/containerd/config.toml")
HANDLER = "tgs"
CRI_RUNTIME_PLUGIN = {1: "cri", 2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
# the runtime's own annotations, and the NVIDIA device plugin's CDI annotations for the NVIDIA
# runtime (which name the pod's GPUs where containerd does not inject CDI devices itself)
POD_ANNOTATIONS = [CLASS_ANNOTATION, CONVERT_ANNOTATION]
CONTAINER_ANNOTATIONS = [*POD_ANNOTATIONS, f"{NVIDIA_CDI_ANNOTATION}*"]


class ContainerdConfigError(InstallError):
    """The config cannot be read or changed; the message says what is wrong and what to do."""


def _table(data: dict, *keys: str) -> dict | None:
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class ContainerdConfig:
    path: Path
    text: str
    version: int
    handlers: dict[str, dict]  # CRI plugin -> the tgs handler under it (one, where all is well)
    imports: tuple[str, ...] = ()
    cri: dict | None = None  # the CRI runtime plugin's own settings, where this file has them
    empty: bool = False  # nothing set (absent, blank or only comments): any version may be chosen for it

    @classmethod
    def read(cls, path: Path) -> "ContainerdConfig":
        """The config at `path` (an absent file reads as an empty one)."""
        try:
            text = path.read_text() if path.exists() else ""
        except (OSError, UnicodeDecodeError) as e:
            raise ContainerdConfigError(f"{path} cannot be read ({e})") from None
        return cls.parse(path, text)

    @classmethod
    def parse(cls, path: Path, text: str) -> "ContainerdConfig":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ContainerdConfigError(f"{path} cannot be read as TOML ({e})") from None
        version = data.get("version", 1)
        if version not in CRI_RUNTIME_PLUGIN:
            raise ContainerdConfigError(f"{path} has version = {version!r}: containerd's configs are versions "
                                        f"{', '.join(map(str, CRI_RUNTIME_PLUGIN))}")
        handlers = {plugin: h for plugin in CRI_RUNTIME_PLUGIN.values()
                    if (h := _table(data, "plugins", plugin, "containerd", "runtimes", HANDLER)) is not None}
        imports = data.get("imports", [])
        if not isinstance(imports, list) or not all(isinstance(i, str) for i in imports):
            raise ContainerdConfigError(f"{path} has imports = {imports!r}: expected a list of paths")
        cri = _table(data, "plugins", CRI_RUNTIME_PLUGIN[version])
        return cls(path, text, version, handlers, tuple(imports), cri, not data)

    def import_patterns(self, conf_d: bool) -> list[str]:
        """What this config imports, in containerd's order: its `imports` (globs, relative to
        its directory), then with `conf_d` (containerd 2.2 and later) conf.d/*.toml."""
        patterns = [os.path.normpath(self.path.parent / i) for i in self.imports]
        if conf_d:
            patterns.append(str(self.path.parent / "conf.d" / "*.toml"))
        return patterns

    def imports_file(self, path: Path, conf_d: bool) -> bool:
        """Whether `path` (which need not exist yet) is among the files this config imports."""
        return any(fnmatch.fnmatch(os.path.normpath(path), p) for p in self.import_patterns(conf_d))

    def imported(self, conf_d: bool) -> list[Path]:
        """The files this config imports that exist, in containerd's order."""
        seen: dict[Path, None] = {}
        for pattern in self.import_patterns(conf_d):
            for found in sorted(glob.glob(pattern)):
                seen.setdefault(Path(found), None)
        return [p for p in seen if p != self.path]

    @property
    def plugin(self) -> str:
        return CRI_RUNTIME_PLUGIN[self.version]

    @property
    def handler(self) -> dict | None:
        """The tgs handler where containerd reads it for this config's version."""
        return self.handlers.get(self.plugin)

    def misplaced(self) -> list[str]:
        """The plugins holding a tgs handler that containerd does not read from this version."""
        return [p for p in self.handlers if p != self.plugin]


@functools.cache
def installed_release() -> tuple[int, int] | None:
    """The installed containerd's major and minor release, None where it is not installed."""
    try:
        out = subprocess.run(["containerd", "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"\sv?(\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def imports_conf_d(release: tuple[int, int] | None) -> bool:
    """Whether containerd imports conf.d/*.toml beside its main config without being told."""
    return release is not None and release >= (2, 2)


@functools.cache
def installed_version() -> int | None:
    """The config version of the installed containerd (its `config default`): 3 for
    containerd 2, 2 for 1.x; None where containerd is not installed."""
    try:
        out = subprocess.run(["containerd", "config", "default"], capture_output=True, text=True, timeout=20)
        version = tomllib.loads(out.stdout).get("version", 1) if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, tomllib.TOMLDecodeError):
        return None
    return version if version in CRI_RUNTIME_PLUGIN else None


def new_file_version(main: ContainerdConfig | None) -> int:
    """The version a new file gets: the main config's (an imported file of a higher version
    is not loaded), else the installed containerd's, else 2."""
    return (main.version if main and not main.empty else None) or installed_version() or 2


def stanza(version: int, runtime: Path, config: Path, systemd: bool = False) -> str:
    """The tgs runtime handler for a config of `version` (`systemd`: the default runtime's
    SystemdCgroup, which it must share)."""
    table = f'plugins."{CRI_RUNTIME_PLUGIN[version]}".containerd.runtimes.{HANDLER}'
    return f"""
# TGS: a runtime handler for containerd's CRI (Kubernetes RuntimeClass handler "tgs"), for a
# containerd config of version {version}. The tgs.class and tgs.convert-memory annotations are
# passed through to the runtime, and the NVIDIA device plugin's CDI annotations for the NVIDIA
# runtime (which name the pod's GPUs where containerd does not inject CDI devices itself).
[{table}]
  runtime_type = "io.containerd.runc.v2"
  pod_annotations = {_list(POD_ANNOTATIONS)}
  container_annotations = {_list(CONTAINER_ANNOTATIONS)}
  [{table}.options]
    BinaryName = "{runtime}"{chr(10) + "    SystemdCgroup = true" if systemd else ""}
    # containerd's runc shim passes no extra arguments: tgs-runtime reads {config} (or $TGS_CONFIG)
"""


def _list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{i}"' for i in items) + "]"


def _misplaced(conf: ContainerdConfig) -> tuple[str, str]:
    """What is wrong with a tgs handler under another version's plugin, and the fix."""
    wrong = conf.misplaced()[0]
    return (f"it is under plugins.\"{wrong}\", which containerd does not read from a version {conf.version} config "
            f"(it reads plugins.\"{conf.plugin}\")", f"remove the [plugins.\"{wrong}\".containerd.runtimes.tgs] "
            f"section and its .options, then tgs setup containerd --write {conf.path}")


@dataclass(frozen=True)
class HandlerChange:
    path: Path
    text: str | None  # the file's new text; None: nothing to change
    message: str


def add_handler(path: Path, runtime: Path, config: Path, version: int | None = None,
                main: Path = CONTAINERD_TOML) -> HandlerChange:
    """The config at `path` (the main config `main`, or a file it imports) with the tgs
    handler added for that file's version, and what that does; nothing is written here. An
    empty or absent file gets `version`, else the main config's (an imported file of a
    higher version is not loaded), else the installed containerd's, else 2, at its top.
    Raises where it cannot be done right."""
    replaceable(path)
    conf = ContainerdConfig.read(path)
    root = ContainerdConfig.read(main) if path.resolve() != main.resolve() else None
    release = installed_release()
    imported = root is not None and root.imports_file(path, imports_conf_d(release))
    if imported and (release is None or release < (2, 0)):
        raise ContainerdConfigError(f"{main} imports {path}, and {_merge_problem(release, main)}: add "
                                    f"the handler to {main} itself (tgs setup containerd --write {main})")
    systemd = systemd_cgroup(configs(main, release) + ([] if imported or root is None else [conf]))
    written = conf.version
    if conf.empty:
        written = version or new_file_version(root)
        text = f"version = {written}\n{conf.text}{stanza(written, runtime, config, systemd)}"
    else:
        if version and version != conf.version:
            raise ContainerdConfigError(f"{path} is a version {conf.version} config, not {version}")
        if conf.misplaced():
            raise ContainerdConfigError("{}'s tgs runtime handler: {}: {}".format(path, *_misplaced(conf)))
        if conf.handler is not None:
            return HandlerChange(path, None, f"{path} already has the tgs runtime handler")
        text = conf.text + ("" if conf.text.endswith("\n") else "\n") + stanza(conf.version, runtime, config, systemd)
    message = f"the tgs runtime handler in {path} (plugins.\"{CRI_RUNTIME_PLUGIN[written]}\", version {written})"
    if root and not root.empty and not imported:
        message += (f"\nnote: {main} does not import {path}, so containerd will not read it: add it to that "
                    "file's imports (containerd 2.2 and later import conf.d/*.toml beside it themselves)")
    return HandlerChange(path, text, message)


# the handler as tgs setup containerd writes it (this version and those before it)
WRITTEN = re.compile(r"\n# TGS: a runtime handler for containerd's CRI.*?\n    # containerd's runc shim passes no "
                     r"extra arguments:[^\n]*\n", re.DOTALL)


def remove_handler(path: Path) -> HandlerChange:
    """The config at `path` without the tgs handler that tgs setup containerd wrote there."""
    replaceable(path)
    conf = ContainerdConfig.read(path)
    if not conf.handlers:
        return HandlerChange(path, None, f"{path} has no tgs runtime handler")
    text = WRITTEN.sub("", conf.text)
    left = ContainerdConfig.parse(path, text)
    if left.handlers:
        plugin = next(iter(left.handlers))
        raise ContainerdConfigError(f"{path} has a tgs runtime handler that tgs setup did not write: remove its "
                                    f"[plugins.\"{plugin}\".containerd.runtimes.tgs] section and its .options by hand")
    return HandlerChange(path, text, f"the tgs runtime handler from {path}")


def write(change: HandlerChange) -> None:
    if change.text is not None:
        replace_file(change.path, lambda tmp: tmp.write_text(change.text))


def _merge_problem(release: tuple[int, int] | None, main: Path) -> str:
    if release is None:
        return "containerd is not installed here, so how it would merge an imported file cannot be told"
    return (f"containerd {release[0]}.{release[1]} merges an imported file's plugin sections whole (before 2.0), "
            f"so a file holding the tgs handler would drop the other CRI settings of {main} (its runtimes, "
            "sandbox image, CNI)")


def configs(main: Path, release: tuple[int, int] | None) -> list[ContainerdConfig]:
    """The main config, then the files it imports, in the order containerd merges them."""
    root = ContainerdConfig.read(main)
    return [root] + [ContainerdConfig.read(p) for p in root.imported(imports_conf_d(release))]


def systemd_cgroup(files: list[ContainerdConfig]) -> bool:
    """Whether the default runtime (runc, unless default_runtime_name names another) has
    systemd manage its cgroups: what kubelet's cgroup driver must match, so every handler
    must share it (pods of a handler that differs fail to start or run unmanaged)."""
    name, systemd = "runc", False
    for conf in files:
        name = (_table(conf.cri, "containerd") or {}).get("default_runtime_name", name)
    for conf in files:
        options = _table(conf.cri, "containerd", "runtimes", name, "options")
        if options is not None and "SystemdCgroup" in options:
            systemd = bool(options["SystemdCgroup"])
    return systemd


def check_placement(conf: ContainerdConfig, root: ContainerdConfig,
                    release: tuple[int, int] | None) -> list[tuple[str, str]]:
    """What keeps containerd from using a tgs handler in `conf`, a file `root` imports."""
    if conf.path == root.path:
        return []
    redo = f"remove {conf.path}, then tgs setup containerd --write {root.path}"
    if release is None or release < (2, 0):
        return [(f"it is in a file {root.path} imports, and {_merge_problem(release, root.path)}", redo)]
    if not root.empty and conf.version > root.version:
        return [(f"its file is version {conf.version}, above {root.path}'s {root.version}: newer containerd releases "
                 "do not load it", f"remove {conf.path}, then tgs setup containerd --containerd-config {root.path} "
                 f"--write {conf.path}")]
    return []


def cdi_off(main: Path, release: tuple[int, int] | None) -> tuple[str, str] | None:
    """Why containerd would not put CDI devices (the device plugin's GPUs) into containers,
    and the fix; None where it would, or where no containerd is installed to tell."""
    if release is None:
        return None
    name = f"containerd {release[0]}.{release[1]}"
    if release < (1, 7):
        return (f"{name} has no CDI (1.7 and later have)", "upgrade containerd, or let the NVIDIA runtime put the "
                "GPUs in: it is tgs-runtime's lower runtime where installed ([runtime] lower_runtime)")
    files = configs(main, release)
    enabled = release >= (2, 0)  # enable_cdi's default
    for conf in files:
        enabled = bool((conf.cri or {}).get("enable_cdi", enabled))
    if enabled:
        return None
    return (f"{name} has CDI off", f"set enable_cdi = true in [plugins.\"{files[0].plugin}\"] of {main}, then "
            "restart containerd")


def check_handler(conf: ContainerdConfig, systemd: bool) -> list[tuple[str, str]]:
    """What is wrong with the tgs handler in `conf`, and how to fix each (for tgs doctor):
    nothing where it is where containerd reads it, runs an installed tgs-runtime, passes
    the tgs.class annotation through and has SystemdCgroup as the default runtime does
    (`systemd`)."""
    again = f"tgs setup containerd --write {conf.path}, then restart containerd"
    if conf.misplaced():
        problem, fix = _misplaced(conf)
        return [(problem, f"{fix}; restart containerd")]
    h = conf.handler or {}
    problems = []
    options = _table(h, "options") or {}
    binary = options.get("BinaryName")
    if not binary or not os.access(str(binary), os.X_OK):
        problems.append((f"its BinaryName ({binary or 'not set'}) is not an installed tgs-runtime",
                         f"remove the handler, then {again} (which installs tgs-runtime too)"))
    if bool(options.get("SystemdCgroup", False)) != systemd:
        problems.append((f"its SystemdCgroup is {str(not systemd).lower()}, the default runtime's "
                         f"{str(systemd).lower()}: with kubelet's cgroup driver set to match the default runtime, "
                         "pods of RuntimeClass tgs would not start or would run outside kubelet's cgroups",
                         f"set SystemdCgroup = {str(systemd).lower()} in its .options, then restart containerd"))
    if CLASS_ANNOTATION not in (h.get("pod_annotations") or []):
        problems.append(("its pod_annotations do not pass tgs.class through: pods could not ask for a class",
                         f"remove the handler, then {again}"))
    return problems
