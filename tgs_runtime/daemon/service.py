"""tgsd: the host daemon. One asyncio loop holds the admin socket, every container's own
socket, a pidfd per container, and the control loop that every period reads each GPU's
counters, runs its controller and memory residency, and writes budgets and heartbeats
into the control blocks (ARCHITECTURE.md, "The path of one container")."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import struct
import time
from pathlib import Path

from tgs_runtime import __version__, config as configmod, framing, proto
from tgs_runtime.config import Config, ConfigError, Controller
from tgs_runtime.control import ActivityFile, ControlBlock, ControlFileError, StatePaths
from tgs_runtime.daemon import residency
from tgs_runtime.daemon.controllers import UNLIMITED, make_controller
from tgs_runtime.daemon.gpus import Gpu, GpuError, GpuInventory
from tgs_runtime.daemon.registry import Container, Phase, Process, Tally, load_registration, process_start_time
from tgs_runtime.daemon.sharing import Claimant, ShareState, Turn, split, take_turns
from tgs_runtime.daemon.stall import HeldGate
from tgs_runtime.daemon.stolen import StolenTime
from tgs_runtime.daemon.window import Mark, Overlap, Sample
from tgs_runtime.logs import RepeatLimiter, get as get_logger
from tgs_runtime.runtime import create as createmod

ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
GHOST_GRACE_S = 10.0  # after a restart, an activity byte waits this long for its process to reconnect
ORDER_TIMEOUT_S = 30.0
SAVE_EVERY_S = 5.0
SMOOTHING = 0.3  # of a period's reading in a container's smoothed figures (what it achieved, waited)


class RequestError(Exception):
    """An admin request that is refused; the message is sent back as the reason."""


@dataclasses.dataclass
class GpuState:
    gpu: Gpu
    activity: ActivityFile
    controller: object
    share: ShareState = dataclasses.field(default_factory=ShareState)
    budget_bytes: int = 0
    last: dict = dataclasses.field(default_factory=dict)  # the last decision, for status
    unfixable_warned: bool = False
    held: HeldGate = dataclasses.field(default_factory=HeldGate)


class Daemon:
    def __init__(self, cfg: Config, gpus: GpuInventory):
        self.cfg = cfg
        self.inventory = gpus
        self.paths = StatePaths(cfg.daemon.state_dir)
        self.log = get_logger()
        self.containers: dict[str, Container] = {}
        self.gpus: dict[str, GpuState] = {}
        self.slots: dict[int, tuple[str, int] | None] = {}  # activity slot -> (container, process) or a ghost
        self.ghosts: dict[int, float] = {}                  # slot -> deadline (after a restart)
        self._conn_ids = 0
        self._order_ids = 0
        self._arrivals = 0
        self._admin: asyncio.AbstractServer | None = None
        self._stop = asyncio.Event()
        self._last_tick = time.monotonic()
        self.stolen = StolenTime()  # the host's CPU time its hypervisor takes (the controllers' Sample)
        self._failures = RepeatLimiter()
        self._last_save = 0.0
        self.started = time.monotonic()

    # ------------------------------------------------------------------ start and stop

    async def start(self) -> None:
        self.paths.state_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.paths.state_dir, 0o755)
        (self.paths.state_dir / proto.ACTIVITY_DIR).mkdir(exist_ok=True)
        self.paths.containers.mkdir(exist_ok=True)
        for g in self.inventory.gpus:
            act = ActivityFile.create(self.paths.activity(g.uuid))
            os.chmod(self.paths.activity(g.uuid), 0o666)
            st = GpuState(g, act, make_controller(self.cfg.control))
            st.budget_bytes = self.cfg.memory.budget_of(g.memory_total)
            self.gpus[g.uuid] = st
            for slot in act.busy_slots():  # left by a previous tgsd: their processes may come back
                self.ghosts[slot] = time.monotonic() + GHOST_GRACE_S
                self.slots[slot] = None
        await self._recover()
        self._admin = await asyncio.start_unix_server(self._admin_conn, path=str(self._fresh_socket(self.paths.admin_socket)))
        os.chmod(self.paths.admin_socket, 0o600)
        self.log.info("tgsd started", version=__version__, state_dir=str(self.paths.state_dir),
                      gpus=[f"{g.index}:{g.uuid}" for g in self.inventory.gpus], controller=self.cfg.control.controller.value,
                      share=self.cfg.control.share.value, containers=len(self.containers),
                      config=str(self.cfg.path or "defaults"))
        notify_systemd("READY=1")

    @staticmethod
    def _fresh_socket(path: Path) -> Path:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return path

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        ticker = asyncio.create_task(self._control_loop())
        await self._stop.wait()
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        await self.shutdown()

    async def shutdown(self) -> None:
        """Stops serving; every container's directory stays, so a new tgsd takes it back."""
        notify_systemd("STOPPING=1")
        if self._admin:
            self._admin.close()
        for c in self.containers.values():
            with contextlib.suppress(Exception):
                c.save()
            if c.server:
                c.server.close()
            for p in list(c.processes.values()):
                p.writer.close()
            if c.pidfd is not None:
                asyncio.get_running_loop().remove_reader(c.pidfd)
                os.close(c.pidfd)
        self.log.info("tgsd stopped", containers=len(self.containers))

    def reload(self) -> None:
        try:
            new = configmod.load(self.cfg.path) if self.cfg.path else self.cfg
        except ConfigError as e:
            self.log.error("config not reloaded", error=str(e))
            return
        changed = configmod.changes(self.cfg, new)
        live = {k: v for k, v in changed.items() if k in configmod.LIVE}
        later = sorted(k for k in changed if k not in configmod.LIVE)
        cfg = self.cfg
        for key in live:
            section, name = key.split(".")
            cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section),
                                                                           **{name: getattr(getattr(new, section), name)})})
        if "control.controller" in live or "control.share" in live:
            for st in self.gpus.values():
                st.controller = make_controller(cfg.control)
                st.share = ShareState()
        self.cfg = cfg
        for st in self.gpus.values():
            st.budget_bytes = cfg.memory.budget_of(st.gpu.memory_total)
        for key, (old, value) in live.items():
            self.log.info("config changed", key=key, old=str(old), new=str(value))
        if later:
            self.log.warning("config changes that need a restart of tgsd", keys=later)
        if not changed:
            self.log.info("config reloaded, nothing changed")

    # ------------------------------------------------------------------ containers

    async def _recover(self) -> None:
        """After a restart: every container directory with a registration comes back."""
        for d in sorted(self.paths.containers.iterdir()):
            cp = self.paths.container(d.name)
            try:
                reg = load_registration(cp)
                c = Container(reg["id"], proto.Class[reg["class"].upper()], list(reg["gpus"]), cp,
                              created=float(reg.get("created", time.time())), phase=Phase(reg["phase"]),
                              init_pid=reg.get("init_pid"), pid_start=reg.get("pid_start"), order=int(reg.get("order", 0)))
                c.control = ControlBlock.open(cp.control)
            except (OSError, ValueError, KeyError, ControlFileError) as e:
                self.log.warning("dropping an unreadable container directory", dir=str(d), error=str(e))
                shutil.rmtree(d, ignore_errors=True)
                continue
            missing = [u for u in c.gpus if u not in self.gpus]
            if missing:
                self.log.warning("dropping a container whose GPUs are gone", container=c.id, gpus=missing)
                c.control.close()
                shutil.rmtree(d, ignore_errors=True)
                continue
            self._arrivals = max(self._arrivals, c.order)
            if c.phase == Phase.ATTACHED:
                if not c.init_pid or process_start_time(c.init_pid) != c.pid_start:
                    self.log.info("container ended while tgsd was away", container=c.id, cls=c.label)
                    self.containers[c.id] = c
                    self.release(c, "ended while tgsd was away")
                    continue
                self._watch(c)
            else:
                c.reserved_at = time.monotonic()  # a fresh window to attach
            await self._open(c)
            self.containers[c.id] = c
            self.log.info("container taken back after a restart", container=c.id, cls=c.label, gpus=c.gpus,
                          phase=c.phase.value)

    @staticmethod
    def _track(c: Container) -> None:
        n = len(c.gpus)
        c.last = [Tally.of(c.control.counters(i), c.control.shim) for i in range(n)]
        c.achieved, c.bound_wait = [0.0] * n, [0.0] * n
        c.budget = [UNLIMITED] * n

    async def _open(self, c: Container) -> None:
        """The container's socket, bound in place (shims reconnect to the same path)."""
        if not c.last:
            self._track(c)
        c.server = await asyncio.start_unix_server(lambda r, w: self._shim_conn(c, r, w),
                                                   path=str(self._fresh_socket(c.paths.socket)))
        os.chmod(c.paths.socket, 0o666)  # any user of this container (only it sees the socket)

    def _watch(self, c: Container) -> None:
        try:
            c.pidfd = os.pidfd_open(c.init_pid)
        except (OSError, TypeError) as e:
            self.log.warning("cannot watch the container's init process", container=c.id, pid=c.init_pid, error=str(e))
            return
        asyncio.get_running_loop().add_reader(c.pidfd, lambda: self.release(c, "its init process exited"))

    def release(self, c: Container, why: str) -> None:
        """Everything the container had goes back: budget share, activity bytes, directory."""
        if self.containers.get(c.id) is not c:
            return
        del self.containers[c.id]
        if c.pidfd is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(c.pidfd)
            os.close(c.pidfd)
            c.pidfd = None
        if c.server:
            c.server.close()
        for p in list(c.processes.values()):
            self._drop_process(c, p)
            p.writer.close()
        if c.control:
            c.control.close()
        shutil.rmtree(c.paths.dir, ignore_errors=True)
        self.log.info("container released", container=c.id, cls=c.label, gpus=c.gpus, reason=why)

    # ------------------------------------------------------------------ admin socket

    async def _admin_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        try:
            if uid not in (0, os.getuid()):
                raise RequestError(f"the admin socket is root's (uid {uid} is not allowed)")
            while True:
                try:
                    body = await framing.read(reader)
                except framing.FrameError as e:
                    self.log.warning("closing an admin connection", peer_pid=pid, error=str(e))
                    return
                if body is None:
                    return
                try:
                    request = json.loads(body)
                    if not isinstance(request, dict):
                        raise ValueError("not an object")
                except ValueError as e:
                    self.log.warning("closing an admin connection: not a JSON request", peer_pid=pid, error=str(e))
                    return
                try:
                    reply = {"ok": True, **await self._admin_op(request)}
                except RequestError as e:
                    reply = {"ok": False, "error": str(e)}
                    self.log.warning("admin request refused", op=request.get("op"), container=request.get("id"),
                                     error=str(e))
                except Exception as e:  # a bug must not take the daemon or the connection down silently
                    self.log.exception("admin request failed", op=request.get("op"), container=request.get("id"))
                    reply = {"ok": False, "error": f"tgsd failed on this request ({type(e).__name__}: {e}); see its log"}
                writer.write(framing.encode(json.dumps(reply).encode()))
                await writer.drain()
        except RequestError as e:
            writer.write(framing.encode(json.dumps({"ok": False, "error": str(e)}).encode()))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _admin_op(self, req: dict) -> dict:
        op = req.get("op")
        if op == "create":
            return await self.create(req)
        if op == "reserve":
            return await self.reserve(req)
        if op == "attach":
            return self.attach(req)
        if op == "deregister":
            return self.deregister(req)
        if op == "status":
            return self.status()
        raise RequestError(f"unknown operation {op!r} (expected create, reserve, attach, deregister or status)")

    def _container_id(self, req: dict) -> str:
        cid = req.get("id")
        if not isinstance(cid, str) or not ID_RE.match(cid):
            raise RequestError(f"container id {cid!r}: expected 1 to 128 letters, digits, '.', '_' or '-'")
        return cid

    async def create(self, req: dict) -> dict:
        """tgs-runtime's create, sent by its launcher: set up the container in `bundle` if
        it asks for TGS (runtime/create.py), under the runtime's own config file."""
        bundle, path = req.get("bundle"), req.get("config")
        if not isinstance(bundle, str) or not os.path.isabs(bundle):
            raise RequestError(f"bundle {bundle!r}: expected an absolute path")
        if not isinstance(path, str) or not os.path.isabs(path):
            raise RequestError(f"config {path!r}: expected an absolute path")
        try:
            cfg = configmod.load(path, named=bool(req.get("named")))
        except ConfigError as e:
            raise RequestError(f"bad TGS config: {e}") from None

        async def reserve(cid: str, request: createmod.specmod.Request) -> dict:
            try:
                return await self.reserve({"id": cid, "class": request.cls, "gpus": request.gpus,
                                           **({} if request.convert is None else {"convert": request.convert})})
            except RequestError as e:
                raise createmod.ReserveFailed(str(e), refused=True) from None

        async def release(cid: str) -> None:
            if cid in self.containers:
                self.release(self.containers[cid], "its create failed")

        try:
            cls = await createmod.set_up(req.get("id"), Path(bundle), cfg, reserve, release)
        except createmod.Failure as e:
            raise RequestError(str(e)) from None
        return {"tgs": cls is not None, "class": cls}

    async def reserve(self, req: dict) -> dict:
        cid = self._container_id(req)
        cls_name = req.get("class")
        if cls_name not in ("production", "opportunistic"):
            raise RequestError(f"class {cls_name!r}: expected 'production' or 'opportunistic'")
        specs = req.get("gpus")
        if not isinstance(specs, list) or not specs or not all(isinstance(s, str) for s in specs):
            raise RequestError("no GPUs: a TGS container needs NVIDIA_VISIBLE_DEVICES naming its GPU(s)")
        if len(specs) > proto.MAX_GPUS:
            raise RequestError(f"{len(specs)} GPUs: a TGS container may use at most {proto.MAX_GPUS}")
        try:
            if "all" in specs:
                uuids = [g.uuid for g in self.inventory.gpus]
            else:
                uuids = list(dict.fromkeys(self.inventory.resolve(s).uuid for s in specs))
        except GpuError as e:
            raise RequestError(str(e)) from None
        klass = proto.Class[cls_name.upper()]
        asked = req.get("convert")
        if asked is not None and not isinstance(asked, bool):
            raise RequestError(f"convert {asked!r}: expected true or false")
        if asked is False and klass == proto.Class.OPPORTUNISTIC:
            raise RequestError("convert false: an opportunistic container's memory is always converted")
        convert = klass == proto.Class.OPPORTUNISTIC or (self.cfg.memory.convert_production if asked is None
                                                          else asked)
        old = self.containers.get(cid)
        if old:
            if old.cls == klass and old.gpus == uuids and old.converts() == convert:
                return self._reservation(old)
            memory = "" if old.converts() == convert else f" with convert {str(old.converts()).lower()}"
            raise RequestError(f"container {cid} is already registered as {old.label} on {old.gpus}{memory}")
        cp = self.paths.container(cid)
        if len(str(cp.socket).encode()) > 107:
            raise RequestError(f"the container's socket path {cp.socket} is longer than AF_UNIX allows (107 bytes): "
                               "use a shorter [daemon] state_dir")
        c = Container(cid, klass, uuids, cp)
        self._arrivals += 1
        c.order = self._arrivals
        try:
            (cp.dir / proto.ACTIVITY_DIR).mkdir(parents=True, exist_ok=True)
            os.chmod(cp.dir, 0o755)
            for u in uuids:
                with contextlib.suppress(FileNotFoundError):
                    cp.activity(u).unlink()
                os.link(self.paths.activity(u), cp.activity(u))
            c.control = ControlBlock.create(cp.control, klass, uuids, convert=convert, stale_ms=self.cfg.daemon.stale_ms)
            os.chmod(cp.control, 0o666)
            self._track(c)
            self._write_budgets(c)
            c.control.heartbeat()
            c.save()
            await self._open(c)
        except OSError as e:
            if c.control:
                c.control.close()
            shutil.rmtree(cp.dir, ignore_errors=True)
            raise RequestError(f"cannot set up {cp.dir}: {e.strerror or e}") from None
        self.containers[cid] = c
        self.log.info("container reserved", container=cid, cls=c.label, gpus=uuids, convert=convert)
        return self._reservation(c)

    def _reservation(self, c: Container) -> dict:
        return {"id": c.id, "class": c.label, "gpus": c.gpus, "dir": str(c.paths.dir),
                "activity": {u: str(self.paths.activity(u)) for u in c.gpus}}

    def attach(self, req: dict) -> dict:
        cid = self._container_id(req)
        pid = req.get("pid")
        c = self.containers.get(cid)
        if c is None:
            raise RequestError(f"container {cid} is not reserved (was tgsd restarted without its state, "
                               "or did the reservation time out?)")
        if not isinstance(pid, int) or pid <= 0:
            raise RequestError(f"pid {pid!r}: expected the container's init process id")
        start = process_start_time(pid)
        if start is None:
            raise RequestError(f"process {pid} does not exist")
        if c.phase == Phase.ATTACHED and c.init_pid == pid:
            return {"id": cid}
        c.phase, c.init_pid, c.pid_start = Phase.ATTACHED, pid, start
        self._watch(c)
        c.save()
        self.log.info("container attached", container=cid, cls=c.label, gpus=c.gpus, pid=pid)
        return {"id": cid}

    def deregister(self, req: dict) -> dict:
        cid = self._container_id(req)
        c = self.containers.get(cid)
        if c is None:
            return {"id": cid, "known": False}
        self.release(c, "deregistered")
        return {"id": cid, "known": True}

    # ------------------------------------------------------------------ container sockets

    async def _shim_conn(self, c: Container, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        host_pid = uid = None
        with contextlib.suppress(OSError):
            host_pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                    struct.calcsize("3i")))
        self._conn_ids += 1
        p = Process(self._conn_ids, host_pid, uid, writer, tokens=float(self.cfg.control.max_messages_per_s),
                    tokens_at=time.monotonic())
        c.processes[p.id] = p
        log = self.log.bind(container=c.id, cls=c.label, host_pid=host_pid)
        try:
            while self.containers.get(c.id) is c:
                body = await framing.read(reader)
                if body is None:
                    break
                if not p.allow_message(time.monotonic(), self.cfg.control.max_messages_per_s):
                    log.warning("closing a connection: above the message rate limit",
                                limit=self.cfg.control.max_messages_per_s)
                    break
                self._handle(c, p, proto.parse(body), log)
        except (framing.FrameError, proto.ProtocolError) as e:
            log.warning("closing a connection: bad message", error=str(e))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._drop_process(c, p)
            writer.close()
            log.debug("process disconnected", process=p.id, slot=p.slot)

    def _handle(self, c: Container, p: Process, msg, log) -> None:
        t = proto.MsgType(msg.h.type)
        if t == proto.MsgType.HELLO:
            p.said_hello = True
            p.pid, p.cuda_version = msg.pid, msg.cuda_version
            p.comm = msg.comm.decode(errors="replace")
            if c.cls == proto.Class.PRODUCTION:
                p.slot = self._take_slot(c, p, msg.activity_slot)
            ack = proto.message(proto.MsgHelloAck, activity_slot=p.slot, process_id=p.id)
            p.writer.write(proto.frame(ack))
            log.debug("process said hello", process=p.id, pid=p.pid, comm=p.comm, slot=p.slot, cuda=p.cuda_version)
        elif t == proto.MsgType.ALLOC:
            key = (p.id, msg.gpu, msg.ptr)
            if msg.gpu >= len(c.gpus):
                raise proto.ProtocolError(f"an allocation on GPU slot {msg.gpu} (the container has {len(c.gpus)})")
            if key not in c.ranges and len(c.ranges) >= self.cfg.control.max_ranges:
                if not c.warned_ranges:
                    log.warning("not tracking more ranges: the container is at its cap", cap=self.cfg.control.max_ranges)
                    c.warned_ranges = True
                return
            kind = proto.MemKind(msg.kind)
            c.ranges[key] = residency.Range(c.id, msg.gpu, msg.ptr, msg.size, kind.evictable,
                                            evicted=msg.size if msg.flags & proto.MEM_EVICTED else 0)
            c.range_owner[key] = p.id
        elif t == proto.MsgType.FREE:
            key = (p.id, msg.gpu, msg.ptr)
            c.ranges.pop(key, None)
            c.range_owner.pop(key, None)
        elif t == proto.MsgType.ORDER_ACK:
            m = p.pending.pop(msg.order_id, None)
            if m is None:
                return
            m.acknowledged(msg.status == 0)
            if msg.status == 0:
                log.debug("order done", op=m.op.name.lower(), ptr=hex(m.ptr), bytes=msg.bytes,
                          gpu=c.gpus[m.range.gpu_slot])
            else:
                log.warning("order failed", op=m.op.name.lower(), ptr=hex(m.ptr), bytes=m.length,
                            cuda_error=msg.status, gpu=c.gpus[m.range.gpu_slot])
        elif t == proto.MsgType.BYE:
            raise ConnectionError("bye")
        else:
            raise proto.ProtocolError(f"a {t.name} message from a shim")

    def _take_slot(self, c: Container, p: Process, wanted: int) -> int:
        if wanted != proto.NO_SLOT and wanted < proto.ACTIVITY_SLOTS and self.slots.get(wanted) is None:
            slot = wanted  # free, or a ghost left from before a restart coming back
        else:
            free = [s for s in range(proto.ACTIVITY_SLOTS) if s not in self.slots]
            if not free:
                self.log.warning("no activity slot left: this production process is not seen by gating",
                                 container=c.id, cls=c.label)
                return proto.NO_SLOT
            slot = free[0]
        self.ghosts.pop(slot, None)
        self.slots[slot] = (c.id, p.id)
        return slot

    def _clear_slot(self, slot: int, uuids) -> None:
        """A production process is gone (its slot already released): its byte and its
        expectation go, and opportunistic shims read no further than the slots in use."""
        for u in uuids:
            if u in self.gpus:
                self.gpus[u].activity.clear(slot, in_use=self.slots)

    def _drop_process(self, c: Container, p: Process) -> None:
        if c.processes.pop(p.id, None) is None:
            return
        if p.slot != proto.NO_SLOT and self.slots.get(p.slot) == (c.id, p.id):
            del self.slots[p.slot]
            self._clear_slot(p.slot, c.gpus)
        held = [0] * len(c.gpus)
        for key in [k for k, owner in c.range_owner.items() if owner == p.id]:
            r = c.ranges.pop(key, None)
            c.range_owner.pop(key, None)
            if r is not None:
                held[r.gpu_slot] += r.size
        if c.control and any(held):  # it died holding memory: the container no longer does
            for slot, n in enumerate(held):
                c.control.budget(slot).released_bytes += n

    # ------------------------------------------------------------------ control

    async def _control_loop(self) -> None:
        while True:
            period = self.cfg.daemon.control_period_ms / 1000
            await asyncio.sleep(max(0.0, self._last_tick + period - time.monotonic()))
            try:
                self.tick()
            except Exception as e:  # one bad period must not stop control
                unlogged = self._failures.check(f"{type(e).__name__}: {e}", time.monotonic())
                if unlogged is not None:  # journald gets one traceback a minute, not ten a second
                    self.log.exception("control period failed", unlogged_repeats=unlogged,
                                       next_repeat_logged_after_s=self._failures.every_s)
            else:
                unlogged = self._failures.ok()
                if unlogged is not None:
                    self.log.info("control periods work again", unlogged_repeats=unlogged)

    def tick(self) -> None:
        now = time.monotonic()
        dt = max(now - self._last_tick, 1e-3)
        self._last_tick = now
        for slot, deadline in list(self.ghosts.items()):
            if now >= deadline:  # its process never came back after the restart
                del self.ghosts[slot]
                self.slots.pop(slot, None)
                self._clear_slot(slot, self.gpus)
        for c in list(self.containers.values()):
            if c.phase == Phase.RESERVED and now - c.reserved_at > self.cfg.daemon.reservation_timeout_s:
                self.release(c, f"reserved but never attached within {self.cfg.daemon.reservation_timeout_s:g}s")
        stolen_s = self.stolen.since_last(now)
        for uuid, st in self.gpus.items():
            self._control_gpu(st, now, dt, stolen_s)
        hb = time.monotonic_ns()
        for c in self.containers.values():
            c.control.heartbeat(hb)
        if now - self._last_save > SAVE_EVERY_S:
            self._last_save = now
            for c in self.containers.values():
                with contextlib.suppress(OSError):
                    c.save()

    def _on(self, uuid: str):
        return [(c, c.gpu_slot(uuid)) for c in self.containers.values() if uuid in c.gpus]

    def _control_gpu(self, st: GpuState, now: float, dt: float, stolen_s: float) -> None:
        uuid = st.gpu.uuid
        members = self._on(uuid)
        prod_blocks = opp_blocks = 0
        busy_ns = gated_ns = overlap_ns = 0
        for c, slot in members:
            tally = Tally.of(c.control.counters(slot), c.control.shim)
            d = tally.since(c.last[slot])
            c.last[slot] = tally
            c.achieved[slot] = _smoothed(c.achieved[slot], d.blocks / dt)
            if c.cls == proto.Class.PRODUCTION:
                prod_blocks += d.blocks
                busy_ns = max(busy_ns, d.busy_ns)  # (the jobs' busy spells may coincide: no sum)
            else:
                c.bound_wait[slot] = _smoothed(c.bound_wait[slot], d.inflight_wait_ns / 1e9 / dt)
                opp_blocks += d.blocks
                gated_ns += d.gated_ns
                overlap_ns += d.overlap_ns
        prod = [(c, s) for c, s in members if c.cls == proto.Class.PRODUCTION]
        opp = [(c, s) for c, s in members if c.cls == proto.Class.OPPORTUNISTIC]
        procs = frozenset(p.id for c, _ in prod for p in c.processes.values() if p.slot != proto.NO_SLOT)
        for c, _ in prod:
            for p in c.processes.values():
                if uuid not in p.gpus and st.activity.used(p.slot):
                    p.gpus.add(uuid)
        rhythm_ns = max((_rhythm_ns(c, st.activity) for c, _ in prod), default=0)
        budget = st.controller.step(Sample(now, dt, prod_blocks, opp_blocks, bool(prod), bool(opp),
                                           _marks(prod, uuid), procs,
                                           Overlap(busy_ns / 1e9, gated_ns / 1e9, overlap_ns / 1e9), rhythm_ns / 1e9,
                                           stolen_s=stolen_s))
        # a container none of whose processes has connected yet does not take part in the split
        claimants = [Claimant(c.id, c.attained(), c.achieved[s], c.budget[s], c.order, c.bound_wait[s])
                     for c, s in opp if c.processes]
        rates = split(self.cfg.control.share, budget.rate, claimants, st.share, self.cfg.control.las_min_share,
                      one_only=self.cfg.control.controller == Controller.TGS_PAPER, bounded=budget.inflight > 0)
        decided = st.last.get("decided")
        # a decision: the budget or its reason changed. Not the solo figure alone: production
        # measured alone moves it every period, and "production arrived" was logged ten
        # times a second and read 0.1 s old in `tgs status` for as long as production ran alone
        if (st.last.get("rate"), st.last.get("state"), st.last.get("inflight"), decided and decided[1]) != (
                budget.rate, budget.state, budget.inflight, budget.why):
            decided = (now, budget.why)  # for `tgs status`: the latest decision, and why
            self.log.debug("controller decision", gpu=uuid, state=budget.state, rate=_rate_text(budget.rate),
                           inflight_max=budget.inflight,
                           solo_blocks_per_s=budget.solo, progress_blocks_per_s=round(st.controller.progress),
                           overlap_per_s=None if budget.overlap is None else round(budget.overlap, 4),
                           shares={k: _rate_text(v) for k, v in rates.items()}, **({"why": budget.why} if budget.why else {}))
        gate = budget.gate and not self._production_holds_an_idle_gpu(st, now, bool(prod), prod_blocks > 0)
        st.last = {"state": budget.state, "rate": budget.rate, "solo": budget.solo,
                   "inflight": budget.inflight, "gate": gate, "overlap": budget.overlap, "decided": decided}
        # behind production, one container launches at a time; without production, all at once
        if gate:
            turns = take_turns(st.share, rates, budget.rate, dt)
        else:
            st.share.turn, turns = Turn(), rates
        for c, slot in opp:
            self._write_opportunistic(c, slot, rates.get(c.id, budget.rate), budget.inflight, gate, st,
                                      rate=turns.get(c.id))
        for c, slot in prod:
            c.control.set_budget(slot, rate=UNLIMITED, gate=False, inflight=0, quota=0, view_total=st.budget_bytes)
        self._memory(st, prod, opp)

    def _production_holds_an_idle_gpu(self, st: GpuState, now: float, production: bool, launched: bool) -> bool:
        """Whether production's activity byte has been held with the GPU idle for long
        enough that opportunistic work goes on (stall.py); logged when it starts and ends."""
        held = production and not launched and bool(st.activity.busy_slots())
        # NVML is asked only while the lift is being decided, not while it stands
        utilization = self.inventory.utilization(st.gpu.index) if held and not st.held.lifted else None
        was = st.held.lifted
        lifted = st.held.step(now, held, launched, utilization)
        if lifted != was:
            if lifted:
                self.log.info("production holds the GPU without using it: opportunistic work goes on until it "
                              "launches again", gpu=st.gpu.uuid, held_s=round(now - (st.held.since or now), 1))
            else:
                self.log.info("production goes on: opportunistic work waits behind it again", gpu=st.gpu.uuid)
        return lifted

    def _write_opportunistic(self, c: Container, slot: int, share: int, inflight: int, gate: bool, st: GpuState,
                             rate: int | None = None) -> None:
        """`share` is the container's part of the GPU's budget; `rate`, what it may launch at
        now when it takes turns (the budget while it holds the turn, nothing while it
        waits). One not among them (new, or its processes yet to connect) waits while
        others take turns, else launches at its share. The floor the shim slides to if tgsd
        goes away comes from the share."""
        cc = self.cfg.control
        if rate is None:
            rate = 0 if st.share.turn.holder is not None else share
        finite = share if share != UNLIMITED else int(c.achieved[slot])
        floor = max(int(finite * cc.floor_fraction), 1) if cc.floor_fraction > 0 else 0
        burst = 0 if rate == UNLIMITED else max(int(rate * cc.burst_ms / 1000), 1)
        quota = self.cfg.memory.opportunistic_quota.of(st.budget_bytes)
        c.control.set_budget(slot, rate=rate, burst=burst, floor=floor, inflight=inflight, gate=gate,
                             anticipate=gate and cc.anticipate, quota=quota, view_total=quota)
        c.budget[slot] = share

    def _write_budgets(self, c: Container) -> None:
        """A new container's budgets until the controller's next period: production free;
        opportunistic gated behind production when there is some, under the GPU's present
        rate and in-flight bound, and waiting while others take turns."""
        for slot, uuid in enumerate(c.gpus):
            st = self.gpus[uuid]
            if c.cls == proto.Class.PRODUCTION:
                c.control.set_budget(slot, rate=UNLIMITED, gate=False, inflight=0, view_total=st.budget_bytes)
            else:
                self._write_opportunistic(c, slot, st.last.get("rate", UNLIMITED),
                                          st.last.get("inflight", self.cfg.control.inflight),
                                          st.last.get("gate", True), st)

    def _memory(self, st: GpuState, prod, opp) -> None:
        if not self.cfg.memory.orders:
            return
        prod_foot = sum(c.footprint(s) for c, s in prod)
        ranges, owners = [], {}
        for c, slot in opp:
            for key, r in c.ranges.items():
                if r.gpu_slot == slot:
                    ranges.append(r)
                    owners[id(r)] = (c, key)
            # memory the shims did not tell us range by range still counts
            told = sum(r.size for k, r in c.ranges.items() if r.gpu_slot == slot)
            untracked = max(0, c.footprint(slot) - told)
            if untracked:
                ranges.append(residency.Range(c.id, slot, 0, untracked, evictable=False))
        plan = residency.plan(st.budget_bytes, prod_foot, ranges)
        for m in plan.moves:
            c, key = owners[id(m.range)]
            p = c.processes.get(c.range_owner.get(key, -1))
            if p is None:
                continue
            self._order_ids += 1
            m.range.pending = m
            p.pending[self._order_ids] = m
            p.writer.write(proto.frame(proto.message(proto.MsgOrder, gpu=m.range.gpu_slot, op=int(m.op),
                                                     order_id=self._order_ids, ptr=m.ptr, size=m.length)))
            self.log.info("memory order", container=c.id, cls=c.label, gpu=st.gpu.uuid, op=m.op.name.lower(),
                          bytes=m.length, range_bytes=m.range.size, production_footprint=prod_foot,
                          budget=st.budget_bytes)
        if plan.over_by and not st.unfixable_warned:
            # what opportunistic containers hold on the GPU that no order can move
            stuck: dict[str, int] = {}
            for r in ranges:
                if not r.evictable and r.resident:
                    stuck[r.container] = stuck.get(r.container, 0) + r.resident
            fix = (f"opportunistic containers hold {sum(stuck.values()) >> 20} MiB that TGS cannot move to the host "
                   "(cuMemCreate memory, which PyTorch's expandable_segments allocates, or allocations made before "
                   "tgsd knew of them): set [memory] opportunistic_quota low enough that production's memory and "
                   "theirs fit the budget" if stuck else
                   "production alone needs more than the budget: raise [memory] budget, or lower reserve")
            self.log.warning("GPU memory over budget and nothing opportunistic left to move", gpu=st.gpu.uuid,
                             over_by=plan.over_by, budget=st.budget_bytes, production_footprint=prod_foot,
                             unmovable=stuck, fix=fix)
        st.unfixable_warned = bool(plan.over_by)

    # ------------------------------------------------------------------ status

    def status(self) -> dict:
        gpus = []
        for uuid, st in self.gpus.items():
            members = []
            for c, slot in self._on(uuid):
                ctr = c.control.counters(slot)
                shim = c.control.shim
                b = c.control.budget(slot)
                on = [r for r in c.ranges.values() if r.gpu_slot == slot]
                members.append({
                    "id": c.id, "class": c.label, "phase": c.phase.value, "processes": len(c.processes),
                    "budget_blocks_per_s": None if b.rate_blocks_per_s == UNLIMITED else b.rate_blocks_per_s,
                    "inflight_max": b.inflight_max, "gated": bool(b.flags & proto.GPU_GATE),
                    "anticipating": bool(b.flags & proto.GPU_ANTICIPATE),
                    "turn": None if st.share.turn.holder is None or c.cls == proto.Class.PRODUCTION
                    else st.share.turn.holder == c.id,
                    "progress_blocks_per_s": round(c.achieved[slot], 1), "launches": ctr.launches,
                    "attained_blocks": ctr.blocks, "throttled_s": round(ctr.throttled_ns / 1e9, 3),
                    "syncs": ctr.syncs, "iteration_starts": ctr.mark_seq // 2,
                    "busy_s": round(ctr.busy_ns / 1e9, 3),
                    "paused_s": round(c.control.pauses(slot).paused_ns / 1e9, 3),
                    "rhythm_s": round(_rhythm_ns(c, st.activity) / 1e9, 3) or None
                    if c.cls == proto.Class.PRODUCTION else None,
                    "gated_s": round(ctr.gated_ns / 1e9, 3),
                    "beside_production_s": round(ctr.overlap_ns / 1e9, 3),
                    **{proto.wait_key(cause): round(getattr(shim, f"{cause}_wait_ns") / 1e9, 3)
                       for cause in proto.SHIM_WAITS},
                    "memory": {"footprint": c.footprint(slot), "quota": b.mem_quota_bytes or None,
                               "resident": sum(r.resident for r in on), "evicted": sum(r.evicted for r in on),
                               "vmm": ctr.vmm_bytes, "converted": c.converts()},
                })
            last = st.last
            gpus.append({"index": st.gpu.index, "uuid": uuid, "name": st.gpu.name, "memory_total": st.gpu.memory_total,
                         "memory_budget": st.budget_bytes,
                         "controller": {"state": last.get("state", "idle"),
                                        "rate_blocks_per_s": None if last.get("rate", UNLIMITED) == UNLIMITED else last.get("rate"),
                                        "solo_blocks_per_s": None if last.get("solo") is None else round(last["solo"], 1),
                                        "production_progress_blocks_per_s": round(st.controller.progress, 1),
                                        "inflight_max": last.get("inflight"), "gate": last.get("gate"),
                                        "opportunistic_beside_production": None if last.get("overlap") is None
                                        else round(last["overlap"], 4),
                                        "decision": _decision(last.get("decided"))},
                         "containers": members})
        return {"version": 1, "daemon": {"pid": os.getpid(), "version": __version__,
                                         "uptime_s": round(time.monotonic() - self.started, 1),
                                         "state_dir": str(self.paths.state_dir),
                                         "host_cpu_stolen": None if (stolen := self.stolen.recent()) is None
                                         else round(stolen, 3),
                                         "controller": self.cfg.control.controller.value, "share": self.cfg.control.share.value,
                                         "config": str(self.cfg.path) if self.cfg.path else None},
                "gpus": gpus}


