#!/usr/bin/env python
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


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
    from vllm_selfspec.bigram_build import default_prefix

    if kind == "none":
        return []
    if kind == "newline":
        return default_prefix(model_path)
    from transformers import AutoTokenizer

    bos = AutoTokenizer.from_pretrained(model_path).bos_token_id
    if bos is None:
        raise SystemExit("--prefix bos: this tokenizer has no BOS token; use newline or none")
    return [int(bos)]


def _shard(a: dict[str, Any], path: str, start: int, end: int) -> tuple[np.ndarray, np.ndarray,
                                                                         np.ndarray | None]:
    """Bigram rows (and greedy extension) of tokens [start, end): one worker's share."""
    import torch

    from vllm_selfspec.bigram_build import bigram_topk, greedy_extension, load_model

    model = load_model(path, getattr(torch, a["dtype"]), a["device"])
    ids, probs = bigram_topk(model, a["top_k"], start, end, a["batch_size"], prefix=a["_prefix"])
    ext = None
    if a["extension"] == "greedy" and a["width"] > 1:
        # the extension indexes the bigram rows by token: pad the rows of this shard
        full = np.zeros((end, a["top_k"]), dtype=np.int32)
        full[start:end] = ids
        ke = min(a["top_k"], a["extend_k"] or a["top_k"])
        ext = greedy_extension(model, full, ke, a["width"], start, end, a["batch_size"],
                               prefix=a["_prefix"])
    return ids, probs, ext


def build_with_ray(args: argparse.Namespace, model_path: str) -> Any:
    import ray  # only with --ray

    from vllm_selfspec.bigram_build import load_model, model_stamp, unigram_ranking
    from vllm_selfspec.proposers.ngram_tables import BigramTable, repeated_extension

    if not ray.is_initialized():
        ray.init(address=args.ray_address, ignore_reinit_error=True, log_to_driver=False)
    root = str(Path(__file__).resolve().parent.parent)

    @ray.remote(num_cpus=args.ray_cpus_per_worker)
    def shard(a: dict[str, Any], path: str, start: int, end: int) -> Any:
        sys.path.insert(0, root)
        import torch

        torch.set_num_threads(max(1, int(a["_threads"])))
        from tools.build_bigram import _shard

        return _shard(a, path, start, end)

    t0 = time.perf_counter()
    model = load_model(model_path)  # stamp, vocabulary and unigram (cheap) on the driver
    stamp = model_stamp(model, args.model)
    vocab = stamp.vocab_size
    a = {**vars(args), "_threads": max(1, int(args.ray_cpus_per_worker)),
         "_prefix": prefix_ids(args.prefix, model_path)}
    bounds = np.linspace(0, vocab, args.ray_workers * 4 + 1).astype(int)
    futures = [shard.remote(a, model_path, int(lo), int(hi)) for lo, hi in zip(bounds, bounds[1:])
               if hi > lo]
    from tqdm import tqdm

    parts: list[Any] = [None] * len(futures)
    pending = list(futures)
    with tqdm(total=len(futures), desc="vocabulary shards") as bar:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for d in done:
                parts[futures.index(d)] = ray.get(d)
                bar.update(1)
    ids = np.concatenate([p[0] for p in parts])
    probs = np.concatenate([p[1] for p in parts])
    ext = repeated_extension(ids, args.top_k, args.width)
    if args.extension == "greedy" and args.width > 1:
        g = np.concatenate([p[2] for p in parts])
        ext[:, : g.shape[1]] = g
    uni = unigram_ranking(model, args.unigram_size)
    meta = {"top_k": args.top_k, "width": args.width, "extension": args.extension,
            "extend_k": args.extend_k, "prefix": a["_prefix"], "build_seconds": round(time.perf_counter() - t0, 1),
            "ray_workers": args.ray_workers, "device": args.device, "dtype": args.dtype}
    return BigramTable(ids, probs, uni, ext, stamp, meta)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import torch
    from tqdm import tqdm

    from vllm_selfspec.assets import resolve_model
    from vllm_selfspec.bigram_build import build_table, cached_table_path, load_model

    model_path = resolve_model(args.model)
    if args.ray:
        table = build_with_ray(args, model_path)
    else:
        model = load_model(model_path, getattr(torch, args.dtype), args.device)
        table = build_table(model, args.top_k, args.width, args.extension, args.unigram_size,
                            args.batch_size, name=args.model,
                            progress=lambda it: tqdm(list(it), desc="vocabulary batches"),
                            extend_k=args.extend_k, prefix=prefix_ids(args.prefix, model_path))
    out = Path(args.out)
    table.save(out)
    summary = {"out": str(out), "model": table.stamp.to_json() if table.stamp else None,
               "vocab_size": table.vocab_size, **table.meta}
    if args.install and table.stamp is not None:
        dest = cached_table_path(table.stamp)
        if dest is None:
            print("--install needs a weights fingerprint (a Llama-family checkpoint); not "
                  "installed", file=sys.stderr)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(out, dest)
            summary["installed"] = str(dest)
    print(json.dumps(summary, indent=2))
    print(f"built the table of {table.vocab_size} tokens in {table.meta['build_seconds']} s",
          file=sys.stderr)
    return summary


if __name__ == "__main__":
    main()
