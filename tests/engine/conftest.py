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
def humaneval_prompts(model_path):
    """HumanEval prompts: code, whose repeats the n-gram drafters find."""
    return prompts(model_path, dataset="humaneval")


@pytest.fixture(scope="session")
def plain_decoding(model_path, session_prompts, humaneval_prompts):
    """Plain decoding, greedy, same engine settings (the losslessness reference): free
    text (the evaluation prompts and the HumanEval ones), and under each structured-output
    grammar (helpers.structured_params). One plain engine for every engine test module."""
    llm = make_llm(model_path)
    try:
        out = {"free": token_ids(llm.generate(session_prompts, GREEDY, use_tqdm=False)),
               "humaneval": token_ids(llm.generate(humaneval_prompts, GREEDY, use_tqdm=False)),
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
def humaneval_reference(plain_decoding):
    return plain_decoding["humaneval"]


@pytest.fixture(scope="session")
def structured_reference(plain_decoding):
    return plain_decoding["structured"]


@pytest.fixture(scope="session")
def sampled_reference(plain_decoding):
    """(the prompt, plain decoding's continuations of it per sampling setting)."""
    return plain_decoding["sampled"]


@pytest.fixture(scope="session")
def selfspec_engine(model_path):
    """``selfspec`` with its defaults (W8A8 draft weights, the uniform mask, which skips
    nothing, cost gate on), in the older spelling ``speculative_model="[selfspec]"``, 6
    draft tokens: shared by the selfspec and draft_weights modules (one engine start)."""
    llm = make_llm(model_path, speculative_model="[selfspec]", num_speculative_tokens=6)
    yield llm
    shutdown(llm)
