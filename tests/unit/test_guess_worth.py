"""GuessWorth: which guessed tokens pay for their place in a draft pass."""

import pytest

from tests.unit.test_draft_verify import make, random_case
from vllm_selfspec.proposers.base import DraftBatch, DraftRequest
from vllm_selfspec.proposers.guess_worth import GuessWorth


def test_the_pass_cost_fit_recovers_a_and_b():
    w = GuessWorth(8)
    assert w.cost() is None and w.break_even() == 0.0  # nothing timed: feed whole guesses
    for n in [1, 3, 5, 8] * 10:
        w.observe_pass(n, 0.006 + 0.0009 * n)
    a, b = w.cost()
    assert a == pytest.approx(0.006, rel=1e-6) and b == pytest.approx(0.0009, rel=1e-6)
    assert w.break_even() == pytest.approx(0.0009 / 0.0069, rel=1e-6)


def test_one_size_of_pass_is_no_fit():
    w = GuessWorth(8)
    for _ in range(40):
        w.observe_pass(1, 0.007)
    assert w.cost() is None and w.length(5) == 5


def test_positions_that_seldom_hold_are_not_fed():
    w = GuessWorth(8)
    for n in [1, 6] * 20:
        w.observe_pass(n, 0.006 + 0.001 * n)  # break-even 1/7
    assert w.length(6) == 6  # the prior: every position held
    for _ in range(400):  # the first token holds half the time, the second 1 in 20
        w.observe_guess(6, 0)
        w.observe_guess(6, 1)
    for i in range(20):
        w.observe_guess(6, 2 if i < 1 else 0)
    assert w.length(6) == 1 and w.length(0) == 0


def test_a_cut_guess_gives_the_same_drafts_and_is_scored_in_full():
    """The fake target drafts token + 1: a guess 4 5 6 7 from token 3 holds in full. With
    the second position learned not to pay, only 4 is fed, and the guess is still scored
    against the drafts as if fed whole (its later tokens held)."""
    reqs = [DraftRequest(0, "a", 10, 3, 6)]
    plain, _ = make(k=6)
    want = plain.propose(DraftBatch(["a"], reqs)).drafts
    p, t = make(k=6)
    p.guess_worth = w = GuessWorth(6)
    for n in [1, 6] * 20:
        w.observe_pass(n, 0.006 + 0.001 * n)
    w.kept[1:] = 0.0  # learned: positions after the first never hold
    got = p.propose(DraftBatch(["a"], reqs), {0: [4, 5, 6, 7]}).drafts
    assert got == want
    assert t.chunks[0][1] == [3, 4] and p.stats["guess_tokens_cut"] == 3
    assert w.kept[1] > 0  # scored in full: position 1 held this time


def test_cut_guesses_never_change_the_drafts():
    import random

    from vllm_selfspec.proposers.base import DraftBatch as B

    rng = random.Random(2)
    for _ in range(150):
        k, low, reqs, guess = random_case(rng)
        plain, _ = make(k=k)
        plain.target.low_conf_at = low
        cut, _ = make(k=k)
        cut.target.low_conf_at = low
        cut.guess_worth = w = GuessWorth(k)
        for n in [1, 4] * 10:
            w.observe_pass(n, 0.006 + 0.001 * n)
        w.kept[:] = [rng.random() * w.fed[0] for _ in range(k)]
        tok = {r.row: r.token for r in reqs}
        got = cut.propose(B([r.req_id for r in reqs], reqs), {r.row: guess(r.token) for r in reqs},
                          lambda row, d, tok=tok, guess=guess:
                          guess(d[-1] if d else tok[row])).drafts
        assert got == plain.propose(B([r.req_id for r in reqs], reqs)).drafts
