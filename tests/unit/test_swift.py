"""SWIFT: layer-set search (§4.1.2), the proposer's phases and serving semantics, keys,
and the saved layer set (cache_hit), against fake targets."""

import json

import numpy as np
import pytest
import torch

from vllm_selfspec.masks import save_swift_mask
from vllm_selfspec.methods import SelfSpecConfigError, split_config
from vllm_selfspec.model_info import ModelInfo
from vllm_selfspec.proposers.artifacts import ArtifactMismatchError, ModelStamp
from vllm_selfspec.proposers.base import DraftBatch, DraftRequest, Verification
from vllm_selfspec.proposers.layer_set_search import LayerSetSearch, LayerSetSearchConfig
from vllm_selfspec.proposers.skip_mask import SkipMask, SkipMaskError, uniform_mask
from vllm_selfspec.proposers.swift import ACCELERATE, OPTIMIZE, SwiftProposer
from vllm_selfspec.resolvers import resolve_swift_artifacts, resolve_swift_mask

V = 16
L = 8


# ---- layer-set search ----------------------------------------------------------------------
def test_search_space_and_random_candidates():
    s = LayerSetSearch(LayerSetSearchConfig(num_layers=L, skip_ratio=0.5))
    assert len(s.slots) == 2 * (L - 2) and s.skip_count == 6
    assert s.best == uniform_mask(L, 0.5)
    for m in s.suggest(3):
        assert len(m.attention) + len(m.mlp) == 6
        assert not ({0, L - 1} & (m.attention | m.mlp))  # first and last layers are kept
        assert s.vector(m).count(1.0) == 6


def test_bayesian_optimization_every_beta_steps():
    s = LayerSetSearch(LayerSetSearchConfig(num_layers=L, bayes_interval=3, seed=1))
    sources = []
    for _ in range(9):
        (c,) = s.suggest(1)
        sources.append(c.source)
        s.register(0.5, [c], [0.4])
    assert sources[2] == sources[5] == sources[8] == "swift bayes"
    assert sources.count("swift bayes") == 3
    # random search only with bayes_interval 0
    s0 = LayerSetSearch(LayerSetSearchConfig(num_layers=L, bayes_interval=0))
    assert all(s0.suggest(1)[0].source == "swift random" for _ in range(5))


def test_register_keeps_the_best_and_dedupes_history():
    s = LayerSetSearch(LayerSetSearchConfig(num_layers=L, max_tolerance_iter=100))
    a, b = s.random_candidate(), s.random_candidate()
    assert s.register(0.5, [a], [0.7]) and s.best == a and s.best_score == 0.7
    assert not s.register(0.6, [b], [0.2])  # same window: a 0.6 vs b 0.2
    assert s.best == a and s.best_score == pytest.approx(0.65) and s.best_windows == 2
    s.register(0.8, [b], [0.1])
    assert s.history[tuple(s.vector(a))] == [pytest.approx(2.1), 3]  # one entry per layer set


def test_stop_rules():
    s = LayerSetSearch(LayerSetSearchConfig(num_layers=L, max_tolerance_iter=3))
    for _ in range(3):
        s.register(0.5, [s.random_candidate()], [0.1])
    assert s.done and "no improvement in 3" in s.stop_reason
    s = LayerSetSearch(LayerSetSearchConfig(num_layers=L, max_opt_iter=2, max_tolerance_iter=10))
    s.register(0.5, [s.random_candidate()], [0.6])
    s.register(0.5, [s.random_candidate()], [0.7])
    assert s.done and "max_opt_iter" in s.stop_reason
    # max_score needs the best set scored on min_windows windows (one lucky window is not enough)
    s = LayerSetSearch(LayerSetSearchConfig(num_layers=L, max_score=0.9, min_windows=3))
    s.register(1.0, [s.random_candidate()], [0.0])
    s.register(1.0, [s.random_candidate()], [0.0])
    assert not s.done
    s.register(1.0, [s.random_candidate()], [0.0])
    assert s.done and "max_score" in s.stop_reason


