"""What a Chimera checkpoint is expected to give: the paper's Table 5 and the chain a
drafter would verify, priced by the measured cost of a draft token.

    python -m vllm_selfspec.offline.chimera_eval --checkpoint CKPT.safetensors \\
        --work CKPT.work --draft-cost 0.08 --verify-cost 0.031 --json OUT.json

Teacher-forced on the held-out split of ``tools/train_chimera.py``: a chain starting at
position n is head 0 at n, head 1 at n+1, ... (each head sees the tokens before it,
which equal the drafts when those were accepted). Drafting stops after the first head
whose top-1 probability is under the stop threshold (that token is still proposed), so
for every threshold the expected tokens per target step and drafts per step follow,
and the expected speedup is tokens / (1 + drafts x (draft cost + verify cost)), costs
in decode steps (``tools/draft_cost.py`` measures them).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

THRESHOLDS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6)


def chain_stats(model: Any, data: Any, batch_tokens: int = 4096, max_seq: int = 768,
                device: Any = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """(correct [N, K] bool, confidence [N, K]) of every chain start n whose K heads all
    have a label (answer positions)."""
    import torch

    k = model.cfg.num_heads
    vocab_index = torch.full((model.cfg.vocab_size,), -1, dtype=torch.long)
    vocab_index[model.draft_ids.cpu()] = torch.arange(model.draft_ids.numel())
    correct, conf = [], []
    model.eval()
    with torch.no_grad():
        for spans in data.batches(batch_tokens, max_seq, None):
            tok, hid, lab, msk = data.tensors(spans, device)
            b, t = tok.shape
            ok = torch.full((k, b, t), -1, dtype=torch.int8)
            cf = torch.zeros(k, b, t)
            select = msk & (lab >= 0)
            for i, (where, _z, logits) in enumerate(model.teacher_forced(tok, hid, select)):
                p = torch.softmax(logits.float(), dim=-1)
                c, top = p.max(dim=-1)
                want = vocab_index[lab[where].cpu()]
                ok[i][where.cpu()] = (top.cpu() == want).to(torch.int8)
                cf[i][where.cpu()] = c.cpu()
            # chain starting at n: head i at n + i
            for n in range(t - k + 1):
                heads = torch.stack([ok[i, :, n + i] for i in range(k)], dim=1)  # [B, K]
                valid = (heads >= 0).all(dim=1)
                if bool(valid.any()):
                    correct.append(heads[valid].bool().numpy())
                    conf.append(torch.stack([cf[i, :, n + i] for i in range(k)],
                                            dim=1)[valid].numpy())
    model.train()
    if not correct:
        return np.zeros((0, k), bool), np.zeros((0, k))
    return np.concatenate(correct), np.concatenate(conf)


def expected(correct: np.ndarray, conf: np.ndarray, threshold: float, heads: int,
             draft_cost: float, verify_cost: float) -> dict[str, float]:
    """Expected tokens per target step, drafts per step and speedup for chain drafting
    with ``heads`` heads and a confidence stop at ``threshold``."""
    c, p = correct[:, :heads], conf[:, :heads]
    low = p < threshold
    first_low = np.where(low.any(axis=1), low.argmax(axis=1), heads - 1)
    drafted = first_low + 1
    lead = np.cumprod(c, axis=1).sum(axis=1)
    accepted = np.minimum(lead, drafted)
    tokens = 1.0 + accepted.mean()
    drafts = drafted.mean()
    return {"threshold": threshold, "heads": heads, "tokens_per_step": round(float(tokens), 4),
            "drafts_per_step": round(float(drafts), 4),
            "speedup": round(float(tokens / (1.0 + drafts * (draft_cost + verify_cost))), 4)}


def speedup_table(correct: np.ndarray, conf: np.ndarray, draft_cost: float,
                  verify_cost: float) -> list[dict[str, float]]:
    return [expected(correct, conf, th, h, draft_cost, verify_cost)
            for h in range(1, correct.shape[1] + 1) for th in THRESHOLDS]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--corpus", "--work", dest="work", default=None,
                   help="the corpus folder with the held-out states (default CKPT.work)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--draft-cost", type=float, default=0.08,
                   help="decode steps per draft token (tools/draft_cost.py)")
    p.add_argument("--verify-cost", type=float, default=0.031,
                   help="decode steps per extra verified token")
    p.add_argument("--json", dest="json_out", default=None)
    args = p.parse_args(argv)

    import torch

    from vllm_selfspec.assets import resolve_model
    from vllm_selfspec.model_info import stamp_from_path
    from vllm_selfspec.offline.train_chimera import Sequences, _target_state, evaluate
    from vllm_selfspec.proposers.chimera import load_checkpoint

    model_path = resolve_model(args.model)
    stamp = stamp_from_path(model_path)
    ckpt = Path(args.checkpoint)
    work = Path(args.work) if args.work else ckpt.with_name(ckpt.name + ".work")
    model = load_checkpoint(ckpt, stamp)
    state = _target_state(model_path)
    embed = state["model.embed_tokens.weight"]
    model.bind_target(embed, state.get("lm_head.weight", embed))
    index = json.loads((work / "states-heldout" / "index.json").read_text())
    held = Sequences.load([work / "states-heldout" / s["file"] for s in index["shards"]])
    with torch.no_grad():
        table5 = evaluate(model, held, 4096, 768, "cpu")
        correct, conf = chain_stats(model, held)
    rows = speedup_table(correct, conf, args.draft_cost, args.verify_cost)
    best = max(rows, key=lambda r: r["speedup"])
    report = {"checkpoint": str(ckpt), "table5": table5, "chains": int(correct.shape[0]),
              "draft_cost": args.draft_cost, "verify_cost": args.verify_cost,
              "expected": rows, "best": best}
    print("Table 5 (held-out, top-1..5 per head):")
    for i, r in enumerate(table5["top_k"]):
        print(f"  head {i}: " + " ".join(f"{x:.3f}" for x in r))
    print(f"best expected: {best}")
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
