"""SWIFT on a stream that switches task: acceptance over time, optimizer re-entries,
and the share of decode time spent optimizing (SWIFT paper §5.3, Figures 6-7 and the
0.8% overhead figure of Table 4).

One engine per method serves the same stream of prompts (by default MT-bench, then
HumanEval, then XSum: 64 prompts), ``--concurrency`` requests at a time, in order:

* ``swift``: starts from the uniform layer set and optimizes on the fly; its
  events (optimization phases, re-entries after an acceptance drop) are placed on
  the stream by the number of requests finished when they happened;
* ``selfspec``: the same drafting with ONE fixed layer set — by default the set
  SWIFT found in its first optimization phase (the paper's "mask tuned on one task,
  used on another"), or ``--fixed-mask FILE`` (e.g. from tools/search_mask.py).

Both run greedy, cost gate off (so every step drafts and acceptance is measured on
the whole stream), with the same confidence threshold (SWIFT's ``stop_threshold``;
the selfspec run has its adaptive rule off). Greedy outputs are checked against a
plain engine only with ``--check-identity`` (it adds a third run).

``--shift-from LOG`` builds the stream instead from an earlier run's log: the
``--shift-n`` prompts on which ``--shift-method`` accepted most, then those on which
it accepted least (segments "high" and "low"): an acceptance shift for showing a
re-entry where tasks do not shift the layers a model wants.

Writes ``OUT.log.jsonl`` (one line per request and method; ``--resume`` reuses the
methods already complete in it), ``OUT.json`` (summary) and ``OUT.png``.

    python tools/swift_stream.py --model smollm2-135m --json results/swift/stream.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--stream", default="mtbench:22,humaneval:21,xsum:21",
                   help="DATASET:N segments served in this order (test split)")
    p.add_argument("--shift-from", default=None, metavar="LOG",
                   help="instead of --stream: an earlier run's OUT.log.jsonl; the stream is the "
                        "--shift-n prompts on which --shift-method accepted most, then the "
                        "--shift-n on which it accepted least (an acceptance shift, for re-entry)")
    p.add_argument("--shift-method", default="selfspec")
    p.add_argument("--shift-n", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--swift-config", default="{}", help="extra swift keys (JSON)")
    p.add_argument("--fixed-mask", default=None,
                   help="layer set for the selfspec run (default: SWIFT's first found set)")
    p.add_argument("--methods", default="swift,selfspec,selfspec-uniform")
    p.add_argument("--overhead-at", type=int, default=64,
                   help="also report the optimization share over the first N requests")
    p.add_argument("--check-identity", action="store_true")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--resume", action="store_true", help="reuse complete methods from the log")
    p.add_argument("--json", dest="json_out", default="results/swift/stream.json")
    return p.parse_args(argv)


def load_stream(spec: str, tok: Any, max_prompt_tokens: int) -> list[tuple[str, Any]]:
    from vllm_selfspec.builders.datasets import load_prompts

    out = []
    for seg in spec.split(","):
        name, _, n = seg.partition(":")
        ps = load_prompts(name, tok, "test", int(n), max_prompt_tokens)
        if len(ps) < int(n):
            raise SystemExit(f"{name}: only {len(ps)} prompts of at most {max_prompt_tokens} tokens")
        out += [(name, p) for p in ps]
    return out


def shift_stream(log: Path, method: str, n: int, tok: Any, max_prompt_tokens: int
                 ) -> list[tuple[str, Any]]:
    """The re-entry stream: the ``n`` prompts of an earlier run on which ``method``'s
    acceptance rate was highest (segment "high"), then the ``n`` where it was lowest ("low")."""
    from vllm_selfspec.builders.datasets import load_prompts

    rows = [r for r in read_log(log).get(method, []) if not r.get("summary")]
    if len(rows) < 2 * n:
        raise SystemExit(f"{log}: {len(rows)} requests of {method}, need {2 * n}")
    ranked = sorted(rows, key=lambda r: -r["accepted"] / max(1, r["draft_tokens"]))
    by_id = {}
    for task in dict.fromkeys(r["task"] for r in rows):
        count = sum(1 for r in rows if r["task"] == task)
        by_id.update({p.id: p for p in load_prompts(task, tok, "test", count, max_prompt_tokens)})
    missing = [r["id"] for r in ranked if r["id"] not in by_id]
    if missing:
        raise SystemExit(f"{log}: prompts {missing[:3]} not found again (another --max-prompt-tokens?)")
    return ([("high", by_id[r["id"]]) for r in ranked[:n]]
            + [("low", by_id[r["id"]]) for r in ranked[-n:]])


def read_log(path: Path) -> dict[str, list[dict[str, Any]]]:
    """The log's records by method."""
    from vllm_selfspec.proposers.artifacts import read_jsonl

    rows: dict[str, list[dict[str, Any]]] = {}
    for r in read_jsonl(path):
        rows.setdefault(r["method"], []).append(r)
    return rows


