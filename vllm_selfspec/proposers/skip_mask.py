"""Skip masks: which attention and MLP sub-layers the draft pass bypasses.

Draft & Verify §3.2-3.3: the draft model is the target with a vector z of
skipped sub-layers; attention and MLP blocks are skipped separately (the
residual stream passes through a skipped block unchanged). The file format is
the one of the Draft & Verify and SWIFT repositories,
``{"attention": [ids], "mlp": [ids]}`` with 0-based layer ids, optionally keyed
by model name (``{"llama-2-13b": {...}, ...}``), so their files load as they are.
Files may add a ``"metadata"`` block whose ``"model"`` stamp
(``proposers.artifacts.ModelStamp``) is checked against the running model.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .artifacts import ModelStamp, atomic_path, check_stamp

SEARCH_REMEDY = (
    "Use a mask made for this model, or leave skip_mask out to use the uniform mask."
)


class SkipMaskError(ValueError):
    """A skip mask that cannot be used for this model."""


@dataclass(frozen=True)
class SkipMask:
    attention: frozenset[int] = frozenset()
    mlp: frozenset[int] = frozenset()
    metadata: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    source: str = field(default="inline", compare=False, hash=False)

    @property
    def num_skipped(self) -> int:
        return len(self.attention) + len(self.mlp)

    def kept_fraction(self, num_layers: int) -> float:
        """Share of the 2L sub-layers the draft pass still runs."""
        return 1.0 - self.num_skipped / (2 * num_layers)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"attention": sorted(self.attention), "mlp": sorted(self.mlp)}
        if self.metadata:
            out["metadata"] = dict(self.metadata)
        return out

    def to_wire(self) -> dict[str, Any]:
        """The form that travels to the workers (``resolved.ArtifactRefs``): the sets, where
        the mask came from and its metadata, JSON-safe."""
        return {"attention": sorted(self.attention), "mlp": sorted(self.mlp),
                "source": self.source,
                "metadata": json.loads(json.dumps(dict(self.metadata), default=str))}

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> SkipMask:
        return cls(frozenset(obj["attention"]), frozenset(obj["mlp"]),
                   metadata=obj.get("metadata") or {}, source=obj.get("source", "inline"))

    def describe(self) -> str:
        return f"skip {len(self.attention)} attention + {len(self.mlp)} MLP sub-layers ({self.source})"

    def to_vector(self, num_layers: int) -> list[int]:
        """The paper's z in {0,1}^{2L}: attention bits first, then MLP bits."""
        return [int(i in self.attention) for i in range(num_layers)] + [
            int(i in self.mlp) for i in range(num_layers)
        ]

    @classmethod
    def from_vector(cls, z: list[int] | list[float], num_layers: int, threshold: float = 0.5,
                    **kw: Any) -> SkipMask:
        """Inverse of to_vector; continuous values are thresholded (D&V §3.3)."""
        if len(z) != 2 * num_layers:
            raise SkipMaskError(f"skip vector has {len(z)} entries, expected 2L = {2 * num_layers}")
        attn = frozenset(i for i in range(num_layers) if z[i] > threshold)
        mlp = frozenset(i for i in range(num_layers) if z[num_layers + i] > threshold)
        return cls(attn, mlp, **kw)


def uniform_mask(num_layers: int, skip_ratio: float) -> SkipMask:
    """Evenly spread skips over layers 1..L-2, as SWIFT's starting point (§4.1):
    round(2(L-2) * skip_ratio) sub-layers, attention and MLP alternating the extra one.
    With skip_ratio 0.5 this is SWIFT's `arange(1, L-1, 2)` for both blocks."""
    if not 0.0 <= skip_ratio < 1.0:
        raise SkipMaskError(f"skip_ratio must be in [0, 1), got {skip_ratio}")
    inner = list(range(1, num_layers - 1))
    n = int(round(2 * len(inner) * skip_ratio))
    n_attn, n_mlp = (n + 1) // 2, n // 2

    def spread(k: int) -> frozenset[int]:
        if k <= 0 or not inner:
            return frozenset()
        step = len(inner) / k
        return frozenset(inner[int(j * step)] for j in range(k))

    return SkipMask(spread(n_attn), spread(n_mlp), source=f"uniform, skip_ratio {skip_ratio}")


