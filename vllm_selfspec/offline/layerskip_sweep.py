"""Sweep LayerSkip's exit layer E and number of speculations d, offline (LayerSkip §4.3,
the authors' ``sweep.py`` grid), with the teacher-forced proxy of tools/search_mask.py.

For every E the early exit (layers 0..E-1, final norm, shared LM head) predicts each
token of the full model's greedy continuations of the dev prompts, given the true
prefix, in one forward: its top-1 agreement with the full model is the early exit's
accuracy at that depth. Replaying greedy self-speculative decoding over those
predictions with d drafts a step (no confidence stop, as the paper) gives the
expected acceptance and, priced with the cost model of tools/draft_cost.py, the
expected speedup over plain decoding on this machine. The best (E, d) is printed
with the tools/bench.py command that measures it in vLLM.

    python tools/layerskip_sweep.py --model smollm2-135m --dataset mtbench \
        --cost-model results/draft-cost.json --json results/layerskip/sweep-mtbench.json

Writes OUT.json, OUT.png (agreement per exit layer; expected speedup over E x d) and a
per-E log OUT.log.jsonl that ``--resume`` continues.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    from vllm_selfspec.offline.dev_set import add_dev_set_args

    add_dev_set_args(p)
    p.add_argument("--exit-layers", default=None, help="comma list of E (default: 1..L)")
    p.add_argument("--num-speculations", default="1,2,3,4,6,8,12", help="comma list of d")
    p.add_argument("--cost-model", default=None,
                   help="JSON with a cost_model block (tools/draft_cost.py); default: measured now")
    p.add_argument("--step-table", default=None, metavar="BENCH.json[:METHOD]",
                   help="price verification with the step table a tools/bench.py run measured "
                        "(default: linear in the drafts)")
    p.add_argument("--continuations", default=None,
                   help="cache of the full model's continuations (default: next to --json)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--resume", action="store_true", help="continue OUT.log.jsonl")
    p.add_argument("--json", dest="json_out", required=True)
    return p.parse_args(argv)


def sweep_row(objective: Any, exit_layer: int, ds: list[int]) -> dict[str, Any]:
    """Early-exit agreement at depth E and the replayed figures for every d (one
    teacher-forced pass per E, replayed for each d)."""
    from vllm_selfspec.offline.dev_set import agreement
    from vllm_selfspec.proposers.expected_speedup import replay
    from vllm_selfspec.proposers.layerskip import early_exit_mask, fixed_speculations

    L = objective.num_layers
    mask = early_exit_mask(exit_layer, L)
    agree, conf = objective.teacher_forced(mask)
    per_d = {}
    for d in ds:
        r = replay(agree, conf, mask, L, d, objective.cost, fixed_speculations())
        per_d[str(d)] = {"expected_speedup": r.speedup, "acceptance_rate": r.acceptance_rate,
                         "mean_acceptance_length": r.mean_acceptance_length}
    return {"exit_layer": exit_layer, "agreement": agreement(agree),
            "draft_token_cost": objective.cost.draft_token(mask, L), "per_d": per_d}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = result["rows"]
    es = [r["exit_layer"] for r in rows]
    ds = result["num_speculations"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    ax1.plot(es, [r["agreement"] for r in rows], "o-", label="early-exit top-1 = full model's")
    d_show = str(max(d for d in ds if d <= 6))
    ax1.plot(es, [r["per_d"][d_show]["acceptance_rate"] for r in rows], "s--",
             label=f"expected acceptance rate, d = {d_show}")
    ax1.plot(es, [r["draft_token_cost"] for r in rows], ":", color="gray",
             label="draft token cost (decode steps)")
    ax1.set_xlabel("exit layer E (draft runs layers 0..E-1)")
    ax1.set_ylim(0, 1.3)
    ax1.set_title(f"{result['model']}: early exit, {result['dataset']} dev")
    ax1.legend(fontsize=8, loc="upper left")
    grid = np.array([[r["per_d"][str(d)]["expected_speedup"] for d in ds] for r in rows])
    im = ax2.imshow(grid.T, origin="lower", aspect="auto", cmap="viridis",
                    extent=(es[0] - 0.5, es[-1] + 0.5, -0.5, len(ds) - 0.5))
    ax2.set_yticks(range(len(ds)), [str(d) for d in ds])
    ax2.set_xlabel("exit layer E")
    ax2.set_ylabel("speculations d")
    best = result["best"]
    ax2.plot(best["exit_layer"], ds.index(best["num_speculations"]), "r*", markersize=12)
    ax2.set_title(f"expected speedup (best {best['expected_speedup']:.2f}x at E={best['exit_layer']}, "
                  f"d={best['num_speculations']})")
    fig.colorbar(im, ax=ax2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from vllm_selfspec.assets import resolve_model
    from vllm_selfspec.offline.dev_set import load_dev_set
    from vllm_selfspec.offline.objectives import ProxyObjective, read_cost_model
    from vllm_selfspec.proposers.artifacts import append_jsonl, read_jsonl
    from vllm_selfspec.proposers.layerskip import fixed_speculations

    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log_path = out.with_suffix(".log.jsonl")
    model_path = resolve_model(args.model)
    ds = sorted({int(x) for x in args.num_speculations.split(",")})
    dev = load_dev_set(args.dataset, AutoTokenizer.from_pretrained(model_path), args.num_prompts)
    cost, table = read_cost_model(args.cost_model, args.step_table)
    cont = Path(args.continuations) if args.continuations else out.with_suffix(".continuations.json")
    objective = ProxyObjective(model_path, dev, args.max_tokens, max(ds),
                               fixed_speculations(), cost=cost,
                               continuations_path=cont, device=args.device, progress=tqdm,
                               step_table=table)
    L = objective.num_layers
    es = ([int(x) for x in args.exit_layers.split(",")] if args.exit_layers
          else list(range(1, L + 1)))
    done = {r["exit_layer"]: r for r in read_jsonl(log_path)} if args.resume else {}
    if not args.resume and log_path.exists():
        log_path.unlink()
    for e in tqdm([e for e in es if e not in done], desc="exit layers"):
        row = sweep_row(objective, e, ds)
        append_jsonl(log_path, row)
        done[e] = row
    rows = [done[e] for e in es]
    useful = [(r["per_d"][str(d)]["expected_speedup"], r["exit_layer"], d)
              for r in rows if r["exit_layer"] < L for d in ds]
    sp, be, bd = max(useful)
    result = {
        "command": "python tools/layerskip_sweep.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "model": args.model, "dataset": args.dataset, "dev_set": dev.to_json(),
        "max_tokens": args.max_tokens, "num_layers": L, "num_speculations": ds,
        "cost_model": objective.cost.to_json(), "rows": rows,
        "best": {"exit_layer": be, "num_speculations": bd, "expected_speedup": sp},
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, out.with_suffix(".png"))
    print(f"{'E':>3} {'agree':>6} " + " ".join(f"d={d:<3}" for d in ds) + "   (expected speedup)")
    for r in rows:
        print(f"{r['exit_layer']:>3} {r['agreement']:6.3f} "
              + " ".join(f"{r['per_d'][str(d)]['expected_speedup']:5.2f}" for d in ds))
    if sp < 1.0:
        print(f"no (E, d) is expected to beat plain decoding on this model and machine (best: "
              f"E={be}, d={bd}, {sp:.2f}x): early exit needs a model trained for it (LayerSkip "
              "§4.1); with the cost gate on, layerskip steps back to plain decoding")
    print(f"best: E={be}, d={bd}, expected {sp:.2f}x; measure it in vLLM with:")
    cfg = json.dumps({"exit_layer": be, "num_speculative_tokens": bd, "cost_gate": False})
    print("python tools/bench.py " + shlex.join([
        "--model", args.model, "--methods", "baseline,layerskip",
        "--method-config", f"layerskip={cfg}", "--dataset", args.dataset, "--num-prompts", "8",
        "--max-tokens", "128", "--dtype", "float32"]))
    print(f"wrote {out}, {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
