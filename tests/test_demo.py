"""`tgs demo`, the README's first command: it runs on simgpu here, shows live progress and
ends with the table, TGS included."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from tgs_runtime.paths import REPO_ROOT


def test_demo_shows_tgs_protecting_production(libshim):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TGS_", "SIMGPU_"))}
    out = subprocess.run([sys.executable, "-m", "tgs_runtime", "demo", "--seconds", "4"], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "simgpu" in text and "simulated" in text, "a run without a GPU says it is simulated"
    assert re.search(r"TGS\s+production\s+\d+\.\d+s\s+[\d.]+ it/s", text), "live progress of the TGS phase"
    rows = {m.group(1): [float(x) for x in m.group(2, 3, 4, 5)]
            for m in re.finditer(r"^(exclusive|co-execution|TGS)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", text, re.M)}
    assert set(rows) == {"exclusive", "co-execution", "TGS"}, text
    tgs_prod, tgs_opp = rows["TGS"][1], rows["TGS"][3]
    co_prod = rows["co-execution"][1]
    assert tgs_prod >= 0.85, f"production kept {tgs_prod} of exclusive under TGS"
    assert tgs_prod > co_prod, "TGS protects production better than no control"
    assert tgs_opp >= 0.2, f"the opportunistic job got {tgs_opp} of its exclusive throughput"
    assert "With TGS, production kept" in text
