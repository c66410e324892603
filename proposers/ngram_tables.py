"""Model-derived N-gram tables of N-Grammys (Stewart et al., 2024), §4.1 and Appendix B.1.

``BigramTable`` is the one file ``tools/build_bigram.py`` writes and method
``ngrammys`` loads:

* ``bigram_ids`` / ``bigram_probs`` [V, K]: for every token x, the top-K of the
  model's next-token distribution p_M(. | x) from a single-token forward;
* ``unigram_ids`` [U]: the paper's unigram ranking, tokens ordered by
  d(x) = mu^T Cov(V) u_x (Appendix B.1, ``unigram``);
* ``extended`` [V, K, W-1]: the continuation of row j of token x beyond its
  bigram token, so a row of width w is ``[bigram_ids[x, j], *extended[x, j, :w-1]]``
  (§4.1 "Extensions": repeated bigram, or greedy decoding from the bigram token).

The file is safetensors with a JSON ``stamp`` (proposers.artifacts.ModelStamp)
in its metadata; loading it for another model or vocabulary is refused.
Builders live in ``vllm_selfspec.offline.bigram_build`` (they need transformers).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .artifacts import ArtifactMismatchError, ModelStamp, check_stamp

FORMAT = "vllm_selfspec.bigram_table/1"
BUILD_REMEDY = ("Build a table for this model with `python tools/build_bigram.py --model MODEL "
                "--out TABLE` and pass it as bigram_table, or leave bigram_table unset to build "
                "and cache one at start-up.")


class BigramTableError(ValueError):
    """A bigram table that cannot be used (unreadable, wrong format or model)."""


@dataclass
class BigramTable:
    bigram_ids: np.ndarray  # [V, K] int32, best first
    bigram_probs: np.ndarray  # [V, K] float32
    unigram_ids: np.ndarray  # [U] int32, best first
    extended: np.ndarray  # [V, K, W-1] int32
    stamp: ModelStamp | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    source: str = "memory"

    @property
    def vocab_size(self) -> int:
        return int(self.bigram_ids.shape[0])

    @property
    def top_k(self) -> int:
        return int(self.bigram_ids.shape[1])

    @property
    def max_width(self) -> int:
        return 1 + int(self.extended.shape[2])

    def rows(self, token: int, k: int, w: int) -> list[list[int]]:
        """The k extended-bigram rows of width w after ``token`` (§4.1), best first."""
        if not 0 <= token < self.vocab_size:
            return []
        k = min(k, self.top_k, self.extended.shape[1])
        first = self.bigram_ids[token, :k, None]
        rest = self.extended[token, :k, : w - 1]
        out = np.concatenate([first, rest], axis=1)
        while out.shape[1] < w:  # wider than stored: repeat the bigram's top-1
            out = np.concatenate([out, self.bigram_ids[out[:, -1], :1]], axis=1)
        return out.tolist()

    def unigram_rows(self, k: int) -> list[list[int]]:
        return [[int(t)] for t in self.unigram_ids[:k]]

    def save(self, path: str | Path) -> None:
        import torch
        from safetensors.torch import save_file

        meta = {"format": FORMAT, "stamp": json.dumps(self.stamp.to_json() if self.stamp else {}),
                "meta": json.dumps(self.meta, default=str)}
        tensors = {
            "bigram_ids": torch.from_numpy(np.ascontiguousarray(self.bigram_ids, np.int32)),
            "bigram_probs": torch.from_numpy(np.ascontiguousarray(self.bigram_probs, np.float16)),
            "unigram_ids": torch.from_numpy(np.ascontiguousarray(self.unigram_ids, np.int32)),
            "extended": torch.from_numpy(np.ascontiguousarray(self.extended, np.int32)),
        }
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".tmp")
        save_file(tensors, str(tmp), metadata=meta)
        tmp.replace(p)

    @staticmethod
    def _open(path: str | Path, arrays: bool) -> tuple[dict[str, Any], dict[str, Any]]:
        """(metadata, tensors) of a table file; with ``arrays`` False only their shapes."""
        from safetensors import safe_open

        p = Path(path)
        if not p.is_file():
            raise BigramTableError(f"bigram table {p} does not exist. {BUILD_REMEDY}")
        try:
            with safe_open(str(p), framework="pt") as f:
                meta = f.metadata() or {}
                if meta.get("format") != FORMAT:
                    raise BigramTableError(f"{p} is not a bigram table of this plugin (format "
                                           f"{meta.get('format')!r}, expected {FORMAT!r}). "
                                           f"{BUILD_REMEDY}")
                t = {k: f.get_tensor(k) if arrays else f.get_slice(k).get_shape()
                     for k in f.keys()}
        except BigramTableError:
            raise
        except Exception as e:  # noqa: BLE001 - any unreadable file gets the same advice
            raise BigramTableError(f"cannot read bigram table {p} ({e}). {BUILD_REMEDY}") from None
        return meta, t

    @staticmethod
    def _stamp(meta: dict[str, Any]) -> ModelStamp | None:
        stamp_json = json.loads(meta.get("stamp") or "{}")
        return ModelStamp.from_json(stamp_json) if stamp_json else None

    @classmethod
    def load(cls, path: str | Path, expect: ModelStamp | None = None) -> "BigramTable":
        """Read a table; with ``expect``, refuse one made for another model."""
        meta, t = cls._open(path, arrays=True)
        table = cls(t["bigram_ids"].numpy(), t["bigram_probs"].float().numpy(),
                    t["unigram_ids"].numpy(), t["extended"].numpy(), cls._stamp(meta),
                    json.loads(meta.get("meta") or "{}"), str(path))
        if expect is not None:
            table.check(expect)
        return table

    @classmethod
    def check_file(cls, path: str | Path, model: ModelStamp) -> dict[str, Any]:
        """Start-up check of a table file against the model, reading its header only;
        returns the build metadata."""
        meta, shapes = cls._open(path, arrays=False)
        _check(str(path), cls._stamp(meta), int(shapes["bigram_ids"][0]), model)
        return json.loads(meta.get("meta") or "{}")

    def check(self, model: ModelStamp) -> None:
        """Refuse a table made for another model (ArtifactMismatchError) or vocabulary."""
        _check(self.source, self.stamp, self.vocab_size, model)


def _check(source: str, stamp: ModelStamp | None, vocab: int, model: ModelStamp) -> None:
    check_stamp("bigram table", source, stamp, model, BUILD_REMEDY)
    if vocab != model.vocab_size:
        raise ArtifactMismatchError(
            f"bigram table {source} covers a vocabulary of {vocab} tokens; this model has "
            f"{model.vocab_size}. {BUILD_REMEDY}")


def repeated_extension(bigram_ids: np.ndarray, k: int, width: int) -> np.ndarray:
    """Rows extended by repeating the bigram's top-1 (§4.1 "Extensions"): [V, k, width-1]."""
    v = bigram_ids.shape[0]
    out = np.empty((v, k, max(0, width - 1)), dtype=np.int32)
    cur = bigram_ids[:, :k]
    for i in range(width - 1):
        cur = bigram_ids[cur, 0]
        out[:, :, i] = cur
    return out
