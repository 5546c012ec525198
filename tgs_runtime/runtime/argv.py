"""runc's command line, as containerd's shim and docker pass it:
    RUNTIME [global options] SUBCOMMAND [options] [container id]
plus our own global `--tgs-config PATH` (from daemon.json runtimeArgs), which is
stripped before the lower runtime sees the arguments."""
from __future__ import annotations

from dataclasses import dataclass, field

GLOBAL_WITH_VALUE = {"--root", "--log", "--log-format", "--criu", "--rootless", "--tgs-config"}
CREATE_WITH_VALUE = {"--bundle", "-b", "--console-socket", "--pid-file", "--preserve-fds"}


@dataclass
class RuncArgs:
    argv: list[str]                 # what the lower runtime gets (without --tgs-config)
    subcommand: str | None = None
    bundle: str | None = None
    container_id: str | None = None
    log: str | None = None
    log_format: str = "text"
    tgs_config: str | None = None
    globals: dict[str, str] = field(default_factory=dict)


def parse(args: list[str]) -> RuncArgs:
    """`args` without the program name."""
    out = RuncArgs(argv=[])
    i = 0
    while i < len(args):
        a = args[i]
        if out.subcommand is None and a.startswith("-"):
            name, eq, value = a.partition("=")
            if not eq and name in GLOBAL_WITH_VALUE and i + 1 < len(args):
                value = args[i + 1]
                i += 1
                consumed = [a, value]
            else:
                consumed = [a]
            if name == "--tgs-config":
                out.tgs_config = value
            else:
                out.argv += consumed
                out.globals[name] = value
                if name == "--log":
                    out.log = value
                elif name == "--log-format":
                    out.log_format = value
            i += 1
            continue
        out.argv.append(a)
        if out.subcommand is None:
            out.subcommand = a
        elif out.subcommand in ("create", "run"):
            name, eq, value = a.partition("=")
            if name in ("--bundle", "-b"):
                if eq:
                    out.bundle = value
                elif i + 1 < len(args):
                    out.bundle = args[i + 1]
                    out.argv.append(args[i + 1])
                    i += 1
            elif not eq and name in CREATE_WITH_VALUE and i + 1 < len(args):
                out.argv.append(args[i + 1])
                i += 1
            elif not a.startswith("-"):
                out.container_id = a
        i += 1
    if out.subcommand in ("create", "run") and out.bundle is None:
        out.bundle = "."
    return out
