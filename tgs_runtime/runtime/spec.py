"""What tgs-runtime changes in a TGS container's OCI spec (config.json), one modifier per
change, each a pure function of the spec (tests/test_runtime_spec.py checks each alone
against golden files). The spec is edited as plain data: fields TGS does not know survive.

Which containers ask for TGS, and as what, is decided here too (`classify`)."""
from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tgs_runtime import proto

SHIM_IN_CONTAINER = "/usr/lib/tgs/libtgs.so"
SIM_LIBS_IN_CONTAINER = "/usr/lib/tgs/simgpu"
PRELOAD = "/etc/ld.so.preload"
CLASS_ANNOTATION = "tgs.class"
CLASS_ENV = "TGS_CLASS"
CONVERT_ANNOTATION = "tgs.convert-memory"  # true|false: a production container's own choice of
CONVERT_ENV = "TGS_CONVERT_MEMORY"         # [memory] convert_production
GPU_ENV = "NVIDIA_VISIBLE_DEVICES"
NO_GPU = ("", "void", "none")  # NVIDIA_VISIBLE_DEVICES values that name no GPU
CDI_MARK = "void"  # what CDI sets NVIDIA_VISIBLE_DEVICES to, beside the device nodes it adds
DEVICE_LIST_DIR = "/var/run/nvidia-container-devices"  # the device plugin's volume-mounts strategy
GPU_MAJOR = 195            # the NVIDIA driver's character devices: /dev/nvidiaN is minor N,
GPU_MINORS = range(254)    # 254 and 255 are nvidia-modeset and nvidiactl
GPU_NODE = "/dev/nvidia{}"
MIG_CAPS_DIR = "/dev/nvidia-caps/"  # a MIG instance's access nodes, beside its parent GPU's
CDI_VENDOR = "nvidia.com"  # the device plugin names its own kind: k8s.device-plugin.nvidia.com/gpu
CDI_KIND = f"{CDI_VENDOR}/gpu"  # CDI's name for NVIDIA GPUs: nvidia.com/gpu=0, =GPU-<uuid>, =all
NVIDIA_CDI_ANNOTATION = "nvidia.cdi.k8s.io/"  # the device plugin's for the NVIDIA runtime in CDI mode
CDI_ANNOTATIONS = ("cdi.k8s.io/", NVIDIA_CDI_ANNOTATION)  # the device plugin's, for containerd or the NVIDIA runtime
SANDBOX_ANNOTATIONS = {
    "io.kubernetes.cri.container-type": "sandbox",     # containerd CRI
    "io.kubernetes.docker.type": "podsandbox",         # dockershim
    "io.kubernetes.cri-o.ContainerType": "sandbox",    # CRI-O
}
HOOK_PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

Spec = dict[str, Any]


class SpecError(ValueError):
    """The container cannot be set up as asked; the message is shown to the user."""


# ---------------------------------------------------------------------------- deciding

def env_value(spec: Spec, name: str) -> str | None:
    """The value a process would see (the last entry wins, as with execve)."""
    value = None
    for entry in (spec.get("process") or {}).get("env") or []:
        key, eq, v = str(entry).partition("=")
        if eq and key == name:
            value = v
    return value


def is_mig_instance(gpu: str) -> bool:
    """A MIG instance as NVIDIA_VISIBLE_DEVICES names one: its UUID, or GPU:instance."""
    gpu = gpu.strip()
    return gpu.startswith("MIG-") or (":" in gpu and all(x.isdigit() for x in gpu.split(":")))


def mig_refusal(what: str) -> str:
    return (f"{what} is a MIG instance: TGS shares whole GPUs (a MIG instance is isolated already); "
            "name a whole GPU, or run this container without a TGS class")


@dataclass(frozen=True)
class Gpus:
    """The GPUs a container's spec gives it, named as tgsd's reserve takes them."""

    names: list[str]
    mig: str = ""  # which of them is a MIG instance, where one is


def _device_nodes(spec: Spec) -> list[dict]:
    return [d for d in ((spec.get("linux") or {}).get("devices") or []) if isinstance(d, dict)]


def _cdi_annotated(spec: Spec) -> list[str]:
    """The devices the device plugin asked CDI for in annotations (kind=name, comma-separated)."""
    return [device for key, value in (spec.get("annotations") or {}).items() if str(key).startswith(CDI_ANNOTATIONS)
            for device in str(value).split(",")]