def _decision(decided: tuple[float, str] | None) -> dict | None:
    """The status's account of a controller's latest decision (a change of its budget,
    as the decision log writes it): how long ago, and why (None: the controller gave no
    reason)."""
    if decided is None:
        return None
    at, why = decided
    return {"age_s": round(time.monotonic() - at, 1), "why": why or None}


def _marks(prod, uuid: str) -> tuple[Mark, ...]:
    """The latest iteration start of each production container on the GPU with processes,
    when every one of them has marked one: each container's marks time its own progress.
    Otherwise none (production is counted). A production container without processes
    (registered for a job still to come, or between jobs) launches nothing and is left out:
    counted, it turned the timing of the other off (the dynamics benchmark, whose second
    container waits for the pair phase, was counted throughout, and a count over half a
    second, off by an iteration in 25, took noise for a load change). Each mark carries
    the container's pauses of its own before it (tgs_proto.h), which production's progress
    leaves out, where one of the container's processes uses this GPU (`uuid`: a container
    of one rank per GPU has its pauses left out on each), or, where none is known to yet,
    it has one process: the pauses of several on one GPU, each counted by its own shim,
    overlap in ways their sum does not tell. So does its busy time before it (None where
    its pauses are not left out: `Window.host_spells`)."""
    marks = []
    for c, slot in prod:
        if not c.processes:
            continue
        m = c.control.iteration_mark(slot)
        if m is None:
            return ()
        users = sum(uuid in p.gpus for p in c.processes.values())
        alone = users == 1 if users else len(c.processes) == 1
        marks.append(Mark(c.id, m.ns / 1e9, m.blocks, m.paused_ns / 1e9 if alone else 0.0,
                          m.busy_ns / 1e9 if alone else None, m.number))
    return tuple(marks)


def _rhythm_ns(c: Container, activity: ActivityFile) -> int:
    """The longest idle spell a production container's processes now expect on the GPU
    (`activity`'s) as their rhythm (ActivityFile.rhythm_ns; 0: none stands)."""
    return max((activity.rhythm_ns(p.slot) for p in c.processes.values()), default=0)


def _smoothed(figure: float, reading: float) -> float:
    """A smoothed figure taken one period's reading further."""
    return (1 - SMOOTHING) * figure + SMOOTHING * reading


def _rate_text(rate: int) -> str:
    return "unlimited" if rate == UNLIMITED else str(rate)


def notify_systemd(state: str) -> None:
    """sd_notify(3) without libsystemd."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.connect(addr)
        s.sendall(state.encode())

