"""Reaching the host's dockerd through the docker SDK, and where it does not answer, saying
where it was looked for and why not in an operator's words (`tgs doctor`, `tgs demo`)."""
from __future__ import annotations

import os
from typing import Any

DEFAULT_HOST = "unix:///var/run/docker.sock"
START = "start docker (systemctl start docker)"


class Unreachable(Exception):
    """No dockerd answers: str() says where and why, `fix` what to do."""

    def __init__(self, why: str, fix: str):
        super().__init__(why)
        self.fix = fix


def host() -> str:
    """Where the docker SDK looks for dockerd: DOCKER_HOST, else its default socket."""
    return os.environ.get("DOCKER_HOST") or DEFAULT_HOST


def _root_cause(e: BaseException) -> BaseException:
    """The OSError under the SDK's wrappers (requests and urllib3 keep it in their causes or
    their arguments: one, from the socket), else `e`."""
    found: BaseException = e
    todo, seen = [e], set()
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, OSError) and x.errno is not None:
            found = x
        todo += [a for a in (x.__cause__, x.__context__, *getattr(x, "args", ())) if isinstance(a, BaseException)]
    return found


def _why(e: BaseException) -> tuple[str, str]:
    """Why dockerd did not answer, and what to do, from the SDK's exception."""
    cause = _root_cause(e)
    if isinstance(cause, FileNotFoundError):
        return "no such socket: docker is not running, or not installed", START
    if isinstance(cause, PermissionError):
        return "permission denied", "run it as root, or as a member of the docker group"
    if isinstance(cause, ConnectionRefusedError):
        return "connection refused: nothing listens there", START
    if isinstance(cause, OSError):
        return (cause.strerror or str(cause)).lower(), START
    text = str(e)
    return f"{type(e).__name__}: {text[:200]}{'...' if len(text) > 200 else ''}", START


def connect(timeout: float) -> tuple[Any, dict]:
    """A docker client and its `docker info`; Unreachable where no dockerd answers."""
    try:
        import docker
    except ImportError:
        raise Unreachable("the docker SDK is not installed", "pip install docker") from None
    try:
        client = docker.from_env(timeout=timeout)
        return client, client.info()
    except Exception as e:  # no socket, no permission, nothing listening, an old daemon
        why, fix = _why(e)
        raise Unreachable(f"no docker daemon answers at {host()} ({why})", fix) from e