def _ids(value: Any, what: str, num_layers: int, source: str) -> frozenset[int]:
    if value is None:
        return frozenset()
    if not isinstance(value, (list, tuple)):
        raise SkipMaskError(f"skip mask {source}: '{what}' must be a list of layer ids, got {value!r}")
    out = set()
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int):
            raise SkipMaskError(f"skip mask {source}: '{what}' holds {v!r}, not a layer id")
        if not 0 <= v < num_layers:
            raise SkipMaskError(
                f"skip mask {source}: {what} layer {v} is out of range; this model has "
                f"{num_layers} layers (valid ids 0..{num_layers - 1})"
            )
        out.add(v)
    return frozenset(out)


def _select_entry(obj: Mapping[str, Any], source: str, key: str | None,
                  model_name: str | None) -> tuple[Mapping[str, Any], str]:
    """Pick one mask from a model-keyed file (D&V / SWIFT repositories)."""
    if "attention" in obj or "mlp" in obj:
        if key is not None:
            raise SkipMaskError(f"skip mask {source} is not keyed by model; remove skip_mask_key")
        return obj, source
    entries = {k: v for k, v in obj.items() if isinstance(v, Mapping) and ("attention" in v or "mlp" in v)}
    if not entries:
        raise SkipMaskError(
            f"skip mask {source} has neither 'attention'/'mlp' lists nor model-keyed entries "
            "(expected {\"attention\": [...], \"mlp\": [...]})"
        )
    if key is not None:
        if key not in entries:
            raise SkipMaskError(f"skip mask {source} has no entry '{key}'; it has: {', '.join(sorted(entries))}")
        return entries[key], f"{source}[{key}]"
    if len(entries) == 1:
        (k, v), = entries.items()
        return v, f"{source}[{k}]"
    if model_name:
        base = os.path.basename(model_name.rstrip("/")).lower()
        for k, v in entries.items():
            if k.lower() == base:
                return v, f"{source}[{k}]"
    raise SkipMaskError(
        f"skip mask {source} holds masks for several models ({', '.join(sorted(entries))}); "
        "choose one with skip_mask_key"
    )


def parse_mask(spec: str | Mapping[str, Any], num_layers: int, model: ModelStamp | None = None,
               key: str | None = None, model_name: str | None = None) -> SkipMask:
    """Load and validate a mask from a JSON file path or an inline dict."""
    if isinstance(spec, (str, os.PathLike)):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise SkipMaskError(f"skip mask file {path} does not exist")
        try:
            obj = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise SkipMaskError(f"skip mask file {path} is not valid JSON ({e})") from e
        source = str(path)
    elif isinstance(spec, Mapping):
        obj, source = spec, "inline"
    else:
        raise SkipMaskError(f"skip_mask must be a file path or a dict, got {type(spec).__name__}")
    if not isinstance(obj, Mapping):
        raise SkipMaskError(f"skip mask {source} must be a JSON object")
    entry, source = _select_entry(obj, source, key, model_name)
    unknown = set(entry) - {"attention", "mlp", "metadata"}
    if unknown:
        raise SkipMaskError(f"skip mask {source} has unknown keys {sorted(unknown)}; "
                            "expected 'attention', 'mlp' and optionally 'metadata'")
    metadata = entry.get("metadata") or {}
    if model is not None and isinstance(metadata.get("model"), Mapping):
        check_stamp("skip mask", source, ModelStamp.from_json(metadata["model"]), model, SEARCH_REMEDY)
    attn = _ids(entry.get("attention"), "attention", num_layers, source)
    mlp = _ids(entry.get("mlp"), "mlp", num_layers, source)
    return SkipMask(attn, mlp, metadata=metadata, source=source)


def save_mask(mask: SkipMask, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(mask.to_json(), indent=2) + "\n")
