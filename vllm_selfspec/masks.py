"""Choosing the skip mask at start-up: the user's, a cached searched one, or uniform.

Order (issue "The plugin, end to end", item 3): a mask given with ``skip_mask``
(file or inline, validated against the model); else a searched mask cached for
this model's weights (``cached_mask_path``); else the uniform starting mask (``proposers.skip_mask.uniform_mask``). The choice is
logged once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vllm_selfspec.assets import cache_dir
from vllm_selfspec.log import logger
from vllm_selfspec.model_info import ModelInfo
from vllm_selfspec.proposers.artifacts import ModelStamp
from vllm_selfspec.proposers.skip_mask import SkipMask, parse_mask, uniform_mask



def cached_mask_path(stamp: ModelStamp) -> Path | None:
    """Where a searched mask for these exact weights is cached (needs a fingerprint)."""
    if not stamp.fingerprint:
        return None
    return cache_dir() / "masks" / f"{stamp.architecture}-{stamp.num_layers}L-{stamp.fingerprint}.json"


def resolve_skip_mask(opts: dict[str, Any], info: ModelInfo) -> SkipMask:
    spec = opts.get("skip_mask")
    if spec is not None:
        mask = parse_mask(spec, info.num_layers, info.stamp, key=opts.get("skip_mask_key"),
                          model_name=info.path)
        logger.info("vllm_selfspec: using skip mask %s", mask.describe())
        return mask
    cached = cached_mask_path(info.stamp)
    if cached is not None and cached.exists():
        mask = parse_mask(str(cached), info.num_layers, info.stamp)
        logger.info("vllm_selfspec: no skip_mask given; using the searched mask cached for this "
                    "model: %s", mask.describe())
        return mask
    mask = uniform_mask(info.num_layers, float(opts["skip_ratio"]))
    logger.info("vllm_selfspec: no skip_mask given and no searched mask cached for this model; "
                "using the uniform mask (%s). A searched mask placed at %s is used instead.",
                mask.describe(), cached or "<cache>/masks/<arch>-<L>L-<fingerprint>.json")
    return mask


def mask_to_opts(mask: SkipMask) -> dict[str, Any]:
    """JSON form that travels in additional_config to the workers."""
    return {"attention": sorted(mask.attention), "mlp": sorted(mask.mlp), "source": mask.source,
            "metadata": json.loads(json.dumps(dict(mask.metadata), default=str))}


def mask_from_opts(obj: dict[str, Any]) -> SkipMask:
    return SkipMask(frozenset(obj["attention"]), frozenset(obj["mlp"]),
                    metadata=obj.get("metadata") or {}, source=obj.get("source", "inline"))
