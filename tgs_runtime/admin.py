"""Talking to tgsd's admin socket (<state_dir>/tgsd.sock): reserve, attach, deregister,
status. Used by tgs-runtime, tgs-hook and `tgs status`."""
from __future__ import annotations

from pathlib import Path

from tgs_runtime import framing, proto


class DaemonUnavailable(RuntimeError):
    """tgsd cannot be reached: the message says where it was looked for and what to do."""


class Refused(RuntimeError):
    """tgsd answered and said no: the message is its reason."""


class AdminClient:
    def __init__(self, state_dir: Path | str, timeout: float = 10.0):
        self.socket = Path(state_dir) / proto.ADMIN_SOCKET_NAME
        self.timeout = timeout

    def call(self, op: str, **fields) -> dict:
        try:
            reply = framing.call_json(str(self.socket), {"op": op, **fields}, self.timeout)
        except FileNotFoundError:
            raise DaemonUnavailable(f"tgsd is not running (no {self.socket}): start it with "
                                    "`systemctl start tgsd`") from None
        except ConnectionRefusedError:
            raise DaemonUnavailable(f"tgsd is not running ({self.socket} refuses connections): start it with "
                                    "`systemctl start tgsd`") from None
        except PermissionError:
            raise DaemonUnavailable(f"{self.socket}: permission denied (the admin socket is root's)") from None
        except (OSError, ValueError, framing.FrameError) as e:
            raise DaemonUnavailable(f"tgsd at {self.socket} did not answer properly: {e}") from None
        if not reply.get("ok"):
            raise Refused(reply.get("error") or "refused without a reason")
        return reply

    def reserve(self, cid: str, cls: str, gpus: list[str], convert: bool | None = None) -> dict:
        """`convert`: whether the container's device allocations become managed memory
        (None: tgsd's [memory] convert_production)."""
        extra = {} if convert is None else {"convert": convert}
        return self.call("reserve", id=cid, **{"class": cls}, gpus=gpus, **extra)

    def attach(self, cid: str, pid: int) -> dict:
        return self.call("attach", id=cid, pid=pid)

    def deregister(self, cid: str) -> dict:
        return self.call("deregister", id=cid)

    def status(self) -> dict:
        return self.call("status")
