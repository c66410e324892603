#!/usr/bin/env python
"""Quickstart: the plugin's methods inside vLLM on the embedded model.

1. One request through `LLM(..., speculative_config={"method": "selfspec"})`.
2. A small side-by-side run of plain decoding, vLLM's `ngram`, `selfspec` and
   `ngrammys` (tools/bench.py: same prompts, interleaved, greedy, float32), printed
   as a table. The first `ngrammys` engine builds the model's bigram table (about a
   minute here) and caches it.
"""

from __future__ import annotations


def main() -> None:
    from vllm import SamplingParams

    from vllm_selfspec import LLM

    llm = LLM("smollm2-135m", dtype="float32", max_model_len=1024, enforce_eager=True,
              kv_cache_memory_bytes=512 << 20,
              speculative_config={"method": "selfspec", "num_speculative_tokens": 6})
    out = llm.chat([{"role": "user", "content": "Give me two tips for writing clear code."}],
                   SamplingParams(max_tokens=64, temperature=0.0))
    print("\nselfspec answer:\n" + out[0].outputs[0].text.strip() + "\n")
    llm.llm_engine.engine_core.shutdown()
    del llm

    from vllm_selfspec.offline import bench

    print("Comparing plain decoding, vLLM ngram, selfspec and ngrammys on 4 MT-bench prompts ...")
    bench.main(["--model", "smollm2-135m", "--methods", "baseline,ngram,selfspec,ngrammys",
                "--dataset", "mtbench", "--num-prompts", "4", "--max-tokens", "64",
                "--dtype", "float32", "--enforce-eager", "--json", "out/quickstart.json"])


if __name__ == "__main__":
    main()
