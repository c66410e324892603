"""A datastore to retrieve drafts from: REST (He et al., 2024, "REST: Retrieval-Based
Speculative Decoding", §3.1-3.2) over a fixed corpus of text in the model's tokens.

REST keeps a corpus in a suffix array, finds the longest suffix of the context that
occurs in it (its tokens at the end of the context, longest first), and builds a trie
of what followed, most frequent first. vLLM verifies one chain per request, so here the
chain is the trie's most frequent path: token by token, the continuation most of the
matching positions agree on (ties to the smaller id, so every TP rank drafts the same).

The index is the corpus's positions sorted by the tokens before them, newest first
(``tokens[p], tokens[p-1], ...``, ``max_query`` deep): the positions whose context ends
with the last j tokens of a request's history are one contiguous range, narrowed one
token at a time by binary search (a few microseconds a level). Documents are separated
by ``SEPARATOR``, which no history token matches, so a match never crosses documents.

File format (one home): stamped safetensors (``artifacts.save_stamped``), format
``vllm_selfspec.datastore.v1``, tensor ``tokens`` (int32, documents separated by -1);
the index is rebuilt when the file is loaded (a sort: ~1 s for 2M tokens here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .artifacts import ArtifactError, ModelStamp, open_stamped, save_stamped
from .past_requests import SEPARATOR

FORMAT = "vllm_selfspec.datastore.v1"
PAD = -2  # before the corpus: never matches a token id
BUILD_REMEDY = ("Pass datastore \"sharegpt\" (built for this model at start-up), a file from "
                "tools/build_datastore.py --model MODEL, or \"none\".")
# At most this many corpus tokens: every ShareGPT first answer in SmolLM2's tokens (what
# the replay gained from it and from 2M tokens: docs/results.md, "The datastore, replayed")
DEFAULT_DATASTORE_TOKENS = 4_000_000
MAX_CANDIDATES = 512  # positions the continuation vote reads at most (evenly spread)
MAX_WIDTH = 64  # separators after the corpus, so a continuation read never runs off


class DatastoreError(ArtifactError):
    """A datastore file that cannot be used (missing, another format, unreadable)."""


class Datastore:
    """A fixed corpus indexed by the tokens before each position (REST §3.1)."""

    def __init__(self, tokens: np.ndarray, stamp: ModelStamp | None = None,
                 meta: dict[str, Any] | None = None, source: str = "",
                 max_query: int = 8, min_query: int = 2) -> None:
        t = np.asarray(tokens, dtype=np.int32).reshape(-1)
        self.stamp, self.meta, self.source = stamp, dict(meta or {}), source
        self.max_query, self.min_query = int(max_query), int(min_query)
        self.corpus_tokens = int(t.size)
        self.tokens = np.concatenate([np.full(self.max_query, PAD, np.int32), t,
                                      np.full(MAX_WIDTH + 1, SEPARATOR, np.int32)])
        pos = np.arange(self.max_query, self.max_query + t.size, dtype=np.int64)
        pos = pos[(self.tokens[pos] >= 0) & (self.tokens[pos + 1] >= 0)]  # has a next token
        keys = [self.tokens[pos - j] for j in range(self.max_query - 1, -1, -1)]
        self.order = pos[np.lexsort(keys)].astype(np.int32) if pos.size else \
            np.zeros(0, np.int32)
        self.col0 = self.tokens[self.order]  # sorted: the token at the position
        self.col1 = self.tokens[self.order - 1]  # sorted within each col0 run

    def match(self, history: np.ndarray) -> tuple[int, np.ndarray]:
        """(j, positions): the longest suffix of ``history`` (``max_query`` tokens at most)
        found in the corpus, and the corpus positions where it ends; (0, []) below
        ``min_query`` tokens."""
        n = int(history.shape[0])
        lo, hi, matched = 0, int(self.order.size), 0
        for j in range(min(self.max_query, n)):
            tok = np.int32(history[n - 1 - j])  # an int would cast the column to int64
            col = (self.col0[lo:hi] if j == 0 else self.col1[lo:hi] if j == 1
                   else self.tokens[self.order[lo:hi] - j])
            a = int(np.searchsorted(col, tok, "left"))
            b = int(np.searchsorted(col, tok, "right"))
            if a == b:
                break
            lo, hi, matched = lo + a, lo + b, j + 1
        if matched < self.min_query:
            return 0, self.order[:0]
        return matched, self.order[lo:hi]

    def draft(self, history: np.ndarray, width: int) -> list[int]:
        """Up to ``width`` tokens: the continuation most of the longest match's positions
        agree on, token by token (REST's trie, its most frequent path); [] without a
        match of ``min_query`` tokens."""
        width = min(int(width), MAX_WIDTH)
        if width <= 0 or self.order.size == 0:
            return []
        _, cand = self.match(history)
        if cand.size > MAX_CANDIDATES:
            cand = cand[np.linspace(0, cand.size - 1, MAX_CANDIDATES).astype(np.int64)]
        row: list[int] = []
        for t in range(1, width + 1):
            if cand.size == 0:
                break
            nxt = self.tokens[cand + t]
            vals, counts = np.unique(nxt, return_counts=True)
            tok = int(vals[int(np.argmax(counts))])  # ties: the smaller id (sorted vals)
            if tok < 0:
                break  # most of them end their document here
            row.append(tok)
            cand = cand[nxt == tok]
        return row

    def memory_bytes(self) -> int:
        return int(self.tokens.nbytes + self.order.nbytes + self.col0.nbytes + self.col1.nbytes)

    # ---- file -----------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        import torch

        body = self.tokens[self.max_query: self.max_query + self.corpus_tokens]
        save_stamped(path, {"tokens": torch.from_numpy(np.ascontiguousarray(body))}, FORMAT,
                     self.stamp, self.meta)

    @classmethod
    def load(cls, path: str | Path, expect: ModelStamp | None = None) -> Datastore:
        """Read a datastore; with ``expect``, refuse one made for another model."""
        header, t = cls._open(path, True, expect)
        return cls(t["tokens"].numpy(), header["stamp"], header["meta"], str(path))

    @classmethod
    def check_file(cls, path: str | Path, model: ModelStamp) -> dict[str, Any]:
        """Start-up check against the model from the header; returns the build metadata."""
        header, _ = cls._open(path, False, model)
        return header["meta"]

    @staticmethod
    def _open(path: str | Path, arrays: bool, expect: ModelStamp | None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        try:
            return open_stamped(path, FORMAT, "datastore", BUILD_REMEDY, arrays, expect)
        except ArtifactError as e:
            if isinstance(e, DatastoreError):
                raise
            raise DatastoreError(str(e)) from None
