"""What a layer-skip draft token costs on a GPU: eager, CUDA graph and compiled passes.

``tools/draft_cost.py`` times the draft pass inside a vLLM engine, which this project can
run only on CPU (the GPU machines it borrows have no vLLM). This tool times the same walk
through transformers (``offline.hf_target.HFTarget.draft_hidden``: the sub-layers a mask
keeps, one query token over the full model's cached K/V, final norm, LM head, argmax) on
any device, in four passes:

* ``eager``: every operation launched from Python, as the plugin's draft pass runs today;
* ``graph``: the eager pass captured once per mask in a CUDA graph and replayed
  (what vLLM does with its target on GPU; CUDA only);
* ``compiled``: ``torch.compile`` (inductor) of the walk, once per mask;
* ``compiled-graph``: the compiled walk captured in a CUDA graph (vLLM's GPU default for
  its target: compiled, then graphed; CUDA only).

The reference "decode step" is the full walk (nothing skipped, full head, one token) in the
cheapest pass timed, i.e. ``compiled-graph`` on a GPU. Every ratio is a draft token over
that step. Variants are timed interleaved in rounds (median of rounds). Weights can be drawn
at random from ``config.json`` (``--random-weights``): timing does not depend on them, and a
GPU machine then needs no model files. Writes the same "fit" / "cost_model" blocks as
``tools/draft_cost.py`` per variant, a JSON file and a plot.

    python tools/draft_cost_hf.py --model CONFIG_DIR --random-weights --device cuda \\
        --dtype bfloat16 --json results/gpu/draft-cost-smollm2.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
import types
from pathlib import Path
from typing import Any, Callable

import torch

PASSES = ("eager", "graph", "compiled", "compiled-graph")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="alias or model folder")
    p.add_argument("--random-weights", action="store_true",
                   help="build the model from config.json with random weights (timing only)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--fractions", default="1,0.5,0.25", help="kept fractions f (uniform masks)")
    p.add_argument("--kind-masks", action=argparse.BooleanOptionalAction, default=True,
                   help="also time 'no inner attention' and 'no inner MLP' (the cost model's split)")
    p.add_argument("--context", type=int, default=512, help="tokens of cached K/V")
    p.add_argument("--verify", type=int, default=8,
                   help="drafts verified at once, for the cost of one more verified token")
    p.add_argument("--draft-vocab", default="0,8192",
                   help="comma list of LM-head sizes N (0: the full head)")
    p.add_argument("--draft-weights", default="full",
                   help="comma list of key draft_weights values (full, int8, int4): the walk's "
                        "linear layers and head through low-bit copies (proposers.low_bit)")
    p.add_argument("--passes", default=None,
                   help=f"comma list of {', '.join(PASSES)} (default: every one the device has)")
    p.add_argument("--repeats", type=int, default=50, help="calls per timing")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median)")
    p.add_argument("--json", dest="json_out", default=None)
    p.add_argument("--plot", default=None, help="PNG path (default: next to --json)")
    p.add_argument("--replot", default=None, metavar="JSON",
                   help="only redraw the plot of a saved report (to --plot, or next to it)")
    return p.parse_args(argv)


def draw_report(report: dict[str, Any], path: str) -> None:
    """Draft token / decode step against the kept fraction, per pass and head, log scale
    (the passes span two orders of magnitude on a GPU)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4))
    for i, (name, d) in enumerate(report["by_variant"].items()):
        pts = sorted((r["kept_fraction"], r["ratio_to_decode_step"]) for r in report["rows"]
                     if r["draft_pass"] == d["draft_pass"] and r["draft_vocab"] == d["draft_vocab"]
                     and r.get("draft_weights", "full") == d.get("draft_weights", "full")
                     and r["mask"].startswith("kept"))
        a, b = d["fit"]["slope"], d["fit"]["overhead"]
        ax.plot(*zip(*pts), "o-" if d["draft_vocab"] == 0 else "s--", color=f"C{i // 2}",
                label=f"{name}: {a:.2f}·f {'+' if b >= 0 else '−'} {abs(b):.2f}")
    ax.plot([0.25, 1], [0.31, 1.06], ":", color="grey", label="goal 1.0·f + 0.06")
    ax.set_yscale("log")
    ax.set_xlabel("kept fraction f of the 2L sub-layers")
    ax.set_ylabel("draft token / decode step")
    ax.set_title(f"{report['architecture']}, {report['device']}, {report['config']['dtype']}",
                 fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _walk(target: Any, prep: Any, mask: Any, pos: torch.Tensor) -> torch.Tensor:
    """The draft pass's sub-layer walk and final norm (``HFTarget.draft_hidden``)."""
    return target.draft_hidden(prep, mask, pos)


def _head(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The LM head's rows ``w`` (all, or a draft vocabulary's) and the draft's argmax."""
    return (h @ w.t()).argmax(-1)


def graphed(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` captured in a CUDA graph (warmed on a side stream first); returns replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def seconds_per_call(fn: Callable[[], Any], repeats: int, cuda: bool) -> float:
    """Mean seconds of ``repeats`` back-to-back calls (CUDA events on a GPU)."""
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0 / repeats
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.replot:
        report = json.loads(Path(args.replot).read_text())
        draw_report(report, args.plot or str(Path(args.replot).with_suffix(".png")))
        return report
    from tqdm import tqdm

    from vllm_selfspec.assets import resolve_model
    from vllm_selfspec.offline.draft_cost import fit_cost_model, fit_line, mask_for_fraction
    from vllm_selfspec.offline.hf_target import HFTarget
    from vllm_selfspec.proposers.low_bit import low_bit_forms
    from vllm_selfspec.proposers.skip_mask import SkipMask

    cuda = torch.device(args.device).type == "cuda"
    passes = args.passes.split(",") if args.passes else [
        p for p in PASSES if cuda or "graph" not in p]
    bad = [p for p in passes if p not in PASSES or ("graph" in p and not cuda)]
    if bad:
        raise SystemExit(f"--passes {','.join(bad)}: not a pass on {args.device} "
                         f"(passes: {', '.join(PASSES)}; graph passes need CUDA)")
    for name in ("recompile_limit", "cache_size_limit"):  # one compile per mask and shape
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 256)
    dtype = getattr(torch, args.dtype)
    t0 = time.perf_counter()
    target = HFTarget(resolve_model(args.model), dtype=dtype, device=args.device,
                      random_weights=args.random_weights)
    nl = target.num_layers
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, target.vocab_size, (args.context + 1,), generator=gen).tolist()
    with torch.inference_mode():
        prep = target.prepare(ids[:-1], ids[-1:])
    last = args.context  # the query position: attends to every cached key
    one = torch.tensor([last], device=target.device)
    span = torch.arange(last - args.verify, last + 1, device=target.device)
    head = target.model.lm_head.weight
    vocabs = [int(x) for x in args.draft_vocab.split(",")]
    # The N rows of a draft vocabulary, as one contiguous matrix (the engine gathers
    # the N most frequent tokens' rows; which rows does not change the time).
    heads = {n: (head if n == 0 else head[:n].contiguous()) for n in vocabs}

    inner = list(range(1, nl - 1))
    masks = [(f"kept {f:g}", mask_for_fraction(nl, f)) for f in map(float, args.fractions.split(","))]
    if args.kind_masks:
        masks += [("no inner attention", {"attention": inner, "mlp": []}),
                  ("no inner MLP", {"attention": [], "mlp": inner})]
    if not any(m["attention"] == [] and m["mlp"] == [] for _, m in masks):
        masks.insert(0, ("kept 1", {"attention": [], "mlp": []}))

    compiled: dict[tuple[Any, ...], Callable[..., Any]] = {}

    def compiled_of(fn: Callable[..., Any], key: tuple[Any, ...]) -> Callable[..., Any]:
        """``fn`` compiled once per key, with a code object of its own, so Dynamo caches
        each graph apart (as ``adapters.compiled_run``); shared by both compiled passes."""
        if key not in compiled:
            code = fn.__code__.replace(co_name=f"{fn.__name__}_{len(compiled)}")
            compiled[key] = torch.compile(types.FunctionType(code, fn.__globals__), dynamic=False)
        return compiled[key]

    weights = [x.strip() for x in args.draft_weights.split(",") if x.strip()]
    copies = {wt: ({} if wt == "full" else target.low_bit_copies(wt)) for wt in weights}
    low_heads = {(wt, n): low_bit_forms(heads[n], [wt]).get(wt)
                 for wt in weights if wt != "full" for n in vocabs}

    def build(pass_: str, mask: SkipMask, n: int, pos: torch.Tensor, wt: str = "full"
              ) -> Callable[[], Any]:
        w, t = heads[n], int(pos.numel())
        lin = low_heads.get((wt, n))
        head_of = (lambda h, w: lin(h).argmax(-1)) if lin is not None else _head
        swap = (lambda: target.draft_weights(copies[wt])) if copies.get(wt) else \
            contextlib.nullcontext
        if pass_.startswith("compiled"):  # the walk per mask, the head per size: two graphs
            with swap():
                body = compiled_of(_walk, ("walk", mask.attention, mask.mlp, t, wt))
                head = compiled_of(head_of, ("head", n, t, wt))
                inner: Callable[[], Any] = lambda: head(body(target, prep, mask, pos), w)  # noqa: E731
                inner()  # compile now, not inside a timing
        else:
            inner = lambda: head_of(_walk(target, prep, mask, pos), w)  # noqa: E731

        def fn() -> Any:
            with swap():
                return inner()

        if pass_.endswith("graph"):
            with swap():
                return graphed(inner)
        return fn

    # (label, mask, vocab, T) -> pass -> callable; compile/capture time is kept apart
    cases: list[tuple[str, dict[str, list[int]], int, int, str]] = [
        (label, m, n, 1, wt) for wt in weights for label, m in masks for n in vocabs]
    cases.append(("kept 1", {"attention": [], "mlp": []}, 0, args.verify + 1, "full"))
    fns: dict[tuple[int, str], Callable[[], Any]] = {}
    build_s: dict[str, float] = {p: 0.0 for p in passes}
    errors: dict[str, str] = {}
    with torch.inference_mode():
        for i, (label, m, n, t, wt) in enumerate(tqdm(cases, desc="build passes")):
            sm = SkipMask(frozenset(m["attention"]), frozenset(m["mlp"]))
            for p in passes:
                b0 = time.perf_counter()
                try:
                    fns[(i, p)] = build(p, sm, n, one if t == 1 else span, wt)
                except Exception as e:  # noqa: BLE001 - a pass that fails is reported, not fatal
                    errors[f"{label}, vocab {n}, T={t}, {wt}, {p}"] = \
                        f"{type(e).__name__}: {e}"[:300]
                build_s[p] += time.perf_counter() - b0
        if cuda:
            torch.cuda.synchronize()
        for fn in fns.values():  # warm every variant once more
            fn()
        samples: dict[tuple[int, str], list[float]] = {k: [] for k in fns}
        for _ in tqdm(range(args.rounds), desc="timing rounds"):
            for k, fn in fns.items():
                samples[k].append(seconds_per_call(fn, args.repeats, cuda))
    secs = {k: statistics.median(v) for k, v in samples.items()}

    def full_s(p: str, t: int = 1) -> float | None:
        i = next(j for j, c in enumerate(cases) if c[2] == 0 and c[3] == t and c[4] == "full"
                 and not c[1]["attention"] and not c[1]["mlp"])
        return secs.get((i, p))

    ref_pass = next((p for p in reversed(PASSES) if p in passes and full_s(p)), None)
    if ref_pass is None:
        raise SystemExit(f"no pass timed the full model; errors: {errors}")
    ref = full_s(ref_pass)
    rows = []
    for (i, p), s in secs.items():
        label, m, n, t, wt = cases[i]
        if t != 1:
            continue
        kept = 1.0 - (len(m["attention"]) + len(m["mlp"])) / (2 * nl)
        rows.append({"mask": label, "draft_pass": p, "draft_vocab": n, "draft_weights": wt,
                     "kept_fraction": round(kept, 4), "skipped_attention": len(m["attention"]),
                     "skipped_mlp": len(m["mlp"]), "draft_token_s": s,
                     "ratio_to_decode_step": s / ref})
    by_variant: dict[str, Any] = {}
    for p in passes:
        t1, tk = full_s(p), full_s(p, args.verify + 1)
        v = (tk - t1) / (args.verify * ref) if t1 and tk else 0.0
        for wt, n in ((wt, n) for wt in weights for n in vocabs):
            mine = [r for r in rows if r["draft_pass"] == p and r["draft_vocab"] == n
                    and r["draft_weights"] == wt]
            uni = [r for r in mine if r["mask"].startswith("kept")]
            if len(uni) < 2:
                continue
            a, b = fit_line([r["kept_fraction"] for r in uni],
                            [r["ratio_to_decode_step"] for r in uni])
            name = (f"{p}, " + ("" if wt == "full" else f"{wt} weights, ")
                    + ("full head" if n == 0 else f"draft vocabulary {n}"))
            by_variant[name] = {
                "draft_pass": p, "draft_vocab": n, "draft_weights": wt,
                "fit": {"slope": a, "overhead": b, "formula": f"cost/decode ≈ {a:.3f}·f + {b:.3f}"},
                "cost_model": fit_cost_model(mine, nl, v) if len(mine) >= 3 else None,
                "uniform_rows": uni}
    report = {
        "config": vars(args), "architecture": target.architecture, "num_layers": nl,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__, "reference_pass": ref_pass, "decode_step_s": ref,
        "full_model_s": {p: {"1": full_s(p), str(args.verify + 1): full_s(p, args.verify + 1)}
                         for p in passes},
        "build_s": build_s, "errors": errors, "rows": rows,
        "by_variant": {k: {x: y for x, y in d.items() if x != "uniform_rows"}
                       for k, d in by_variant.items()},
        "wall_s": time.perf_counter() - t0}
    print(f"{target.architecture} on {report['device']}, {args.dtype}, {args.context} cached tokens; "
          f"decode step ({ref_pass}, full model): {1e3 * ref:.3f} ms")
    for p in passes:
        f1, fk = report["full_model_s"][p]["1"], report["full_model_s"][p][str(args.verify + 1)]
        if f1:
            print(f"  full model, {p}: {1e3 * f1:.3f} ms"
                  + (f"; {args.verify + 1} tokens {1e3 * fk:.3f} ms" if fk else ""))
    print("mask                 weights vocab  pass            kept f  draft ms  / decode step")
    for r in sorted(rows, key=lambda r: (r["mask"], r["draft_weights"], r["draft_vocab"],
                                         PASSES.index(r["draft_pass"]))):
        print(f"{r['mask']:<20} {r['draft_weights']:<7} {r['draft_vocab'] or 'full'!s:<6} "
              f"{r['draft_pass']:<15} "
              f"{r['kept_fraction']:.3f}  {1e3 * r['draft_token_s']:8.3f}  {r['ratio_to_decode_step']:.3f}")
    for name, d in by_variant.items():
        print(f"{name}: {d['fit']['formula']}")
    for k, e in errors.items():
        print(f"failed: {k}: {e}")
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
        plot = args.plot or str(Path(args.json_out).with_suffix(".png"))
        draw_report(report, plot)
        print(f"wrote {args.json_out} and {plot}")
    return report


if __name__ == "__main__":
    main()
