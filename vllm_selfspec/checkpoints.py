"""Choosing Chimera's checkpoint at start-up (front-end process, before any engine
process starts): the user's ``checkpoint``, else one trained for these exact weights
(cached by ``tools/train_chimera.py --install``, or shipped with the plugin for the
embedded model). The file header is checked against the model; the worker loads the
weights (``drafter.PluginDrafter``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_selfspec.log import logger
from vllm_selfspec.methods import SelfSpecConfigError
from vllm_selfspec.model_info import ModelInfo
from vllm_selfspec.proposers.artifacts import ArtifactError, ModelStamp, artifact_path
from vllm_selfspec.proposers.chimera import TRAIN_REMEDY, check_checkpoint

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


def resolve_checkpoint(opts: dict[str, Any], info: ModelInfo, core: dict[str, Any]) -> None:
    """Fix ``opts["checkpoint_path"]`` and, unless the user set it, the number of draft
    tokens (the checkpoint's decoding heads)."""
    path = opts.get("checkpoint")
    if path is None:
        found = default_checkpoint(info.stamp)
        if found is None:
            raise ArtifactError(
                f"no Chimera checkpoint was given and none is cached or shipped for this model "
                f"({info.stamp.describe()}). {TRAIN_REMEDY}")
        path = str(found)
        how = "trained for this model"
    else:
        path = str(Path(path).expanduser())
        how = "checkpoint"
    meta = check_checkpoint(path, info.stamp)
    cfg, training = meta.get("config", {}), meta.get("training", {})
    heads = int(cfg.get("num_heads", 1))
    k = core.get("num_speculative_tokens")
    if k is None:
        core["num_speculative_tokens"] = heads
    elif k > heads and opts.get("method") == "chimera":  # ngrammys-chimera: context drafts
        raise SelfSpecConfigError(
            f"vllm_selfspec: num_speculative_tokens={k} exceeds the {heads} decoding heads of "
            f"the Chimera checkpoint {path}; use at most {heads} (or leave it unset)")
    opts["checkpoint_path"] = path
    logger.info("vllm_selfspec: chimera %s %s: %d heads (%s), draft vocabulary %s, trained on %s "
                "answer tokens", how, path, heads, cfg.get("head_kind", "?"),
                cfg.get("draft_vocab_size", "?"), training.get("answer_tokens", "?"))
