"""The contract with libtgs.so, mirrored once from libshim/include/tgs_proto.h.

tests/test_proto.py compiles a program against the header and checks every size,
offset and constant here against it. Change both together (and ARCHITECTURE.md)."""
from __future__ import annotations

import ctypes as C
import enum
import struct

PROTO_VERSION = 1
CONTROL_MAGIC = 0x4C525443
ACTIVITY_MAGIC = 0x56544341
MSG_MAGIC = 0x314D4754
MAX_FRAME = 65536
MAX_GPUS = 8
UUID_LEN = 48
ACTIVITY_SLOTS = 256
EXPECT_SLOTS = 64  # the lowest activity slots, whose processes say when they expect to launch again
NO_SLOT = 0xFFFFFFFF
PAGE = 4096
CONTROL_SIZE = 4 * PAGE
DAEMON_OFFSET = PAGE
SHIM_OFFSET = 2 * PAGE
PAUSES_OFFSET = 3 * PAGE  # production's pauses (tgs_gpu_pauses), outside the shim part
ACTIVITY_SIZE = PAGE
RATE_UNLIMITED = (1 << 64) - 1
NS_PER_BLOCK_SHIFT = 16
GPU_GATE = 1
GPU_ANTICIPATE = 2
MEM_EVICTED = 1

DEFAULT_STATE_DIR = "/run/tgs"
CONTAINER_DIR = "/run/tgs"
SOCKET_NAME = "tgs.sock"
CONTROL_NAME = "control"
REGISTRATION_NAME = "registration.json"
ACTIVITY_DIR = "activity"
ADMIN_SOCKET_NAME = "tgsd.sock"
DEFAULT_SHIM_PATH = "/usr/lib/tgs/libtgs.so"


class Class(enum.IntEnum):
    NONE = 0
    PRODUCTION = 1
    OPPORTUNISTIC = 2


class MsgType(enum.IntEnum):
    HELLO = 1
    HELLO_ACK = 2
    ALLOC = 3
    FREE = 4
    ORDER = 5
    ORDER_ACK = 6
    BYE = 7


class MemKind(enum.IntEnum):
    MANAGED = 1
    APP_MANAGED = 2
    DEVICE = 3
    VMM = 4

    @property
    def evictable(self) -> bool:
        return self in (MemKind.MANAGED, MemKind.APP_MANAGED)


class OrderOp(enum.IntEnum):
    EVICT = 1
    RESTORE = 2


# Constants the test compares with the header, by their C names.
CONSTANTS = {
    "TGS_PROTO_VERSION": PROTO_VERSION, "TGS_CONTROL_MAGIC": CONTROL_MAGIC, "TGS_ACTIVITY_MAGIC": ACTIVITY_MAGIC,
    "TGS_MSG_MAGIC": MSG_MAGIC, "TGS_MAX_FRAME": MAX_FRAME, "TGS_MAX_GPUS": MAX_GPUS, "TGS_UUID_LEN": UUID_LEN,
    "TGS_ACTIVITY_SLOTS": ACTIVITY_SLOTS, "TGS_EXPECT_SLOTS": EXPECT_SLOTS, "TGS_NO_SLOT": NO_SLOT, "TGS_PAGE": PAGE,
    "TGS_CONTROL_SIZE": CONTROL_SIZE,
    "TGS_DAEMON_OFFSET": DAEMON_OFFSET, "TGS_SHIM_OFFSET": SHIM_OFFSET, "TGS_PAUSES_OFFSET": PAUSES_OFFSET,
    "TGS_ACTIVITY_SIZE": ACTIVITY_SIZE,
    "TGS_RATE_UNLIMITED": RATE_UNLIMITED, "TGS_NS_PER_BLOCK_SHIFT": NS_PER_BLOCK_SHIFT, "TGS_GPU_GATE": GPU_GATE,
    "TGS_GPU_ANTICIPATE": GPU_ANTICIPATE,
    "TGS_MEM_EVICTED": MEM_EVICTED,
    **{f"TGS_CLASS_{c.name}": c.value for c in Class},
    **{f"TGS_MSG_{t.name}": t.value for t in MsgType},
    **{f"TGS_MEM_{k.name}": k.value for k in MemKind},
    **{f"TGS_ORDER_{o.name}": o.value for o in OrderOp},
}
STRINGS = {
    "TGS_DEFAULT_STATE_DIR": DEFAULT_STATE_DIR, "TGS_CONTAINER_DIR": CONTAINER_DIR, "TGS_SOCKET_NAME": SOCKET_NAME,
    "TGS_CONTROL_NAME": CONTROL_NAME, "TGS_REGISTRATION_NAME": REGISTRATION_NAME, "TGS_ACTIVITY_DIR": ACTIVITY_DIR,
    "TGS_ADMIN_SOCKET_NAME": ADMIN_SOCKET_NAME, "TGS_DEFAULT_SHIM_PATH": DEFAULT_SHIM_PATH,
}

