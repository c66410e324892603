"""Replay of self-speculative decoding over teacher-forced agreement (proxy objective)."""

import pytest

from vllm_selfspec.proposers.draft_exit import DraftExitConfig
from vllm_selfspec.proposers.expected_speedup import CostModel, replay
from vllm_selfspec.proposers.skip_mask import SkipMask

FREE = CostModel(0.0, 0.0, 0.0, 0.0)  # drafting and verifying for free: speedup = tokens/step
STATIC = DraftExitConfig(threshold=0.5, adaptive=False)


def test_perfect_draft_emits_k_plus_one_per_step():
    agree, conf = [[True] * 13], [[0.9] * 13]
    r = replay(agree, conf, SkipMask(), 4, k=4, cost=FREE, exit_cfg=STATIC)
    # token 0 from prefill, then 12 tokens in steps of 5, 5, 2
    assert r.tokens == 12 and r.steps == 3 and r.drafted == 4 + 4 + 2
    assert r.accepted == 4 + 4 + 2


def test_stops_after_low_confidence_token_and_accepts_prefix():
    agree = [[True, True, False, True, True, True]]
    conf = [[1.0, 0.9, 0.9, 0.2, 0.9, 0.9]]
    r = replay(agree, conf, SkipMask(), 4, k=8, cost=FREE, exit_cfg=STATIC)
    # step 1 from j0=1: drafts j=1,2,3 (stops after conf[3]=0.2), accepts 1 -> emits 2
    # step 2 from j0=3: drafts j=3 only (conf 0.2), accepted -> emits 2
    # step 3 from j0=5: drafts j=5 (the last token), accepted -> emits 1
    assert (r.steps, r.drafted, r.accepted, r.tokens) == (3, 5, 3, 5)


def test_costs():
    cost = CostModel(draft_fixed=0.2, draft_attention=0.01, draft_mlp=0.02, verify_per_token=0.1)
    m = SkipMask(frozenset({1, 2}), frozenset({1}))
    assert cost.draft_token(m, 10) == pytest.approx(0.2 + 8 * 0.01 + 9 * 0.02)
    assert cost.verify(3) == pytest.approx(1.3)
    r = replay([[True] * 3], [[0.9] * 3], m, 10, k=2, cost=cost, exit_cfg=STATIC)
    assert r.cost == pytest.approx(2 * cost.draft_token(m, 10) + cost.verify(2))
    assert r.speedup == pytest.approx(2 / r.cost)
    assert CostModel.from_json(cost.to_json()) == cost


def test_uniform_cost_model_sums_to_one_decode_step():
    c = CostModel.uniform(30)
    assert c.draft_token(SkipMask(), 30) == pytest.approx(1.0)
