"""The config file: validation, the shipped default, reload rules."""
from __future__ import annotations

import re

import pytest

from tgs_runtime import config
from tgs_runtime.config import ConfigError
from tgs_runtime.paths import REPO_ROOT

SHIPPED = REPO_ROOT / "daemon" / "config.toml"


def test_the_shipped_default_is_the_defaults_and_documents_every_key():
    cfg = config.load(SHIPPED)
    defaults = config.Config()
    for section in config.SECTIONS:
        assert getattr(cfg, section) == getattr(defaults, section) or section == "sim", section
    text = SHIPPED.read_text()
    for section, rules in config.RULES.items():
        assert f"[{section}]" in text
        for key in rules:
            assert re.search(rf"^#? ?{key} = ", text, re.M), f"{section}.{key} is not in daemon/config.toml"


@pytest.mark.parametrize("toml,message", [
    ('[control]\nshare = "random"', "control.share = 'random': expected one of 'fair', 'las'"),
    ("[daemon]\ncontrol_period_ms = 0", "daemon.control_period_ms = 0: expected an integer from 10 to 1000"),
    ('[daemon]\nstate_dir = "relative"', "daemon.state_dir = 'relative': expected an absolute path"),
    ('[memory]\nbudget = "lots"', "memory.budget = 'lots': expected a size"),
    ("[memory]\nconvert_production = 1", "memory.convert_production = 1: expected true or false"),
    ('[runtime]\ndefault_class = "batch"', "runtime.default_class = 'batch'"),
    ("[runtime]\nlower_runtime = []", "runtime.lower_runtime = []"),
    ("[gpu]\nx = 1", "[gpu]: unknown section"),
    ("[control]\ntollerance = 0.1", "control.tollerance: unknown key"),
    ("[control\n", "not valid TOML"),
])
def test_errors_name_the_key_the_value_and_what_is_allowed(tmp_path, toml, message):
    p = tmp_path / "c.toml"
    p.write_text(toml)
    with pytest.raises(ConfigError) as e:
        config.load(p)
    assert message in str(e.value) and str(p) in str(e.value)


def test_a_named_file_must_exist(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        config.load(tmp_path / "missing.toml")


def test_memory_amounts():
    cfg = config.from_dict({"memory": {"budget": "90%", "reserve": "1G", "opportunistic_quota": "8G"}})
    assert cfg.memory.budget_of(40 << 30) == int((40 << 30) * 0.9) - (1 << 30)
    assert cfg.memory.opportunistic_quota.of(123) == 8 << 30


def test_changes_and_what_is_live():
    a = config.Config()
    b = config.from_dict({"control": {"share": "las"}, "daemon": {"state_dir": "/x"}})
    changed = config.changes(a, b)
    assert set(changed) == {"control.share", "daemon.state_dir"}
    assert "control.share" in config.LIVE and "daemon.state_dir" not in config.LIVE
