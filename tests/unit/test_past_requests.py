"""Drafts from earlier requests (proposers.past_requests) and their use by ngrammys."""

from __future__ import annotations

import numpy as np

from vllm_selfspec.proposers.base import DraftBatch, DraftRequest
from vllm_selfspec.proposers.ngrammys import NGrammysProposer
from vllm_selfspec.proposers.past_requests import SEPARATOR, PastRequests


def test_longest_suffix_wins_then_the_most_recent():
    p = PastRequests(100, max_query=4, min_query=2)
    p.remember("a", np.array([1, 2, 3, 4, 5, 6]))
    p.remember("b", np.array([9, 3, 4, 7, 8]))
    p.finish({"a", "b"})
    assert p.requests_added == 2
    # suffix (2, 3, 4) matches only request a (3 tokens); (3, 4) alone would prefer b
    assert p.draft(np.array([0, 2, 3, 4]), 5) == [5, 6]  # stops at the separator
    assert p.draft(np.array([0, 0, 3, 4]), 1) == [7]  # two tokens: the most recent (b)
    assert p.draft(np.array([0, 0, 0, 4]), 3) == []  # one token is under min_query
    assert p.draft(np.array([5, 6]), 3) == []  # nothing followed (5, 6)
    assert p.draft(np.array([3, 4]), 0) == []
    assert SEPARATOR not in p.draft(np.array([7, 8]), 4)


def test_bounded_oldest_evicted_state_freed():
    p = PastRequests(8)
    for i, r in enumerate(("a", "b", "c")):
        p.remember(r, np.array([10 * i + 1, 10 * i + 2, 10 * i + 3, 10 * i + 4]))
    p.finish({"a"})
    p.finish({"b", "c"})
    assert p.buffer.size == 8 and p.running == {}
    assert p.draft(np.array([1, 2]), 2) == []  # a was evicted
    assert p.draft(np.array([21, 22]), 2) == [23, 24]
    p.finish({"never-seen"})  # aborted before drafting: nothing to add
    assert p.buffer.size == 8
    assert p.report()["history_bytes"] == 32


def _propose(p: NGrammysProposer, hist: list[int], rid: str) -> list[int]:
    req = DraftRequest(row=0, req_id=rid, position=len(hist) - 1, token=hist[-1], max_len=8)
    return p.propose(DraftBatch([rid], [req], np.asarray([hist]), np.asarray([len(hist)]))).drafts[0]


def test_ngrammys_drafts_from_a_finished_request_only_with_history_on():
    on = NGrammysProposer(4, {"bigram_table": "none", "history_tokens": 64})
    off = NGrammysProposer(4, {"bigram_table": "none"})
    for p in (on, off):
        assert _propose(p, [5, 6, 7, 8, 9, 10], "a") == []  # no repeat in its own context
        p.finish({"a"})
    assert _propose(on, [1, 2, 6, 7], "b") == [8, 9, 10]
    assert on.stats["from_history"] == 1
    assert _propose(off, [1, 2, 6, 7], "b") == []
    # the request's own context still comes first
    assert _propose(on, [6, 7, 1, 2, 6, 7], "c") == [1, 2, 6, 7]


def test_ngrammys_history_is_ngrammys_with_history_on_by_default():
    from vllm_selfspec.proposers.ngrammys_history import NGrammysHistoryProposer
    from vllm_selfspec.proposers.past_requests import DEFAULT_HISTORY_TOKENS

    p = NGrammysHistoryProposer(4, {"bigram_table": "none"})
    assert p.past is not None and p.past.max_tokens == DEFAULT_HISTORY_TOKENS
    _propose(p, [5, 6, 7, 8, 9, 10], "a")
    p.finish({"a"})
    assert _propose(p, [1, 2, 6, 7], "b") == [8, 9, 10]
    assert p.describe().startswith("N-Grammys + earlier requests (262144 tokens kept)")
    off = NGrammysHistoryProposer(4, {"bigram_table": "none", "history_tokens": 0})
    assert off.past is None
