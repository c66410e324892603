#!/usr/bin/env python
"""Search a skip mask offline (Draft & Verify §3.3), then decode with it.

    python examples/search_mask_then_serve.py [--iterations 20]

The search (tools/search_mask.py, proxy objective: teacher-forced agreement priced by the
draft-cost model) writes a stamped mask file; ``selfspec`` takes it as ``skip_mask``.
The same file works with ``vllm serve ... --speculative-config
'{"method": "selfspec", "skip_mask": "mask.json"}'``.
"""

from __future__ import annotations

import argparse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--out", default="out/mask.json")
    args = ap.parse_args()

    from vllm_selfspec.offline import search_mask

    search_mask.main(["--model", "smollm2-135m", "--dataset", "mtbench", "--objective", "proxy",
                      "--iterations", str(args.iterations), "--out", args.out])

    from vllm import LLM, SamplingParams

    from vllm_selfspec.assets import resolve_model

    llm = LLM(resolve_model("smollm2-135m"), dtype="float32", max_model_len=2048,
              kv_cache_memory_bytes=1 << 30,
              speculative_config={"method": "selfspec", "skip_mask": args.out})
    out = llm.generate(["The three laws of thermodynamics are"],
                       SamplingParams(max_tokens=64, temperature=0.0))
    print(out[0].outputs[0].text)


if __name__ == "__main__":
    main()
