"""Search space, layouts, and the resumable BO loop (with a cheap synthetic objective)."""

import pytest

from vllm_selfspec.offline import search as ms
from vllm_selfspec.proposers.artifacts import read_jsonl
from vllm_selfspec.proposers.skip_mask import SkipMask

L = 6


def test_vector_mask_round_trip_and_budget():
    z = [0.9, 0.1, 0.6, 0.0, 0.0, 0.0] + [0.0, 0.55, 0.0, 0.0, 0.0, 0.95]
    m = ms.vector_to_mask(z, L)
    assert m.attention == {0, 2} and m.mlp == {1, 5}  # MLP ids offset by L, any L
    top2 = ms.vector_to_mask(z, L, budget=2)
    assert top2.attention == {0} and top2.mlp == {5}
    assert ms.params_to_vector(ms.vector_to_params(z, L), L) == z


def test_layout_masks_same_counts():
    lay = ms.layout_masks(10, 4, 2, seed=1)
    assert set(lay) == {"first", "middle", "last", "random"}
    for m in lay.values():
        assert len(m.attention) == 4 and len(m.mlp) == 2
    assert lay["first"].attention == {0, 1, 2, 3} and lay["last"].mlp == {8, 9}


def synthetic(masks):
    """Best: skip attention of even layers only (a known optimum)."""
    out = []
    for m in masks:
        good = len([i for i in m.attention if i % 2 == 0]) - 2 * len([i for i in m.attention if i % 2])
        out.append({"value": 1.0 + 0.1 * good - 0.05 * len(m.mlp)})
    return out


def test_search_writes_log_and_resumes(tmp_path):
    log = tmp_path / "m.trials.jsonl"
    cfg = ms.SearchConfig(num_layers=L, iterations=12, seed=0)
    probes = [SkipMask(frozenset({0, 2}), frozenset())]
    trials = ms.search(cfg, synthetic, log, probes)
    assert len(trials) == 12 and len(log.read_text().splitlines()) == 12
    assert trials[0]["attention"] == [0, 2]  # probed first
    # resume: more iterations continue the same log, probes are not repeated
    cfg2 = ms.SearchConfig(num_layers=L, iterations=20, seed=0)
    calls = []

    def counting(masks):
        calls.append(len(masks))
        return synthetic(masks)

    trials2 = ms.search(cfg2, counting, log, probes)
    assert len(trials2) == 20 and sum(calls) <= 8
    assert [t["iteration"] for t in trials2] == list(range(20))
    best = ms.best_trial(trials2)
    assert best["value"] >= trials2[0]["value"]


def test_resume_tolerates_a_torn_last_line(tmp_path):
    log = tmp_path / "m.trials.jsonl"
    ms.search(ms.SearchConfig(num_layers=L, iterations=3), synthetic, log)
    with open(log, "a") as f:
        f.write('{"iteration": 3, "z": [0.1')
    assert len(read_jsonl(log)) == 3


def test_batches_use_constant_liar(tmp_path):
    cfg = ms.SearchConfig(num_layers=L, iterations=8, batch=4, seed=0)
    sizes = []

    def batched(masks):
        sizes.append(len(masks))
        return synthetic(masks)

    trials = ms.search(cfg, batched, tmp_path / "b.jsonl")
    assert len(trials) == 8 and max(sizes) > 1


@pytest.mark.parametrize("budget", [None, 5])
def test_default_probes(budget):
    probes = ms.default_probes(30, budget)
    assert probes and all(0 not in p.attention | p.mlp for p in probes)
    assert (SkipMask() in probes) == (budget is None)
    if budget:
        assert all(p.num_skipped == 5 for p in probes)
