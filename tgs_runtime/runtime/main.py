"""tgs-runtime's Python part: for `create` (and `run`) of a container that asks for TGS,
reserve it with tgsd, edit its spec, and exec the lower runtime; anything else is
exec'd through. Errors go where docker shows them (stderr and the --log file)."""
from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sys
from pathlib import Path

from tgs_runtime.runtime import argv as argvmod
from tgs_runtime.runtime.argv import RuncArgs


class Failure(Exception):
    """Create cannot go on: the message is the one line the user sees."""


def report(args: RuncArgs | None, msg: str) -> None:
    sys.stderr.write(f"tgs-runtime: {msg}\n")
    if not args or not args.log:
        return
    try:
        t = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        with open(args.log, "a") as f:
            if args.log_format == "json":
                f.write(json.dumps({"level": "error", "msg": f"tgs-runtime: {msg}", "time": t}) + "\n")
            else:
                f.write(f'time="{t}" level=error msg="tgs-runtime: {msg}"\n')
    except OSError:
        pass  # never fail because our own log cannot be written


def lower_runtime(names) -> str:
    for name in names:
        found = name if "/" in name else shutil.which(name, path=os.environ.get("PATH") or
                                                        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        if found and os.access(found, os.X_OK):
            return found
    raise Failure(f"no lower runtime found (tried {', '.join(names)}; config [runtime] lower_runtime)")


def set_up(args: RuncArgs, cfg) -> None:
    """Reserve and edit the spec of a container that asks for TGS; nothing otherwise."""
    from tgs_runtime.admin import AdminClient, DaemonUnavailable, Refused
    from tgs_runtime.runtime import spec as specmod

    bundle = Path(args.bundle or ".")
    try:
        spec = specmod.read(bundle)
        request = specmod.classify(spec, cfg.runtime.default_class, cfg.runtime.production.value)
    except specmod.SpecError as e:
        raise Failure(str(e)) from None
    if request is None:
        return
    if not args.container_id:
        raise Failure("create without a container id")
    admin = AdminClient(cfg.daemon.state_dir)
    try:
        reply = admin.reserve(args.container_id, request.cls, request.gpus)
    except DaemonUnavailable as e:
        raise Failure(f"cannot set up TGS for this {request.cls} container: {e}") from None
    except Refused as e:
        raise Failure(f"tgsd refused this {request.cls} container: {e}") from None
    try:
        setup = specmod.Setup(
            cls=request.cls, gpus=reply["gpus"], container_dir=Path(reply["dir"]), activity=reply["activity"],
            shim_path=cfg.runtime.shim_path, hook_path=cfg.runtime.hook_path, config_path=cfg.path,
            hook_timeout_s=cfg.runtime.hook_timeout_s,
            sim_state=cfg.sim.state if cfg.sim.enabled else None,
            sim_lib_dir=cfg.sim.lib_dir if cfg.sim.enabled else None,
            preload_lines=specmod.image_preload(spec, bundle))
        for path, what in ((setup.shim_path, "libtgs.so"), (setup.hook_path, "tgs-hook")):
            if not os.access(path, os.R_OK):
                raise Failure(f"{what} is not installed at {path} (run `tgs setup docker`, or fix [runtime] in {cfg.path})")
        specmod.write(bundle, specmod.apply(spec, setup))
    except BaseException as e:
        try:
            admin.deregister(args.container_id)  # nothing is left behind
        except (DaemonUnavailable, Refused):
            pass
        if isinstance(e, Failure):
            raise
        if isinstance(e, OSError):
            raise Failure(f"cannot edit {bundle}/config.json: {e.strerror or e}") from None
        raise


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv if argv is None else argv
    args = None
    try:
        args = argvmod.parse(argv[1:])
        from tgs_runtime import config

        try:
            cfg = config.load(args.tgs_config)
        except config.ConfigError as e:
            if args.subcommand not in ("create", "run"):
                cfg = config.Config()  # never stand in the way of anything but a create
            else:
                raise Failure(f"bad TGS config: {e}") from None
        lower = lower_runtime(cfg.runtime.lower_runtime)
        if args.subcommand in ("create", "run"):
            set_up(args, cfg)
        os.execv(lower, [lower, *args.argv])
    except Failure as e:
        report(args, str(e))
        sys.exit(1)
    except OSError as e:
        report(args, f"cannot run the lower runtime: {e}")
        sys.exit(127)


if __name__ == "__main__":  # pragma: no cover
    main()
