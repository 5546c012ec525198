"""Frames on every TGS socket: a u32 little-endian length, then at most 64 KiB of body
(ARCHITECTURE.md, "Framing")."""
from __future__ import annotations

import json
import socket
import struct

from tgs_runtime.proto import MAX_FRAME


class FrameError(ValueError):
    """An oversized or malformed frame: the connection it came on is closed."""


def encode(body: bytes) -> bytes:
    if len(body) > MAX_FRAME:
        raise FrameError(f"a body of {len(body)} bytes is larger than {MAX_FRAME}")
    return struct.pack("<I", len(body)) + body


async def read(reader) -> bytes | None:
    """The next body from an asyncio.StreamReader, or None at a clean end of stream.
    (asyncio is imported here only: tgs-runtime and tgs-hook start without it.)"""
    import asyncio

    try:
        head = await reader.readexactly(4)
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise FrameError("the stream ended inside a frame header") from None
        return None
    (n,) = struct.unpack("<I", head)
    if n > MAX_FRAME:
        raise FrameError(f"a frame of {n} bytes (the limit is {MAX_FRAME})")
    try:
        return await reader.readexactly(n)
    except asyncio.IncompleteReadError:
        raise FrameError("the stream ended inside a frame") from None


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        buf += chunk
    return buf


def call_json(path: str, request: dict, timeout: float = 10.0) -> dict:
    """One JSON request and its answer on a framed socket (the admin socket)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(encode(json.dumps(request).encode()))
        (n,) = struct.unpack("<I", _recv_exact(s, 4))
        if n > MAX_FRAME:
            raise FrameError(f"a reply of {n} bytes")
        return json.loads(_recv_exact(s, n))
