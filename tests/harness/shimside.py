"""Containers as libtgs.so sees them, without tgsd: a directory made by tgs_runtime.control
(the code tgsd uses), and a stand-in for tgsd's side of the container socket that keeps
the heartbeat, acknowledges hellos, records notices and sends orders. The libtgs.so tests
use it (the issue allows it: tgsd is tested on its own, with these shims)."""
from __future__ import annotations

import ctypes as C
import itertools
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tgs_runtime import proto
from tgs_runtime.control import ActivityFile, ControlBlock, StatePaths


@dataclass
class Connection:
    sock: socket.socket
    hello: proto.MsgHello | None = None
    slot: int = proto.NO_SLOT
    acks: dict[int, proto.MsgOrderAck] = field(default_factory=dict)
    cond: threading.Condition = field(default_factory=threading.Condition)
    closed: bool = False


class Host:
    """One state_dir: activity files and activity slots shared by its containers."""

    def __init__(self, state_dir: Path):
        self.paths = StatePaths(state_dir)
        self._slots = itertools.count(0)
        self._activity: dict[str, ActivityFile] = {}

    def activity(self, uuid: str) -> ActivityFile:
        if uuid not in self._activity:
            p = self.paths.activity(uuid)
            p.parent.mkdir(parents=True, exist_ok=True)
            self._activity[uuid] = ActivityFile.create(p)
        return self._activity[uuid]

    def next_slot(self) -> int:
        return next(self._slots)

    def close(self) -> None:
        for a in self._activity.values():
            a.close()


class ShimContainer:
    """A TGS container's directory, with tgsd's side of its socket served when `serve`."""

    def __init__(self, host: Host, cid: str, klass: proto.Class, uuids: list[str], *, serve: bool = True,
                 convert: bool = True, heartbeat: bool = True):
        self.host = host
        self.klass = klass
        self.uuids = uuids
        self.paths = host.paths.container(cid)
        self.paths.dir.mkdir(parents=True, exist_ok=True)
        for u in uuids:
            host.activity(u)
            link = self.paths.activity(u)
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():
                os.link(host.paths.activity(u), link)
        self.control = ControlBlock.create(self.paths.control, klass, uuids, convert=convert)
        self.conns: list[Connection] = []
        self.notices: list[proto.MsgMem] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        if heartbeat:
            self._start(self._beat)
        self._server = None
        if serve:
            self.start_serving()

    def start_serving(self) -> None:
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(self.paths.socket))
        self._server.listen(16)
        self._server.settimeout(0.2)
        self._start(self._accept)

    def env(self, shim: Path) -> dict[str, str]:
        return {"TGS_DIR": str(self.paths.dir), "LD_PRELOAD": str(shim)}

    # -- tgsd's side --
    def _start(self, fn, *args) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    def _beat(self) -> None:
        while not self._stop.is_set():
            self.control.heartbeat()
            self._stop.wait(0.1)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                s, _ = self._server.accept()
            except (socket.timeout, OSError):
                continue
            conn = Connection(s)
            with self._lock:
                self.conns.append(conn)
            self._start(self._serve, conn)

    def _recv_exact(self, s: socket.socket, n: int) -> bytes | None:
        buf = b""
        while len(buf) < n:
            try:
                chunk = s.recv(n - len(buf))
            except OSError:
                return None
            if not chunk:
                return None
            buf += chunk
        return buf

    def _serve(self, conn: Connection) -> None:
        s = conn.sock
        s.settimeout(None)
        while not self._stop.is_set():
            head = self._recv_exact(s, 4)
            if head is None:
                break
            (n,) = struct.unpack("<I", head)
            body = self._recv_exact(s, n)
            if body is None:
                break
            msg = proto.parse(body)
            if isinstance(msg, proto.MsgHello):
                conn.hello = msg
                if self.klass == proto.Class.PRODUCTION:
                    conn.slot = msg.activity_slot if msg.activity_slot != proto.NO_SLOT else self.host.next_slot()
                ack = proto.message(proto.MsgHelloAck, activity_slot=conn.slot, process_id=next(self._ids))
                try:
                    s.sendall(proto.frame(ack))
                except OSError:
                    break
            elif isinstance(msg, proto.MsgMem):
                with self._lock:
                    self.notices.append(msg)
            elif isinstance(msg, proto.MsgOrderAck):
                with conn.cond:
                    conn.acks[msg.order_id] = msg
                    conn.cond.notify_all()
        conn.closed = True
        if conn.slot != proto.NO_SLOT:  # a dead process's activity byte goes back, as tgsd does
            for u in self.uuids:
                self.host.activity(u).clear(conn.slot)

    def drained(self, timeout: float = 10) -> None:
        """Waits until every connection has ended: the processes behind them have exited,
        and each one's notices, which were on their way through the socket, have been read."""
        self.wait_for(lambda: self.conns and all(c.closed for c in self.conns), timeout, "the connections' end")

    def ranges(self) -> dict[int, proto.MsgMem]:
        """Live allocations by address, from the notices received."""
        out: dict[int, proto.MsgMem] = {}
        with self._lock:
            for m in self.notices:
                if m.h.type == proto.MsgType.ALLOC:
                    out[m.ptr] = m
                else:
                    out.pop(m.ptr, None)
        return out

    def wait_for(self, predicate, timeout: float = 20, what: str = "condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.02)
        raise TimeoutError(f"{what} did not happen in {timeout}s")

    def order(self, conn: Connection, op: proto.OrderOp, ptr: int, size: int, gpu: int = 0,
              timeout: float = 30) -> proto.MsgOrderAck:
        oid = next(self._ids)
        msg = proto.message(proto.MsgOrder, gpu=gpu, op=int(op), order_id=oid, ptr=ptr, size=size)
        conn.sock.sendall(proto.frame(msg))
        with conn.cond:
            if not conn.cond.wait_for(lambda: oid in conn.acks, timeout):
                raise TimeoutError(f"no acknowledgement of order {oid}")
            return conn.acks[oid]

    def send_raw(self, conn: Connection, data: bytes) -> None:
        conn.sock.sendall(data)

    def close(self) -> None:
        self._stop.set()
        if self._server:
            self._server.close()
        for c in self.conns:
            try:
                c.sock.close()
            except OSError:
                pass
        for t in self._threads:
            t.join(2)
        self.control.close()


def counters(c: ShimContainer, slot: int = 0) -> dict[str, int]:
    ctr = c.control.counters(slot)
    return {name: getattr(ctr, name) for name, _ in proto.GpuCounters._fields_ if name != "reserved"}


def waits(c: ShimContainer) -> dict[str, int]:
    """What its launching threads waited for other than production, ns by cause (all GPUs)."""
    shim = c.control.shim
    return {cause: getattr(shim, f"{cause}_wait_ns") for cause in ("inflight", "anticipation", "token")}


def sizeof(t) -> int:
    return C.sizeof(t)
