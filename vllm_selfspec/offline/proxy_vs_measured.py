"""How well does the proxy objective rank skip masks? Compare it with the measured one.

Evaluates the same masks with both objectives of tools/search_mask.py — the
teacher-forced proxy and the wall-clock measurement inside one vLLM engine — and
reports Spearman's rank correlation, a JSON file and a scatter plot. Masks: the
first/middle/last/random layouts of D&V Table 7 at a few skip counts, uniform
masks, and optionally the best trials of a search log.

    python tools/proxy_vs_measured.py --model smollm2-135m --num-masks 15 --json out.json
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2.0
            i = j + 1
        return r

    rx, ry = ranks(xs), ranks(ys)
    n = len(xs)
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx = sum((a - mx) ** 2 for a in rx) ** 0.5
    vy = sum((b - my) ** 2 for b in ry) ** 0.5
    return cov / (vx * vy) if vx and vy else 0.0


def errors(proxy: list[float], measured: list[float]) -> dict[str, float]:
    """Proxy minus measured speedup: mean and mean absolute."""
    d = [x - y for x, y in zip(proxy, measured)]
    return {"mean_abs_error": sum(map(abs, d)) / len(d), "mean_error": sum(d) / len(d)}


def candidate_masks(num_layers: int, n: int, seed: int, log: str | None) -> dict[str, Any]:
    from vllm_selfspec.offline.search import layout_masks
    from vllm_selfspec.proposers.artifacts import read_jsonl
    from vllm_selfspec.proposers.skip_mask import SkipMask, uniform_mask

    out: dict[str, SkipMask] = {}
    if log:
        trials = sorted(read_jsonl(log), key=lambda t: -t["value"])
        for t in trials[: max(1, n // 4)]:
            out[f"trial{t['iteration']}"] = SkipMask(frozenset(t["attention"]), frozenset(t["mlp"]))
    for r in (0.05, 0.15, 0.3):
        out[f"uniform{r}"] = uniform_mask(num_layers, r)
    rng = random.Random(seed)
    counts = [(4, 2), (8, 4), (12, 8), (2, 2), (6, 3), (10, 6)]
    for rep in range(100):  # layouts of every count first, then more random masks
        for na, nm in counts:
            if len(out) >= n:
                break
            for name, m in layout_masks(num_layers, na, nm, seed=rng.randrange(10**6)).items():
                if rep and name != "random":
                    continue
                out.setdefault(f"{name}{rep or ''}-{na}a{nm}m", m)
                if len(out) >= n:
                    break
    return dict(list(out.items())[:n])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dataset", default="mtbench")
    p.add_argument("--num-prompts", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--num-masks", type=int, default=15)
    p.add_argument("--k", type=int, default=12)
    p.add_argument("--from-log", default=None, help="also take the best trials of this search log")
    p.add_argument("--cost-model", default=None,
                   help="JSON cost model for the proxy (default: measured now with the proxy passes)")
    p.add_argument("--step-table", default=None, metavar="BENCH.json[:METHOD]",
                   help="price verification with a bench run's step table; the linear proxy is "
                        "reported beside it ('proxy_linear')")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", dest="json_out", required=True)
    args = p.parse_args(argv)
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from vllm_selfspec.assets import resolve_model
    from vllm_selfspec.offline.dev_set import load_dev_set
    from vllm_selfspec.offline.objectives import MeasuredObjective, ProxyObjective, read_cost_model
    from vllm_selfspec.proposers.draft_exit import DraftExitConfig

    path = resolve_model(args.model)
    dev = load_dev_set(args.dataset, AutoTokenizer.from_pretrained(path), args.num_prompts)
    exit_cfg = DraftExitConfig()
    cost_in, table = read_cost_model(args.cost_model, args.step_table)
    proxy = ProxyObjective(path, dev, args.max_tokens, args.k, exit_cfg, cost_in, step_table=table)
    linear = replace(proxy.cost, verify_steps=())
    masks = candidate_masks(proxy.num_layers, args.num_masks, args.seed, args.from_log)
    rows = []
    for name, m in tqdm(masks.items(), desc="proxy"):
        priced = proxy.evaluate_priced(m, [proxy.cost, linear] if table else [proxy.cost])
        rows.append({"mask": name, "attention": sorted(m.attention), "mlp": sorted(m.mlp),
                     "proxy": priced[0], **({"proxy_linear": priced[1]} if table else {})})
    cost = proxy.cost.to_json()
    del proxy
    measured = MeasuredObjective(path, dev, args.max_tokens, args.k, exit_cfg,
                                 enforce_eager=args.enforce_eager)
    for row in tqdm(rows, desc="measured"):
        from vllm_selfspec.proposers.skip_mask import SkipMask

        row["measured"] = measured.evaluate(SkipMask(frozenset(row["attention"]),
                                                     frozenset(row["mlp"])))
    measured.close()
    xs = [r["proxy"]["value"] for r in rows]
    ys = [r["measured"]["value"] for r in rows]
    rho = spearman(xs, ys)
    rho_acc = spearman([r["proxy"]["acceptance_rate"] for r in rows],
                       [r["measured"]["acceptance_rate"] for r in rows])
    report = {"config": vars(args), "cost_model": cost, "spearman_speedup": rho,
              "spearman_acceptance_rate": rho_acc, **errors(xs, ys), "rows": rows}
    if table:
        lin = [r["proxy_linear"]["value"] for r in rows]
        report["linear"] = {"spearman_speedup": spearman(lin, ys), **errors(lin, ys)}
    Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
    draw(rows, rho, str(Path(args.json_out).with_suffix(".png")))
    print(f"Spearman rank correlation over {len(rows)} masks: speedup {rho:.3f}, "
          f"acceptance rate {rho_acc:.3f}; proxy − measured: mean {report['mean_error']:+.3f}, "
          f"mean absolute {report['mean_abs_error']:.3f}")
    if table:
        lin_r = report["linear"]
        print(f"  linear verification instead of the step table: Spearman {lin_r['spearman_speedup']:.3f}, "
              f"proxy − measured: mean {lin_r['mean_error']:+.3f}, mean absolute {lin_r['mean_abs_error']:.3f}")
    for r in rows:
        print(f"{r['mask']:>18}  proxy {r['proxy']['value']:.3f}  measured {r['measured']['value']:.3f}"
              f"  acc {r['proxy']['acceptance_rate']:.2f}/{r['measured']['acceptance_rate']:.2f}")
    return report


def draw(rows: list[dict[str, Any]], rho: float, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4))
    xs = [r["proxy"]["value"] for r in rows]
    ys = [r["measured"]["value"] for r in rows]
    ax.scatter(xs, ys)
    for r, x, y in zip(rows, xs, ys):
        ax.annotate(r["mask"], (x, y), fontsize=6, alpha=0.7)
    ax.set_xlabel("proxy: expected speedup")
    ax.set_ylabel("measured speedup (vLLM)")
    ax.set_title(f"Spearman ρ = {rho:.2f} over {len(rows)} masks")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
