"""Drafts from earlier requests: the prompts and outputs this engine has already served.

SuffixDecoding (Oliaro et al., 2024, §3) keeps a global suffix tree over previous
requests' outputs next to each request's own tree; the same idea here is a bounded
buffer of finished requests' tokens (prompt + output, separated by -1) searched for
the longest suffix of the current request's history (``max_query`` tokens down to
``min_query``), the most recent occurrence winning. The buffer holds at most
``max_tokens`` tokens (int32: 4 bytes each); the oldest requests are evicted first.

Per-request state is a copy of the request's latest token history (taken when it
drafts), moved into the buffer when the request finishes, aborted requests included,
and dropped there. Everything runs in the worker's one drafting thread; at tensor
parallelism every rank sees the same requests in the same order and builds the same
buffer, so drafts agree across ranks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

SEPARATOR = -1  # between requests: never matches a token id
# 1 MiB of int32 tokens, a small part of a step to scan (docs/results.md); the default
# of ``history_tokens`` in ``ngrammys-history`` and ``ngrammys-chimera``
DEFAULT_HISTORY_TOKENS = 262_144


class PastRequests:
    """A bounded buffer of finished requests' tokens, searched by suffix match."""

    def __init__(self, max_tokens: int, max_query: int = 8, min_query: int = 2) -> None:
        if max_tokens <= 0:
            raise ValueError("max_tokens must be positive")
        self.max_tokens = int(max_tokens)
        self.max_query = int(max_query)
        self.min_query = int(min_query)
        self.buffer = np.zeros(0, dtype=np.int32)
        self.running: dict[str, np.ndarray] = {}  # per request: its tokens, then spare room
        self._lengths: dict[str, int] = {}
        self.requests_added = 0

    def remember(self, req_id: str, tokens: np.ndarray) -> None:
        """Keep a copy of a running request's tokens (prompt + output so far). Runs every
        draft step: only the tokens new since the last call are written (the copy grows
        by doubling), so a step costs its new tokens, not the whole history."""
        n = int(tokens.shape[0])
        held = self.running.get(req_id)
        start = self._lengths.get(req_id, 0) if held is not None else 0
        if held is None or n > held.size:
            grown = np.empty(max(n, 2 * (held.size if held is not None else 0)), dtype=np.int32)
            if held is not None:
                grown[:start] = held[:start]
            held = self.running[req_id] = grown
        start = min(start, n)  # shorter after a preemption: rewrite from there
        held[start:n] = tokens[start:n]
        self._lengths[req_id] = n

    def finish(self, req_ids: set[str]) -> None:
        """Move finished (or aborted) requests' tokens into the buffer, evicting the oldest."""
        parts = [self.buffer]
        for r in sorted(req_ids):  # sorted: the same buffer on every TP rank
            toks = self.running.pop(r, None)
            n = self._lengths.pop(r, 0)
            if toks is None or n == 0:
                continue
            toks = toks[:n]
            parts += [toks[-(self.max_tokens - 1):], np.asarray([SEPARATOR], dtype=np.int32)]
            self.requests_added += 1
        if len(parts) == 1:
            return
        buf = np.concatenate(parts)
        if buf.size > self.max_tokens:
            buf = buf[buf.size - self.max_tokens:]
        self.buffer = buf

    def draft(self, history: np.ndarray, width: int) -> list[int]:
        """Up to ``width`` tokens that followed the longest suffix of ``history`` (of
        ``max_query`` down to ``min_query`` tokens) in the buffer; [] without a match."""
        buf, n = self.buffer, int(history.shape[0])
        if width <= 0 or buf.size < 2 or n < self.min_query:
            return []
        # hits: end positions e in the buffer with buf[e] == history[-1] and a next token
        hits = np.flatnonzero(buf[:-1] == int(history[-1]))
        best = -1
        for j in range(1, min(self.max_query, n)):
            if hits.size == 0:
                break
            if j >= self.min_query:
                best = int(hits[-1])  # a match of j tokens: keep the most recent
            ok = hits >= j
            hits = hits[ok]
            hits = hits[buf[hits - j] == int(history[n - 1 - j])]
        if hits.size and min(self.max_query, n) >= self.min_query:
            best = int(hits[-1])  # the longest query matched
        if best < 0:
            return []
        row = buf[best + 1: best + 1 + width]
        stop = np.flatnonzero(row == SEPARATOR)
        if stop.size:
            row = row[: stop[0]]
        return [int(t) for t in row]

    def memory_bytes(self) -> int:
        """Bytes held: the buffer and the running requests' copies."""
        return int(self.buffer.nbytes + sum(t.nbytes for t in self.running.values()))

    def report(self) -> dict[str, int]:
        return {"history_tokens": int(self.buffer.size), "history_bound": self.max_tokens,
                "history_requests": self.requests_added, "history_bytes": self.memory_bytes(),
                "history_running": len(self.running)}


class DraftsFromPastRequests:
    """Proposer mixin (before the proposer's base class): ``self.past``, the buffer of
    earlier requests (None when ``history_tokens`` is 0), fed with every drafting
    request's tokens, filled at ``finish`` and reported. One home for this wiring in
    ``ngrammys`` and ``ngrammys-chimera``."""

    past: PastRequests | None = None

    def keep_past_requests(self, max_tokens: int) -> None:
        self.past = PastRequests(max_tokens) if max_tokens > 0 else None

    def past_draft(self, req_id: str | None, history: np.ndarray, width: int, want: bool
                   ) -> list[int]:
        """Remember the request's tokens; if ``want``, a draft from earlier requests
        (it only reads finished requests, so the order of the two does not matter)."""
        if self.past is None:
            return []
        if req_id is not None:
            self.past.remember(req_id, history)  # moved into the buffer when it finishes
        return self.past.draft(history, width) if want else []

    def finish(self, req_ids: set[str]) -> None:
        super().finish(req_ids)  # type: ignore[misc]
        if self.past is not None:
            self.past.finish(req_ids)

    def report(self) -> dict[str, Any]:
        return {**super().report(),  # type: ignore[misc]
                **(self.past.report() if self.past is not None else {})}
