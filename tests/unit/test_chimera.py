"""Chimera's draft model and its drafting over a per-request context store (no engine)."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from vllm_selfspec.proposers.artifacts import ArtifactError, ArtifactMismatchError, ModelStamp
from vllm_selfspec.proposers.base import DraftBatch, DraftRequest, TargetStates
from vllm_selfspec.proposers.chimera import (
    ChimeraConfig,
    ChimeraDraftModel,
    check_checkpoint,
    load_checkpoint,
    save_checkpoint,
    trigram_ids,
)
from vllm_selfspec.proposers.chimera_drafting import ChimeraProposer
from vllm_selfspec.proposers.draft_vocab import DraftVocab
from vllm_selfspec.proposers.low_bit import KernelTable, quantize_int8, shape_key
from vllm_selfspec.proposers.resolved import Artifacts

V, H = 97, 32
STAMP = ModelStamp("LlamaForCausalLM", 4, H, V, "abc")


def tiny(heads: int = 3, draft_vocab: int = 60, seed: int = 0) -> ChimeraDraftModel:
    torch.manual_seed(seed)
    cfg = ChimeraConfig(hidden_size=H, intermediate_size=64, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5, rope_theta=1e4,
                        vocab_size=V, num_heads=heads, draft_vocab_size=draft_vocab)
    counts = np.random.default_rng(seed).integers(0, 50, V)
    m = ChimeraDraftModel(cfg, DraftVocab.from_counts(counts, draft_vocab))
    with torch.no_grad():  # break the identity-like init so heads differ
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return m


class FakeTarget:
    def __init__(self) -> None:
        torch.manual_seed(1)
        self.device = torch.device("cpu")
        self.dtype = torch.float32
        self.vocab_size = V
        self.embed_weight = torch.randn(V + 3, H)  # padded rows, like vLLM's
        self.lm_head_weight = torch.randn(V + 3, H)


def proposer(model: ChimeraDraftModel, k: int = 3, **opts) -> ChimeraProposer:
    """The drafter over ``model``'s float weights unless ``draft_weights`` says otherwise
    (the tests that compare drafting with training need the same weights)."""
    opts.setdefault("draft_weights", "full")
    p = ChimeraProposer(k, opts, Artifacts(checkpoint=model))
    p.bind(FakeTarget())
    return p


def batch_for(tokens: list[int], hidden: torch.Tensor, start: int, n_states: int,
              max_len: int = 8, temperature: float = 0.0) -> DraftBatch:
    """One request whose newest token is tokens[-1]; states for [start, start+n_states)."""
    ids = np.zeros((1, 64), dtype=np.int32)
    ids[0, : len(tokens)] = tokens
    req = DraftRequest(row=0, req_id="r", position=len(tokens) - 1, token=tokens[-1],
                       max_len=max_len, temperature=temperature)
    st = [TargetStates(0, "r", start, hidden[start: start + n_states])] if n_states else []
    return DraftBatch(["r"], [req], ids, np.array([len(tokens)]), st)


def test_a_wider_draft_vocabulary_keeps_the_checkpoints_rows_first():
    m = tiny(draft_vocab=40)
    own = m.draft_ids.clone()
    counts = np.zeros(V, dtype=np.int64)
    counts[own[:5].numpy()] = 1000  # already in: not taken twice
    counts[[3, 4, 5]] = [10, 30, 20]
    counts[own[5:].numpy()] = 0
    wide = m.vocab.extended(counts, 43)
    assert wide.size == 43 and torch.equal(wide.ids[:40], own)
    outside = [i for i in (4, 5, 3) if i not in set(own.tolist())]
    assert wide.ids[40:40 + len(outside)].tolist() == outside  # most frequent first
    assert len(set(wide.ids.tolist())) == 43
    m.set_draft_vocab(wide)
    t = FakeTarget()
    m.bind_target(t.embed_weight, t.lm_head_weight)
    assert m.cfg.draft_vocab_size == 43 and m.lm_rows.shape == (43, H)
    assert torch.equal(m.lm_rows[40], t.lm_head_weight[wide.ids[40]])


def test_trigram_ids_collapse_at_the_start():
    assert trigram_ids(torch.tensor([5, 6, 7, 8])).tolist() == \
        [[5, 5, 5], [5, 5, 6], [5, 6, 7], [6, 7, 8]]


def test_drafting_matches_the_teacher_forced_masks():
    """The store-based drafting pass computes what training computes: head i at
    position n+i sees h_{<=n-1} and g_{<=n+i} (drafts included)."""
    m = tiny()
    p = proposer(m)
    toks = torch.randint(0, V, (12,)).tolist()
    hidden = torch.randn(20, H)
    # the target has run over tokens 0..10; token 11 is the newest (just sampled)
    out = p.propose(batch_for(toks, hidden, 0, 11))
    drafts = out.drafts[0]
    assert len(drafts) == 3
    full = torch.tensor(toks + drafts).unsqueeze(0)
    n = len(toks) - 1
    with torch.no_grad():
        heads = m.teacher_forced(full, torch.cat([hidden[:11], torch.zeros(4, H)]).unsqueeze(0))
    for i, (where, _z, logits) in enumerate(heads):
        rows = where[0].nonzero().squeeze(1).tolist()
        at = rows.index(n + i)
        assert int(m.vocab.to_target(logits[at].argmax())) == drafts[i], i


def test_store_follows_verification_preemption_and_prefix_cache_hits():
    m = tiny()
    p = proposer(m)
    toks = torch.randint(0, V, (12,)).tolist()
    hidden = torch.randn(20, H)
    p.propose(batch_for(toks[:8], hidden, 0, 7))  # prefill of 7 tokens, token 7 sampled
    s = p.stores["r"]
    assert (s.next_mature, s.next_green, s.count) == (7, 8, 15)
    p.propose(batch_for(toks[:10], hidden, 7, 2))  # one draft accepted + bonus
    assert (s.next_mature, s.next_green, s.count) == (9, 10, 19)
    p.propose(batch_for(toks[:10], hidden, 0, 9))  # recomputed after preemption: fresh store
    s2 = p.stores["r"]
    assert s2 is not s and (s2.next_mature, s2.next_green, s2.count) == (9, 10, 19)
    assert p.stats["store_resets"] == 1
    p.finish({"r"})
    assert "r" not in p.stores
    # prefix-cache hit: the first 6 states are never computed; green states cover them
    out = p.propose(batch_for(toks[:10], hidden, 6, 3))
    s3 = p.stores["r"]
    assert (s3.next_mature, s3.next_green, s3.count) == (9, 10, 13)
    assert p.stats["missing_states"] == 6 and out.drafts[0]


def test_no_draft_without_the_newest_state_and_tracking_without_drafts():
    m = tiny()
    p = proposer(m)
    toks = torch.randint(0, V, (12,)).tolist()
    hidden = torch.randn(20, H)
    b = batch_for(toks[:8], hidden, 0, 5)  # states end before the newest token's predecessor
    assert p.propose(b).drafts == [[]]
    p2 = proposer(m)
    p2.track(batch_for(toks[:8], hidden, 0, 7))  # a step the cost gate kept plain
    assert p2.pending_rows == 7 and "r" not in p2.stores  # kept, taken in when a draft is due
    assert p2.propose(batch_for(toks[:8], hidden, 7, 0)).drafts[0]
    assert p2.stores["r"].next_mature == 7 and p2.pending_rows == 0


def test_states_kept_over_plain_steps_draft_as_if_taken_in_every_step(monkeypatch):
    """Lazy intake: states kept over steps the cost gate kept plain (and a preemption
    among them) give the drafts of a proposer that took them in every step."""
    import vllm_selfspec.proposers.chimera_drafting as cd

    m = tiny()
    toks = torch.randint(0, V, (16,)).tolist()
    hidden = torch.randn(20, H)
    steps = [(8, 0, 7), (9, 7, 1), (11, 8, 2), (11, 0, 10), (12, 10, 1), (14, 11, 2)]
    eager, lazy = proposer(m), proposer(m)
    for n, start, count in steps:
        b = batch_for(toks[:n], hidden, start, count)
        eager.propose(b)  # drafts every step: takes every state in at once
        lazy.track(b)
    assert lazy.pending_rows == 23
    b = batch_for(toks[:14], hidden, 13, 0)
    assert lazy.propose(b).drafts == eager.propose(b).drafts != [[]]
    assert lazy.stats["store_resets"] == eager.stats["store_resets"] == 1
    s, e = lazy.stores["r"], eager.stores["r"]
    assert (s.next_mature, s.next_green, s.count) == (e.next_mature, e.next_green, e.count)
    # a finished request's kept states go with it; many kept rows are taken in anyway
    lazy.track(batch_for(toks[:15], hidden, 13, 1))
    lazy.finish({"r"})
    assert lazy.pending == [] and lazy.pending_rows == 0
    monkeypatch.setattr(cd, "PENDING_ROWS", 8)
    lazy.track(batch_for(toks[:10], hidden, 0, 9))
    assert lazy.pending_rows == 0 and lazy.stores["r"].next_mature == 9


def test_stop_threshold_and_request_limits():
    m = tiny()
    toks = torch.randint(0, V, (12,)).tolist()
    hidden = torch.randn(20, H)
    assert len(proposer(m, k=3).propose(batch_for(toks, hidden, 0, 11, max_len=2)).drafts[0]) == 2
    assert len(proposer(m, k=2).propose(batch_for(toks, hidden, 0, 11)).drafts[0]) == 2
    assert len(proposer(m, k=3, stop_threshold=1.0).propose(
        batch_for(toks, hidden, 0, 11)).drafts[0]) == 1


def test_sampled_drafts_hand_q_over_the_full_vocabulary():
    m = tiny()
    p = proposer(m, seed=3)
    toks = torch.randint(0, V, (12,)).tolist()
    out = p.propose(batch_for(toks, torch.randn(20, H), 0, 11, temperature=0.8))
    q = out.probs
    assert q is not None and q.shape == (1, 3, V)
    outside = torch.ones(V, dtype=torch.bool)
    outside[m.draft_ids] = False
    for i, t in enumerate(out.drafts[0]):
        assert abs(float(q[0, i].sum()) - 1.0) < 1e-5
        assert float(q[0, i, outside].sum()) == 0.0
        assert float(q[0, i, t]) > 0.0  # the draft was drawn from q


def test_checkpoint_round_trip_and_refusals(tmp_path):
    m = tiny()
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, m, STAMP, {"answer_tokens": 123})
    meta = check_checkpoint(path, STAMP)
    assert meta["training"]["answer_tokens"] == 123 and meta["config"]["num_heads"] == 3
    back = load_checkpoint(path, STAMP)
    assert torch.equal(back.draft_ids, m.draft_ids)
    w0 = m.state_dict()["block.q_proj.weight"].to(torch.bfloat16).float()
    assert torch.equal(back.state_dict()["block.q_proj.weight"], w0)
    other = ModelStamp("LlamaForCausalLM", 4, H, V, "zzz", name="other")
    with pytest.raises(ArtifactMismatchError, match="made for another model"):
        check_checkpoint(path, other)
    with pytest.raises(ArtifactError, match="does not exist"):
        check_checkpoint(tmp_path / "missing.safetensors", STAMP)


def test_training_step_lowers_the_loss():
    m = tiny(heads=2)
    m.bind_target(torch.randn(V, H), torch.randn(V, H))
    toks = torch.randint(0, V, (2, 16))
    hidden = torch.randn(2, 16, H)
    labels = torch.roll(toks, -1, dims=1)
    mask = torch.ones(2, 16, dtype=torch.bool)
    opt = torch.optim.AdamW(m.trainable_parameters(), lr=3e-3)
    first = None
    for _ in range(30):
        out = m.train_forward(toks, hidden, labels, mask)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        first = first if first is not None else float(out.loss.detach())
    assert float(out.loss) < first
    assert len(out.correct) == 2 and out.counted[0] > 0


def test_distilling_the_targets_distribution():
    """kd_weight w mixes each head's CE with KL(target's p over the draft vocabulary || q);
    training on it moves q toward p, and w = 0 leaves the labels-only loss unchanged."""
    m = tiny(heads=2)
    lm = torch.randn(V, H)
    m.bind_target(torch.randn(V, H), lm)
    toks = torch.randint(0, V, (2, 16))
    hidden = torch.randn(2, 16, H)
    # the target's own top-1 over the draft vocabulary: the labels the corpus holds
    labels = m.draft_ids[(hidden @ lm[m.draft_ids].T).argmax(-1)]
    mask = torch.ones(2, 16, dtype=torch.bool)
    plain = m.train_forward(toks, hidden, labels, mask)
    assert not plain.kl
    assert float(plain.loss) == pytest.approx(float(torch.stack(plain.ce).mean() + plain.mse))
    mixed = m.train_forward(toks, hidden, labels, mask, kd_weight=0.5)
    assert len(mixed.kl) == 2 and all(float(k) > 0 for k in mixed.kl)
    want = torch.stack([0.5 * c + 0.5 * k for c, k in zip(mixed.ce, mixed.kl)]).mean() + mixed.mse
    assert float(mixed.loss) == pytest.approx(float(want))
    opt = torch.optim.AdamW(m.trainable_parameters(), lr=3e-3)
    first = None
    for _ in range(30):
        out = m.train_forward(toks, hidden, labels, mask, kd_weight=1.0)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        first = first if first is not None else float(torch.stack(out.kl).mean().detach())
    assert float(torch.stack(out.kl).mean()) < 0.5 * first
    paper = ChimeraDraftModel(replace(m.cfg, head_kind="paper"))
    with pytest.raises(ValueError, match="head_kind='shared'"):
        paper.train_forward(toks, hidden, labels, mask, kd_weight=0.5)


def test_ngrammys_chimera_drafts_context_matches_else_chimera():
    from vllm_selfspec.proposers.ngrammys_chimera import NGrammysChimeraProposer

    m = tiny()
    p = NGrammysChimeraProposer(6, {"query_length": 2, "min_query_length": 2,
                                    "draft_weights": "full"},
                                Artifacts(checkpoint=m))
    p.bind(FakeTarget())
    hidden = torch.randn(40, H)
    rep = [5, 6, 7, 8, 9, 10, 11, 5, 6]  # "5 6" occurred before: its continuation is 7 8 9 ...
    out = p.propose(batch_for(rep, hidden, 0, len(rep) - 1))
    assert out.drafts[0] == [7, 8, 9, 10, 11, 5][: min(6, 6)]
    assert p.stats["from_context"] == 1 and p.stats["from_chimera"] == 0
    p.finish({"r"})
    fresh = [1, 2, 3, 4, 12, 13, 14, 15, 16]  # no repeated bigram: Chimera drafts (<= 3 heads)
    out = p.propose(batch_for(fresh, hidden, 0, len(fresh) - 1))
    assert 1 <= len(out.drafts[0]) <= 3 and p.stats["from_chimera"] == 1
    assert out.timed is not None and out.timed["chimera"][0] == len(out.drafts[0])  # priced apart
    # sampled, context drafts only: no q at all (vLLM takes the drafts as one-hot)
    p.finish({"r"})
    out = p.propose(batch_for(rep, hidden, 0, len(rep) - 1, temperature=0.9))
    assert out.drafts[0] and out.probs is None
    # sampled, one context row and one Chimera row: Chimera's q for its row, and the
    # context row's q one-hot at its drafts
    p.finish({"r"})
    ctx_b = batch_for(rep, hidden, 0, len(rep) - 1, temperature=0.9)
    chi_b = batch_for(fresh, hidden, 0, len(fresh) - 1, temperature=0.9)
    ids = np.concatenate([ctx_b.token_ids[:1], chi_b.token_ids[:1]])
    r1, r2 = ctx_b.requests[0], chi_b.requests[0]
    r2.row, r2.req_id = 1, "s"
    st = [ctx_b.states[0], TargetStates(1, "s", 0, chi_b.states[0].hidden)]
    mixed = DraftBatch(["r", "s"], [r1, r2], ids, np.array([len(rep), len(fresh)]), st)
    out = p.propose(mixed)
    assert out.drafts[0] and out.drafts[1] and out.probs is not None
    assert all(float(out.probs[0, i, t]) == 1.0 for i, t in enumerate(out.drafts[0]))
    assert all(float(out.probs[0, i].sum()) == 1.0 for i in range(len(out.drafts[0])))
    assert 0.0 < float(out.probs[1, 0].max()) < 1.0 + 1e-6
    # the cost gate prices the lookups per row looked up, and the states Chimera's drafts
    # read (``prepare``) with Chimera's own tokens, not with the context rows' lookups
    p.finish({"r", "s"})
    taken_in = p.extend_green

    def slow_intake(*args, **kwargs):
        time.sleep(0.05)
        return taken_in(*args, **kwargs)

    p.extend_green = slow_intake
    out = p.propose(batch_for(fresh, hidden, 0, len(fresh) - 1))
    assert out.rows == 1 and out.drafts[0] and out.timed["chimera"][1] >= 0.05


def test_low_bit_copies_take_over_the_draft_models_multiplies():
    """``use_low_bit``: every linear layer and the LM-head rows run through the copies
    given (close to the float weights, not equal to them); training's weights stay."""
    full, low = tiny(), tiny()
    target = FakeTarget()
    for m in (full, low):
        m.bind_target(target.embed_weight, target.lm_head_weight)
    weights = low.linear_weights()
    assert "lm_rows" in weights and "block.down_proj" in weights and "heads.2" in weights
    low.use_low_bit({name: quantize_int8(w) for name, w in weights.items()})
    torch.manual_seed(3)
    h, z = torch.randn(5, H), torch.randn(5, H)
    tri = torch.randint(0, V, (5, 3))
    for i in range(3):
        a, b = full.head_logits(i, h, z), low.head_logits(i, h, z)
        assert not torch.equal(a, b)
        assert float((a - b).norm() / a.norm()) < 0.05
    a, b = full.green(tri), low.green(tri)
    assert not torch.equal(a, b) and float((a - b).norm() / a.norm()) < 0.05
    for name, w in low.linear_weights().items():  # the float weights are untouched
        assert torch.equal(w, full.linear_weights()[name])


