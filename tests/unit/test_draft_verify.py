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
        self.chunks = []

    def draft_step(self, rows, tokens, positions, mask, draft_index, head=None, settled=False):
        self.calls.append((rows.tolist(), positions.tolist(), draft_index, mask))
        return self._logits(tokens.tolist(), positions.tolist())

    def draft_chunk(self, rows, tokens, lens, starts, mask, head=None):
        """The same rule at every fed token (a chunk sees what one-token steps would)."""
        positions = [s + j for s, n in zip(starts.tolist(), lens) for j in range(n)]
        self.chunks.append((rows.tolist(), tokens.tolist(), list(lens), starts.tolist()))
        return self._logits(tokens.tolist(), positions)

    def _logits(self, tokens, positions):
        logits = torch.full((len(tokens), V), -10.0)
        for i, (t, p) in enumerate(zip(tokens, positions)):
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


def _draft(p, reqs, guesses=None):
    return p.propose(DraftBatch([f"r{i}" for i in range(len(reqs))], reqs), guesses).drafts


def test_guesses_give_the_same_drafts_in_fewer_passes():
    reqs = [DraftRequest(0, "a", 10, 3, 6), DraftRequest(1, "b", 20, 7, 3),
            DraftRequest(2, "c", 30, 1, 4)]
    p, t = make(k=6)
    want = _draft(p, reqs)
    assert want == [[4, 5, 6, 7, 8, 9], [8, 9, 10], [2, 3, 4, 5]] and len(t.calls) == 6
    p, t = make(k=6)
    # a: right for three tokens, then wrong; b: no guess; c: wrong from the first token
    got = _draft(p, reqs, {0: [4, 5, 6, 9, 9, 9, 9], 2: [9, 9]})
    assert got == want
    # one chunk: each row's newest token and its guess, cut to max_len - 1 tokens
    assert t.chunks == [([0, 1, 2], [3, 4, 5, 6, 9, 9, 7, 1, 9, 9], [6, 1, 3], [10, 20, 30])]
    # a drafted 4 tokens in the chunk and goes on at position 14; b and c after one
    assert t.calls[0][0] == [0, 1, 2] and t.calls[0][1] == [14, 21, 31]
    assert len(t.calls) == 3  # against 6 passes without guesses
    assert p.stats["guessed_tokens"] == 7 and p.stats["guesses_kept"] == 3


def test_guesses_never_change_the_drafts():
    """Random guesses (often right), limits and unsure positions: the drafts are those of
    the loop without guesses."""
    import random

    rng = random.Random(0)
    for _ in range(200):
        k = rng.randint(1, 8)
        low = {rng.randint(0, 12) for _ in range(rng.randint(0, 2))}
        reqs = [DraftRequest(i, f"r{i}", rng.randint(0, 5), rng.randrange(V), rng.randint(1, k))
                for i in range(rng.randint(1, 3))]
        guesses = {}
        for r in reqs:
            g = [(r.token + 1 + j) % V for j in range(rng.randint(0, 9))]
            if g and rng.random() < 0.5:
                g[rng.randrange(len(g))] = rng.randrange(V)
            guesses[r.row] = g
        plain, _ = make(k=k)
        plain.target.low_conf_at = low
        guessed, _ = make(k=k)
        guessed.target.low_conf_at = low
        assert _draft(guessed, reqs, guesses) == _draft(plain, reqs), (k, low, reqs, guesses)


def test_guessed_sampled_rows_return_q_at_each_draft():
    p, t = make(k=4)
    reqs = [DraftRequest(0, "a", 1, 0, 4, temperature=1.0)]
    out = p.propose(DraftBatch(["a"], reqs), {0: [1, 2, 9]})
    # the fake q is peaked (e^20 : 1): the draws are the argmax, 1 2 3 4
    assert out.drafts == [[1, 2, 3, 4]] and len(t.chunks) == 1 and len(t.calls) == 1
    assert torch.allclose(out.probs[0].sum(-1), torch.ones(4))
    assert [int(out.probs[0, j].argmax()) for j in range(4)] == [1, 2, 3, 4]


