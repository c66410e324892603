"""What one self-speculative draft token costs, against one plain decode step.

Two engines with the same settings, batch 1:

* baseline: the worker's pure-decode steps are timed (``execute_model`` +
  ``sample_tokens``: input preparation, forward, logits, sampling, bookkeeping);
* selfspec: the draft forwards are timed inside the drafter (attention metadata,
  the kept sub-layers, final norm, LM head), with the draft-exit threshold at 0
  so every step drafts K tokens, for skip masks that keep a fraction f of the 2L
  sub-layers (uniform masks, switched inside one engine).

Reports cost(f) / decode step per f, the least-squares fit cost ≈ a·f + b (b =
fixed overhead per draft token), a JSON file and a PNG plot. Two more masks (all
inner attention skipped, all inner MLP skipped) split the cost per sub-layer kind,
and the verification forwards of K drafts give the cost of verifying one more
token: together the "cost_model" block that tools/search_mask.py --cost-model
reads (vllm_selfspec/proposers/expected_speedup.py: CostModel).

    python tools/draft_cost.py --model smollm2-135m --fractions 1,0.75,0.5,0.25 --json out.json
    python tools/draft_cost.py --draft-vocab 0,4096 --json out.json  # full vs a draft vocabulary
    python tools/draft_cost.py --compile-draft both --json out.json  # eager vs compiled pass
    python tools/draft_cost.py --draft-kernels both --json out.json  # native ops vs kernels
    python tools/draft_cost.py --draft-weights full,w8a8 --json out.json  # key draft_weights

Variants (draft vocabulary x draft pass: eager with vLLM's fused CPU kernels, the engine's
default, ``adapters.DraftKernels``; eager with the native op forms; compiled,
``control.set_compile_walks``) are timed interleaved, prompt by prompt, in one engine;
"fit" and "cost_model" are those of the first draft vocabulary with the last pass
timed (compiled where timed, else the kernels, else native), "by_variant" holds every one.
Each ``--draft-weights`` value (fixed at start-up) gets its own engine, one after the
other; "fit" and "cost_model" are the first value's.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--fractions", default="1,0.75,0.5,0.25",
                   help="kept fractions f of the 2L sub-layers")
    p.add_argument("--dataset", default="mtbench")
    p.add_argument("--num-prompts", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--draft-vocab", default="0",
                   help="comma list of draft vocabulary sizes N (key draft_vocab: draft logits "
                        "over the N most frequent tokens; 0: the full LM head), timed "
                        "interleaved prompt by prompt in one engine; the first one fills "
                        "'fit' and 'cost_model', every one 'by_variant'")
    p.add_argument("--compile-draft", choices=("off", "on", "both"), default="off",
                   help="time the eager draft pass, the compiled one "
                        "(torch.compile per mask; its compile step is not timed) or both")
    p.add_argument("--draft-kernels", choices=("off", "on", "both"), default="on",
                   help="the eager pass with vLLM's fused CPU kernels (on, the engine's "
                        "default), with the native op forms (off), or both")
    p.add_argument("--draft-weights", default="full",
                   help="comma list of key draft_weights values (full, int8, w8a8, int4): one "
                        "engine each, timed one after the other")
    p.add_argument("--json", dest="json_out", default=None)
    p.add_argument("--plot", default=None, help="PNG path (default: next to --json)")
    return p.parse_args(argv)


def mask_for_fraction(num_layers: int, f: float) -> dict[str, Any]:
    from vllm_selfspec.proposers.skip_mask import uniform_mask

    inner = 2 * (num_layers - 2)
    n_skip = round((1.0 - f) * 2 * num_layers)
    if n_skip > inner:
        raise SystemExit(f"f={f} needs {n_skip} skipped sub-layers; at most {inner} "
                         "(the first and last layer are kept)")
    ratio = n_skip / inner
    m = uniform_mask(num_layers, min(ratio, 0.999))
    return {"attention": sorted(m.attention), "mlp": sorted(m.mlp)}


def fit_cost_model(rows: list[dict[str, Any]], num_layers: int, verify_per_token: float
                   ) -> dict[str, float]:
    """Least squares: ratio = fixed + a·kept_attention + m·kept_mlp."""
    import numpy as np

    a = np.array([[1.0, num_layers - r["skipped_attention"], num_layers - r["skipped_mlp"]]
                  for r in rows])
    y = np.array([r["ratio_to_decode_step"] for r in rows])
    (fixed, per_attn, per_mlp), *_ = np.linalg.lstsq(a, y, rcond=None)
    return {"draft_fixed": float(max(fixed, 0.0)), "draft_attention": float(max(per_attn, 0.0)),
            "draft_mlp": float(max(per_mlp, 0.0)), "verify_per_token": float(verify_per_token)}


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0, my
    a = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return a, my - a * mx


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    from tqdm import tqdm
    from transformers import AutoConfig, AutoTokenizer
    from vllm import SamplingParams, TokensPrompt

    from vllm_selfspec import control
    from vllm_selfspec.assets import resolve_model
    from vllm_selfspec.builders.datasets import load_prompts
    from vllm_selfspec.offline import engines

    path = resolve_model(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    num_layers = AutoConfig.from_pretrained(path).num_hidden_layers
    prompts = [TokensPrompt(prompt_token_ids=p.token_ids)
               for p in load_prompts(args.dataset, tok, "test", args.num_prompts + 1, 512)]
    warm, timed = prompts[:1], prompts[1:]
    sp = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    kw = dict(dtype=args.dtype, max_model_len=2048, block_size=32, kv_cache_memory_bytes=1 << 30,
              max_num_seqs=1, enforce_eager=args.enforce_eager, seed=0)
    fractions = [float(x) for x in args.fractions.split(",")]
    vocabs = [int(x) for x in str(args.draft_vocab).split(",")]

    base = engines.start(path, **kw)
    base.generate(warm, sp, use_tqdm=False)
    base.collective_rpc(control.install_step_timer)
    for p in tqdm(timed, desc="baseline decode steps"):
        base.generate([p], sp, use_tqdm=False)
    st = base.collective_rpc(control.step_timer)[0]
    decode_s = st["seconds"] / st["steps"]
    forward_1 = st["forward"].get(1) or st["forward"].get("1")
    engines.shutdown(base)
    del base

    inner = list(range(1, num_layers - 1))
    masks = [(f"kept {f:g}", mask_for_fraction(num_layers, f)) for f in fractions]
    masks += [("no inner attention", {"attention": inner, "mlp": []}),
              ("no inner MLP", {"attention": [], "mlp": inner})]
    modes = {"off": [False], "on": [True], "both": [False, True]}
    passes = ([("native" if not k else "kernels") for k in modes[args.draft_kernels]]
              if False in modes[args.compile_draft] else [])
    passes += ["compiled"] if True in modes[args.compile_draft] else []
    weights = [w.strip() for w in str(args.draft_weights).split(",") if w.strip()]
    variants = [(w, n, c) for w in weights for c in passes for n in vocabs]
    rows = []
    verify_k = None
    for w in weights:
        spec = engines.start(path, speculative_config={
            "method": "selfspec", "num_speculative_tokens": args.k,
            "skip_mask": {"attention": [], "mlp": []}, "cost_gate": False,
            "draft_vocab": max(vocabs), "draft_weights": w}, **kw)
        spec.collective_rpc(control.set_draft_exit, args=(0.0, False))
        spec.generate(warm, sp, use_tqdm=False)
        spec.collective_rpc(control.install_step_timer)
        mine = [(n, c) for ww, n, c in variants if ww == w]
        for label, mask in tqdm(masks, desc=f"draft cost per mask ({w})"):
            spec.collective_rpc(control.set_skip_mask, args=(mask,))
            spec.collective_rpc(control.set_draft_exit, args=(0.0, False))
            for c in passes:  # warm this mask (and compile its walk)
                set_pass(spec, c)
                spec.generate(warm, sp, use_tqdm=False)
            # every variant on the same prompt in turn: machine drift hits them alike
            seconds = {v: 0.0 for v in mine}
            tokens = {v: 0 for v in mine}
            for p in timed:
                for n, c in mine:
                    set_pass(spec, c)
                    spec.collective_rpc(control.set_draft_vocab, args=(n,))
                    spec.collective_rpc(control.reset_stats)
                    spec.generate([p], sp, use_tqdm=False)
                    st_d = spec.collective_rpc(control.drafter_stats)[0]
                    seconds[(n, c)] += st_d["draft_seconds"]
                    tokens[(n, c)] += st_d["draft_rows"]
            kept = 1.0 - (len(mask["attention"]) + len(mask["mlp"])) / (2 * num_layers)
            for n, c in mine:
                per_token = seconds[(n, c)] / tokens[(n, c)]
                rows.append({"mask": label, "draft_weights": w, "draft_vocab": n,
                             "draft_pass": c, "compiled": c == "compiled",
                             "kept_fraction": round(kept, 4),
                             "skipped_attention": len(mask["attention"]),
                             "skipped_mlp": len(mask["mlp"]), "draft_tokens": tokens[(n, c)],
                             "draft_token_s": per_token,
                             "ratio_to_decode_step": per_token / decode_s})
        fwd = spec.collective_rpc(control.step_timer)[0]["forward"]
        engines.shutdown(spec)
        del spec
        verify_k = verify_k or fwd.get(args.k + 1) or fwd.get(str(args.k + 1))
    if not verify_k or not forward_1:
        raise SystemExit(f"no plain steps or no verification steps of {args.k} drafts were timed; "
                         "raise --max-tokens")
    v = (verify_k - forward_1) / (args.k * decode_s)
    by_variant: dict[str, Any] = {}
    for w, n, c in variants:
        mine = [r for r in rows if r["draft_weights"] == w and r["draft_vocab"] == n
                and r["draft_pass"] == c]
        uniform_rows = [r for r in mine if r["mask"].startswith("kept")]
        a, b = fit_line([r["kept_fraction"] for r in uniform_rows],
                        [r["ratio_to_decode_step"] for r in uniform_rows])
        by_variant[variant_name(n, c, w)] = {
            "draft_weights": w, "draft_vocab": n, "draft_pass": c, "compiled": c == "compiled",
            "fit": {"slope": a, "overhead": b, "formula": f"cost/decode ≈ {a:.3f}·f + {b:.3f}"},
            "cost_model": fit_cost_model(mine, num_layers, v), "uniform_rows": uniform_rows}
    first = by_variant[variant_name(vocabs[0], passes[-1], weights[0])]
    report = {"config": vars(args), "decode_step_s": decode_s, "decode_steps": st["steps"],
              "forward_s": {"1": forward_1, str(args.k + 1): verify_k},
              "rows": rows, "fit": first["fit"], "cost_model": first["cost_model"],
              "by_variant": {n: {k: x for k, x in d.items() if k != "uniform_rows"}
                             for n, d in by_variant.items()}}
    print(f"plain decode step (worker): {1000 * decode_s:.1f} ms over {st['steps']} steps")
    print("mask                 weights vocab   pass      kept f   draft token ms   ratio to "
          "decode step")
    for r in rows:
        vocab = r["draft_vocab"] or "full"
        kind = r["draft_pass"]
        print(f"{r['mask']:<20} {r['draft_weights']:<7} {vocab!s:<6}  {kind:<8}  "
              f"{r['kept_fraction']:.3f}    {1000 * r['draft_token_s']:8.1f}         "
              f"{r['ratio_to_decode_step']:.3f}")
    for n, d in by_variant.items():
        print(f"{n}: {d['fit']['formula']}; cost model {json.dumps(d['cost_model'])}")
    print(f"verifying {args.k} drafts: forward {1000 * verify_k:.1f} ms vs "
          f"{1000 * forward_1:.1f} ms for one token -> {v:.3f} decode steps per extra token")
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
        plot = args.plot or str(Path(args.json_out).with_suffix(".png"))
        draw(by_variant, plot)
        print(f"wrote {args.json_out} and {plot}")
    return report


PASS_NAMES = {"native": "eager pass, native ops", "kernels": "eager pass, vLLM kernels",
              "compiled": "compiled pass"}


def set_pass(llm: Any, draft_pass: str) -> None:
    """Switch the engine's draft pass: native / kernels (eager) or compiled."""
    from vllm_selfspec import control

    llm.collective_rpc(control.set_compile_walks, args=(draft_pass == "compiled",))
    llm.collective_rpc(control.set_draft_kernels, args=(draft_pass != "native",))


def variant_name(draft_vocab: int, draft_pass: str, draft_weights: str = "full") -> str:
    vocab = "full vocabulary" if draft_vocab == 0 else f"draft vocabulary {draft_vocab}"
    weights = "" if draft_weights == "full" else f"{draft_weights} weights, "
    return f"{weights}{vocab}, {PASS_NAMES[draft_pass]}"


def draw(by_variant: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    top = 0.0
    for i, (name, d) in enumerate(by_variant.items()):
        xs = [r["kept_fraction"] for r in d["uniform_rows"]]
        ys = [r["ratio_to_decode_step"] for r in d["uniform_rows"]]
        a, b = d["fit"]["slope"], d["fit"]["overhead"]
        ax.plot(xs, ys, "o", color=f"C{i}", label=name)
        ax.plot([0, 1], [b, a + b], "-", color=f"C{i}", label=f"fit {a:.2f}·f + {b:.2f}")
        top = max(top, *ys)
    ax.plot([0, 1], [0, 1], ":", color="grey", label="ideal f")
    ax.set_xlabel("kept fraction f of the 2L sub-layers")
    ax.set_ylabel("draft token / plain decode step")
    ax.set_xlim(0, 1.05)
    ax.set_ylim(0, max(1.35, top + 0.1))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