def test_draft_weights_key_picks_kernels_from_the_kernel_table(tmp_path, monkeypatch):
    """Key ``draft_weights``: each of the draft model's shapes takes the kernel the cached
    kernel table chose (here int8 for all, seeded as measured faster); "full" takes none."""
    monkeypatch.setenv("VLLM_SELFSPEC_CACHE", str(tmp_path))
    m = tiny()
    table = KernelTable.cached(torch.device("cpu"), torch.float32)
    target = FakeTarget()
    m.bind_target(target.embed_weight, target.lm_head_weight)
    for w in m.linear_weights().values():
        table.times[shape_key(*w.shape)] = {"full": 100.0, "int8": 10.0}
    table.save_cached()
    low = proposer(tiny(), k=3, draft_weights="int8")
    assert set(low.low_bit_formats) == set(m.linear_weights())
    assert set(low.low_bit_formats.values()) == {"int8"}
    assert "draft weights int8" in low.describe()
    assert proposer(tiny(), k=3).low_bit_formats == {}
    toks = torch.randint(0, V, (12,)).tolist()
    hidden = torch.randn(20, H)
    drafts = low.propose(batch_for(toks, hidden, 0, 11)).drafts[0]
    assert len(drafts) == 3 and all(0 <= t < V for t in drafts)