def _gpu_name(entry: str) -> tuple[str, bool] | None:
    """A GPU as reserve names it, and whether it is a MIG instance, from a name as
    NVIDIA_VISIBLE_DEVICES gives it or a CDI device's fully qualified name (`nvidia.com/gpu=0`,
    the device plugin's `k8s.device-plugin.nvidia.com/gpu=GPU-<uuid>`, toolkits before 1.14
    `nvidia.com/gpu=gpu0` and `=mig0:1`); None for no GPU or another vendor's device."""
    entry = entry.strip()
    if "=" not in entry:
        return None if entry in NO_GPU else (entry, is_mig_instance(entry))
    kind, _, name = entry.partition("=")
    vendor, _, cls = kind.partition("/")
    if not name or not (vendor == CDI_VENDOR or vendor.endswith("." + CDI_VENDOR)):
        return None
    if cls != "gpu" and not cls.startswith("mig"):
        return None
    for old in ("gpu", "mig"):  # the names of toolkits before 1.14
        if name.startswith(old) and name[len(old):len(old) + 1].isdigit():
            name = name[len(old):]
    return name, cls != "gpu" or is_mig_instance(name)


def gpus_of(spec: Spec, asked: bool = True) -> Gpus:
    """NVIDIA_VISIBLE_DEVICES, as the NVIDIA runtime (or docker's --gpus) reads it; the
    device plugin's list of mounts where it points there. Where it names no GPU (CDI sets it
    to void: docker --device nvidia.com/gpu=0, containerd or CRI-O with CDI), the CDI
    devices the device plugin annotated, else the GPU device nodes in the spec itself: for
    a container that did not ask for TGS, only beside CDI's void (a privileged container
    has every device node of the host, and is no GPU job for that)."""
    text = (env_value(spec, GPU_ENV) or "").strip()
    if text.rstrip("/") == DEVICE_LIST_DIR:
        listed = [str(m.get("destination", "")).rstrip("/") for m in spec.get("mounts") or [] if isinstance(m, dict)]
        return _named([posixpath.basename(d) for d in listed if posixpath.dirname(d) == DEVICE_LIST_DIR])
    if text not in NO_GPU:
        return _named(text.split(","))
    annotated = _named(_cdi_annotated(spec))
    if annotated.names or not (asked or text == CDI_MARK):
        return annotated
    nodes = _device_nodes(spec)
    names = list(dict.fromkeys(GPU_NODE.format(d["minor"]) for d in nodes if d.get("type") == "c"
                               and d.get("major") == GPU_MAJOR and d.get("minor") in GPU_MINORS))
    caps = [str(d.get("path")) for d in nodes if str(d.get("path", "")).startswith(MIG_CAPS_DIR)]
    return Gpus(names, mig=f"GPU {', '.join(names)} (with {caps[0]})" if names and caps else "")


def _named(entries: list[str]) -> Gpus:
    gpus = [g for g in map(_gpu_name, entries) if g]
    mig = [name for name, is_mig in gpus if is_mig]
    return Gpus(list(dict.fromkeys(name for name, _ in gpus)), mig=f"GPU {mig[0]!r}" if mig else "")


def is_sandbox(spec: Spec) -> bool:
    ann = spec.get("annotations") or {}
    return any(ann.get(k) == v for k, v in SANDBOX_ANNOTATIONS.items())


@dataclass(frozen=True)
class Request:
    cls: str
    gpus: list[str]
    convert: bool | None = None  # whether its device allocations become managed memory; None: the host's choice


def _convert(spec: Spec, cls: str) -> bool | None:
    """A container's own choice of whether its device allocations become managed memory
    (the tgs.convert-memory annotation wins over TGS_CONVERT_MEMORY); None: the host's."""
    annotation = (spec.get("annotations") or {}).get(CONVERT_ANNOTATION)
    text = annotation if annotation is not None else env_value(spec, CONVERT_ENV)
    if text is None or not text.strip():
        return None
    source = f"annotation {CONVERT_ANNOTATION}" if annotation is not None else CONVERT_ENV
    value = {"true": True, "false": False}.get(text.strip().lower())
    if value is None:
        raise SpecError(f"{source}={text!r}: expected true or false")
    if cls == "opportunistic" and not value:
        raise SpecError(f"{source}=false: an opportunistic container's GPU memory is always managed memory (it is "
                        "what lets tgsd move it to the host when production needs the GPU's memory); a job that "
                        "needs plain device memory (CUDA IPC) can run as production")
    return value


