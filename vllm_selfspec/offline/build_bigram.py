"""Build the N-Grammys table of a model (paper §4.1, Appendix B.1) for method ``ngrammys``.

    python tools/build_bigram.py --model smollm2-135m --top-k 32 --width 4 --out TABLE

For every token x: the top-k of p_M(. | x) from a single-token forward (batched
over the vocabulary), the paper's unigram ranking from the input/output
embeddings, and extended rows of width w (``--extension repeated``: repeat the
bigram's top-1, free; ``greedy``: decode greedily from [x, bigram token], k*(w-1)
short forwards per token — meant for a GPU). The file (safetensors) is stamped
with the model's fingerprint and vocabulary size; ``ngrammys`` refuses it for any
other model. ``--install`` also caches it where ``ngrammys`` finds it when no
``bigram_table`` is given. ``--ray`` shards the vocabulary over Ray workers (each
loads its own copy of the model); without it nothing imports Ray.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="alias, local folder or hub name")
    p.add_argument("--top-k", type=int, default=32, help="bigram candidates kept per token")
    p.add_argument("--width", type=int, default=4, help="width w of the extended rows")
    p.add_argument("--extension", choices=("repeated", "greedy"), default="repeated")
    p.add_argument("--extend-k", type=int, default=None,
                   help="greedy extension for the first N rows only (rest: repeated)")
    p.add_argument("--prefix", choices=("newline", "bos", "none"), default="newline",
                   help="context before x in the single-token forward: 'none' is the paper's p(.|x) "
                        "(degenerate for models whose first position is an attention sink)")
    p.add_argument("--unigram-size", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    p.add_argument("--out", required=True, help="table file (.safetensors)")
    p.add_argument("--install", action="store_true",
                   help="also cache it as this model's default table for ngrammys")
    p.add_argument("--ray", action="store_true", help="shard the vocabulary over Ray workers")
    p.add_argument("--ray-address", default=None)
    p.add_argument("--ray-workers", type=int, default=2)
    p.add_argument("--ray-cpus-per-worker", type=float, default=1.0)
    args = p.parse_args(argv)
    if args.top_k < 1 or args.width < 1:
        p.error("--top-k and --width must be at least 1")
    return args


def prefix_ids(kind: str, model_path: str) -> list[int]:
    from vllm_selfspec.builders.bigram import default_prefix

    if kind == "none":
        return []
    if kind == "newline":
        return default_prefix(model_path)
    from transformers import AutoTokenizer

    bos = AutoTokenizer.from_pretrained(model_path).bos_token_id
    if bos is None:
        raise SystemExit("--prefix bos: this tokenizer has no BOS token; use newline or none")
    return [int(bos)]


def table_spec(args: argparse.Namespace, model_path: str) -> Any:
    from vllm_selfspec.builders.bigram import TableSpec

    return TableSpec(top_k=args.top_k, width=args.width, extension=args.extension,
                     extend_k=args.extend_k, prefix=prefix_ids(args.prefix, model_path),
                     unigram_size=args.unigram_size, batch_size=args.batch_size)


def build_with_ray(args: argparse.Namespace, model_path: str) -> Any:
    """Shard the vocabulary over Ray workers (each loads its own model), assemble here."""
    import ray  # only with --ray
    import torch
    from tqdm import tqdm

    from vllm_selfspec.builders.bigram import assemble, load_model, vocab_size

    if not ray.is_initialized():
        ray.init(address=args.ray_address, ignore_reinit_error=True, log_to_driver=False)

    @ray.remote(num_cpus=args.ray_cpus_per_worker)
    def shard(spec: Any, path: str, dtype: str, device: str, threads: int, start: int,
              end: int) -> Any:
        import torch

        torch.set_num_threads(threads)
        from vllm_selfspec.builders.bigram import load_model, shard_rows

        return shard_rows(load_model(path, getattr(torch, dtype), device), spec, start, end)

    t0 = time.perf_counter()
    spec = table_spec(args, model_path)
    model = load_model(model_path, getattr(torch, args.dtype))  # stamp and unigram here
    bounds = np.linspace(0, vocab_size(model), args.ray_workers * 4 + 1).astype(int)
    threads = max(1, int(args.ray_cpus_per_worker))
    futures = [shard.remote(spec, model_path, args.dtype, args.device, threads, int(lo), int(hi))
               for lo, hi in zip(bounds, bounds[1:]) if hi > lo]
    parts: list[Any] = [None] * len(futures)
    pending = list(futures)
    with tqdm(total=len(futures), desc="vocabulary shards") as bar:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for d in done:
                parts[futures.index(d)] = ray.get(d)
                bar.update(1)
    return assemble(model, spec, parts, args.model, t0, device=args.device,
                    ray_workers=args.ray_workers)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import torch
    from tqdm import tqdm

    from vllm_selfspec.assets import resolve_model
    from vllm_selfspec.builders.bigram import build_table, load_model
    from vllm_selfspec.proposers.artifacts import artifact_path, atomic_path

    model_path = resolve_model(args.model)
    if args.ray:
        table = build_with_ray(args, model_path)
    else:
        model = load_model(model_path, getattr(torch, args.dtype), args.device)
        table = build_table(model, table_spec(args, model_path), name=args.model,
                            progress=lambda it: tqdm(list(it), desc="vocabulary batches"))
    out = Path(args.out)
    table.save(out)
    summary = {"out": str(out), "model": table.stamp.to_json() if table.stamp else None,
               "vocab_size": table.vocab_size, **table.meta}
    if args.install and table.stamp is not None:
        dest = artifact_path("bigram", table.stamp)
        if dest is None:
            print("--install needs a weights fingerprint (a Llama-family checkpoint); not "
                  "installed", file=sys.stderr)
        else:
            with atomic_path(dest) as tmp:
                shutil.copyfile(out, tmp)
            summary["installed"] = str(dest)
    print(json.dumps(summary, indent=2))
    print(f"built the table of {table.vocab_size} tokens in {table.meta['build_seconds']} s",
          file=sys.stderr)
    return summary


if __name__ == "__main__":
    main()
