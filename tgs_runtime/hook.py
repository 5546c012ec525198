"""tgs-hook: the OCI hook of TGS containers (tgs-runtime adds it to their spec).

    tgs-hook [--tgs-config PATH] createRuntime   tell tgsd the container's init pid (attach);
                                                 failing makes runc abort the create
    tgs-hook [--tgs-config PATH] poststop        tell tgsd the container is gone (deregister);
                                                 always exits 0 (tgsd reclaims anyway)

The OCI state (id, pid, ...) comes on stdin."""
from __future__ import annotations

import json
import sys

USAGE = "usage: tgs-hook [--tgs-config PATH] createRuntime|poststop  (the OCI state on stdin)"
MAX_STATE = 1 << 20


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    config_path = None
    if len(args) >= 2 and args[0] == "--tgs-config":
        config_path = args[1]
        args = args[2:]
    if len(args) != 1 or args[0] not in ("createRuntime", "poststop", "createContainer", "prestart"):
        print(f"tgs-hook: {USAGE}", file=sys.stderr)
        sys.exit(2)
    stage = args[0]
    strict = stage != "poststop"

    def fail(msg: str) -> None:
        print(f"tgs-hook: {msg}", file=sys.stderr)
        sys.exit(1 if strict else 0)

    raw = sys.stdin.buffer.read(MAX_STATE + 1)
    try:
        state = json.loads(raw)
        cid, pid = state["id"], state.get("pid")
        if not isinstance(cid, str):
            raise ValueError("id is not a string")
    except (ValueError, KeyError, TypeError) as e:
        fail(f"the OCI state on stdin is not usable ({e}): expected JSON with id and pid")
        return
    from tgs_runtime import config
    from tgs_runtime.admin import AdminClient, DaemonUnavailable, Refused

    try:
        cfg = config.load(config_path)
    except config.ConfigError as e:
        fail(f"bad TGS config: {e}")
        return
    admin = AdminClient(cfg.daemon.state_dir)
    try:
        if stage == "poststop":
            admin.deregister(cid)
        else:
            if not isinstance(pid, int) or pid <= 0:
                fail(f"the OCI state has no init pid for container {cid}")
                return
            admin.attach(cid, pid)
    except (DaemonUnavailable, Refused) as e:
        fail(f"{stage} of container {cid}: {e}")


if __name__ == "__main__":  # pragma: no cover
    main()
