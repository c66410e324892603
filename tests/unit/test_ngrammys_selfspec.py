"""ngrammys-selfspec: n-gram sources where they match, the self-draft elsewhere."""

import numpy as np
import torch

from tests.unit.test_draft_verify import FakeTarget, V
from vllm_selfspec import methods
from vllm_selfspec.proposers.base import DraftBatch, DraftRequest, Verification
from vllm_selfspec.proposers.ngrammys_selfspec import SELF_DRAFT, NGrammysSelfSpecProposer
from vllm_selfspec.proposers.resolved import Artifacts
from vllm_selfspec.proposers.skip_mask import SkipMask


def make(k=4, **opts):
    """The proposer with ``matches`` "gate" unless given: the tests of the gate's choice
    between a match and the self-draft."""
    p = NGrammysSelfSpecProposer(k, {"history_tokens": 0, "query_length": 2,
                                     "min_query_length": 2, "matches": "gate", **opts},
                                 Artifacts(skip_mask=SkipMask()))
    t = FakeTarget()
    p.bind(t)
    return p, t


def batch(rows, temperature=0.0, limit=None, worth=None):
    ids = np.zeros((len(rows), 64), dtype=np.int32)
    reqs = []
    for i, toks in enumerate(rows):
        ids[i, : len(toks)] = toks
        reqs.append(DraftRequest(row=i, req_id=f"r{i}", position=len(toks) - 1,
                                 token=toks[-1], max_len=8, temperature=temperature))
    return DraftBatch([f"r{i}" for i in range(len(rows))], reqs, ids,
                      np.array([len(t) for t in rows]), limit=limit, worth=worth)


# "9 3" occurred before: a context match proposes 5 6 7 ...; the second has no repeat
REPEAT = [9, 3, 5, 6, 7, 11, 12, 9, 3]
FRESH = [1, 2, 4, 8, 10, 13, 14]


def test_context_matches_draft_n_grams_the_rest_self_drafts():
    p, t = make(k=4)
    out = p.propose(batch([REPEAT, FRESH]))
    assert out.drafts[0] == [5, 6, 7, 11]  # the context continuation
    assert out.drafts[1] == [15, 0, 1, 2]  # the fake target: next = token + 1 (mod V)
    assert out.evidence[0].startswith("context") and out.evidence[1] == SELF_DRAFT
    assert [c[0] for c in t.calls] == [[1]] * 4  # the self-draft ran for the fresh row only
    assert out.timed is not None and out.timed[SELF_DRAFT][0] == 4
    assert out.depth == {SELF_DRAFT: 4}  # four passes: priced per position (CostGate)
    assert p.stats["from_context"] == 1 and p.stats["from_selfspec"] == 1


def test_a_source_the_gate_holds_back_falls_through_to_the_self_draft():
    p, t = make(k=4)
    out = p.propose(batch([REPEAT], limit=lambda cls: 0 if cls.startswith("context") else 8))
    assert out.drafts[0] == [4, 5, 6, 7] and out.evidence[0] == SELF_DRAFT
    out = p.propose(batch([REPEAT], limit=lambda cls: 0))
    assert out.drafts[0] == [] and t.calls  # nothing pays: nothing drafted


def test_a_match_predicted_to_pay_less_than_the_self_draft_is_passed_over():
    p, t = make(k=4)
    low = {SELF_DRAFT: 1.6}  # every n-gram class 1.1: the self-draft pays more
    out = p.propose(batch([REPEAT, FRESH], worth=lambda cls: low.get(cls, 1.1)))
    assert out.evidence == [SELF_DRAFT, SELF_DRAFT]
    assert out.drafts[0] == [4, 5, 6, 7] and p.stats["match_passed_over"] == 1
    assert p.stats["from_context"] == 0 and p.stats["from_selfspec"] == 2
    high = {SELF_DRAFT: 1.6}  # the context match pays more: it drafts, as without worth
    out = p.propose(batch([REPEAT], worth=lambda cls: high.get(cls, 3.0)))
    assert out.drafts[0] == [5, 6, 7, 11] and out.evidence[0].startswith("context")
    # a self-draft the gate holds back is not preferred, whatever it would be worth
    out = p.propose(batch([REPEAT], limit=lambda cls: 0 if cls == SELF_DRAFT else 8,
                          worth=lambda cls: low.get(cls, 1.1)))
    assert out.drafts[0] == [5, 6, 7, 11] and out.evidence[0].startswith("context")


def test_a_passed_over_match_is_the_self_drafts_guess():
    low = {SELF_DRAFT: 1.6}  # the self-draft pays more than the context match
    # a repeat the fake model agrees with: after "3 4 5 6" it drafts 7 8 ..., as before
    agreeing = [2, 3, 4, 5, 6, 7, 8, 1, 3, 4, 5, 6]
    p, t = make(k=4)
    out = p.propose(batch([agreeing], worth=lambda cls: low.get(cls, 1.1)))
    assert out.evidence == [SELF_DRAFT] and out.drafts[0] == [7, 8, 9, 10]
    # one pass fed the newest token and the match's first three tokens (7 8 1) and kept 7 8;
    # the loop drafted the rest from 9
    assert t.chunks == [([0], [6, 7, 8, 1], [4], [11])] and len(t.calls) == 1
    assert p.stats["guesses_kept"] == 2
    off, t_off = make(k=4, matches="gate-unguessed")
    assert off.propose(batch([agreeing], worth=lambda cls: low.get(cls, 1.1))).drafts == \
        out.drafts
    assert not t_off.chunks and len(t_off.calls) == 4
    # "guess": the self-draft even where the gate would draft the match (no worth known)
    always, t_always = make(k=4, matches="guess")
    assert always.propose(batch([agreeing])).evidence == [SELF_DRAFT] and t_always.chunks
    gate, _ = make(k=4)
    assert gate.propose(batch([agreeing])).evidence[0].startswith("context")


