"""`tgs doctor`: checks an installation end to end and says what to fix."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click

from tgs_runtime import config as configmod, containerd_config, dockerd, install
from tgs_runtime.runtime import gpu_access


class Report:
    def __init__(self) -> None:
        self.failed = 0

    def ok(self, what: str) -> None:
        click.echo(f"  ok    {what}")

    def fail(self, what: str, fix: str) -> None:
        self.failed += 1
        click.echo(f"  FAIL  {what}\n        fix: {fix}")


@click.command("doctor")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), help="The TGS config.")
@click.option("--daemon-json", type=click.Path(dir_okay=False, path_type=Path), default=install.DAEMON_JSON,
              show_default=True)
@click.option("--containerd-config", "containerd_config_path", type=click.Path(dir_okay=False, path_type=Path),
              default=containerd_config.CONTAINERD_TOML, show_default=True)
@click.option("--cdi-spec-dir", "cdi_dirs", multiple=True, type=click.Path(file_okay=False, path_type=Path),
              default=gpu_access.CDI_DIRS, show_default=True,
              help="Where the container engine reads CDI specs (repeat for each).")
def doctor_cmd(config_path: Path | None, daemon_json: Path, containerd_config_path: Path,
               cdi_dirs: tuple[Path, ...]) -> None:
    """Check the config, libtgs.so, tgs-hook, the lower runtime, tgsd, docker or containerd,
    the GPUs and how TGS containers get them."""
    r = Report()
    click.echo("TGS installation check")
    try:
        cfg = configmod.load(config_path)
        r.ok(f"config {cfg.path or '(built-in defaults: no /etc/tgs/config.toml)'} is valid")
    except configmod.ConfigError as e:
        r.fail(f"config: {e}", "correct the key named (tgsd --check shows the whole config)")
        sys.exit(1)
    shim = cfg.runtime.shim_path
    if not shim.exists():
        r.fail(f"libtgs.so is not at {shim}", "tgs setup docker (or set [runtime] shim_path)")
    else:
        probe = subprocess.run(["/bin/true"], env={"LD_PRELOAD": str(shim), "PATH": "/usr/bin:/bin"},
                               capture_output=True, text=True)
        if probe.returncode != 0 or probe.stderr:
            r.fail(f"libtgs.so at {shim} does not load: {probe.stderr.strip()}", "reinstall: tgs setup docker")
        else:
            r.ok(f"libtgs.so at {shim} loads")
    hook = cfg.runtime.hook_path
    if os.access(hook, os.X_OK):
        r.ok(f"tgs-hook at {hook}")
    else:
        r.fail(f"tgs-hook is not executable at {hook}", "tgs setup docker (or set [runtime] hook_path)")
    from tgs_runtime.runtime.create import Failure
    from tgs_runtime.runtime.main import lower_runtime

    lower = None
    try:
        lower = lower_runtime(cfg.runtime.lower_runtime)
        r.ok(f"lower runtime {lower} (the first installed of [runtime] lower_runtime: "
             f"{', '.join(cfg.runtime.lower_runtime)})")
    except Failure as e:
        r.fail(f"{e}: every container of the tgs runtime would fail", "install runc (apt-get install runc), or "
               "name an installed runtime in [runtime] lower_runtime")
    from tgs_runtime.admin import AdminClient, DaemonUnavailable, Refused

    try:
        st = AdminClient(cfg.daemon.state_dir, timeout=5).status()
        gpus = ", ".join(f"{g['index']}:{g['uuid']}" for g in st["gpus"])
        r.ok(f"tgsd answers at {cfg.daemon.state_dir} (pid {st['daemon']['pid']}, GPUs {gpus})")
    except (DaemonUnavailable, Refused) as e:
        r.fail(str(e), "systemctl enable --now tgsd; journalctl -u tgsd says why it does not start")
    containerd = check_containerd(r, containerd_config_path)
    entry = None
    try:
        entry = install.read_daemon_json(daemon_json).get("runtimes", {}).get(install.RUNTIME_NAME)
    except install.InstallError as e:
        r.fail(str(e), f"fix {daemon_json}")
    if not entry and containerd is not None:
        click.echo(f"  -     {daemon_json} has no tgs runtime: docker is not set up for TGS, containerd is"
                   + ("" if containerd else " (see the failure above)"))
    elif not entry:
        r.fail(f"{daemon_json} has no tgs runtime, and {containerd_config_path} no tgs runtime handler",
               f"tgs setup docker, or for Kubernetes: tgs setup containerd --write {containerd_config_path}")
    elif not os.access(entry.get("path", ""), os.X_OK):
        r.fail(f"the tgs runtime in {daemon_json} points at {entry.get('path')}, which is not there", "tgs setup docker")
    else:
        r.ok(f"{daemon_json} names the tgs runtime ({entry['path']})")
        create = Path(entry["path"]).parent / "tgs-runtime-create"
        if not os.access(create, os.X_OK):
            r.fail(f"{create} is missing (tgs-runtime falls back to it when tgsd cannot be asked)", "tgs setup docker")
    dockerd = check_dockerd(r) if entry or containerd is None else None
    if cfg.sim.enabled:
        libs = [Path(cfg.sim.lib_dir or "") / n for n in ("libcuda.so.1", "libnvidia-ml.so.1")]
        missing = [str(p) for p in libs if not p.exists()]
        if missing:
            r.fail(f"[sim] is on but {', '.join(missing)} is missing", "make -C libshim, or set [sim] lib_dir")
        else:
            r.ok(f"GPU backend: simgpu (simulated) from {cfg.sim.lib_dir}, state {cfg.sim.state}")
    else:
        probe = subprocess.run([sys.executable, "-c", "import json, pynvml as n; n.nvmlInit(); "
                                "print(json.dumps([n.nvmlDeviceGetCount(), str(n.nvmlSystemGetDriverVersion())]))"],
                               capture_output=True, text=True, timeout=30)
        if probe.returncode == 0:
            count, driver = json.loads(probe.stdout)
            r.ok(f"GPU backend: NVML, driver {driver}, {count} GPU(s)")
            if lower:
                access = gpu_access.GpuAccess.of(lower, cdi_dirs)
                problem = None
                if access.route == gpu_access.Route.CDI and dockerd is not None:
                    off = gpu_access.docker_cdi_off(dockerd)
                    problem = off and (off, "turn CDI on in /etc/docker/daemon.json (\"features\": {\"cdi\": "
                                       "true}; docker 25 or later), then systemctl restart docker")
                elif access.route == gpu_access.Route.CDI and containerd:
                    problem = containerd_config.cdi_off(containerd_config_path, containerd_config.installed_release())
                if access.route == gpu_access.Route.NONE:
                    r.fail(access.describe(), gpu_access.FIX)
                elif problem:
                    r.fail(f"{access.describe()}; but {problem[0]}", problem[1])
                else:
                    r.ok(access.describe())
                # whichever route comes first, containers may be given GPUs by CDI too
                stale = access.cdi and gpu_access.cdi_driver_versions(access.cdi) - {driver}
                if stale:
                    r.fail(f"the CDI spec {access.cdi} mounts the libraries of driver {', '.join(sorted(stale))}, "
                           f"but the driver is {driver}: containers given a GPU by CDI would not start",
                           f"nvidia-ctk cdi generate --output={access.cdi} (or enable the toolkit's "
                           "nvidia-cdi-refresh service, 1.18 and later)")
        else:
            r.fail("NVML does not answer: no NVIDIA driver here", "install the NVIDIA driver, or enable [sim] "
                   "to try TGS on simgpu")
    click.echo("all checks passed" if not r.failed else f"{r.failed} check(s) failed")
    sys.exit(1 if r.failed else 0)


def check_containerd(r: Report, path: Path) -> bool | None:
    """containerd's tgs runtime handler, in its main config or a file it imports: True
    where it is right, False where it is there but wrong (said), None where there is none."""
    try:
        release = containerd_config.installed_release()
        files = containerd_config.configs(path, release)
    except containerd_config.ContainerdConfigError as e:
        r.fail(str(e), f"fix {path}: containerd cannot start with it either")
        return False
    found = [c for c in files if c.handlers]
    if not found:
        return None
    right, systemd = True, containerd_config.systemd_cgroup(files)
    for conf in found:
        problems = (containerd_config.check_placement(conf, files[0], release)
                    + containerd_config.check_handler(conf, systemd))
        for problem, fix in problems:
            r.fail(f"containerd's tgs runtime handler in {conf.path}: {problem}", fix)
        if problems:
            right = False
        else:
            r.ok(f"{conf.path} has the tgs runtime handler where containerd reads it (plugins.\"{conf.plugin}\", "
                 f"version {conf.version})")
    return right


def check_dockerd(r: Report) -> dict | None:
    """Whether dockerd has loaded the tgs runtime; its `docker info`, None where it does not answer."""
    try:
        _, info = dockerd.connect(timeout=5)
    except dockerd.Unreachable as e:  # docker missing or not running: say so, it is not fatal to TGS
        r.fail(str(e), f"{e.fix}, or use containerd (tgs setup containerd)")
        return None
    if install.RUNTIME_NAME in info.get("Runtimes", {}):
        r.ok("dockerd has loaded the tgs runtime")
    else:
        r.fail("dockerd runs but has not loaded the tgs runtime", "systemctl reload docker (dockerd re-reads "
               "runtimes on SIGHUP)")
    return info


def register(group: click.Group) -> None:
    group.add_command(doctor_cmd)
