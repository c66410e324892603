"""Choosing Chimera's checkpoint at start-up (front-end process, before any engine
process starts): the user's ``checkpoint``, else one trained for these exact weights
(cached by ``tools/train_chimera.py --install``, or shipped with the plugin for the
embedded model). The file header is checked against the model; the worker loads the
weights (``drafter.PluginDrafter``).
"""

from __future__ import annotations

from pathlib import Path

from vllm_selfspec.proposers.artifacts import ModelStamp, artifact_path
from vllm_selfspec.proposers.chimera import check_checkpoint, load_draft_vocab_ids  # noqa: F401

SHIPPED = Path(__file__).resolve().parent / "trained"


def shipped_checkpoint(stamp: ModelStamp) -> Path | None:
    """A checkpoint shipped in ``vllm_selfspec/trained/`` made for these exact weights."""
    if not stamp.fingerprint or not SHIPPED.is_dir():
        return None
    for f in sorted(SHIPPED.glob("chimera-*.safetensors")):
        try:
            check_checkpoint(f, stamp)
        except ValueError:
            continue
        return f
    return None


def default_checkpoint(stamp: ModelStamp) -> Path | None:
    cached = artifact_path("chimera", stamp)
    if cached is not None and cached.is_file():
        return cached
    return shipped_checkpoint(stamp)