def test_sampled_batch_hands_q_for_self_drafts_and_one_hot_for_n_grams():
    p, _ = make(k=3)
    out = p.propose(batch([REPEAT, FRESH], temperature=1.0))
    assert out.probs is not None and out.probs.shape == (2, 3, V)
    for i, tok in enumerate(out.drafts[0]):
        assert float(out.probs[0, i, tok]) == 1.0 and float(out.probs[0, i].sum()) == 1.0
    q = out.probs[1, : len(out.drafts[1])]
    assert torch.allclose(q.sum(-1), torch.ones(len(out.drafts[1])))


def test_only_self_drafts_move_the_draft_exit_threshold():
    p, _ = make(k=4)
    before = p.exit.threshold
    p.propose(batch([REPEAT, FRESH]))  # r0: n-gram draft, r1: self-draft
    p.observe([Verification("r0", 4, 0)])  # a rejected n-gram chain: not the draft's doing
    assert p.exit.threshold == before
    p.propose(batch([REPEAT, FRESH]))
    p.observe([Verification("r1", 4, 0)])
    assert p.exit.threshold != before
    assert p.stats["drafts"] == 2


def test_registered_with_selfspec_and_n_gram_keys():
    m, core, opts = methods.split_config({"method": "ngrammys-selfspec"})
    assert core["num_speculative_tokens"] == 12
    assert opts["draft_weights"] == "w8a8" and opts["datastore"] == "sharegpt"
    assert opts["history_tokens"] > 0 and "bigram_table" not in opts
    # by default a match is the self-draft's guess, even where the gate knows no worth
    assert opts["matches"] == "guess"
    p = NGrammysSelfSpecProposer(4, {"history_tokens": 0, "query_length": 2,
                                     "min_query_length": 2}, Artifacts(skip_mask=SkipMask()))
    t = FakeTarget()
    p.bind(t)
    out = p.propose(batch([[2, 3, 4, 5, 6, 7, 8, 1, 3, 4, 5, 6]]))
    assert out.evidence == [SELF_DRAFT] and t.chunks and out.drafts[0] == [7, 8, 9, 10]


def test_by_default_an_unsure_self_draft_drafts_on_where_the_match_agrees():
    """The context repeats "3 4 5 6 7 8"; the self-draft is unsure at the second draft
    (position 12) but drafts what the match guessed there, so the row drafts on."""
    m, core, opts = methods.split_config({"method": "ngrammys-selfspec"})
    assert opts["agreement"] is True
    history = [2, 3, 4, 5, 6, 7, 8, 1, 3, 4, 5, 6]
    drafts = {}
    for agreement in (True, False):
        p = NGrammysSelfSpecProposer(4, {"history_tokens": 0, "query_length": 2,
                                         "min_query_length": 2, "agreement": agreement},
                                     Artifacts(skip_mask=SkipMask()))
        t = FakeTarget(low_conf_at={12})
        p.bind(t)
        drafts[agreement] = p.propose(batch([history])).drafts[0]
        assert p.stats["kept_by_agreement"] == int(agreement)
    assert drafts[False] == [7, 8]  # stops after the unsure draft, as selfspec does
    assert drafts[True] == [7, 8, 9, 10]


def test_a_passed_over_match_is_verified_in_the_shadow_of_the_self_draft():
    """The context match after "9 3" is 5 6 7 11; the self-draft drafts instead. At the next
    step the match is scored against the tokens the target produced since."""
    p, _ = make(k=4, matches="guess")
    out = p.propose(batch([REPEAT]))
    assert out.evidence == [SELF_DRAFT] and out.shadows is None
    label = next(iter(p.passed_over.values()))[0]
    assert label.startswith("context")
    # the target produced 5 6 8: the match would have had two accepted of three tried
    out = p.propose(batch([REPEAT + [5, 6, 8]]))
    assert out.shadows == [(label, 3, 2)]
    # all the target produced so far equals the match, which goes on: the rest is unknown
    p, _ = make(k=4, matches="guess")
    p.propose(batch([REPEAT]))
    assert p.propose(batch([REPEAT + [5, 6]])).shadows == [(label, 2, 2)]
    # wrong from its first token; and a request not stepped since gives no shadow
    p, _ = make(k=4, matches="guess")
    p.propose(batch([REPEAT]))
    assert p.propose(batch([REPEAT + [1]])).shadows == [(label, 1, 0)]
    p, _ = make(k=4, matches="guess")
    p.propose(batch([REPEAT]))
    assert p.propose(batch([REPEAT])).shadows is None
    p.finish({"r0"})
    assert not p.passed_over