u8, u16, u32, u64 = C.c_uint8, C.c_uint16, C.c_uint32, C.c_uint64


class Struct(C.LittleEndianStructure):
    _pack_ = 8


class ControlHeader(Struct):
    _c_name_ = "tgs_control_header"
    _fields_ = [("magic", u32), ("version", u32), ("size", u32), ("header_size", u32), ("daemon_offset", u32),
                ("daemon_size", u32), ("shim_offset", u32), ("shim_size", u32), ("reserved", u8 * 32)]


class GpuBudget(Struct):
    _c_name_ = "tgs_gpu_budget"
    _fields_ = [("uuid", C.c_char * UUID_LEN), ("rate_blocks_per_s", u64), ("ns_per_block_fp", u64),
                ("burst_blocks", u64), ("floor_blocks_per_s", u64), ("mem_quota_bytes", u64),
                ("mem_view_total_bytes", u64), ("inflight_max", u32), ("flags", u32), ("released_bytes", u64),
                ("reserved", u64 * 3)]


class DaemonPart(Struct):
    _c_name_ = "tgs_daemon_part"
    _fields_ = [("cls", u32), ("ngpus", u32), ("heartbeat_ns", u64), ("generation", u64), ("stale_ms", u32),
                ("convert", u32), ("reserved", u64 * 6), ("gpu", GpuBudget * MAX_GPUS)]


class GpuCounters(Struct):
    _c_name_ = "tgs_gpu_counters"
    _fields_ = [("launches", u64), ("blocks", u64), ("syncs", u64), ("gcra_tat_ns", u64), ("throttled_ns", u64),
                ("waits", u64), ("footprint_bytes", u64), ("vmm_bytes", u64), ("evicted_bytes", u64),
                ("restored_bytes", u64), ("mark_seq", u64), ("mark_ns", u64), ("mark_blocks", u64),
                ("busy_ns", u64), ("gated_ns", u64), ("overlap_ns", u64)]


# What an opportunistic container's launching threads wait for, in words, by the cause's
# name: behind busy production (GpuCounters.gated_ns, per GPU), else ShimPart's
# <cause>_wait_ns (the container's, all its GPUs together). `tgs status --json` shows each as
# wait_key(cause) seconds (docs/status.md).
WAIT_CAUSES = {"gated": "behind production", "inflight": "at the in-flight bound",
               "anticipation": "anticipating production", "token": "for tokens"}
SHIM_WAITS = ("inflight", "anticipation", "token")  # those counted in ShimPart


def wait_key(cause: str) -> str:
    """The status document's key of a wait cause's seconds."""
    return "gated_s" if cause == "gated" else f"{cause}_wait_s"


def waits_in_words(amounts: dict[str, float | None], unit: str, fmt: str = "g") -> str:
    """Waits by cause in words, each amount in `unit`: 'waited 0.3 s/s behind production,
    ...' (a cause whose amount is None was not counted)."""
    known = [f"{v:{fmt}} {unit} {WAIT_CAUSES[k]}" for k, v in amounts.items() if v is not None]
    return "waited " + ", ".join(known) if known else "waits not counted"


class ShimPart(Struct):
    _c_name_ = "tgs_shim_part"
    _fields_ = [("processes", u32), ("pad", u32), ("inflight_wait_ns", u64), ("anticipation_wait_ns", u64),
                ("token_wait_ns", u64), ("reserved", u64 * 4), ("gpu", GpuCounters * MAX_GPUS)]


class GpuPauses(Struct):
    _c_name_ = "tgs_gpu_pauses"
    _fields_ = [("paused_ns", u64), ("mark_paused_ns", u64)]


class Control(Struct):
    _c_name_ = "tgs_control"
    _fields_ = [
        ("header", ControlHeader),
        ("pad0", u8 * (DAEMON_OFFSET - C.sizeof(ControlHeader))),
        ("daemon", DaemonPart),
        ("pad1", u8 * (SHIM_OFFSET - DAEMON_OFFSET - C.sizeof(DaemonPart))),
        ("shim", ShimPart),
        ("pad2", u8 * (PAUSES_OFFSET - SHIM_OFFSET - C.sizeof(ShimPart))),
        ("pauses", GpuPauses * MAX_GPUS),
        ("mark_busy_ns", u64 * MAX_GPUS),  # production's busy_ns at its latest iteration start
        ("pad3", u8 * (CONTROL_SIZE - PAUSES_OFFSET - MAX_GPUS * (C.sizeof(GpuPauses) + C.sizeof(u64)))),
    ]


class Expectation(Struct):
    """A production process's next launch, as it expects it when it goes idle."""
    _c_name_ = "tgs_expectation"
    _fields_ = [("idle_ns", u64), ("due_ns", u64), ("due_until_ns", u64)]


