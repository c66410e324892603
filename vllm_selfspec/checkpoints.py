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


def resolve_draft_vocab(opts: dict[str, Any], info: ModelInfo, core: dict[str, Any]) -> None:
    """Key ``draft_vocab`` = N > 0 of the layer-skip methods: the N most frequent tokens of
    the model's own answers, read from the draft vocabulary (most frequent first) of the
    Chimera checkpoint cached or shipped for these exact weights. Fixes
    ``opts["draft_vocab_path"]``; the worker reads the ids (``drafter.PluginDrafter``)."""
    n = int(opts.get("draft_vocab") or 0)
    if n <= 0:
        return
    found = default_checkpoint(info.stamp)
    if found is None:
        cache = artifact_path("chimera", info.stamp)
        raise ArtifactError(
            f"draft_vocab={n}: no draft vocabulary for this model ({info.stamp.describe()}); "
            f"build one from its own answers with python tools/train_chimera.py --model MODEL "
            f"--tokens 300000 --out {cache or 'CKPT.safetensors'} (the checkpoint stores it), "
            f"or set draft_vocab 0")
    cfg = check_checkpoint(found, info.stamp).get("config", {})
    size = int(cfg.get("draft_vocab_size", 0))
    if n > size:
        raise ArtifactError(f"draft_vocab={n}: the draft vocabulary of {found} has {size} "
                            f"tokens; use at most {size} (or 0: the full vocabulary)")
    opts["draft_vocab_path"] = str(found)
    logger.info("vllm_selfspec: draft vocabulary: the %d most frequent tokens of %s", n, found)


def load_draft_vocab_ids(path: str | Path, n: int) -> list[int]:
    """The first (most frequent) ``n`` target ids of a checkpoint's draft vocabulary."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return f.get_tensor("draft_ids")[:n].long().tolist()
