"""The cost gate picks the arm that produces tokens faster, measured in windows."""

from vllm_selfspec.proposers.cost_gate import CostGate, CostGateConfig


def simulate(gate, steps, draft_step_s, draft_tokens, plain_step_s=0.06, prefill_every=0):
    """Engine steps on a fake clock: the arm chosen at step t decides how long step
    t+1 takes and how many tokens it emits."""
    now, arms, drafted = 0.0, [], False
    for t in range(steps):
        prefill = prefill_every and t % prefill_every == 0
        if t > 0:
            now += (draft_step_s if drafted else plain_step_s) * (3 if prefill else 1)
        gate.record(now, draft_tokens if drafted else 1, decode_only=not prefill)
        drafted = gate.should_draft()
        arms.append(drafted)
    return arms


def test_steps_back_when_drafting_does_not_pay():
    gate = CostGate(CostGateConfig(window=8, exploit_windows=4))
    arms = simulate(gate, 400, draft_step_s=0.10, draft_tokens=1.3)  # 13 vs 16.7 tok/s
    assert gate.winner == "plain"
    assert sum(arms[-200:]) / 200 < 0.25  # only the measurement windows draft


def test_keeps_drafting_when_it_pays():
    gate = CostGate(CostGateConfig(window=8, exploit_windows=4))
    arms = simulate(gate, 400, draft_step_s=0.10, draft_tokens=2.5)  # 25 vs 16.7 tok/s
    assert gate.winner == "draft"
    assert sum(arms[-200:]) / 200 > 0.75


def test_prefill_steps_are_not_counted():
    gate = CostGate(CostGateConfig(window=8, exploit_windows=4))
    simulate(gate, 400, draft_step_s=0.10, draft_tokens=2.5, prefill_every=5)
    assert gate.winner == "draft"
    assert all(r > 10 for _, r in gate.history)  # slow prefill steps left out of the rates


def test_starts_by_measuring():
    gate = CostGate(CostGateConfig(window=4, exploit_windows=2))
    arms = simulate(gate, 12, draft_step_s=0.10, draft_tokens=2.0)
    assert arms[:4] == [False] * 4 and any(arms[4:10])


def test_back_off_while_the_same_arm_wins():
    gate = CostGate(CostGateConfig(window=4, exploit_windows=2, max_exploit_windows=8))
    arms = simulate(gate, 2000, draft_step_s=0.10, draft_tokens=1.2)
    assert gate.exploit_windows == 8 and gate.streak >= 2
    assert sum(arms[-1000:]) / 1000 < 0.12  # drafting windows become rare
