"""The compiled layer-skip draft pass (``control.set_compile_walks``), measured by
``tools/draft_cost.py --compile-draft`` but not offered as a key: in about a dozen
compiles inside vLLM workers here, one aborted the worker and one hung it
(docs/results.md). Deselected by default (marker ``compiled_draft``; run it with
``make test-compiled-draft``) and on an engine of its own, so that such a failure
cannot take other tests' engines with it.
"""

import pytest
from vllm import SamplingParams

from tests.engine.helpers import MAX_TOKENS, make_llm, shutdown, token_ids
from vllm_selfspec import control
from vllm_selfspec.offline.spec_metrics import acceptance

pytestmark = [pytest.mark.engine, pytest.mark.compiled_draft]

GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)


@pytest.fixture(scope="module")
def engine(model_path):
    llm = make_llm(model_path,
                   speculative_config={"method": "selfspec", "num_speculative_tokens": 4,
                                       "skip_mask": {"attention": [3, 7, 11], "mlp": [5, 9]},
                                       "cost_gate": False})
    yield llm
    shutdown(llm)


def test_compiled_draft_pass_keeps_greedy_output_identical(engine, eval_prompts, reference):
    """A settled mask's sub-layer walk is compiled once (torch.compile, one graph for any
    number of rows: single rows are padded to two) and drafts with the same KV rules;
    output identical to plain decoding, 1 and 8 requests in flight."""
    engine.collective_rpc(control.set_compile_walks, args=(True,))
    outs = engine.generate(eval_prompts, GREEDY, use_tqdm=False)
    single = engine.generate(eval_prompts[:1], GREEDY, use_tqdm=False)
    stats = engine.collective_rpc(control.drafter_stats)[0]
    assert token_ids(outs) == reference and token_ids(single) == reference[:1]
    assert stats["compiles"] == 1 and stats["draft_rows"] > 0
    assert acceptance(outs).accepted > 0
