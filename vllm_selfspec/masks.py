"""The skip mask between processes: the JSON form that travels to the workers in
``additional_config`` (``mask_to_opts`` / ``mask_from_opts``), and the layer set SWIFT
saves for ``cache_hit`` (``save_swift_mask``). Which mask a method starts from is chosen
in resolvers.py."""

from __future__ import annotations

import json
import time
from typing import Any

from vllm_selfspec.proposers.artifacts import atomic_path
from vllm_selfspec.proposers.skip_mask import SkipMask


def mask_to_opts(mask: SkipMask) -> dict[str, Any]:
    """JSON form that travels in additional_config to the workers."""
    return {"attention": sorted(mask.attention), "mlp": sorted(mask.mlp), "source": mask.source,
            "metadata": json.loads(json.dumps(dict(mask.metadata), default=str))}


def mask_from_opts(obj: dict[str, Any]) -> SkipMask:
    return SkipMask(frozenset(obj["attention"]), frozenset(obj["mlp"]),
                    metadata=obj.get("metadata") or {}, source=obj.get("source", "inline"))


def save_swift_mask(path: str, mask: SkipMask, stamp: dict[str, Any], info: dict[str, Any]
                    ) -> None:
    """Write the layer set an optimization phase found, stamped with the model
    (atomically: a reader never sees half a file)."""
    out = {"attention": sorted(mask.attention), "mlp": sorted(mask.mlp),
           "metadata": {"model": stamp, "method": "swift", "saved": time.time(),
                        **{k: v for k, v in info.items() if v is not None}}}
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(out, indent=2) + "\n")
