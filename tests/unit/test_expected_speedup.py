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


TABLE = {"1": 0.050, "2+": 0.060, "4+": 0.065, "9+": 0.090}  # a plain and drafted steps


def test_step_table_prices_verification_by_the_measured_shape():
    cost = CostModel(0.1, 0.01, 0.02, 0.03).with_step_table(TABLE)
    s = cost.verify_steps
    assert len(s) == 9 and s[0] == 1.0
    assert s[1] == pytest.approx(1.2) and s[3] == pytest.approx(1.3) and s[8] == pytest.approx(1.8)
    assert s[2] == pytest.approx(1.25)  # between 1 and 3 drafts, interpolated
    assert s[5] == pytest.approx(1.3 + 2 / 5 * 0.5)
    assert cost.verify(1) == pytest.approx(1.2) and cost.verify(10) == pytest.approx(1.8 + 2 * 0.03)
    assert CostModel(0.1, 0.01, 0.02, 0.03).verify(1) == pytest.approx(1.03)  # the line
    for bad in ({"1": 0.05}, {"2+": 0.06}, {"1": 0.0, "2+": 0.06}):
        with pytest.raises(ValueError, match="plain step"):
            cost.with_step_table(bad)


def test_step_table_round_trips_and_old_files_still_read():
    cost = CostModel(0.1, 0.01, 0.02, 0.03).with_step_table(TABLE)
    assert CostModel.from_json(cost.to_json()) == cost
    old = {"draft_fixed": 0.1, "draft_attention": 0.01, "draft_mlp": 0.02, "verify_per_token": 0.03}
    assert CostModel.from_json(old).verify_steps == () and "verify_steps" not in CostModel.from_json(old).to_json()


def test_drafted_step_overhead_makes_unaccepted_drafts_cost_more():
    agree, conf = [[False] * 20], [[0.9] * 20]
    line = CostModel(0.0, 0.0, 0.0, 0.0)
    shaped = line.with_step_table(TABLE)
    r_line = replay(agree, conf, SkipMask(), 4, k=1, cost=line, exit_cfg=STATIC)
    r_shaped = replay(agree, conf, SkipMask(), 4, k=1, cost=shaped, exit_cfg=STATIC)
    assert r_line.speedup == pytest.approx(1.0) and r_shaped.speedup == pytest.approx(1 / 1.2)


def test_read_cost_model_takes_a_bench_runs_step_table(tmp_path):
    import json

    from vllm_selfspec.offline.objectives import read_cost_model

    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"results": [
        {"method": "baseline"},
        {"method": "selfspec", "drafter": {"cost_gate": {"step_table_s": {"1": 0.05, "2+": 0.06}}}},
        {"method": "ngrammys", "drafter": {"cost_gate": {"step_table_s": TABLE}}}]}))
    model = tmp_path / "cost.json"
    model.write_text(json.dumps({"cost_model": CostModel(0.1, 0.01, 0.02, 0.03).to_json()}))
    cost, table = read_cost_model(str(model), str(bench))
    assert cost == CostModel(0.1, 0.01, 0.02, 0.03) and table == TABLE  # the most sizes
    assert read_cost_model(None, f"{bench}:selfspec") == (None, {"1": 0.05, "2+": 0.06})
    assert read_cost_model(None, None) == (None, None)
    with pytest.raises(SystemExit, match="no step table for 'swift'.*selfspec, ngrammys"):
        read_cost_model(None, f"{bench}:swift")
    bench.write_text(json.dumps({"results": [{"method": "baseline"}]}))
    with pytest.raises(SystemExit, match="no method there has a step table"):
        read_cost_model(None, str(bench))