# ---- the proposer ------------------------------------------------------------------------
class FakeTarget:
    """Drafts (token + 1) % V with high confidence; matchness of a layer set is the
    share of skipped sub-layers outside ``bad`` (known to the test)."""

    num_layers = L
    vocab_size = V
    device = torch.device("cpu")

    def __init__(self, bad=frozenset()):
        self.bad = set(bad)
        self.score_calls = []
        self.settled = []

    def draft_step(self, rows, tokens, positions, mask, draft_index, head=None, settled=False):
        self.settled.append(settled)
        logits = torch.full((len(rows), V), -10.0)
        for i, t in enumerate(tokens.tolist()):
            logits[i, (t + 1) % V] = 10.0
        return logits

    def score_masks(self, windows, masks):
        self.score_calls.append((windows, masks))
        n = sum(len(w.inputs) for w in windows)
        out = torch.zeros(len(masks), n, dtype=torch.bool)
        for j, m in enumerate(masks):
            good = sum(1 for i in m.attention if ("attention", i) not in self.bad)
            good += sum(1 for i in m.mlp if ("mlp", i) not in self.bad)
            out[j, : round(n * good / max(1, len(m.attention) + len(m.mlp)))] = True
        return out


def batch(outputs=(40,), position=100):
    reqs = [DraftRequest(row=i, req_id=f"r{i}", position=position, token=1, max_len=4,
                         num_output_tokens=n) for i, n in enumerate(outputs)]
    toks = np.arange(len(reqs) * (position + 8)).reshape(len(reqs), position + 8) % V
    return DraftBatch([r.req_id for r in reqs], reqs, token_ids=toks,
                      num_tokens=np.full(len(reqs), position + 1))


def make(target=None, **opts):
    # optimization_budget 1.0: every step may optimize (the budget has its own test)
    p = SwiftProposer(4, {"context_window": 8, "bayes_interval": 0, "max_tolerance_iter": 5,
                          "max_opt_iter": 50, "optimization_budget": 1.0, **opts})
    t = target or FakeTarget()
    p.bind(t)
    return p, t


def test_waits_for_a_context_window_then_scores_best_and_candidates_in_one_forward():
    p, t = make(candidates_per_step=3)
    assert p.phase == OPTIMIZE and p.exit.threshold == 0.8 and not p.exit.cfg.adaptive
    p.propose(batch(outputs=(7,)))  # not enough generated tokens yet (§4.1.1)
    assert t.score_calls == []
    out = p.propose(batch(outputs=(7, 9)))
    (windows, masks), = t.score_calls
    assert len(masks) == 4 and len(windows) == 1 and windows[0].row == 1
    w = windows[0]
    # 9 generated tokens at positions 92..100: the complete chunk of 8 is 92..99,
    # predicted from the tokens at 91..98 (91 is the last prompt token)
    assert w.start == 91 and len(w.inputs) == len(w.targets) == 8
    assert w.targets[:-1] == w.inputs[1:]  # teacher forcing: the next generated token
    assert out.drafts[1] == [2, 3, 4, 5]  # drafting goes on while optimizing


def test_the_best_sets_score_on_a_window_is_measured_once():
    """The window stays until the request has generated another context_window
    tokens; meanwhile only the candidates are scored, against the cached score."""
    p, t = make(candidates_per_step=2)
    p.propose(batch(outputs=(9,), position=100))
    p.propose(batch(outputs=(10,), position=101))  # same chunk: 92..99
    p.propose(batch(outputs=(17,), position=108))  # next chunk: 100..107
    starts = [c[0][0].start for c in t.score_calls]
    assert starts == [91, 91, 99]
    assert [len(c[1]) for c in t.score_calls] == [3, 2, 3]
    assert p.stats["opt_fresh_windows"] == 2 and p.search.best_windows == 2
    p.finish({"r0"})
    assert p.best_on_window == {}


def test_round_robin_over_requests():
    p, t = make()
    for _ in range(4):
        p.propose(batch(outputs=(20, 20)))
    assert [c[0][0].row for c in t.score_calls] == [0, 1, 0, 1]


