#!/usr/bin/env python
"""Build N-Grammys' bigram table ahead of time, then decode with it.

    python examples/build_bigram_then_serve.py [--model smollm2-135m]

``ngrammys`` builds and caches a table at start-up when none is given; for large
vocabularies that takes long (one single-token forward per vocabulary entry), so build
it ahead with tools/build_bigram.py (``--ray`` shards it over a cluster, ``--device
cuda`` uses a GPU) and pass it as ``bigram_table`` (or ``--install`` it into the cache).
"""

from __future__ import annotations

import argparse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--out", default="out/bigram.safetensors")
    args = ap.parse_args()

    from vllm_selfspec.offline import build_bigram

    build_bigram.main(["--model", args.model, "--out", args.out])

    from vllm import LLM, SamplingParams

    from vllm_selfspec.assets import resolve_model

    llm = LLM(resolve_model(args.model), dtype="float32", max_model_len=2048,
              kv_cache_memory_bytes=1 << 30,
              speculative_config={"method": "ngrammys", "bigram_table": args.out})
    out = llm.generate(["def quicksort(xs):"], SamplingParams(max_tokens=64, temperature=0.0))
    print(out[0].outputs[0].text)


if __name__ == "__main__":
    main()
