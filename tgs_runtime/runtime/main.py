"""tgs-runtime-create: tgs-runtime's Python part, for `create` (and `run`) of a container
that may ask for TGS when tgsd could not be reached by the launcher (which otherwise has
tgsd set the container up; see create.py). It decides exactly: a container that asks for
TGS fails with a clear message, anything else is exec'd through to the lower runtime.
Errors go where docker shows them (stderr and the --log file)."""
from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sys
from pathlib import Path

from tgs_runtime.runtime import argv as argvmod
from tgs_runtime.runtime.argv import RuncArgs
from tgs_runtime.runtime.create import Failure


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
    import asyncio

    from tgs_runtime.admin import AdminClient, DaemonUnavailable, Refused
    from tgs_runtime.runtime.create import ReserveFailed
    from tgs_runtime.runtime.create import set_up as create
    from tgs_runtime.runtime.spec import Request

    admin = AdminClient(cfg.daemon.state_dir)

    async def reserve(cid: str, request: Request) -> dict:
        try:
            return admin.reserve(cid, request.cls, request.gpus, request.convert)
        except DaemonUnavailable as e:
            raise ReserveFailed(str(e), refused=False) from None
        except Refused as e:
            raise ReserveFailed(str(e), refused=True) from None

    async def release(cid: str) -> None:
        try:
            admin.deregister(cid)
        except (DaemonUnavailable, Refused):
            pass

    asyncio.run(create(args.container_id, Path(args.bundle or "."), cfg, reserve, release))


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
        try:
            os.execv(lower, [lower, *args.argv])
        except OSError as e:  # as the launcher says it (libshim/runtime/launcher.c)
            report(args, f"cannot run {lower}: {e.strerror}")
            sys.exit(127)
    except Failure as e:
        report(args, str(e))
        sys.exit(1)
    except OSError as e:  # not foreseen above: still one line, and the log's
        report(args, str(e))
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    main()