def serve_stream(label: str, spec: dict[str, Any] | None, stream: list[tuple[str, Any]],
                 args: argparse.Namespace, model_path: str, log: Path) -> dict[str, Any]:
    """Serve the stream with one engine; log one line per request; return a summary."""
    from tqdm import tqdm
    from vllm import SamplingParams, TokensPrompt

    from vllm_selfspec.control import drafter_stats
    from vllm_selfspec.offline import engines
    from vllm_selfspec.offline.spec_metrics import acceptance, engine_args
    from vllm_selfspec.proposers.artifacts import append_jsonl

    kw = dict(dtype=args.dtype, max_model_len=2048, block_size=32, kv_cache_memory_bytes=1 << 30,
              max_num_seqs=args.concurrency, enforce_eager=args.enforce_eager, seed=0)
    llm = engines.start(model_path, speculative_config=spec, **engine_args({"speculative_config": spec}), **kw)
    sp = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    rows, seconds = [], 0.0
    for g in tqdm(range(0, len(stream), args.concurrency), desc=label, unit="group"):
        group = stream[g: g + args.concurrency]
        t0 = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p.token_ids) for _, p in group], sp,
                            use_tqdm=False)
        dt = time.perf_counter() - t0
        seconds += dt
        opt = {}
        if spec is not None and spec.get("method") == "swift":
            st = llm.collective_rpc(drafter_stats)[0]
            opt = {"opt_seconds_so_far": st["opt_seconds"], "phase": st["phase"]}
        for j, ((task, p), o) in enumerate(zip(group, outs)):
            a = acceptance([o])
            r = {"method": label, "index": g + j, "task": task, "id": p.id,
                 "tokens": a.tokens, "drafts": a.drafts, "draft_tokens": a.draft_tokens,
                 "accepted": a.accepted, "group_seconds": dt, "seconds_so_far": seconds, **opt,
                 "token_ids": list(o.outputs[0].token_ids)}
            rows.append(r)
            append_jsonl(log, r)
    stats: dict[str, Any] = {}
    if spec is not None:
        stats = llm.collective_rpc(drafter_stats)[0]
    summary = {"method": label, "summary": True, "config": spec, "seconds": seconds,
               "stats": stats}
    append_jsonl(log, summary)
    engines.shutdown(llm)
    del llm
    return summary