def classify(spec: Spec, default_class: str = "", production_policy: str = "any") -> Request | None:
    """The TGS class and GPUs the container asks for, or None for a container TGS leaves alone.
    The tgs.class annotation wins over TGS_CLASS; without either, GPU containers take the
    configured default class."""
    if is_sandbox(spec):
        return None
    annotation = (spec.get("annotations") or {}).get(CLASS_ANNOTATION)
    env = env_value(spec, CLASS_ENV)
    cls = (annotation or env or "").strip().lower()
    gpus = gpus_of(spec, asked=bool(cls))
    source = "annotation tgs.class" if annotation else f"{CLASS_ENV}"
    if not cls:  # MIG instances are isolated already: the default class leaves their containers alone
        if not default_class or not gpus.names or gpus.mig:
            return None
        cls, source = default_class, "[runtime] default_class"
    if cls not in ("production", "opportunistic"):
        raise SpecError(f"{source}={cls!r}: expected production or opportunistic")
    if cls == "production" and production_policy == "annotation" and not annotation:
        raise SpecError("production needs the annotation tgs.class=production on this host (config [runtime] "
                        "production = \"annotation\"); TGS_CLASS alone may come from the image")
    if not gpus.names:
        raise SpecError(f"this {cls} container needs a GPU: set {GPU_ENV} (e.g. -e {GPU_ENV}=0), or give it one "
                        "with --gpus or a CDI device (--device nvidia.com/gpu=0)")
    if gpus.mig:
        raise SpecError(mig_refusal(gpus.mig))
    return Request(cls, gpus.names, _convert(spec, cls))


# ---------------------------------------------------------------------------- changing

@dataclass(frozen=True)
class Setup:
    """Everything the modifiers need, from tgsd's reservation and the config."""

    cls: str
    gpus: list[str]                      # UUIDs
    container_dir: Path                  # <state_dir>/c/<id> on the host
    activity: dict[str, str]             # UUID -> host path of the GPU's activity file
    shim_path: Path
    hook_path: Path
    config_path: Path | None
    hook_timeout_s: int = 10
    sim_state: Path | None = None
    sim_lib_dir: Path | None = None
    preload_lines: list[str] = field(default_factory=list)  # the image's own /etc/ld.so.preload


def _editable(spec: Spec) -> Spec:
    """A copy of the spec that a modifier may change: new containers where modifiers change
    things (the spec, its mounts, process and env, hooks and each stage's list), shared
    entries (which are replaced, never changed). A deep copy in each modifier took 5 ms of
    every create (a 10 kB spec, seven modifiers)."""
    out = dict(spec)
    if isinstance(out.get("mounts"), list):
        out["mounts"] = list(out["mounts"])
    if isinstance(out.get("process"), dict):
        out["process"] = process = dict(out["process"])
        if isinstance(process.get("env"), list):
            process["env"] = list(process["env"])
    if isinstance(out.get("hooks"), dict):
        out["hooks"] = {stage: list(v) if isinstance(v, list) else v for stage, v in out["hooks"].items()}
    return out


def _mounts(spec: Spec) -> list:
    return spec.setdefault("mounts", [])


def _bind(spec: Spec, source: str, destination: str, *, ro: bool) -> None:
    mounts = _mounts(spec)
    mounts[:] = [m for m in mounts if m.get("destination") != destination]
    mounts.append({"destination": destination, "type": "bind", "source": source,
                   "options": ["rbind", "ro" if ro else "rw", "nosuid", "nodev"]})


def _set_env(spec: Spec, name: str, value: str) -> None:
    env = spec.setdefault("process", {}).setdefault("env", [])
    env[:] = [e for e in env if e.partition("=")[0] != name] + [f"{name}={value}"]


def mount_shim(spec: Spec, s: Setup) -> Spec:
    """libtgs.so, read-only, at the path the preload names."""
    spec = _editable(spec)
    _bind(spec, str(s.shim_path), SHIM_IN_CONTAINER, ro=True)
    return spec


def mount_container_dir(spec: Spec, s: Setup) -> Spec:
    """The container's own directory (socket, control block) at /run/tgs."""
    spec = _editable(spec)
    _bind(spec, str(s.container_dir), proto.CONTAINER_DIR, ro=False)
    return spec


def preload(spec: Spec, s: Setup) -> Spec:
    """Every dynamically linked glibc process loads the shim: /etc/ld.so.preload, holding
    the shim and then whatever the image's own file holds. glibc's loader alone reads that
    file, so static and musl binaries are untouched (an LD_PRELOAD variable would break
    musl ones). The combined file is written into the container's directory."""
    spec = _editable(spec)
    lines = [SHIM_IN_CONTAINER] + [l for l in s.preload_lines if l and l != SHIM_IN_CONTAINER]
    target = s.container_dir / "ld.so.preload"
    target.write_text("\n".join(lines) + "\n")
    _bind(spec, str(target), PRELOAD, ro=True)
    return spec


