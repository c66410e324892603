"""The adaptive draft-exit threshold of Draft & Verify §3.4 (eqs. 2-4)."""

import pytest

from vllm_selfspec.proposers.draft_exit import DraftExitConfig, DraftExitController


def test_first_stage_uses_beta1_zero_and_raises_threshold_when_acceptance_low():
    c = DraftExitController(DraftExitConfig())  # γ0 .6, α .9, ε .01, β1 .5, β2 .9
    c.observe(drafted=4, accepted=2)
    assert c.acceptance == pytest.approx(0.5)  # AR = AR_1 (β1 = 0 for e = 1)
    assert c.threshold == pytest.approx(0.9 * 0.6 + 0.1 * 0.61)


def test_rule_by_hand():
    c = DraftExitController(DraftExitConfig(threshold=0.6))
    c.observe(4, 4)  # AR = 1.0 > α -> lower
    g1 = 0.9 * 0.6 + 0.1 * 0.59
    assert c.threshold == pytest.approx(g1)
    c.observe(4, 0)  # AR = .5*1 + .5*0 = .5 <= α -> raise
    assert c.acceptance == pytest.approx(0.5)
    assert c.threshold == pytest.approx(0.9 * g1 + 0.1 * (g1 + 0.01))


def test_not_lowered_after_a_full_length_draft():
    c = DraftExitController(DraftExitConfig(threshold=0.6))
    c.observe(12, 12, reached_max=True)
    assert c.threshold == pytest.approx(0.6)


def test_converges_towards_target_acceptance():
    c = DraftExitController(DraftExitConfig(threshold=0.6))
    for _ in range(300):
        c.observe(5, 2)  # persistently 40% acceptance -> threshold climbs
    assert c.threshold > 0.85
    assert 0.0 <= c.threshold <= 1.0


def test_static_threshold_and_empty_drafts():
    c = DraftExitController(DraftExitConfig(threshold=0.3, adaptive=False))
    c.observe(4, 0)
    c.observe(0, 0)
    assert c.threshold == 0.3 and c.should_exit(0.29) and not c.should_exit(0.3)
