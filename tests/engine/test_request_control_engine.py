"""``ngrammys-selfspec``'s two sources (SmolLM2-135M, float32). The engine key
``max_draft_prompt_tokens`` is checked on the ``ngrammys`` engine (test_ngrammys_engine.py).

Per-request control and structured outputs: the self-drafting methods and Chimera check them
on their own engines (``helpers.check_request_control`` in their modules), and every method
through ``vllm serve`` with its defaults (test_serve.py)."""

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


def test_ngrammys_selfspec_drafts_from_both_sources_and_stays_identical(
        model_path, eval_prompts, reference, sampled_reference):
    """Context n-grams where the text repeats, the low-bit self-draft elsewhere (gate off:
    every request drafts every step; ``matches: "gate"``, so a match drafts alone where the
    gate knows no better); greedy output identical to plain decoding, and
    sampling, with deterministic n-gram drafts and sampled self-drafts in one batch, follows
    plain decoding's distribution (helpers.check_sampling_distribution)."""
    from vllm_selfspec import control

    llm = make_llm(model_path, speculative_config={"method": "ngrammys-selfspec",
                                                    "cost_gate": False, "matches": "gate"})
    try:
        outs = llm.generate(eval_prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0),
                            use_tqdm=False)
        stats = llm.collective_rpc(control.drafter_stats)[0]
        check_sampling_distribution(llm, sampled_reference)
    finally:
        shutdown(llm)
    assert token_ids(outs) == reference
    assert stats["from_selfspec"] > 0 and stats["from_context"] > 0, stats
    assert stats["draft_weights"] == "w8a8" and acceptance(outs).accepted > 0


def test_ngrammys_selfspec_guessed_self_drafts_stay_identical(
        model_path, eval_prompts, reference, sampled_reference):
    """Every request self-drafts with its n-gram match as the guess of the first pass
    (``matches: "guess"``, gate off): several tokens in one draft pass through the target's
    KV cache, the match kept where the self-draft agrees. Greedy output identical to plain
    decoding, guessed tokens kept, and sampling (q of each kept position) follows plain
    decoding's distribution."""
    from vllm_selfspec import control

    llm = make_llm(model_path, speculative_config={"method": "ngrammys-selfspec",
                                                    "cost_gate": False, "matches": "guess"})
    try:
        outs = llm.generate(eval_prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0),
                            use_tqdm=False)
        stats = llm.collective_rpc(control.drafter_stats)[0]
        check_sampling_distribution(llm, sampled_reference)
        sampled = llm.collective_rpc(control.drafter_stats)[0]
    finally:
        shutdown(llm)
    assert token_ids(outs) == reference
    assert stats["from_context"] == 0 and stats["from_selfspec"] > 0, stats
    assert stats["guesses_kept"] > 0 and stats["guessed_tokens"] > stats["guesses_kept"], stats
    # each match passed over was scored against the target's tokens (the gate's evidence)
    assert stats["shadow_verifications"] > 0, stats
    assert stats.get("failures", 0) == 0 and acceptance(outs).accepted > 0
    assert sampled["guessed_tokens"] > stats["guessed_tokens"], sampled  # guessed while sampling
