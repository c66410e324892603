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

The file is a stamped safetensors file (``artifacts.save_stamped``: format, a
JSON ``ModelStamp`` and the build metadata in its header); loading it for another
model or vocabulary is refused.
Builders live in ``vllm_selfspec.builders.bigram`` (they need transformers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .artifacts import (
    ArtifactError,
    ArtifactMismatchError,
    ModelStamp,
    check_stamp,
    open_stamped,
    save_stamped,
)

FORMAT = "vllm_selfspec.bigram_table/1"
NO_TABLE = "none"  # ngrammys' bigram_table value for context n-grams only
BUILD_REMEDY = ("Build a table for this model with `python tools/build_bigram.py --model MODEL "
                "--out TABLE` and pass it as bigram_table, or leave bigram_table unset to build "
                "and cache one at start-up.")


class BigramTableError(ArtifactError):
    """A bigram table file that cannot be used (missing, wrong format or unreadable)."""


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

        tensors = {
            "bigram_ids": torch.from_numpy(np.ascontiguousarray(self.bigram_ids, np.int32)),
            "bigram_probs": torch.from_numpy(np.ascontiguousarray(self.bigram_probs, np.float16)),
            "unigram_ids": torch.from_numpy(np.ascontiguousarray(self.unigram_ids, np.int32)),
            "extended": torch.from_numpy(np.ascontiguousarray(self.extended, np.int32)),
        }
        save_stamped(path, tensors, FORMAT, self.stamp, self.meta)

    @staticmethod
    def _open(path: str | Path, arrays: bool, expect: ModelStamp | None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(header, tensors) of a table file; with ``arrays`` False only their shapes;
        with ``expect``, a table stamped for another model is refused."""
        try:
            return open_stamped(path, FORMAT, "bigram table", BUILD_REMEDY, arrays, expect)
        except ArtifactError as e:
            raise BigramTableError(str(e)) from None

    @classmethod
    def load(cls, path: str | Path, expect: ModelStamp | None = None) -> BigramTable:
        """Read a table; with ``expect``, refuse one made for another model."""
        header, t = cls._open(path, True, expect)
        table = cls(t["bigram_ids"].numpy(), t["bigram_probs"].float().numpy(),
                    t["unigram_ids"].numpy(), t["extended"].numpy(), header["stamp"],
                    header["meta"], str(path))
        if expect is not None:
            _check_vocab(table.source, table.vocab_size, expect)
        return table

    @classmethod
    def check_file(cls, path: str | Path, model: ModelStamp) -> dict[str, Any]:
        """Start-up check of a table file against the model, reading its header only;
        returns the build metadata."""
        header, shapes = cls._open(path, False, model)
        _check_vocab(str(path), int(shapes["bigram_ids"][0]), model)
        return header["meta"]

    def check(self, model: ModelStamp) -> None:
        """Refuse a table made for another model (ArtifactMismatchError) or vocabulary."""
        check_stamp("bigram table", self.source, self.stamp, model, BUILD_REMEDY)
        _check_vocab(self.source, self.vocab_size, model)


def _check_vocab(source: str, vocab: int, model: ModelStamp) -> None:
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
