"""Search a skip mask for a model (Draft & Verify §3.3): Bayesian optimization over 2L bits.

    python tools/search_mask.py --model smollm2-135m --dataset mtbench --num-prompts 8 \\
        --iterations 200 --objective proxy --out MASK.json

Writes MASK.json ({"attention": [...], "mlp": [...], "metadata": {...}}: loadable by
``{"method": "selfspec", "skip_mask": "MASK.json"}``, stamped with the model it was
made for), a trials log MASK.trials.jsonl (``--resume`` continues it), and plots
MASK.objective.png (objective per iteration) and MASK.layout.png (which sub-layers
are skipped, like the paper's Figure 6). ``--install`` also caches the mask where
``selfspec`` finds it when no skip_mask is given.

The mask written is the best one that skips something (the empty mask drafts with the
whole model). When none is expected to beat plain decoding on this machine, one line
says so with the best expected speedup; the metadata holds it (``expected_speedup``,
``beats_plain_decoding``, and the best trial overall, empty or not).

Objectives: ``proxy`` (teacher-forced, one masked pass per candidate, a measured
cost model; needs only torch + transformers) and ``measured`` (the paper's: wall
time per token of selfspec decoding inside one vLLM engine). Dev prompts come
from the dataset's dev split; evaluation (tools/bench.py) uses the test split.
``--ray`` evaluates batches of suggestions in parallel on a Ray cluster (each
worker holds its own model); without it nothing imports Ray.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    from vllm_selfspec.offline.dev_set import add_dev_set_args

    add_dev_set_args(p)
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--objective", choices=["proxy", "measured"], default="proxy")
    p.add_argument("--out", required=True, help="mask JSON to write")
    p.add_argument("--task", default=None, help="label for the mask (metadata and cache name)")
    p.add_argument("--skip-budget", type=int, default=None,
                   help="skip exactly N sub-layers (the N largest variables) instead of z > 0.5")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue the trials log of --out")
    p.add_argument("--probe", action="append", default=[], metavar="MASK.json",
                   help="known masks to evaluate first (default: uniform masks)")
    p.add_argument("--k", type=int, default=12, help="num_speculative_tokens (selfspec default)")
    p.add_argument("--cost-model", default=None,
                   help="JSON cost model for the proxy (default: measured now with the proxy passes)")
    p.add_argument("--step-table", default=None, metavar="BENCH.json[:METHOD]",
                   help="price verification with the step table a tools/bench.py run measured "
                        "(default: linear in the drafts)")
    p.add_argument("--draft-weights", default="full",
                   help="key draft_weights of the pass the mask is searched for (full, int8, "
                        "w8a8, int4): the proxy scores and times it through low-bit copies, the "
                        "measured objective runs it. With low-bit weights the empty mask (every "
                        "sub-layer kept) may be the best, and is written if so")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu", help="proxy objective device (cpu, cuda)")
    p.add_argument("--enforce-eager", action="store_true", help="measured objective: no compile")
    p.add_argument("--ray", action="store_true", help="evaluate candidates on a Ray cluster")
    p.add_argument("--ray-address", default=None, help="cluster address (default: start locally)")
    p.add_argument("--ray-workers", type=int, default=2)
    p.add_argument("--ray-cpus-per-worker", type=float, default=1.0)
    p.add_argument("--install", action="store_true",
                   help="also cache the mask as this model's default for selfspec")
    return p.parse_args(argv)


def build_objective(args: argparse.Namespace, model_path: str, progress: Any = None) -> Any:
    """Construct the objective (in this process or inside a Ray worker)."""
    from transformers import AutoTokenizer

    from vllm_selfspec.offline.dev_set import load_dev_set
    from vllm_selfspec.offline.objectives import MeasuredObjective, ProxyObjective, read_cost_model
    from vllm_selfspec.proposers.draft_exit import DraftExitConfig

    tok = AutoTokenizer.from_pretrained(model_path)
    dev = load_dev_set(args["dataset"], tok, args["num_prompts"])
    exit_cfg = DraftExitConfig()
    if args["objective"] == "proxy":
        cost, table = read_cost_model(args.get("cost_model"), args.get("step_table"))
        cont = Path(args["out"]).with_suffix(".continuations.json")
        return ProxyObjective(model_path, dev, args["max_tokens"], args["k"], exit_cfg, cost,
                              continuations_path=cont, device=args["device"],
                              progress=progress or (lambda x: x), step_table=table,
                              draft_weights=args.get("draft_weights", "full"))
    return MeasuredObjective(model_path, dev, args["max_tokens"], args["k"], exit_cfg,
                             dtype=args["dtype"], enforce_eager=args["enforce_eager"],
                             draft_weights=args.get("draft_weights", "full"))


def ray_evaluator(args: argparse.Namespace, model_path: str) -> Any:
    import ray  # only with --ray

    if not ray.is_initialized():
        ray.init(address=args.ray_address, ignore_reinit_error=True, log_to_driver=False)

    @ray.remote(num_cpus=args.ray_cpus_per_worker)
    class Worker:
        def __init__(self, a: dict[str, Any], path: str) -> None:
            import torch

            torch.set_num_threads(max(1, int(a.get("_threads", 1))))
            from vllm_selfspec.offline.search_mask import build_objective as build

            self.obj = build(a, path)

        def evaluate(self, mask_json: dict[str, Any]) -> dict[str, Any]:
            from vllm_selfspec.proposers.skip_mask import SkipMask

            m = SkipMask(frozenset(mask_json["attention"]), frozenset(mask_json["mlp"]))
            return self.obj.evaluate(m)

        def describe(self) -> dict[str, Any]:
            return self.obj.describe()

    a = {**vars(args), "_threads": max(1, int(args.ray_cpus_per_worker))}
    workers = [Worker.remote(a, model_path) for _ in range(args.ray_workers)]

    def evaluate_batch(masks: list[Any]) -> list[dict[str, Any]]:
        futures = [workers[i % len(workers)].evaluate.remote(m.to_json()) for i, m in enumerate(masks)]
        return ray.get(futures)

    return evaluate_batch, (lambda: ray.get(workers[0].describe.remote())), workers


def draw_objective(trials: list[dict[str, Any]], path: Path, objective: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [t["iteration"] for t in trials]
    ys = [t["value"] for t in trials]
    best, run = [], float("-inf")
    for y in ys:
        run = max(run, y)
        best.append(run)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.scatter(xs, ys, s=8, alpha=0.6, label="trial")
    ax.plot(xs, best, color="C1", label="best so far")
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("iteration")
    ax.set_ylabel(f"speedup ({objective} objective)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def draw_layout(mask: Any, num_layers: int, path: Path, title: str) -> None:
    """Figure 6 of the paper: gray kept, red skipped attention, blue skipped MLP."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    fig, ax = plt.subplots(figsize=(max(6, num_layers * 0.28), 1.9))
    for i in range(num_layers):
        ax.add_patch(Rectangle((i, 1), 0.9, 0.9, color="#d62728" if i in mask.attention else "#cccccc"))
        ax.add_patch(Rectangle((i, 0), 0.9, 0.9, color="#1f77b4" if i in mask.mlp else "#cccccc"))
    ax.set_xlim(0, num_layers)
    ax.set_ylim(0, 2)
    ax.set_yticks([0.45, 1.45], ["MLP", "attention"])
    ax.set_xticks([i + 0.45 for i in range(0, num_layers, 5)], [str(i) for i in range(0, num_layers, 5)])
    ax.set_xlabel("layer")
    ax.set_title(title, fontsize=9)
    for s in ax.spines.values():
        s.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def choose_mask(trials: list[dict[str, Any]], allow_empty: bool = False
                ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The mask to write: the best trial that skips something (with full draft weights an
    empty mask drafts with the whole model, which never pays; ``allow_empty``: with low-bit
    draft weights it may be the best), and the verdict on it. Returns (trial or None
    when every trial was empty, verdict: ``expected_speedup``, ``beats_plain_decoding``
    and ``best_overall``, the best trial's value, empty or not)."""
    from vllm_selfspec.offline.search import best_trial

    best = best_trial(trials)
    skipping = [t for t in trials if t["attention"] or t["mlp"] or allow_empty]
    chosen = best_trial(skipping) if skipping else None
    value = float(chosen["value"]) if chosen else float("nan")
    return chosen, {"expected_speedup": value,
                    "beats_plain_decoding": bool(chosen) and value > 1.0,
                    "best_overall": float(best["value"]),
                    "best_overall_is_empty": not (best["attention"] or best["mlp"])}


def verdict_line(verdict: dict[str, Any], objective: str) -> str | None:
    """One line when no mask is expected to beat plain decoding here, else None."""
    if verdict["beats_plain_decoding"]:
        return None
    return (f"no skip mask is expected to beat plain decoding on this machine ({objective} "
            f"objective): best expected speedup {verdict['expected_speedup']:.3f}x for a mask "
            f"that skips something (plain decoding: 1.000x); writing that mask with the figure "
            f"in its metadata (expected_speedup)")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    from tqdm import tqdm

    import vllm_selfspec
    from vllm_selfspec.assets import resolve_model
    from vllm_selfspec.offline.search import (
        TOOL_VERSION,
        SearchConfig,
        default_probes,
        search,
    )
    from vllm_selfspec.proposers.skip_mask import SkipMask, parse_mask, save_mask

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log_path = out.with_suffix(".trials.jsonl")
    if log_path.exists() and not args.resume:
        raise SystemExit(f"{log_path} exists: pass --resume to continue it, or choose another --out")
    model_path = resolve_model(args.model)
    t0 = time.time()

    from vllm_selfspec.model_info import stamp_from_path

    stamp = stamp_from_path(model_path)  # config + three small tensors, no model load
    num_layers = stamp.num_layers
    if args.ray:
        evaluate_batch, describe, _workers = ray_evaluator(args, model_path)
        batch = args.ray_workers
    else:
        obj = build_objective(vars(args), model_path,
                              progress=lambda xs: tqdm(xs, desc="full-model continuations"))
        if stamp.fingerprint is None and args.objective == "proxy":
            stamp = obj.target.stamp()  # hub model: fingerprint from the loaded weights

        def evaluate_batch(masks: list[SkipMask]) -> list[dict[str, Any]]:
            return [obj.evaluate(m) for m in masks]

        describe = obj.describe
        batch = 1
    probes = [parse_mask(p, num_layers) for p in args.probe] or default_probes(num_layers,
                                                                               args.skip_budget)
    if args.skip_budget is not None:
        probes = [m for m in probes if m.num_skipped == args.skip_budget]
    cfg = SearchConfig(num_layers=num_layers, iterations=args.iterations, seed=args.seed,
                       budget=args.skip_budget, batch=batch)
    setup_s = time.time() - t0
    t1 = time.time()
    trials = search(cfg, evaluate_batch, log_path, probes,
                    progress=lambda **kw: tqdm(desc=f"{args.objective} search", unit="trial", **kw))
    search_s = time.time() - t1
    best, verdict = choose_mask(trials, allow_empty=args.draft_weights != "full")
    if best is None:  # every trial skipped nothing: price the uniform mask once
        from vllm_selfspec.proposers.skip_mask import uniform_mask

        m = uniform_mask(num_layers, 0.15)
        if not m.num_skipped:
            m = SkipMask(frozenset({num_layers // 2}), frozenset())
        r = evaluate_batch([m])[0]
        best = {**r, "iteration": len(trials), "attention": sorted(m.attention),
                "mlp": sorted(m.mlp)}
        verdict.update(expected_speedup=float(r["value"]),
                       beats_plain_decoding=float(r["value"]) > 1.0)
    mask = SkipMask(frozenset(best["attention"]), frozenset(best["mlp"]))
    details = {k: v for k, v in best.items()
               if k not in ("z", "attention", "mlp", "mask_key", "cached", "time")}
    fresh = sum(1 for t in trials if not t.get("cached"))
    meta = {
        "model": stamp.to_json(), "objective": args.objective, "value": best["value"],
        "expected_speedup": verdict["expected_speedup"],
        "beats_plain_decoding": verdict["beats_plain_decoding"],
        "best_overall_value": verdict["best_overall"],
        "best_overall_is_empty": verdict["best_overall_is_empty"],
        "best": details, "iterations": len(trials), "evaluated": fresh,
        "dev_set": {"dataset": args.dataset, "split": "dev", "num_prompts": args.num_prompts,
                    "max_tokens": args.max_tokens},
        "task": args.task or args.dataset, "skip_budget": args.skip_budget, "seed": args.seed,
        "draft_weights": args.draft_weights,
        "search": describe(), "setup_seconds": round(setup_s, 1),
        "search_seconds_this_run": round(search_s, 1),
        "tool": "tools/search_mask.py", "tool_version": TOOL_VERSION,
        "vllm_selfspec": vllm_selfspec.__version__,
    }
    result = SkipMask(mask.attention, mask.mlp, metadata=meta, source=str(out))
    save_mask(result, out)
    draw_objective(trials, out.with_suffix(".objective.png"), args.objective)
    draw_layout(mask, num_layers, out.with_suffix(".layout.png"),
                f"{stamp.name}: skip {len(mask.attention)} attention + {len(mask.mlp)} MLP "
                f"({args.objective}, {best['value']:.3f}x)")
    line = verdict_line(verdict, args.objective)
    if line:
        print(line)
    print(f"best: {mask.describe()} -> {best['value']:.3f}x ({args.objective}); wrote {out}")
    if args.install:
        from vllm_selfspec.proposers.artifacts import artifact_path, atomic_path

        dest = artifact_path("masks", stamp)
        if dest is None:
            print("not installed: the model's weights fingerprint is unknown")
        else:
            with atomic_path(dest) as tmp:
                shutil.copyfile(out, tmp)
            print(f"installed as this model's default mask: {dest}")
    return {"mask": result.to_json(), "trials": len(trials)}


if __name__ == "__main__":
    main()
