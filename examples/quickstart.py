#!/usr/bin/env python
"""Quickstart: the plugin's methods inside vLLM on the embedded model (SmolLM2-135M).

A small side-by-side run (tools/bench.py: same prompts, interleaved, greedy, float32)
of plain decoding, vLLM's `ngram`, and this plugin's `ngrammys` (near-free n-gram drafts)
and `selfspec` (the model drafting for itself through low-bit copies of its layers), printed
as a table, then one of the answers. vLLM's own logs stay at warning level; ``--verbose``
brings them back. The first `ngrammys` engine builds the model's bigram table once
(cached); `selfspec` makes its low-bit copies at start-up.
"""

from __future__ import annotations

import argparse
import os
import time


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--verbose", action="store_true", help="show vLLM's info logs")
    ap.add_argument("--methods", default="baseline,ngram,ngrammys,selfspec")
    ap.add_argument("--num-prompts", type=int, default=4)
    args = ap.parse_args(argv)
    if not args.verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    t0 = time.time()
    print(f"vllm-selfspec quickstart: {args.methods} on {args.num_prompts} MT-bench prompts "
          "(SmolLM2-135M, float32, greedy)")
    from vllm_selfspec.offline import bench

    report = bench.main(["--model", "smollm2-135m", "--methods", args.methods,
                         "--dataset", "mtbench", "--num-prompts", str(args.num_prompts),
                         "--max-tokens", "64", "--dtype", "float32", "--enforce-eager",
                         "--show-answer", "--json", "out/quickstart.json"])
    same = all(r["identical_to_baseline"] for r in report["results"])
    print(f"\nEvery method's output {'is' if same else 'is NOT'} token-identical to plain "
          f"decoding. Done in {time.time() - t0:.0f} s; the table is in out/quickstart.json.")


if __name__ == "__main__":
    main()
