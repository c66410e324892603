"""The layer set SWIFT saves for ``cache_hit`` (``save_swift_mask``). The form a mask
takes to the workers is ``SkipMask.to_wire``; which mask a method starts from is chosen
in resolvers.py."""

from __future__ import annotations

import json
import time
from typing import Any

from vllm_selfspec.proposers.artifacts import atomic_path
from vllm_selfspec.proposers.skip_mask import SkipMask


def save_swift_mask(path: str, mask: SkipMask, stamp: dict[str, Any], info: dict[str, Any]
                    ) -> None:
    """Write the layer set an optimization phase found, stamped with the model
    (atomically: a reader never sees half a file)."""
    out = {"attention": sorted(mask.attention), "mlp": sorted(mask.mlp),
           "metadata": {"model": stamp, "method": "swift", "saved": time.time(),
                        **{k: v for k, v in info.items() if v is not None}}}
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(out, indent=2) + "\n")
