"""Choosing the skip mask at start-up: the user's, a cached searched one, or uniform.

Order (issue "The plugin, end to end", item 3): a mask given with ``skip_mask``
(file or inline, validated against the model); else a searched mask cached for
this model's weights (``artifact_path("masks", stamp)``); else the uniform starting
mask (``proposers.skip_mask.uniform_mask``). The choice is logged once.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from vllm_selfspec.log import logger
from vllm_selfspec.model_info import ModelInfo
from vllm_selfspec.proposers.artifacts import artifact_path, atomic_path
from vllm_selfspec.proposers.skip_mask import SkipMask, SkipMaskError, parse_mask, uniform_mask


def resolve_skip_mask(opts: dict[str, Any], info: ModelInfo) -> SkipMask:
    spec = opts.get("skip_mask")
    if spec is not None:
        mask = parse_mask(spec, info.num_layers, info.stamp, key=opts.get("skip_mask_key"),
                          model_name=info.path)
        logger.info("vllm_selfspec: using skip mask %s", mask.describe())
        return mask
    cached = artifact_path("masks", info.stamp)
    weights = opts.get("draft_weights", "full")
    if cached is not None and cached.exists():
        mask = parse_mask(str(cached), info.num_layers, info.stamp)
        searched_for = mask.metadata.get("draft_weights", "full")
        if searched_for == weights:
            logger.info("vllm_selfspec: no skip_mask given; using the searched mask cached for "
                        "this model: %s", mask.describe())
            return mask
        logger.info("vllm_selfspec: the searched mask cached for this model (%s) was searched "
                    "for draft_weights %r, not %r: not used", cached, searched_for, weights)
    mask = uniform_mask(info.num_layers, float(opts["skip_ratio"]))
    logger.info("vllm_selfspec: no skip_mask given and no searched mask cached for this model; "
                "using the uniform mask (%s). A searched mask placed at %s is used instead.",
                mask.describe(), cached or "<cache>/masks/<arch>-<L>L-<fingerprint>.json")
    return mask


def resolve_exit_mask(opts: dict[str, Any], info: ModelInfo) -> SkipMask:
    """LayerSkip: the early exit as a skip mask over layers exit_layer..L-1
    (default: a quarter of the depth). Fixes ``opts["exit_layer"]``."""
    from vllm_selfspec.proposers.layerskip import default_exit_layer, early_exit_mask

    if opts.get("exit_layer") is None:
        opts["exit_layer"] = default_exit_layer(info.num_layers)
        how = "no exit_layer given; a quarter of the depth"
    else:
        how = "exit_layer"
    mask = early_exit_mask(int(opts["exit_layer"]), info.num_layers)
    logger.info("vllm_selfspec: layerskip drafts with the first %d of %d layers (%s)",
                opts["exit_layer"], info.num_layers, how)
    return mask


def mask_to_opts(mask: SkipMask) -> dict[str, Any]:
    """JSON form that travels in additional_config to the workers."""
    return {"attention": sorted(mask.attention), "mlp": sorted(mask.mlp), "source": mask.source,
            "metadata": json.loads(json.dumps(dict(mask.metadata), default=str))}


def mask_from_opts(obj: dict[str, Any]) -> SkipMask:
    return SkipMask(frozenset(obj["attention"]), frozenset(obj["mlp"]),
                    metadata=obj.get("metadata") or {}, source=obj.get("source", "inline"))


def resolve_swift_mask(opts: dict[str, Any], info: ModelInfo) -> SkipMask:
    """SWIFT's starting layer set: the saved one (``cache_hit``), the user's
    ``skip_mask`` (e.g. from tools/search_mask.py), else the uniform set (§4.1.1).
    Also fixes ``opts["mask_cache"]``, where the worker saves what it finds (default:
    ``artifact_path("swift", stamp)``, the place ``cache_hit`` reads)."""
    path = opts.get("mask_cache") or artifact_path("swift", info.stamp)
    opts["mask_cache"] = str(Path(path).expanduser()) if path else None
    if opts.get("cache_hit"):
        if path is None or not Path(path).expanduser().is_file():
            raise SkipMaskError(
                f"swift cache_hit: no layer set saved for this model at "
                f"{path or '<no cache path: set mask_cache>'}; run once without cache_hit (the "
                "set is saved when an optimization phase ends) or pass skip_mask")
        mask = parse_mask(str(Path(path).expanduser()), info.num_layers, info.stamp)
        logger.info("vllm_selfspec: swift cache_hit: starting from the saved layer set %s, "
                    "no first optimization phase", mask.describe())
        return mask
    if opts.get("skip_mask") is not None:
        mask = parse_mask(opts["skip_mask"], info.num_layers, info.stamp,
                          key=opts.get("skip_mask_key"), model_name=info.path)
        logger.info("vllm_selfspec: swift starts optimizing from %s", mask.describe())
        return mask
    mask = uniform_mask(info.num_layers, float(opts["skip_ratio"]))
    logger.info("vllm_selfspec: swift starts optimizing from the uniform layer set (%s); the set "
                "it finds is saved to %s", mask.describe(), opts["mask_cache"] or "nowhere "
                "(set mask_cache)")
    return mask


def save_swift_mask(path: str, mask: SkipMask, stamp: dict[str, Any], info: dict[str, Any]
                    ) -> None:
    """Write the layer set an optimization phase found, stamped with the model
    (atomically: a reader never sees half a file)."""
    out = {"attention": sorted(mask.attention), "mlp": sorted(mask.mlp),
           "metadata": {"model": stamp, "method": "swift", "saved": time.time(),
                        **{k: v for k, v in info.items() if v is not None}}}
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(out, indent=2) + "\n")
