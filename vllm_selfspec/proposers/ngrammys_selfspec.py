"""Context n-grams, earlier requests and a datastore first; the model's own low-bit
self-draft where none of them has a match.

A composition of two papers' drafters, not either one, so it has its own method name
(``ngrammys-selfspec``):

* N-Grammys §4.2 context n-grams, then earlier requests (SuffixDecoding's cross-request
  idea) and a REST datastore, as ``ngrammys-history`` drafts them (``NGrammysProposer``
  without its bigram table): near-free, and long and accurate where text repeats;
* Draft & Verify §3 for the requests none of them matches, in place of N-Grammys'
  bigram rows: the target drafts for itself through its kept sub-layers, by default
  through low-bit copies of its weights (key ``draft_weights``), which agree with the
  target's greedy token most of the time for a fraction of a decode step per token; the
  adaptive draft-exit threshold (§3.4) learns from those drafts only.
* Where a request has a match, the match is by default the self-draft's guess (key
  ``matches``): the self-draft's first pass feeds it with the newest token and keeps it as
  far as the self-draft would have drafted the same tokens
  (``SelfSpecProposer._guessed_pass``), as a draft model checks a cheaper draft's tokens
  in staged speculative decoding (Spector & Re, 2023). The drafts are the self-draft's
  own; a guess that holds saves a draft pass per guessed token, and a match the
  self-draft would not have drafted is not verified at all. Where the self-draft is unsure
  of a token but drafts the guessed one (key ``agreement``), the two drafters agree and the
  row drafts on through the guess from the same pass instead of stopping there. Each
  later pass gets a fresh guess: the sources looked up again with the row's drafts so far
  (key ``guess_again``), and a guess is fed only as far as its positions have held often
  enough to pay for their place in a pass (key ``guess_cut``, ``proposers.guess_worth``).

A source the cost gate holds back for a request (its evidence class does not pay) falls
through to the self-draft; where the gate holds the self-draft back, the match drafts
alone. With ``matches`` "gate", a match drafts alone unless the gate predicts its class to
pay less than the self-draft (``CostGate.worth``: expected tokens per second of a step
with its drafting, from each class's acceptance curve and draft cost): where text seldom
repeats, short context matches and datastore rows are accepted far less often than a
low-bit self-draft, and taking the first source that matches cost this method half of
``selfspec``'s acceptance length (docs/results.md). The gate prices the self-draft per
pass (one pass drafts a position for every row) and n-gram tokens on their own (almost
nothing). A match passed over for the self-draft is scored at the request's next step
against the tokens the target produced (``_shadows``), as evidence for its class: the gate
measures each kind of match without drafting it. Sampling: n-gram drafts are deterministic
(one-hot q); self-drafts are drawn from the low-bit pass's q.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from .base import DraftBatch, DraftRequest, Proposal, Verification, agreed_prefix
from .draft_verify import GuessAgain, SelfSpecOptions, SelfSpecProposer
from .guess_worth import GuessWorth
from .ngrammys import (
    DATASTORE_HELP,
    HISTORY_HELP,
    SHAREGPT,
    NGrammysProposer,
    min_agreement_option,
    min_query_length_option,
    query_length_option,
)
from .options import option
from .past_requests import DEFAULT_HISTORY_TOKENS
from .resolved import Artifacts

SELF_DRAFT = "selfspec"  # the evidence class of the self-draft's drafts
GATE, GUESS, UNGUESSED = "gate", "guess", "gate-unguessed"  # key matches
MATCHES = (GATE, GUESS, UNGUESSED)


@dataclass(frozen=True)
class NGrammysSelfSpecOptions(SelfSpecOptions):
    """Method ``ngrammys-selfspec``'s keys: ``selfspec``'s, and the n-gram sources'."""

    query_length: int = query_length_option()
    min_query_length: int = min_query_length_option()
    min_agreement: float = min_agreement_option()
    history_tokens: int = option(DEFAULT_HISTORY_TOKENS, HISTORY_HELP, "int", 0, None)
    datastore: str = option(SHAREGPT, DATASTORE_HELP, "str")
    matches: str = option(
        GUESS, "what a request's n-gram match does: \"guess\" (a self-draft takes the match "
        "as its guess: the first pass feeds it and keeps it as far as the self-draft agrees, "
        "the same drafts in fewer passes; the match alone where the gate holds the self-draft "
        "back), \"gate\" (the cost gate picks between drafting the match and that "
        "self-draft) or \"gate-unguessed\" (the gate picks between the match and a "
        "self-draft that sees no match, nor any later one)", "str", choices=MATCHES)
    agreement: bool = option(
        True, "where a match is the self-draft's guess and the self-draft is unsure of a "
        "token (top-1 under the draft-exit threshold) but drafts the guessed one, draft on "
        "through the guess instead of stopping (the match and the self-draft agree)", "bool")
    guess_cut: bool = option(
        True, "feed only the leading guessed tokens that pay for their place in a draft "
        "pass: a position is fed while the share of guesses that held there is at least "
        "b / (a + b), a pass of n tokens taking a + b·n seconds (both measured as drafting "
        "goes)", "bool")
    guess_again: bool = option(
        True, "where the self-draft leaves its guess (or had none) and drafts on, look the "
        "n-gram sources up again with its drafts so far and feed their match with the next "
        "pass as a fresh guess (the same drafts; more tokens a pass where the match holds)",
        "bool")


