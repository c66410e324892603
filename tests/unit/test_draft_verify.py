"""SelfSpecProposer (Draft & Verify drafting loop) against a fake target."""

import torch

from vllm_selfspec.proposers.base import DraftBatch, DraftRequest, Verification
from vllm_selfspec.proposers.draft_verify import SelfSpecProposer
from vllm_selfspec.proposers.resolved import Artifacts
from vllm_selfspec.proposers.skip_mask import SkipMask

V = 16


class FakeTarget:
    """Next token = (token + 1) % V, with a confidence that depends on the position."""

    num_layers = 4
    vocab_size = V
    device = torch.device("cpu")

    def __init__(self, low_conf_at=None):
        self.low_conf_at = low_conf_at or set()
        self.calls = []

    def draft_step(self, rows, tokens, positions, mask, draft_index, head=None, settled=False):
        self.calls.append((rows.tolist(), positions.tolist(), draft_index, mask))
        logits = torch.full((len(rows), V), -10.0)
        for i, (t, p) in enumerate(zip(tokens.tolist(), positions.tolist())):
            if p in self.low_conf_at:  # flat: top-1 probability ~0.1
                logits[i] = 0.0
                logits[i, (t + 1) % V] = 0.5
            else:
                logits[i, (t + 1) % V] = 10.0
        return logits


def make(k=4, **opts):
    p = SelfSpecProposer(k, opts, Artifacts(skip_mask=SkipMask(frozenset({1}), frozenset())))
    t = FakeTarget()
    p.bind(t)
    return p, t


def test_drafts_are_ragged_and_respect_limits():
    p, t = make(k=4)
    batch = DraftBatch(req_ids=["a", "b", "c"], requests=[
        DraftRequest(row=0, req_id="a", position=10, token=3, max_len=4),
        DraftRequest(row=2, req_id="c", position=5, token=7, max_len=2),
    ])
    out = p.propose(batch)
    assert out.drafts == [[4, 5, 6, 7], [], [8, 9]]
    assert out.probs is None
    # positions advance one per draft step; the mask is passed through
    assert t.calls[0][1] == [10, 5] and t.calls[1][1] == [11, 6] and t.calls[2][1] == [12]
    assert t.calls[0][3].attention == {1}


def test_draft_exit_keeps_the_low_confidence_token_then_stops():
    p, t = make(k=6)
    t.low_conf_at = {12}  # the third draft (position 12) is unsure
    out = p.propose(DraftBatch(["a"], [DraftRequest(0, "a", 10, 0, 6)]))
    assert out.drafts == [[1, 2, 3]]


def test_sampled_rows_return_q():
    p, t = make(k=3)
    out = p.propose(DraftBatch(["a", "b"], [DraftRequest(0, "a", 1, 0, 3, temperature=1.0),
                                           DraftRequest(1, "b", 1, 0, 3)]))
    assert out.probs is not None and out.probs.shape == (2, 3, V)
    assert torch.allclose(out.probs[0, :len(out.drafts[0])].sum(-1), torch.ones(len(out.drafts[0])))
    assert out.probs[1].sum() == 0  # greedy row: argmax draft, no q
    p2, _ = make(k=3, draft_sample_method="greedy")
    out2 = p2.propose(DraftBatch(["a"], [DraftRequest(0, "a", 1, 0, 3, temperature=1.0)]))
    assert out2.probs is None and out2.drafts == [[1, 2, 3]]


def test_feedback_moves_the_threshold():
    p, _ = make(k=4)
    g0 = p.exit.threshold
    p.observe([Verification("a", 4, 0)])
    assert p.exit.threshold > g0 and p.stats["drafted"] == 4 and p.stats["accepted"] == 0


def test_no_rows():
    p, t = make()
    assert p.propose(DraftBatch(["a"], [])).drafts == [[]] and not t.calls