def hooks(spec: Spec, s: Setup) -> Spec:
    """createRuntime: attach (tgsd learns the init pid); poststop: deregister. Absolute
    paths, an explicit PATH and a timeout; inserted once however often this runs."""
    spec = _editable(spec)
    all_hooks = spec.setdefault("hooks", {})
    base = ["tgs-hook"] + (["--tgs-config", str(s.config_path)] if s.config_path else [])
    for stage, arg in (("createRuntime", "createRuntime"), ("poststop", "poststop")):
        entries = all_hooks.setdefault(stage, [])
        entries[:] = [h for h in entries if h.get("path") != str(s.hook_path)]
        entries.append({"path": str(s.hook_path), "args": base + [arg], "env": [HOOK_PATH_ENV],
                        "timeout": s.hook_timeout_s})
    return spec


def environment(spec: Spec, s: Setup) -> Spec:
    """The class as TGS decided it, and where the container's directory is."""
    spec = _editable(spec)
    _set_env(spec, CLASS_ENV, s.cls)
    _set_env(spec, "TGS_DIR", proto.CONTAINER_DIR)
    return spec


def mount_activity(spec: Spec, s: Setup) -> Spec:
    """Each GPU's production activity file: writable for production, read-only otherwise."""
    spec = _editable(spec)
    for uuid in s.gpus:
        _bind(spec, s.activity[uuid], f"{proto.CONTAINER_DIR}/{proto.ACTIVITY_DIR}/{uuid}",
              ro=s.cls != "production")
    return spec


def simgpu(spec: Spec, s: Setup) -> Spec:
    """With [sim]: simgpu's libraries and state file, the way the NVIDIA runtime injects the
    real driver, and only the container's GPUs visible."""
    if not s.sim_state or not s.sim_lib_dir:
        return spec
    spec = _editable(spec)
    for lib in ("libcuda.so.1", "libnvidia-ml.so.1"):
        _bind(spec, str(Path(s.sim_lib_dir) / lib), f"{SIM_LIBS_IN_CONTAINER}/{lib}", ro=True)
    _bind(spec, str(s.sim_state), str(s.sim_state), ro=False)
    old = [p for p in (env_value(spec, "LD_LIBRARY_PATH") or "").split(":") if p and p != SIM_LIBS_IN_CONTAINER]
    _set_env(spec, "LD_LIBRARY_PATH", ":".join([SIM_LIBS_IN_CONTAINER, *old]))
    _set_env(spec, "SIMGPU_STATE", str(s.sim_state))
    _set_env(spec, "SIMGPU_VISIBLE_DEVICES", ",".join(s.gpus))
    return spec


MODIFIERS = [mount_shim, mount_container_dir, mount_activity, preload, hooks, environment, simgpu]


def apply(spec: Spec, s: Setup) -> Spec:
    for modify in MODIFIERS:
        spec = modify(spec, s)
    return spec


# ---------------------------------------------------------------------------- files

def rootfs(spec: Spec, bundle: Path) -> Path:
    root = Path((spec.get("root") or {}).get("path") or "rootfs")
    return root if root.is_absolute() else bundle / root


def image_preload(spec: Spec, bundle: Path) -> list[str]:
    """The image's own /etc/ld.so.preload entries (whitespace or newline separated)."""
    try:
        text = (rootfs(spec, bundle) / PRELOAD.lstrip("/")).read_text()
    except (OSError, UnicodeDecodeError):
        return []
    return [w for line in text.splitlines() for w in line.split("#")[0].split()]


def read(bundle: Path) -> Spec:
    path = bundle / "config.json"
    try:
        spec = json.loads(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"bundle {bundle}: no config.json (is this an OCI bundle?)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"cannot read {path}: {e}") from None
    except ValueError as e:
        raise SpecError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(spec, dict):
        raise SpecError(f"{path} is not an OCI spec (not a JSON object)")
    return spec


def write(bundle: Path, spec: Spec) -> None:
    """Atomically: a complete new file renamed over the old one. Not synced to disk: a
    bundle lives as long as its container, which a crash of the host ends (the engine
    writes a new bundle to start it again), and an fsync cost 1.5-2.5 ms of every create
    where bundles are on a disk (podman's; docker's where /run is not a tmpfs)."""
    path = bundle / "config.json"
    tmp = bundle / f".config.json.tgs-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(json.dumps(spec))  # json.dump writes piece by piece: ten times slower
    os.chmod(tmp, path.stat().st_mode & 0o7777)
    os.replace(tmp, path)