class NGrammysSelfSpecProposer(SelfSpecProposer):
    """Method ``ngrammys-selfspec``."""

    options_class = NGrammysSelfSpecOptions

    def __init__(self, num_speculative_tokens: int, options: Mapping[str, Any],
                 artifacts: Artifacts | None = None) -> None:
        super().__init__(num_speculative_tokens, options, artifacts)
        c = self.cfg
        # ngrammys' sources without its bigram rows (the self-draft takes their place)
        self.ngrams = NGrammysProposer(num_speculative_tokens, {
            "bigram_table": "none", "num_rows": 1, "query_length": c.query_length,
            "min_query_length": c.min_query_length, "min_agreement": c.min_agreement,
            "history_tokens": c.history_tokens},
            Artifacts(datastore=self.artifacts.datastore))
        self.self_drafted: set[str] = set()  # requests whose pending draft is a self-draft
        # req_id -> (evidence class, tokens in the request then, continuation) of a match
        # passed over for the self-draft: scored against what the target produced next
        self.passed_over: dict[str, tuple[str, int, list[int]]] = {}
        self.agreement = c.agreement
        self.guess_worth = GuessWorth(num_speculative_tokens) if c.guess_cut else None
        self.stats.update({"from_context": 0, "from_history": 0, "from_datastore": 0,
                           "from_selfspec": 0, "match_passed_over": 0,
                           "shadow_verifications": 0})

    def observe(self, results: list[Verification]) -> None:
        """Base counters for every draft; the draft-exit threshold learns from the
        self-drafts only (an n-gram chain's acceptance says nothing of the draft's
        confidence)."""
        for r in results:
            self.stats["drafts"] += 1
            self.stats["drafted"] += r.drafted
            self.stats["accepted"] += r.accepted
            if r.req_id in self.self_drafted:
                self.exit.observe(r.drafted, r.accepted, reached_max=r.drafted >= self.k)
        self.self_drafted.clear()

    @torch.inference_mode()
    def propose(self, batch: DraftBatch) -> Proposal:
        drafts: list[list[int]] = [[] for _ in batch.req_ids]
        evidence = [""] * len(batch.req_ids)
        if batch.token_ids is None or batch.num_tokens is None:
            return Proposal(drafts)
        rest, guesses = [], {}
        shadows = self._shadows(batch)
        looked_up = 0
        for r in batch.requests:
            if r.max_len <= 0:
                continue
            looked_up += 1
            history = batch.token_ids[r.row, : int(batch.num_tokens[r.row])]
            rows, labels = self.ngrams.candidates(history, r.req_id)
            cap = batch.cap(r, labels[0]) if rows else 0
            own = batch.cap(r, SELF_DRAFT)
            if cap > 0 and not (own > 0 and (self.cfg.matches == GUESS
                                             or batch.prefers(SELF_DRAFT, labels[0]))):
                drafts[r.row] = [int(t) for t in rows[0][:cap]]
                evidence[r.row] = labels[0]
                self.stats["from_" + labels[0].split(":")[0]] += 1
                continue
            if own > 0:
                rest.append(dataclasses.replace(r, max_len=own))
                evidence[r.row] = SELF_DRAFT
                self.stats["match_passed_over"] += int(cap > 0)
                if rows:
                    self.passed_over[r.req_id] = (labels[0], len(history),
                                                  [int(t) for t in rows[0][: self.k]])
                    if self.cfg.matches != UNGUESSED:
                        guesses[r.row] = rows[0]
            else:  # both held back: the class this row is in (CostGate.landed)
                evidence[r.row] = labels[0] if rows else SELF_DRAFT
        probs, timed, depth = None, None, None
        if rest:
            t0 = time.perf_counter()
            again = (self._guess_again(batch, rest)
                     if self.cfg.guess_again and self.cfg.matches != UNGUESSED else None)
            own = super().propose(DraftBatch(batch.req_ids, rest, batch.token_ids,
                                             batch.num_tokens), guesses, again)
            for r in rest:
                drafts[r.row] = own.drafts[r.row]
                if own.drafts[r.row]:
                    self.self_drafted.add(r.req_id)
            self.stats["from_selfspec"] += len(self.self_drafted)
            probs = own.probs
            timed = {SELF_DRAFT: (sum(len(drafts[r.row]) for r in rest),
                                  time.perf_counter() - t0)}
            depth = {SELF_DRAFT: (own.depth or {}).get("", 0)}
        if probs is not None:  # n-gram drafts are one-hot in a sampled batch
            for r in batch.requests:
                if evidence[r.row] not in ("", SELF_DRAFT):
                    for i, t in enumerate(drafts[r.row]):
                        probs[r.row, i, t] = 1.0
        return Proposal(drafts, probs, evidence=evidence, timed=timed, depth=depth,
                        shadows=shadows or None, rows=looked_up)

    def _guess_again(self, batch: DraftBatch, rest: list[DraftRequest]) -> GuessAgain:
        """Key ``guess_again``: a row's fresh guess is the n-gram sources' first match for
        its tokens followed by its drafts so far (looked up without a request id, so the
        unverified drafts are not remembered as the request's tokens)."""
        assert batch.token_ids is not None and batch.num_tokens is not None
        tokens = {r.row: batch.token_ids[r.row, : int(batch.num_tokens[r.row])] for r in rest}

        def again(row: int, drafted: list[int]) -> list[int]:
            history = tokens[row]
            extended = np.concatenate([history, np.asarray(drafted, dtype=history.dtype)])
            rows, _ = self.ngrams.candidates(extended)
            return rows[0] if rows else []

        return again

    def _shadows(self, batch: DraftBatch) -> list[tuple[str, int, int]]:
        """Each match passed over at a request's last draft, verified as if it had been
        drafted alone, against the tokens the target has produced since: accepted up to
        its first token that differs; where it equals all of them and goes on, the
        positions after them are unknown and not counted. So a match class is measured
        while the self-draft drafts in its place, and the cost gate can prefer it where it
        pays more (key ``matches`` "gate"). ``propose`` calls it once the batch's token
        ids are known to be there."""
        shadows = []
        for r in batch.requests:
            seen = self.passed_over.pop(r.req_id, None)
            if seen is None:
                continue
            label, start, guess = seen
            new = [int(t) for t in batch.token_ids[r.row, start: int(batch.num_tokens[r.row])]]
            if not new:
                continue
            same = agreed_prefix(guess, new)
            tried = min(len(guess), same + 1 if same < len(new) else same)
            if tried > 0:
                shadows.append((label, tried, same))
        self.stats["shadow_verifications"] += len(shadows)
        return shadows

    def finish(self, req_ids: set[str]) -> None:
        super().finish(req_ids)
        for r in req_ids:
            self.passed_over.pop(r, None)
        self.ngrams.finish(req_ids)

    def report(self) -> dict[str, Any]:
        worth = {} if self.guess_worth is None else self.guess_worth.report()
        return {**super().report(), **self.ngrams.report(), **worth}

    def describe(self) -> str:
        return (f"ngrammys-selfspec: {self.ngrams.describe().split(':')[0]}, else "
                + super().describe())
