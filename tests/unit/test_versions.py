"""The supported vLLM range is one value: the version gate, its message and the
gpu extra of pyproject.toml all read patches.SUPPORTED_VLLM."""

from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from vllm_selfspec import patches

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_gpu_extra_pins_the_supported_range():
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    (vllm,) = [Requirement(r) for r in extras["gpu"] if Requirement(r).name == "vllm"]
    assert vllm.specifier == SpecifierSet(patches.SUPPORTED_VLLM)


@pytest.mark.parametrize("version, ok", [("0.32.0", True), ("0.32.0+cpu", True),
                                         ("0.33.1.dev5+g0123abc", True), ("0.31.9", False),
                                         ("0.34.0", False)])
def test_version_gate(version, ok):
    assert patches.version_supported(version) is ok


def test_version_help_names_the_range():
    msg = patches.version_help("0.40.0")
    assert "0.40.0" in msg and msg.count(patches.SUPPORTED_VLLM) == 2
