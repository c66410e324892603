"""Context n-grams first, Chimera's heads where the context has no match.

A composition of two papers' drafters, not either paper's algorithm, so it has its
own method name (``ngrammys-chimera``; ``ngrammys`` stays faithful to N-Grammys):

* N-Grammys §4.2 context n-grams: the last q tokens (q = ``query_length`` down to
  ``min_query_length``) are looked up in the request's own context; a match proposes
  the tokens that followed it, up to ``num_speculative_tokens`` (near-free, and long
  and accurate on repetitive text: code, lists, quoted input);
* earlier requests (``proposers.past_requests``, SuffixDecoding's global tree idea) where
  the request's own context has no match: the prompts and outputs this engine has
  already served, up to ``history_tokens`` tokens;
* Chimera §4.1 (``proposers.chimera_drafting``) for the requests with no match, in
  place of N-Grammys' model-derived bigram rows (for the requests neither source matches): its heads read the target's own
  hidden states, so they predict the next tokens of free text far better than a
  bigram table, for a tenth of a decode step per token.

Sampling: context drafts are deterministic (one-hot q); Chimera's are drawn from q
over its draft vocabulary (scattered into the full vocabulary), as in ``chimera``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from .base import DraftBatch, Proposal
from .chimera_drafting import ChimeraOptions, ChimeraProposer
from .ngrammys import (
    HISTORY_HELP,
    min_agreement_option,
    min_query_length_option,
    mixed_rows_labelled,
    query_length_option,
)
from .options import option
from .past_requests import DEFAULT_HISTORY_TOKENS, DraftsFromPastRequests
from .resolved import Artifacts

DEFAULT_WIDTH = 8  # num_speculative_tokens: context drafts; Chimera drafts up to its heads


@dataclass(frozen=True)
class NGrammysChimeraOptions(ChimeraOptions):
    """Method ``ngrammys-chimera``'s keys."""

    query_length: int = query_length_option()
    min_query_length: int = min_query_length_option()
    min_agreement: float = min_agreement_option()
    history_tokens: int = option(DEFAULT_HISTORY_TOKENS, HISTORY_HELP, "int", 0, None)
    # cost_gate stays on (CommonOptions): the gate keeps one draft length per source
    # (proposers.cost_gate, evidence classes), so long context matches keep their chains
    # while Chimera's drafts are cut to what pays (docs/results.md, "per evidence class")


class NGrammysChimeraProposer(DraftsFromPastRequests, ChimeraProposer):
    """Method ``ngrammys-chimera``."""

    options_class = NGrammysChimeraOptions
    # Chimera's tokens cost ~0.09 of a step, context tokens ~0.001: priced apart
    timed_evidence = "chimera"

    def __init__(self, num_speculative_tokens: int, options: Mapping[str, Any],
                 artifacts: Artifacts | None = None) -> None:
        super().__init__(num_speculative_tokens, options, artifacts)
        c = self.cfg
        self.keep_past_requests(c.history_tokens)
        self.stats.update({"from_context": 0, "from_history": 0, "from_chimera": 0})

    def context_draft(self, history: np.ndarray, limit: int) -> tuple[list[int], str]:
        """The first context row (longest query first) and its evidence class."""
        c = self.cfg  # ngrammys' candidate rows without bigram rows, the first one only
        rows, labels = mixed_rows_labelled(history, None, 1, limit, c.query_length,
                                           c.min_query_length, min_agreement=c.min_agreement)
        return (rows[0], labels[0]) if rows else ([], "")

    def describe(self) -> str:
        return (f"ngrammys-chimera: context n-grams (q {self.cfg.query_length}.."
                f"{self.cfg.min_query_length}, up to {self.k} tokens), else earlier requests "
                f"({self.cfg.history_tokens} tokens kept), else " + super().describe())

    @torch.inference_mode()
    def propose(self, batch: DraftBatch) -> Proposal:
        assert self.model is not None and self.target is not None, "bind() was not called"
        drafts: list[list[int]] = [[] for _ in batch.req_ids]
        self.track(batch)
        if batch.token_ids is None or batch.num_tokens is None:
            return Proposal(drafts)
        rest = []
        evidence = [""] * len(batch.req_ids)
        looked_up = 0
        for r in batch.requests:
            if r.max_len <= 0:
                continue
            looked_up += 1
            hist = batch.token_ids[r.row, : int(batch.num_tokens[r.row])]
            limit = min(r.max_len, self.k)
            row, label = self.context_draft(hist, limit)
            past = self.past_draft(r.req_id, hist, limit, not row)
            if not row:
                row, label = past, "history"
            if row:
                # a source the cost gate holds back drafts nothing (no fall-through to Chimera)
                drafts[r.row] = [int(t) for t in row[: batch.cap(r, label)]]
                evidence[r.row] = label
                if drafts[r.row]:
                    self.stats["from_" + label.split(":")[0]] += 1
            else:
                r.max_len = batch.cap(r, "chimera")
                evidence[r.row] = "chimera"  # (held back too: the class this row is in)
                if r.max_len > 0:
                    rest.append(r)
        # Chimera's to pay: taking in the states its drafts read
        intake = self.prepare(batch, rest) if rest else 0.0
        ready = self.ready(rest)
        if ready:
            self.stats["steps"] += 1
            self.stats["from_chimera"] += len(ready)
            out = self._draft(batch, ready, drafts)  # sets out.timed (timed_evidence)
            if out.timed:
                out.timed = {name: (n, secs + intake) for name, (n, secs) in out.timed.items()}
        else:
            out = Proposal(drafts)
        out.evidence, out.rows = evidence, looked_up
        if out.probs is not None:  # context drafts are one-hot in a sampled batch
            for r in batch.requests:
                if r not in ready:
                    for i, t in enumerate(drafts[r.row]):
                        out.probs[r.row, i, t] = 1.0
        return out