def segment_rates(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for task in dict.fromkeys(r["task"] for r in rows):
        rs = [r for r in rows if r["task"] == task]
        dt, acc, dr = (sum(r[k] for r in rs) for k in ("draft_tokens", "accepted", "drafts"))
        out[task] = {"acceptance_rate": acc / dt if dt else 0.0,
                     "mean_acceptance_length": 1 + acc / dr if dr else 1.0, "requests": len(rs)}
    return out


def plot(path: Path, results: dict[str, dict[str, Any]], stream: list[tuple[str, Any]],
         window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(2, 1, figsize=(10, 7), gridspec_kw={"height_ratios": [3, 2]})
    tasks = [t for t, _ in stream]
    start = 0
    colors = ["#eef3fb", "#fbf3e6", "#eefbee", "#f6eefb"]
    for k, task in enumerate(dict.fromkeys(tasks)):
        n = tasks.count(task)
        ax.axvspan(start - 0.5, start + n - 0.5, color=colors[k % 4], zorder=0)
        ax.text(start + n / 2, 1.02, task, ha="center", va="bottom", transform=ax.get_xaxis_transform())
        start += n
    for res in results.values():
        rows = res["rows"]
        xs, ys = [], []
        for i in range(len(rows)):
            win = rows[max(0, i - window + 1): i + 1]
            dt = sum(r["draft_tokens"] for r in win)
            xs.append(rows[i]["index"])
            ys.append(sum(r["accepted"] for r in win) / dt if dt else 0.0)
        ax.plot(xs, ys, label=res["legend"], lw=1.8)
    sw = results.get("swift")
    if sw is not None:
        first = True
        for ev in sw["summary"]["stats"].get("events", []):
            if ev["event"] in ("optimize", "accelerate"):
                x = ev["finished_requests"] - 0.5
                c = "tab:red" if ev["event"] == "optimize" else "tab:green"
                lab = {"optimize": "swift: optimization starts", "accelerate": "swift: phase ends"}
                ax.axvline(x, color=c, ls="--", lw=1,
                           label=lab[ev["event"]] if first or ev["event"] == "accelerate" else None)
                first = False
        h, lab = ax.get_legend_handles_labels()
        uniq = dict(zip(lab, h))
        ax.legend(uniq.values(), uniq.keys(), loc="lower right", fontsize=8)
        trace = sw["summary"]["stats"].get("trace", [])
        if trace:
            bx.plot([t[0] for t in trace], [t[2] for t in trace], ".", ms=2, color="0.6",
                    label="candidate matchness")
            bx.plot([t[0] for t in trace], [t[1] for t in trace], color="tab:blue",
                    label="best layer set (mean matchness)")
            bx.set_xlabel("engine step")
            bx.set_ylabel("matchness")
            bx.set_ylim(0, 1)
            bx.legend(loc="lower right", fontsize=8)
            bx.set_title("SWIFT optimization steps", fontsize=10)
    ax.set_xlabel(f"request in stream (acceptance rate over the last {window} requests)")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # drafter stats RPC
    from transformers import AutoTokenizer

    from vllm_selfspec.assets import resolve_model

    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.with_suffix(".log.jsonl")
    mask_file = out.with_name(out.stem + "-swift-mask.json")
    if not args.resume and log.exists():
        log.unlink()
    model_path = resolve_model(args.model)
    tok = AutoTokenizer.from_pretrained(model_path)
    if args.shift_from:
        stream = shift_stream(Path(args.shift_from), args.shift_method, args.shift_n, tok,
                              args.max_prompt_tokens)
    else:
        stream = load_stream(args.stream, tok, args.max_prompt_tokens)
    swift_cfg = {"method": "swift", "cost_gate": False, "mask_cache": str(mask_file),
                 **json.loads(args.swift_config)}
    methods = args.methods.split(",") + (["baseline"] if args.check_identity else [])
    done = read_log(log)
    results: dict[str, dict[str, Any]] = {}
    for label in methods:
        prev = done.get(label, [])
        summary = next((r for r in prev if r.get("summary")), None)
        if summary is None:
            if label == "swift":
                spec: dict[str, Any] | None = swift_cfg
            elif label == "selfspec":
                fixed = args.fixed_mask or str(mask_file)
                if not Path(fixed).exists() and "swift" in results and not args.fixed_mask:
                    # SWIFT never ended a phase on this stream: take its last best set
                    fixed = str(out.with_name(out.stem + "-swift-last-mask.json"))
                    Path(fixed).write_text(json.dumps(results["swift"]["summary"]["stats"]["mask"]))
                if not Path(fixed).exists():
                    raise SystemExit(f"no fixed mask: {fixed} (run swift first or pass --fixed-mask)")
                spec = {"method": "selfspec", "skip_mask": fixed, "cost_gate": False,
                        "adaptive_threshold": False,
                        "draft_exit_threshold": swift_cfg.get("stop_threshold", 0.8)}
                if "skip_ratio" in swift_cfg:
                    spec["skip_ratio"] = swift_cfg["skip_ratio"]
            elif label == "selfspec-uniform":  # SWIFT's starting point, never optimized
                spec = {"method": "selfspec", "skip_ratio": swift_cfg.get("skip_ratio", 0.45),
                        "cost_gate": False, "adaptive_threshold": False,
                        "draft_exit_threshold": swift_cfg.get("stop_threshold", 0.8)}
            elif label == "baseline":
                spec = None
            else:
                raise SystemExit(f"unknown method {label}")
            if prev:  # drop the partial rows of an interrupted run
                from vllm_selfspec.proposers.artifacts import atomic_path

                kept = [json.dumps(r) for m, rs in done.items() if m != label for r in rs]
                with atomic_path(log) as tmp:
                    tmp.write_text("".join(k + "\n" for k in kept))
            serve_stream(label, spec, stream, args, model_path, log)
            done = read_log(log)
            prev = done[label]
            summary = next(r for r in prev if r.get("summary"))
        rows = sorted((r for r in prev if not r.get("summary")), key=lambda r: r["index"])
        legend = label
        if label == "selfspec":
            legend = f"selfspec, one fixed layer set ({Path(str(summary['config']['skip_mask'])).name})"
        elif label == "swift":
            legend = "swift (optimized on the fly)"
        elif label == "selfspec-uniform":
            legend = "selfspec, the uniform layer set SWIFT starts from"
        results[label] = {"rows": rows, "summary": summary, "legend": legend}

    report: dict[str, Any] = {"command": "python tools/swift_stream.py " + shlex.join(
        sys.argv[1:] if argv is None else argv), "stream": args.stream,
        "shift_from": args.shift_from,
        "prompts": [[t, p.id] for t, p in stream] if args.shift_from else None,
        "max_tokens": args.max_tokens, "concurrency": args.concurrency, "methods": {}}
    for label, res in results.items():
        rows, st = res["rows"], res["summary"]["stats"]
        dt = sum(r["draft_tokens"] for r in rows)
        entry: dict[str, Any] = {
            "config": res["summary"]["config"], "seconds": res["summary"]["seconds"],
            "tokens": sum(r["tokens"] for r in rows),
            "acceptance_rate": sum(r["accepted"] for r in rows) / dt if dt else None,
            "per_task": segment_rates(rows) if label != "baseline" else None}
        if label == "swift":
            entry["optimization_seconds"] = st.get("opt_seconds")
            entry["optimization_share"] = st.get("opt_seconds", 0.0) / res["summary"]["seconds"]
            upto = [r for r in rows if r["index"] < args.overhead_at]
            if upto and len(upto) < len(rows) and "opt_seconds_so_far" in upto[-1]:
                entry[f"optimization_share_first_{args.overhead_at}"] = \
                    upto[-1]["opt_seconds_so_far"] / upto[-1]["seconds_so_far"]
            entry["optimization_steps"] = st.get("opt_steps")
            entry["optimization_phases"] = st.get("opt_phases")
            entry["events"] = [{k: v for k, v in e.items() if k != "time"} for e in st.get("events", [])]
            entry["final_mask"] = st.get("mask")
        if "baseline" in results and label != "baseline":
            base = {r["index"]: r["token_ids"] for r in results["baseline"]["rows"]}
            entry["identical_to_plain"] = all(r["token_ids"] == base[r["index"]] for r in rows)
            entry["speedup"] = results["baseline"]["summary"]["seconds"] / res["summary"]["seconds"]
        report["methods"][label] = entry
    png = out.with_suffix(".png")
    plot(png, {k: v for k, v in results.items() if k != "baseline"}, stream, window=args.concurrency * 2)
    out.write_text(json.dumps(report, indent=2) + "\n")
    for label, e in report["methods"].items():
        line = f"{label:16s} {e['tokens']} tokens in {e['seconds']:.1f} s"
        if e["acceptance_rate"] is not None:
            per = ", ".join(f"{t} {v['acceptance_rate']:.2f}" for t, v in e["per_task"].items())
            line += f"; acceptance rate {e['acceptance_rate']:.3f} ({per})"
        if "optimization_share" in e:
            line += f"; optimizing {e['optimization_seconds']:.1f} s = {100 * e['optimization_share']:.1f}%" \
                    f" of decode time, {e['optimization_phases']} phase(s)"
        key = f"optimization_share_first_{args.overhead_at}"
        if key in e:
            line += f" ({100 * e[key]:.1f}% over the first {args.overhead_at} requests)"
        if "speedup" in e:
            line += f"; {e['speedup']:.2f}x plain"
        if "identical_to_plain" in e:
            line += f"; identical to plain: {e['identical_to_plain']}"
        print(line)
    print(f"wrote {out}, {png}, {log}")
    return report


if __name__ == "__main__":
    main()