def test_agreement_drafts_on_through_a_guess_the_draft_is_unsure_of():
    reqs = [DraftRequest(0, "a", 10, 3, 6)]
    guess = {0: [4, 5, 6, 9]}
    # unsure at position 11 (its draft, 5, equals the guess) and at 12 (6, also guessed)
    p, t = make(k=6)
    t.low_conf_at = {11, 12}
    assert _draft(p, reqs, guess) == [[4, 5]]  # without agreement: stops as the loop does
    p, t = make(k=6)
    t.low_conf_at = {11, 12}
    p.agreement = True
    # 5 and 6 are unsure but guessed: on to 7 (sure, leaves the guess), then the loop
    assert _draft(p, reqs, guess) == [[4, 5, 6, 7, 8, 9]]
    assert p.stats["kept_by_agreement"] == 2 and len(t.chunks) == 1
    # an unsure draft that differs from the guess still stops the row
    p, t = make(k=6)
    t.low_conf_at = {11}
    p.agreement = True
    assert _draft(p, reqs, {0: [4, 9, 9]}) == [[4, 5]] and not t.calls
    # without a guess agreement changes nothing
    p, t = make(k=6)
    t.low_conf_at = {11}
    p.agreement = True
    assert _draft(p, reqs) == [[4, 5]]


def test_a_fresh_guess_after_the_draft_leaves_the_first_one():
    reqs = [DraftRequest(0, "a", 10, 3, 8), DraftRequest(1, "b", 20, 7, 3)]
    p, t = make(k=8)
    want = _draft(p, reqs)
    seen = []

    def again(row, drafted):
        seen.append((row, list(drafted)))
        # a: after its first chunk (4 5 6 then 7, off the guess) guesses 8 9 10 11 right
        return [8, 9, 10, 11] if row == 0 else []

    p, t = make(k=8)
    got = p.propose(DraftBatch(["r0", "r1"], reqs), {0: [4, 5, 6, 9]}, again).drafts
    assert got == want == [[4, 5, 6, 7, 8, 9, 10, 11], [8, 9, 10]]
    # chunk 2: a from its draft 7 at position 14 with the fresh guess cut to the 3 tokens
    # its limit leaves (its 8th draft comes from the last one), b from 8 at 21, unguessed
    assert seen[:2] == [(0, [4, 5, 6, 7]), (1, [8])]
    assert t.chunks[1] == ([0, 1], [7, 8, 9, 10, 8], [4, 1], [14, 21])
    assert len(t.chunks) == 2 and len(t.calls) == 1  # b's last draft: a one-token step
    assert p.stats["guessed_again"] >= 1 and p.stats["guesses_kept"] == 3 + 3


def random_case(rng):
    """A random draft limit, unsure positions, requests and a guesser for property tests:
    ``guess(last)`` proposes the fake model's own continuation of ``last``, often with
    one token wrong."""
    k = rng.randint(1, 8)
    low = {rng.randint(0, 12) for _ in range(rng.randint(0, 2))}
    reqs = [DraftRequest(i, f"r{i}", rng.randint(0, 5), rng.randrange(V), rng.randint(1, k))
            for i in range(rng.randint(1, 3))]

    def guess(last):
        g = [(last + 1 + j) % V for j in range(rng.randint(0, 9))]
        if g and rng.random() < 0.5:
            g[rng.randrange(len(g))] = rng.randrange(V)
        return g

    return k, low, reqs, guess


def test_fresh_guesses_never_change_the_drafts():
    """Random first and fresh guesses (often right), limits and unsure positions: the
    drafts are those of the loop without guesses."""
    import random

    rng = random.Random(1)
    for _ in range(200):
        k, low, reqs, guess = random_case(rng)
        first = {r.row: guess(r.token) for r in reqs}
        tok = {r.row: r.token for r in reqs}
        plain, _ = make(k=k)
        plain.target.low_conf_at = low
        guessed, _ = make(k=k)
        guessed.target.low_conf_at = low
        got = guessed.propose(DraftBatch([r.req_id for r in reqs], reqs), first,
                              lambda row, d, tok=tok, guess=guess:
                              guess(d[-1] if d else tok[row])).drafts
        assert got == _draft(plain, reqs), (k, low, reqs)
