"""Key draft_vocab of the layer-skip methods: draft logits over a draft vocabulary only."""

import json

import pytest
import torch

from vllm_selfspec import methods
from vllm_selfspec.checkpoints import SHIPPED, load_draft_vocab_ids
from vllm_selfspec.model_info import ModelInfo
from vllm_selfspec.proposers.artifacts import ArtifactError, ModelStamp
from vllm_selfspec.proposers.base import DraftBatch, DraftRequest
from vllm_selfspec.proposers.draft_verify import SelfSpecProposer
from vllm_selfspec.proposers.draft_vocab import DraftVocab
from vllm_selfspec.proposers.layerskip import EarlyExitProposer
from vllm_selfspec.proposers.resolved import ArtifactRefs, Artifacts
from vllm_selfspec.proposers.skip_mask import SkipMask
from vllm_selfspec.proposers.swift import SwiftProposer
from vllm_selfspec.resolvers import resolve_draft_vocab

V, H = 32, 8


class HeadTarget:
    """A target with a real LM head: hidden = f(token, position), logits = hidden @ W^T
    (or over the rows it is given: a draft vocabulary)."""

    num_layers = 4
    vocab_size = V
    device = torch.device("cpu")

    def __init__(self, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.embed = torch.randn(V, H, generator=g)
        self.pos = torch.randn(64, H, generator=g) * 0.3
        self.lm_head_weight = torch.randn(V, H, generator=g) * 3
        self.heads = []

    def draft_step(self, rows, tokens, positions, mask, draft_index, head=None, settled=False):
        hidden = self.embed[tokens] + self.pos[positions]
        self.heads.append(None if head is None else head.shape)
        return hidden @ (self.lm_head_weight if head is None else head).t()


def make(vocab_ids=None, k=6, cls=SelfSpecProposer, **opts):
    opts = {"draft_exit_threshold": 0.0, "adaptive_threshold": False, **opts}
    p = cls(k, opts, Artifacts(skip_mask=SkipMask(frozenset({1}), frozenset()),
                               draft_vocab=None if vocab_ids is None else tuple(vocab_ids)))
    t = HeadTarget()
    p.bind(t)
    return p, t


def greedy(p, token=3, position=5):
    return p.propose(DraftBatch(["a"], [DraftRequest(0, "a", position, token, p.k)])).drafts[0]


def test_greedy_draft_is_the_full_vocabulary_draft_when_its_argmax_is_inside():
    full, _ = make()
    draft = greedy(full)
    # a vocabulary that holds every argmax of the full draft, in a shuffled order
    others = [t for t in range(V) if t not in draft][:6]
    ids = list(dict.fromkeys(draft)) + others
    ids = ids[::-1]
    sub, t = make(ids)
    assert greedy(sub) == draft
    assert t.heads[0] == (len(ids), H)  # logits over the draft vocabulary's rows only


def test_greedy_draft_outside_the_vocabulary_is_the_best_token_inside():
    full, t = make()
    draft = greedy(full)
    first = draft[0]
    ids = [x for x in range(V) if x != first]  # the full draft's first token is missing
    sub, _ = make(ids, k=1)
    got = greedy(sub)[0]
    logits = t.embed[3] + t.pos[5]
    logits = logits @ t.lm_head_weight.t()
    logits[first] = float("-inf")
    assert got == int(logits.argmax()) and got != first


def test_sampled_q_is_scattered_into_the_full_vocabulary():
    ids = [5, 1, 30, 7, 12, 0, 22, 9]
    p, t = make(ids, k=3)
    out = p.propose(DraftBatch(["a", "b"], [DraftRequest(0, "a", 2, 4, 3, temperature=1.0),
                                           DraftRequest(1, "b", 2, 4, 3)]))
    assert out.probs is not None and out.probs.shape == (2, 3, V)
    outside = torch.ones(V, dtype=torch.bool)
    outside[ids] = False
    n = len(out.drafts[0])
    q = out.probs[0, :n]
    assert torch.allclose(q.sum(-1), torch.ones(n))
    assert q[:, outside].abs().sum() == 0
    assert all(x in ids for x in out.drafts[0] + out.drafts[1])
    # the first position: q is softmax over the draft vocabulary's logits, at their target ids
    logits = (t.embed[4] + t.pos[2]) @ t.lm_head_weight[ids].t()
    assert torch.allclose(q[0, ids], torch.softmax(logits, -1), atol=1e-6)
    assert out.probs[1].sum() == 0  # greedy row


def test_full_or_no_vocabulary_drafts_with_the_models_own_head():
    p, t = make(list(range(V)))
    assert p.vocab is None
    greedy(p)
    assert t.heads[0] is None


@pytest.mark.parametrize("cls", [EarlyExitProposer, SwiftProposer])
def test_other_layer_skip_methods_take_the_vocabulary(cls):
    opts = {"cache_hit": True} if cls is SwiftProposer else {}
    p, t = make([3, 4, 5], k=2, cls=cls, **opts)
    assert p.vocab is not None and p.vocab.size == 3 and "draft vocabulary 3" in p.describe()


def test_draft_vocab_is_a_key_of_the_layer_skip_methods_off_by_default():
    for name in ("selfspec", "swift", "layerskip"):
        key = methods.METHODS[name].key("draft_vocab")
        assert key is not None and key.default == 0


def _info(fingerprint):
    return ModelInfo(ModelStamp("LlamaForCausalLM", 30, 576, 49152, fingerprint, "x"), "m")


def test_start_up_refuses_in_one_line_where_no_vocabulary_exists(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_SELFSPEC_CACHE", str(tmp_path))
    opts = {"draft_vocab": 1024}
    with pytest.raises(ArtifactError) as e:
        resolve_draft_vocab(opts, _info("0" * 16), {})
    msg = str(e.value)
    assert "\n" not in msg and "tools/train_chimera.py" in msg and "draft_vocab 0" in msg
    resolve_draft_vocab({"draft_vocab": 0}, _info("0" * 16), {})  # off: nothing needed


def test_the_shipped_checkpoint_gives_the_embedded_model_its_most_frequent_tokens(
        tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_SELFSPEC_CACHE", str(tmp_path))
    ckpt = SHIPPED / "chimera-smollm2-135m.safetensors"
    from safetensors import safe_open

    with safe_open(str(ckpt), "pt") as f:
        stamp = ModelStamp.from_json(json.loads(f.metadata()["stamp"]))
    refs = resolve_draft_vocab({"draft_vocab": 4096}, ModelInfo(stamp, "m"), {})
    assert refs == {"draft_vocab": str(ckpt), "draft_vocab_size": 4096}
    assert ArtifactRefs(stamp, **refs).load().draft_vocab[:4] == (198, 30, 253, 28)
    ids = load_draft_vocab_ids(ckpt, 4096)
    assert len(ids) == len(set(ids)) == 4096 and ids[:4] == [198, 30, 253, 28]
    with pytest.raises(ArtifactError, match="at most 16384"):
        resolve_draft_vocab({"draft_vocab": 20000}, ModelInfo(stamp, "m"), {})


def test_draft_vocab_scatter_round_trip():
    vocab = DraftVocab(torch.tensor([4, 0, 2]), 6)
    q = torch.tensor([[0.5, 0.3, 0.2]])
    assert torch.equal(vocab.scatter(q), torch.tensor([[0.3, 0.0, 0.2, 0.0, 0.5, 0.0]]))
    assert vocab.to_target(torch.tensor([0, 2])).tolist() == [4, 2]


def test_the_vocabulary_can_be_narrowed_or_switched_off_in_a_running_engine():
    p, t = make([9, 3, 4, 5], k=2)
    p.use_draft_vocab(2)
    assert p.vocab.ids.tolist() == [9, 3] and p.head.shape == (2, H)
    assert all(x in (9, 3) for x in greedy(p))
    p.use_draft_vocab(0)
    assert p.vocab is None and p.head is None
    p.use_draft_vocab(4)
    assert p.vocab.size == 4
    with pytest.raises(ValueError, match="4 were loaded"):
        p.use_draft_vocab(5)


def test_the_size_asked_for_before_bind_applies_at_bind():
    p = SelfSpecProposer(2, {}, Artifacts(skip_mask=SkipMask(), draft_vocab=(9, 3, 4)))
    assert "draft vocabulary 3 (from the first draft step)" in p.describe()
    p.use_draft_vocab(2)  # an engine binds at its first draft step
    assert "draft vocabulary 2 (from the first draft step)" in p.describe()
    p.use_draft_vocab(0)
    assert "draft vocabulary" not in p.describe()
    p.bind(HeadTarget())
    assert p.vocab is None
    p.use_draft_vocab(2)
    assert p.vocab.size == 2
