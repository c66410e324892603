"""What a Chimera checkpoint is expected to give: the paper's Table 5 and the chain a
drafter would verify, priced by the measured cost of a draft token.

    python -m vllm_selfspec.offline.chimera_eval --checkpoint CKPT.safetensors \\
        --work CKPT.work --draft-cost 0.08 --verify-cost 0.031 --json OUT.json \\
        --prompts mtbench,humaneval

Besides the whole held-out split it reports the held-out answers whose prompts share no
8-token run with a training prompt (ShareGPT repeats many prompts nearly word for word,
and the target answers a repeat as it answered the original), and with ``--prompts`` the
same figures on the bench's own prompt sets: the target answers them greedily
(transformers, ``--answer-dtype``) and its states are taken as for training, so the
heads are measured on what the engine meets there. Nothing is trained on those answers.

Teacher-forced on the held-out split of ``tools/train_chimera.py``: a chain starting at
position n is head 0 at n, head 1 at n+1, ... (each head sees the tokens before it,
which equal the drafts when those were accepted). Drafting stops after the first head
whose top-1 probability is under the stop threshold (that token is still proposed), so
for every threshold the expected tokens per target step and drafts per step follow,
and the expected speedup is tokens / (1 + drafts x (draft cost + verify cost)), costs
in decode steps (``tools/draft_cost.py`` measures them). Beside that average over every
start, each set reports the mean acceptance length along the drafter's own path
(``along_the_path``: a chain starts only after the previous one's accepted drafts and the
target's token, so right after a miss), which is what the engine measures.

``--draft-vocab N`` widens a checkpoint's draft vocabulary before measuring (its own tokens
first, then the corpus's most frequent answer tokens): the shared heads draft over the
target's LM-head rows, so a wider vocabulary needs no training. ``--heads K`` measures
chains of K heads, the checkpoint's last head standing in for every head it lacks
(``ChimeraDraftModel.with_heads``, no training): what deeper chains could add. Every set
reports the path figure for 1..K heads (``tokens_per_step_path_by_heads``), and the bench's
prompt sets also over the prompts ``tools/bench.py`` times (``..._timed_by_heads``).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

UNSEEN_NGRAM = 8  # tokens: a held-out prompt sharing a run this long with a training one is a repeat

THRESHOLDS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6)
MAX_SEQ = 768  # tokens of a sequence measured: its last ones (``Sequences.batches``)


def chain_stats(model: Any, data: Any, batch_tokens: int = 4096, max_seq: int = MAX_SEQ,
                device: Any = "cpu", starts: list[np.ndarray] | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """(correct [N, K] bool, confidence [N, K]) of every chain start n whose K heads all
    have a label (answer positions); with ``starts``, each chain's (sequence, n) [N, 2]
    is appended to it in the same order."""
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
                    if starts is not None:
                        seq = np.asarray([a for a, _ in spans])[valid.numpy()]
                        starts.append(np.stack([seq, np.full_like(seq, n)], axis=1))
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


def path_steps(correct: np.ndarray, starts: np.ndarray) -> dict[int, list[int]]:
    """Tokens per target step of the chains a drafter meets (all heads drafted), per
    sequence: the first chain starts at the sequence's first answer position and every later
    one right after the previous chain's accepted drafts and the target's own token, so
    chains start after misses, not at every position as in ``expected``."""
    lead = np.cumprod(correct, axis=1).sum(axis=1)
    by_seq: dict[int, dict[int, int]] = {}
    for (seq, n), a in zip(starts.tolist(), lead.tolist()):
        by_seq.setdefault(int(seq), {})[int(n)] = int(a)
    out: dict[int, list[int]] = {}
    for seq, chains in by_seq.items():
        n, last, steps = min(chains), max(chains), []
        while n <= last:
            a = chains.get(n, 0)
            steps.append(1 + a)
            n += 1 + a
        out[seq] = steps
    return out


def along_the_path(correct: np.ndarray, starts: np.ndarray) -> float:
    """Mean acceptance length along the drafter's path (``path_steps``) over all sequences:
    what the engine measures (``tools/bench.py``'s mean acceptance length, every head
    drafted), where ``expected`` averages over every start."""
    return mean_step(path_steps(correct, starts))


def mean_step(by_seq: dict[int, list[int]]) -> float:
    """Tokens per target step over every step of ``path_steps``' sequences."""
    steps = [x for seq in by_seq.values() for x in seq]
    return float(np.mean(steps)) if steps else 1.0


