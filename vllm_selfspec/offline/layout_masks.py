"""Write first / middle / last / random skip masks with the same number of skipped
attention and MLP sub-layers as a given mask (Draft & Verify Table 7, Figure 7),
and print the tools/bench.py command that compares them on held-out prompts.

    python tools/layout_masks.py results/masks/smollm2-mtbench.json --out-dir results/masks
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mask", help="the searched mask (JSON)")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dataset", default="mtbench")
    args = p.parse_args(argv)
    from vllm_selfspec.offline.search import layout_masks
    from vllm_selfspec.proposers.skip_mask import SkipMask, save_mask

    data = json.loads(Path(args.mask).read_text())
    stamp = data.get("metadata", {}).get("model", {})
    num_layers = int(stamp["num_layers"])
    n_attn, n_mlp = len(data.get("attention", [])), len(data.get("mlp", []))
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    configs = {"searched": args.mask}
    for name, m in layout_masks(num_layers, n_attn, n_mlp, args.seed).items():
        path = out / f"{Path(args.mask).stem}.{name}.json"
        save_mask(SkipMask(m.attention, m.mlp, metadata={"model": stamp, "layout": name}), path)
        configs[name] = str(path)
    methods = "baseline," + ",".join(f"{k}=selfspec" for k in configs)
    argv_b = ["--model", "smollm2-135m", "--methods", methods]
    for k, v in configs.items():
        argv_b += ["--method-config", f"{k}=" + json.dumps({"skip_mask": v, "cost_gate": False})]
    argv_b += ["--dataset", args.dataset, "--num-prompts", "8", "--max-tokens", "128",
               "--dtype", "float32", "--json", str(out / f"table7-{args.dataset}.json")]
    print("python tools/bench.py " + shlex.join(argv_b))


if __name__ == "__main__":
    main()