def test_phase_ends_with_the_best_set_and_saves_it():
    bad = {("attention", i) for i in range(1, L - 1)}  # skipping attention hurts
    p, t = make(FakeTarget(bad), skip_ratio=0.5, max_tolerance_iter=30, max_score=0.99)
    saved = []
    p.artifact_saver = lambda m, info: saved.append((m, info))
    for _ in range(200):
        p.propose(batch())
        if p.phase == ACCELERATE:
            break
    assert p.phase == ACCELERATE and saved and saved[0][0] == p.mask
    assert saved[0][1]["matchness"] >= 0.5 and saved[0][1]["reason"]
    assert len(p.mask.mlp) > len(p.mask.attention)  # learned to skip MLPs rather than attention
    calls = len(t.score_calls)
    p.propose(batch())
    assert len(t.score_calls) == calls  # no optimization step in the acceleration phase
    assert [e["event"] for e in p.events] == ["start", "optimize", "accelerate"]


def test_only_the_acceleration_phase_mask_may_be_compiled():
    """The compiled draft pass: the optimization phase's best-so-far set changes with every
    improvement, so only the acceleration phase's set is drafted as settled."""
    p, t = make(max_tolerance_iter=3)
    p.propose(batch())
    assert p.phase == OPTIMIZE and t.settled and not any(t.settled)
    q, u = make(cache_hit=True)
    q.propose(batch())
    assert q.phase == ACCELERATE and u.settled and all(u.settled)


def test_reenters_optimization_when_acceptance_drops():
    p, _ = make(cache_hit=True, reoptimize_window=4, reoptimize_drop=0.3)
    assert p.phase == ACCELERATE and p.stats["opt_phases"] == 0
    p.observe([Verification("a", 4, 4)] * 4)
    assert p.reference == 1.0 and p.phase == ACCELERATE
    p.observe([Verification("a", 4, 3)] * 4)  # 0.75 >= 0.7 x 1.0: keep going
    assert p.phase == ACCELERATE
    p.observe([Verification("a", 4, 1)] * 4)  # 0.25: a new task
    assert p.phase == OPTIMIZE and p.stats["opt_phases"] == 1
    assert p.events[-1]["event"] == "optimize" and "acceptance 0.25" in p.events[-1]["reason"]
    # never with reoptimize_drop 0
    q, _ = make(cache_hit=True, reoptimize_window=4, reoptimize_drop=0.0)
    q.observe([Verification("a", 4, 4)] * 4 + [Verification("a", 4, 0)] * 8)
    assert q.phase == ACCELERATE


def test_optimization_stays_within_its_share_of_engine_time(monkeypatch):
    """Each optimization step costs 10 ms here; engine steps take 50 ms. With a 2% budget
    the optimizer runs about one step in 10, and its time stays under 2%."""
    import vllm_selfspec.proposers.swift as sw

    clock = [0.0]
    monkeypatch.setattr(sw.time, "perf_counter", lambda: clock[0])

    class SlowTarget(FakeTarget):
        def score_masks(self, windows, masks):
            clock[0] += 0.01
            return super().score_masks(windows, masks)

    p, _ = make(target=SlowTarget(), optimization_budget=0.02, max_tolerance_iter=10_000,
                max_opt_iter=10_000)
    for _ in range(1000):
        p.track(batch(outputs=(40,)))
        clock[0] += 0.05
    steps = p.stats["opt_steps"]
    assert 80 <= steps <= 110, steps  # 2% of 50 s served is 1 s: ~100 steps of 10 ms
    # the fake clock above, not wall time: this checks the budget rule, not speed
    assert p.stats["opt_seconds"] <= 0.02 * p.stats["served_seconds"]  # never a step over


def test_report_is_json():
    p, _ = make()
    p.propose(batch())
    r = json.loads(json.dumps(p.report()))
    assert r["phase"] == OPTIMIZE and len(r["trace"]) == 1 and set(r["mask"]) >= {"attention", "mlp"}


# ---- keys and the saved layer set -----------------------------------------------------------
def test_keys_have_the_paper_defaults():
    """The paper's defaults but r: its 0.45 is for 13B+ models drafting in full precision;
    the draft here reads low-bit copies of every kept layer (draft_weights), where a skipped
    sub-layer saves little and costs acceptance (docs/results.md)."""
    m, core, o = split_config({"method": "swift"})
    assert m.name == "swift" and core["num_speculative_tokens"] == 12
    assert (o["context_window"], o["bayes_interval"], o["max_opt_iter"],
            o["max_tolerance_iter"], o["max_score"], o["stop_threshold"]) == \
        (32, 25, 1000, 300, 0.95, 0.8)
    assert (o["skip_ratio"], o["draft_weights"]) == (0.05, "w8a8")