def speedup_table(correct: np.ndarray, conf: np.ndarray, draft_cost: float,
                  verify_cost: float) -> list[dict[str, float]]:
    return [expected(correct, conf, th, h, draft_cost, verify_cost)
            for h in range(1, correct.shape[1] + 1) for th in THRESHOLDS]


def timed_path(per_prompt: list[dict[str, Any]]) -> list[float]:
    """Along the path with 1..K heads over the prompts ``tools/bench.py`` times by default
    (after its warm-up prompts): total tokens over total steps of those entries."""
    from vllm_selfspec.offline.bench import NUM_PROMPTS, WARMUP_PROMPTS

    rows = per_prompt[WARMUP_PROMPTS: WARMUP_PROMPTS + NUM_PROMPTS]
    if not rows:
        return []
    out = []
    for k in range(len(rows[0]["steps_by_heads"])):
        steps = sum(r["steps_by_heads"][k] for r in rows)
        tokens = sum(r["steps_by_heads"][k] * r["tokens_per_step_path_by_heads"][k] for r in rows)
        out.append(round(tokens / steps, 4) if steps else 1.0)
    return out


def summary(model: Any, data: Any, draft_cost: float, verify_cost: float
            ) -> tuple[dict[str, Any], dict[str, Any], tuple[np.ndarray, np.ndarray]]:
    """(figures, Table 5, chains) of ``data``, teacher-forced: the figures are top-1 per head
    and the expected tokens per step drafting every head (no confidence stop), over every
    start and along the drafter's path with 1..K heads (``path_steps_by_heads``: each
    sequence's steps per number of heads, in ``data``'s order)."""
    from vllm_selfspec.offline.train_chimera import evaluate

    table5 = evaluate(model, data, 4096, MAX_SEQ, "cpu")
    starts: list[np.ndarray] = []
    correct, conf = chain_stats(model, data, starts=starts)
    heads = correct.shape[1]
    every = expected(correct, conf, 0.0, heads, draft_cost, verify_cost)
    at = np.concatenate(starts) if starts else np.zeros((0, 2), dtype=np.int64)
    by_heads = [path_steps(correct[:, :k], at) for k in range(1, heads + 1)]
    path = [round(mean_step(b), 4) for b in by_heads]
    # a sequence's chains are keyed by its span's start (``Sequences.batches``)
    span_start = [max(int(a), int(b) - MAX_SEQ)
                  for a, b in zip(data.offsets[:-1], data.offsets[1:])]
    figures = {"positions": data.num_tokens, "top1": [round(r[0], 4) for r in table5["top_k"]],
               "tokens_per_step": every["tokens_per_step"],
               "tokens_per_step_path": path[-1], "tokens_per_step_path_by_heads": path,
               "path_steps_by_heads": [[b.get(a, []) for b in by_heads] for a in span_start],
               "chains": int(correct.shape[0])}
    return figures, table5, (correct, conf)


def common_opening(prompts: list[list[int]], share: float = 0.5) -> int:
    """Length of the token prefix at least ``share`` of the prompts start with (the chat
    template's system turn; a prompt cut to its last tokens has lost it)."""
    live, i = prompts, 0
    while True:
        counts = Counter(p[i] for p in live if len(p) > i)
        if not counts:
            return i
        tok, n = counts.most_common(1)[0]
        if n < share * len(prompts):
            return i
        live = [p for p in live if len(p) > i and p[i] == tok]
        i += 1


def user_text(prompts: list[list[int]]) -> list[list[int]]:
    """The prompts without the chat template's common opening and closing (the system turn,
    the assistant turn's header), where a prompt has them."""
    head = common_opening(prompts)
    tail = common_opening([p[::-1] for p in prompts])
    opening = list(Counter(tuple(p[:head]) for p in prompts).most_common(1)[0][0])
    closing = list(Counter(tuple(p[len(p) - tail:]) for p in prompts).most_common(1)[0][0])
    out = []
    for p in prompts:
        lo = head if p[:head] == opening else 0
        hi = len(p) - tail if tail and p[len(p) - tail:] == closing else len(p)
        out.append(p[lo:max(lo, hi)])
    return out


