"""Sizes as operators write them: "16G", "512M", "64K", "16GiB" or bytes."""
from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*$")
_MULT = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes in `text`; binary units. Raises ValueError naming the text."""
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a size (use e.g. 16G, 512M, 64K or a byte count)")
    return int(float(m.group(1)) * _MULT[m.group(2).lower()])


def format_size(n: int) -> str:
    for unit, mult in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= mult and n % (mult // 16 or 1) == 0:
            v = n / mult
            return f"{v:g}{unit}"
    return str(n)
