"""Engine fixtures shared by the engine test modules: the evaluation prompts and
plain decoding's greedy output on them (one plain engine per session)."""

import pytest
from vllm import SamplingParams

from tests.engine.helpers import (
    MAX_TOKENS,
    SAMPLING_SETTINGS,
    make_llm,
    prompts,
    sample_continuations,
    shutdown,
    structured_outputs,
    token_ids,
)

GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)


@pytest.fixture(scope="session")
def session_prompts(model_path):
    return prompts(model_path)


@pytest.fixture(scope="session")
def eval_prompts(session_prompts):
    """The evaluation prompts (a module may use others under this name; the plain
    decoding references below are always of these)."""
    return session_prompts


@pytest.fixture(scope="session")
def plain_decoding(model_path, session_prompts):
    """Plain decoding, greedy, same engine settings (the losslessness reference): free
    text, and under each structured-output grammar (helpers.structured_params)."""
    llm = make_llm(model_path)
    try:
        out = {"free": token_ids(llm.generate(session_prompts, GREEDY, use_tqdm=False)),
               "structured": structured_outputs(llm, session_prompts),
               "sampled": (session_prompts[0], {s: sample_continuations(llm, session_prompts[0], s)
                                             for s in SAMPLING_SETTINGS})}
    finally:
        shutdown(llm)
    return out


@pytest.fixture(scope="session")
def reference(plain_decoding):
    return plain_decoding["free"]


@pytest.fixture(scope="session")
def structured_reference(plain_decoding):
    return plain_decoding["structured"]


@pytest.fixture(scope="session")
def sampled_reference(plain_decoding):
    """(the prompt, plain decoding's continuations of it per sampling setting)."""
    return plain_decoding["sampled"]
