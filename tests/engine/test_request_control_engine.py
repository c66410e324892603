"""Per-request control and structured outputs with the near-free methods (their defaults,
cost gate on), and the engine key ``max_draft_prompt_tokens`` (SmolLM2-135M, float32).

The self-drafting methods and Chimera run the same checks on their own engines
(``helpers.check_request_control`` in their modules)."""

import pytest
from vllm import SamplingParams

from tests.engine.helpers import MAX_TOKENS, check_request_control, make_llm, shutdown, token_ids
from vllm_selfspec.offline.spec_metrics import acceptance

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module", params=["ngrammys", "ngrammys-history", "ngrammys-chimera",
                                        "ngrammys-selfspec"])
def engine(request, model_path):
    llm = make_llm(model_path, speculative_config={"method": request.param})
    yield request.param, llm
    shutdown(llm)


def test_structured_outputs_and_per_request_control(engine, eval_prompts, reference,
                                                    structured_reference):
    """Every near-free method with its defaults (cost gate on): structured outputs and
    per-request control identical to plain decoding; ``ngrammys-history`` drafted from its
    ShareGPT datastore on the way (the gate tries every source)."""
    from vllm_selfspec import control

    method, llm = engine
    check_request_control(llm, eval_prompts, reference, structured_reference)
    stats = llm.collective_rpc(control.drafter_stats)[0]
    if method == "ngrammys-history":
        assert stats["from_datastore"] > 0, stats


def test_ngrammys_selfspec_drafts_from_both_sources_and_stays_identical(
        model_path, eval_prompts, reference):
    """Context n-grams where the text repeats, the low-bit self-draft elsewhere (gate off:
    every request drafts every step); greedy output identical to plain decoding."""
    from vllm_selfspec import control

    llm = make_llm(model_path, speculative_config={"method": "ngrammys-selfspec",
                                                    "cost_gate": False})
    try:
        outs = llm.generate(eval_prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0),
                            use_tqdm=False)
        stats = llm.collective_rpc(control.drafter_stats)[0]
    finally:
        shutdown(llm)
    assert token_ids(outs) == reference
    assert stats["from_selfspec"] > 0 and stats["from_context"] > 0, stats
    assert stats["draft_weights"] == "w8a8" and acceptance(outs).accepted > 0


def test_long_prompts_draft_nothing(model_path, eval_prompts, reference):
    """``max_draft_prompt_tokens``: requests whose prompt is longer draft nothing (where
    acceptance collapses on long contexts); shorter ones draft as usual; output identical."""
    lengths = sorted(len(p["prompt_token_ids"]) for p in eval_prompts)
    limit = lengths[len(lengths) // 2 - 1]  # half the prompts are longer
    llm = make_llm(model_path, speculative_config={"method": "ngrammys", "cost_gate": False,
                                                    "max_draft_prompt_tokens": limit})
    try:
        outs = llm.generate(eval_prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0),
                            use_tqdm=False)
    finally:
        shutdown(llm)
    assert token_ids(outs) == reference
    long = [o for p, o in zip(eval_prompts, outs) if len(p["prompt_token_ids"]) > limit]
    short = [o for p, o in zip(eval_prompts, outs) if len(p["prompt_token_ids"]) <= limit]
    assert long and short
    assert acceptance(long).draft_tokens == 0
    assert acceptance(short).draft_tokens > 0