def unseen_ids(held: list[dict[str, Any]], train: list[dict[str, Any]],
               n: int = UNSEEN_NGRAM) -> set[str]:
    """Ids of held-out records whose prompt (without the template's common opening and
    closing) shares no ``n``-token run with a training prompt."""
    texts = user_text([r["prompt"] for r in held + train])

    def grams(ids: list[int]) -> set[tuple[int, ...]]:
        return {tuple(ids[i: i + n]) for i in range(len(ids) - n + 1)}

    seen: set[tuple[int, ...]] = set()
    for t in texts[len(held):]:
        seen |= grams(t)
    return {r["id"] for r, t in zip(held, texts) if not (grams(t) & seen)}


def prompt_set_states(model_path: str, name: str, num: int, max_tokens: int, dtype: str,
                      folder: Path) -> list[Path]:
    """States shards of the target's greedy answers to the first ``num`` bench prompts of
    ``name`` (``load_prompts``, the test split, as ``tools/bench.py`` builds them), answered
    one at a time with transformers in ``dtype``; cached (resumable) in ``folder``."""
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vllm_selfspec.builders.datasets import load_prompts
    from vllm_selfspec.offline.chimera_data import collect_states, read_records

    folder.mkdir(parents=True, exist_ok=True)
    answers = folder / "answers.jsonl"
    done = read_records(answers)
    tok = AutoTokenizer.from_pretrained(model_path)
    todo = load_prompts(name, tok, "test", num)[len(done):]
    if todo:
        torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype).eval()
        with torch.inference_mode(), answers.open("a") as f:
            for pr in tqdm(todo, desc=f"{name}: answers", unit="prompt"):
                x = torch.tensor([pr.token_ids])
                g = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                   max_new_tokens=max_tokens,
                                   pad_token_id=tok.eos_token_id)[0, x.shape[1]:].tolist()
                f.write(json.dumps({"id": pr.id, "prompt": pr.token_ids, "response": g}) + "\n")
        done = read_records(answers)
    return collect_states(model_path, done, folder / "states")


