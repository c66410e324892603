"""Draft vocabulary: draft logits over the N most frequent tokens only.

FR-Spec (Zhao et al., 2025) and EAGLE-3's ``d2t`` map: a drafter's LM head is a
large share of a draft token's cost (SmolLM2: 49,152 rows, 0.17 of a decode
step), and most of its rows are tokens the model rarely emits. Drafting over the
N most frequent tokens of the model's own generations keeps output lossless: the
target still verifies over its full vocabulary; tokens outside the subset are
simply never drafted. With sampling, q over the subset is scattered into the full
vocabulary (zero elsewhere), which is exactly the distribution the draft was drawn
from, so vLLM's rejection sampler stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class DraftVocab:
    """``ids[j]`` is the target token id of draft index j (most frequent first)."""

    ids: torch.Tensor  # [N] int64
    vocab_size: int  # V of the target

    @property
    def size(self) -> int:
        return int(self.ids.numel())

    @property
    def is_full(self) -> bool:
        return self.size == self.vocab_size

    @classmethod
    def full(cls, vocab_size: int) -> DraftVocab:
        return cls(torch.arange(vocab_size, dtype=torch.long), vocab_size)

    @classmethod
    def from_counts(cls, counts: np.ndarray, size: int) -> DraftVocab:
        """The ``size`` most frequent tokens of ``counts`` [V] (ties to the lower id)."""
        v = int(counts.shape[0])
        order = _by_frequency(counts)[: min(int(size), v)]
        return cls(torch.from_numpy(order.astype(np.int64)), v)

    def extended(self, counts: np.ndarray, size: int) -> DraftVocab:
        """These ids first, then the most frequent others of ``counts`` [V] up to ``size``."""
        have = np.zeros(self.vocab_size, dtype=bool)
        have[self.ids.numpy()] = True
        order = _by_frequency(counts)
        more = order[~have[order]][: max(0, int(size) - self.size)]
        return DraftVocab(torch.cat([self.ids, torch.from_numpy(more.astype(np.int64))]),
                          self.vocab_size)

    def coverage(self, counts: np.ndarray) -> float:
        """Share of the counted tokens that are in this vocabulary."""
        total = float(counts.sum())
        return float(counts[self.ids.numpy()].sum()) / total if total else 0.0

    def rows(self, weight: torch.Tensor) -> torch.Tensor:
        """The LM-head rows of the draft vocabulary: [N, H] from [V(+pad), H]."""
        return weight.index_select(0, self.ids.to(weight.device))

    def to_target(self, draft_index: torch.Tensor) -> torch.Tensor:
        """Draft indices -> target token ids."""
        return self.ids.to(draft_index.device)[draft_index]

    def scatter(self, q: torch.Tensor) -> torch.Tensor:
        """q over the draft vocabulary [n, N] -> over the target vocabulary [n, V]."""
        if self.is_full:
            return q
        out = q.new_zeros(q.shape[0], self.vocab_size)
        out[:, self.ids.to(q.device)] = q
        return out


def _by_frequency(counts: np.ndarray) -> np.ndarray:
    """Token ids, most counted first (ties to the lower id)."""
    return np.lexsort((np.arange(int(counts.shape[0])), -counts.astype(np.int64)))
