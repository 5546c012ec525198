"""`tgs sim run` and `tgs sim status`, as an operator uses them."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tgs_runtime.workload import summary


def tgs(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "tgs_runtime", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def clean_env(libshim):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIMGPU_")}
    env["TGS_LIBSHIM_BUILD"] = str(libshim.root)
    return env


def test_sim_run_then_status(libshim, tmp_path):
    state = tmp_path / "gpu.state"
    env = clean_env(libshim)
    env["SIMGPU_LABEL"] = "cli-job"
    run = tgs("sim", "run", "--state", str(state), "--memory", "2G", "--devices", "2", "--",
              "tgs-workload-placeholder", env=env)
    assert run.returncode != 0 and "cannot run tgs-workload-placeholder" in run.stderr
    run = tgs("sim", "run", "--state", str(state), "--memory", "2G", "--devices", "2", "--",
              sys.executable, "-m", "tgs_runtime", "workload", "--seconds", "0.5", "--json", env=env)
    assert run.returncode == 0, run.stderr
    assert summary(run.stdout).iterations > 10
    st = tgs("sim", "status", "--state", str(state), "--json", env=env)
    assert st.returncode == 0, st.stderr
    snap = json.loads(st.stdout)
    assert snap["settings"]["devices"] == 2 and snap["settings"]["memory"] == 2 << 30
    assert snap["devices"][0]["contexts"][0]["label"] == "cli-job"
    human = tgs("sim", "status", "--state", str(state), env=env)
    assert "cli-job" in human.stdout and "2 device(s) of 2G" in human.stdout


def test_sim_run_replaces_an_idle_state_with_other_settings(libshim, tmp_path):
    state = tmp_path / "gpu.state"
    env = clean_env(libshim)
    for memory in ("1G", "3G"):
        run = tgs("sim", "run", "--state", str(state), "--memory", memory, "--", sys.executable, "-m",
                  "tgs_runtime", "workload", "--seconds", "0.1", "--json", env=env)
        assert run.returncode == 0, run.stderr
    snap = json.loads(tgs("sim", "status", "--state", str(state), "--json", env=env).stdout)
    assert snap["settings"]["memory"] == 3 << 30


def test_sim_run_bad_memory(libshim, tmp_path):
    run = tgs("sim", "run", "--state", str(tmp_path / "s"), "--memory", "lots", "--", "true", env=clean_env(libshim))
    assert run.returncode != 0 and "'lots' is not a size" in run.stderr


def test_sim_status_without_state(libshim, tmp_path):
    st = tgs("sim", "status", "--state", str(tmp_path / "none"), env=clean_env(libshim))
    assert st.returncode == 1 and "does not exist" in st.stderr
    assert f"tgs sim run --state {tmp_path / 'none'} -- CMD" in st.stderr, "it says how to make one"