@pytest.mark.parametrize("cfg,frag", [
    ({"skip_ratio": 1.0}, "skip_ratio"),
    ({"context_window": 1}, "context_window"),
    ({"max_score": 0.0}, "max_score"),
    ({"bayes_interval": -1}, "bayes_interval"),
    ({"stop_threshold": "high"}, "stop_threshold"),
    ({"draft_exit_threshold": 0.5}, "unknown key 'draft_exit_threshold'"),
    ({"cache_hit": True, "skip_mask": {"attention": [1]}}, "not both"),
])
def test_bad_keys_are_refused(cfg, frag):
    with pytest.raises(SelfSpecConfigError, match=frag):
        split_config({"method": "swift", **cfg})


STAMP = ModelStamp("LlamaForCausalLM", L, 64, V, "abcd1234abcd1234", "tiny")


def test_saved_layer_set_round_trip(tmp_path):
    info = ModelInfo(STAMP, "tiny")
    path = tmp_path / "swift.json"
    opts = {"mask_cache": str(path), "cache_hit": True, "skip_ratio": 0.45, "skip_mask": None}
    with pytest.raises(SkipMaskError, match="run once without cache_hit"):
        resolve_swift_mask(dict(opts), info)
    save_swift_mask(str(path), SkipMask(frozenset({2}), frozenset({3, 4})), STAMP.to_json(),
                    {"matchness": 0.9})
    m = resolve_swift_mask(dict(opts), info)
    assert m.attention == {2} and m.mlp == {3, 4}
    other = ModelInfo(ModelStamp("LlamaForCausalLM", L, 64, V, "0000000000000000", "tuned"), "t")
    with pytest.raises(ArtifactMismatchError, match="weights fingerprint"):
        resolve_swift_mask(dict(opts), other)
    # without cache_hit: the uniform start, and mask_cache is where the worker saves
    o = dict(opts, cache_hit=False)
    assert resolve_swift_mask(o, info) == uniform_mask(L, 0.45)
    assert resolve_swift_artifacts(o, info, {})["mask_cache"] == str(path)


# ---- the scoring forward's per-token masks ---------------------------------------------------
def test_run_per_token_matches_one_mask_at_a_time():
    """Each token gets its own mask; MLPs run only on the tokens that keep them."""
    from torch import nn

    from vllm_selfspec.adapters import PreNormDecoderAdapter

    torch.manual_seed(0)
    H, n_layers = 8, 4

    class Attn(nn.Module):  # token-wise stand-in: the per-token masking is what is tested
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(H, H)
            self.attn = type("A", (), {"layer_name": "attn"})()

        def forward(self, positions, hidden_states):
            return self.proj(hidden_states) + positions.unsqueeze(1) * 0.01

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm, self.post_attention_layernorm = nn.LayerNorm(H), nn.LayerNorm(H)
            self.self_attn, self.mlp = Attn(), nn.Sequential(nn.Linear(H, 2 * H), nn.GELU(),
                                                            nn.Linear(2 * H, H))

    class Inner(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(Layer() for _ in range(n_layers))
            self.norm = nn.LayerNorm(H)

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Inner()

    ad = PreNormDecoderAdapter(LM())
    masks = [([1, 2], [2]), ([], [1, 2]), ([1], [])]
    T = 5
    hidden = torch.randn(len(masks) * T, H)
    pos = torch.arange(T).repeat(len(masks))
    keep_a = torch.tensor([[0.0 if i in a else 1.0 for i in range(n_layers)] for a, _ in masks])
    keep_m = torch.tensor([[0.0 if i in m else 1.0 for i in range(n_layers)] for _, m in masks])
    with torch.no_grad():
        got = ad.run_per_token(hidden, pos, keep_a.repeat_interleave(T, 0), keep_m.repeat_interleave(T, 0))
        for j in range(len(masks)):
            sl = slice(j * T, (j + 1) * T)
            one = ad.run_per_token(hidden[sl], pos[sl], keep_a[j].expand(T, -1), keep_m[j].expand(T, -1))
            assert torch.allclose(got[sl], one, atol=1e-6)
