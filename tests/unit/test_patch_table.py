"""The patch table (vllm_selfspec/patches.py: PATCHES) lists every patch the module
docstring describes, each applied where its row says."""

import re
from pathlib import Path

from vllm_selfspec import patches

ROOT = Path(__file__).resolve().parents[2] / "vllm_selfspec"


def test_every_documented_patch_has_a_row_and_every_row_a_function():
    documented = re.findall(r"^(P\d+) +\S", patches.__doc__, flags=re.M)
    assert documented == [p.id for p in patches.PATCHES] == [f"P{i}" for i in range(1, 11)]
    for p in patches.PATCHES:
        assert getattr(patches, p.apply.__name__) is p.apply
        assert p.vllm.startswith(">=") and p.target


def test_each_patch_is_applied_where_its_row_says():
    plugin = (ROOT / "plugin.py").read_text()
    drafter = (ROOT / "drafter.py").read_text()
    control = (ROOT / "control.py").read_text()
    for p in patches.PATCHES:
        call = f"patches.{p.apply.__name__}("
        if p.process.startswith(patches.PLUGIN_LOAD):
            assert call in plugin, p.id
        if patches.DRAFTER_START in p.process or "drafter start" in p.process:
            assert call in drafter, p.id
        if p.process == patches.TOOL_RPC:
            assert call in control, p.id
