"""The table `tgs demo` ends with, read back: setting -> [production it/s, vs exclusive,
opportunistic it/s, vs exclusive]."""
from __future__ import annotations

import re


def demo_rows(text: str) -> dict[str, list[float]]:
    return {m.group(1): [float(x) for x in m.group(2, 3, 4, 5)]
            for m in re.finditer(r"^(exclusive|co-execution|TGS)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", text, re.M)}
