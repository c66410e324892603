"""Engine fixtures shared by the engine test modules: the evaluation prompts and
plain decoding's greedy output on them (one plain engine per session)."""

import pytest
from vllm import SamplingParams

from tests.engine.helpers import MAX_TOKENS, make_llm, prompts, shutdown, token_ids

GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)


@pytest.fixture(scope="session")
def eval_prompts(model_path):
    return prompts(model_path)


@pytest.fixture(scope="session")
def reference(model_path, eval_prompts):
    """Plain decoding, greedy, same engine settings (the losslessness reference)."""
    llm = make_llm(model_path)
    out = token_ids(llm.generate(eval_prompts, GREEDY, use_tqdm=False))
    shutdown(llm)
    return out