def held_out_figures(model: Any, work: Path, index_file: Path, costs: tuple[float, float]
                     ) -> dict[str, Any]:
    """Table 5, the speedup table and the held-out sets' figures of a corpus folder (its
    ``states-heldout``; ``held_out_unseen``: the answers to prompts unlike every training one)."""
    import torch

    from vllm_selfspec.offline.chimera_data import read_records
    from vllm_selfspec.offline.corpus import HELD_OUT_FILE, TRAIN_FILE
    from vllm_selfspec.offline.train_chimera import Sequences

    index = json.loads(index_file.read_text())
    shards = [index_file.parent / s["file"] for s in index["shards"]]
    with torch.no_grad():
        whole, table5, (correct, conf) = summary(model, Sequences.load(shards), *costs)
    whole.pop("path_steps_by_heads")
    rows = speedup_table(correct, conf, *costs)
    best = max(rows, key=lambda r: r["speedup"])
    out = {"table5": table5, "chains": whole["chains"], "expected": rows, "best": best,
           "sets": {"held_out": whole}}
    print("Table 5 (held-out, top-1..5 per head):")
    for i, r in enumerate(table5["top_k"]):
        print(f"  head {i}: " + " ".join(f"{x:.3f}" for x in r))
    print(f"best expected: {best}")
    held_recs, train_recs = read_records(work / HELD_OUT_FILE), read_records(work / TRAIN_FILE)
    if held_recs and train_recs:
        unseen = unseen_ids(held_recs, train_recs)
        if unseen:
            with torch.no_grad():
                s = summary(model, Sequences.load(shards, keep=unseen), *costs)[0]
            s.pop("path_steps_by_heads")
            out["sets"]["held_out_unseen"] = {**s, "records": len(unseen), "of": len(held_recs)}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--corpus", "--work", dest="work", default=None,
                   help="the corpus folder with the held-out states (default CKPT.work; "
                        "without one, only the --prompts sets are measured)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--draft-cost", type=float, default=0.08,
                   help="decode steps per draft token (tools/draft_cost.py)")
    p.add_argument("--verify-cost", type=float, default=0.031,
                   help="decode steps per extra verified token")
    p.add_argument("--json", dest="json_out", default=None)
    p.add_argument("--prompts", default="",
                   help="comma-separated bench prompt sets (mtbench, humaneval, ...) to measure "
                        "the heads on besides the held-out split")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--answer-dtype", choices=("float32", "bfloat16"), default="float32",
                   help="the target's dtype while it answers --prompts (the bench checks float32)")
    p.add_argument("--draft-vocab", type=int, default=0,
                   help="widen the checkpoint's draft vocabulary to this many tokens (its own "
                        "first, then the corpus's most frequent answer tokens) before measuring")
    p.add_argument("--heads", type=int, default=0,
                   help="measure chains of this many heads, the checkpoint's last head "
                        "repeated for the heads it lacks (no training)")
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "vllm-selfspec" / "chimera-eval"),
                   help="where the answers and states of --prompts are kept (per model)")
    args = p.parse_args(argv)

    import torch

    from vllm_selfspec.assets import resolve_model
    from vllm_selfspec.model_info import stamp_from_path
    from vllm_selfspec.offline.chimera_data import read_records, token_counts
    from vllm_selfspec.offline.corpus import TRAIN_FILE
    from vllm_selfspec.offline.train_chimera import Sequences, _shard_ids, _target_state
    from vllm_selfspec.proposers.chimera import load_checkpoint

    model_path = resolve_model(args.model)
    stamp = stamp_from_path(model_path)
    ckpt = Path(args.checkpoint)
    work = Path(args.work) if args.work else ckpt.with_name(ckpt.name + ".work")
    model = load_checkpoint(ckpt, stamp)
    if args.draft_vocab > model.cfg.draft_vocab_size:
        counts = token_counts(read_records(work / TRAIN_FILE), model.cfg.vocab_size)
        if not counts.any():
            raise SystemExit(f"--draft-vocab: no training answers in {work} to count tokens "
                             "from; give the corpus with --corpus")
        model.set_draft_vocab(model.vocab.extended(counts, args.draft_vocab))
    model = model.with_heads(args.heads)
    state = _target_state(model_path)
    embed = state["model.embed_tokens.weight"]
    model.bind_target(embed, state.get("lm_head.weight", embed))
    costs = (args.draft_cost, args.verify_cost)
    report: dict[str, Any] = {"checkpoint": str(ckpt), "draft_vocab": model.cfg.draft_vocab_size,
                              "heads": model.cfg.num_heads, "draft_cost": args.draft_cost,
                              "verify_cost": args.verify_cost, "sets": {}}
    held_index = work / "states-heldout" / "index.json"
    prompt_names = [x for x in args.prompts.split(",") if x]
    if held_index.exists():
        report.update(held_out_figures(model, work, held_index, costs))
    elif not prompt_names:
        raise SystemExit(f"no held-out states in {work}: give a corpus made with "
                         "tools/corpus.py --states (--corpus) or bench prompt sets (--prompts)")
    cache = Path(args.cache) / (stamp.fingerprint or Path(model_path).name)
    for name in prompt_names:
        folder = cache / f"{name}-{args.num_prompts}x{args.max_tokens}-{args.answer_dtype}"
        set_shards = prompt_set_states(model_path, name, args.num_prompts, args.max_tokens,
                                       args.answer_dtype, folder)
        with torch.no_grad():
            s = summary(model, Sequences.load(set_shards), *costs)[0]
        ids = [i for shard in set_shards for i in _shard_ids(shard)]
        per = {}
        for i, by_k in zip(ids, s.pop("path_steps_by_heads")):
            means = [round(float(np.mean(x)), 4) if x else 1.0 for x in by_k]
            per[i] = {"steps": len(by_k[-1]), "tokens_per_step_path": means[-1],
                      "steps_by_heads": [len(x) for x in by_k],
                      "tokens_per_step_path_by_heads": means}
        # in the bench's order (it warms up on the first prompt and times the next ones)
        s["per_prompt"] = {r["id"]: per[r["id"]] for r in read_records(folder / "answers.jsonl")
                           if r["id"] in per}
        s["tokens_per_step_path_timed_by_heads"] = timed_path(list(s["per_prompt"].values()))
        report["sets"][name] = {**s, "answer_dtype": args.answer_dtype}
    for name, s in report["sets"].items():
        print(f"{name}: {s['positions']} positions, top-1 per head "
              + " ".join(f"{x:.3f}" for x in s["top1"])
              + f", expected tokens per step {s['tokens_per_step']:.2f}"
              + f" (along the drafter's path {s['tokens_per_step_path']:.2f}; with 1..K heads "
              + " ".join(f"{x:.2f}" for x in s["tokens_per_step_path_by_heads"]) + ")")
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