class Activity(Struct):
    _c_name_ = "tgs_activity"
    _fields_ = [("magic", u32), ("version", u32), ("nslots", u32), ("expect_slots", u32), ("reserved", u64 * 7),
                ("busy", u8 * ACTIVITY_SLOTS), ("expect", Expectation * EXPECT_SLOTS),
                ("step_spell_ns", u64 * EXPECT_SLOTS)]


class MsgHeader(Struct):
    _c_name_ = "tgs_msg_header"
    _fields_ = [("magic", u32), ("type", u16), ("version", u16), ("size", u32), ("seq", u32)]


class MsgHello(Struct):
    _c_name_ = "tgs_msg_hello"
    _type_ = MsgType.HELLO
    _fields_ = [("h", MsgHeader), ("pid", u32), ("cuda_version", u32), ("driver_version", u32),
                ("activity_slot", u32), ("comm", C.c_char * 16)]


class MsgHelloAck(Struct):
    _c_name_ = "tgs_msg_hello_ack"
    _type_ = MsgType.HELLO_ACK
    _fields_ = [("h", MsgHeader), ("status", u32), ("activity_slot", u32), ("process_id", u64)]


class MsgMem(Struct):
    _c_name_ = "tgs_msg_mem"
    _type_ = None  # ALLOC or FREE
    _fields_ = [("h", MsgHeader), ("gpu", u32), ("kind", u32), ("flags", u32), ("device", u32), ("ptr", u64),
                ("size", u64)]


class MsgOrder(Struct):
    _c_name_ = "tgs_msg_order"
    _type_ = MsgType.ORDER
    _fields_ = [("h", MsgHeader), ("gpu", u32), ("op", u32), ("order_id", u64), ("ptr", u64), ("size", u64)]


class MsgOrderAck(Struct):
    _c_name_ = "tgs_msg_order_ack"
    _type_ = MsgType.ORDER_ACK
    _fields_ = [("h", MsgHeader), ("op", u32), ("status", u32), ("order_id", u64), ("bytes", u64)]


class MsgBye(Struct):
    _c_name_ = "tgs_msg_bye"
    _type_ = MsgType.BYE
    _fields_ = [("h", MsgHeader)]


STRUCTS = [ControlHeader, GpuBudget, DaemonPart, GpuCounters, ShimPart, GpuPauses, Control, Expectation, Activity,
           MsgHeader,
           MsgHello, MsgHelloAck, MsgMem, MsgOrder, MsgOrderAck, MsgBye]

# What each message type's body must be (the shim's side of the socket).
BODY = {MsgType.HELLO: MsgHello, MsgType.HELLO_ACK: MsgHelloAck, MsgType.ALLOC: MsgMem, MsgType.FREE: MsgMem,
        MsgType.ORDER: MsgOrder, MsgType.ORDER_ACK: MsgOrderAck, MsgType.BYE: MsgBye}


class ProtocolError(ValueError):
    """A frame or body that breaks the contract: the connection is closed."""


def message(cls: type[Struct], type_: MsgType | None = None, seq: int = 0, **fields) -> Struct:
    m = cls(**fields)
    m.h.magic = MSG_MAGIC
    m.h.type = int(type_ if type_ is not None else cls._type_)
    m.h.version = PROTO_VERSION
    m.h.size = C.sizeof(cls)
    m.h.seq = seq
    return m


def frame(body: bytes | Struct) -> bytes:
    data = bytes(body)
    if len(data) > MAX_FRAME:
        raise ProtocolError(f"a body of {len(data)} bytes is larger than {MAX_FRAME}")
    return struct.pack("<I", len(data)) + data


def parse(body: bytes) -> Struct:
    """A message from the shim side, checked against the contract."""
    if len(body) < C.sizeof(MsgHeader):
        raise ProtocolError(f"a body of {len(body)} bytes is shorter than a header")
    h = MsgHeader.from_buffer_copy(body[: C.sizeof(MsgHeader)])
    if h.magic != MSG_MAGIC:
        raise ProtocolError(f"bad magic {h.magic:#x}")
    if h.version != PROTO_VERSION:
        raise ProtocolError(f"protocol version {h.version}, expected {PROTO_VERSION}")
    try:
        cls = BODY[MsgType(h.type)]
    except ValueError:
        raise ProtocolError(f"unknown message type {h.type}") from None
    if h.size != len(body) or len(body) != C.sizeof(cls):
        raise ProtocolError(f"a {MsgType(h.type).name} of {len(body)} bytes (header says {h.size}), "
                            f"expected {C.sizeof(cls)}")
    return cls.from_buffer_copy(body)


def uuid_bytes(uuid: str) -> bytes:
    return uuid.encode()[: UUID_LEN - 1]


def ns_per_block_fp(rate_blocks_per_s: int) -> int:
    """The fixed-point ns per block the shims spend tokens with."""
    if rate_blocks_per_s in (0, RATE_UNLIMITED):
        return 0
    return int(1e9 * (1 << NS_PER_BLOCK_SHIFT) / rate_blocks_per_s)
