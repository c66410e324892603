"""Served speed under load: vLLM's own serving benchmark (``vllm bench serve``) against one
``vllm serve`` per method, over a sweep of request rates.

``tools/bench.py`` times engines stepping in turn inside one process; this times what a
server's clients see: requests arrive as a Poisson process at each ``--request-rates``
rate (``inf``: all at once), vLLM batches them continuously, and vLLM's benchmark reports
output throughput and TTFT, time per output token and end-to-end latency at p50/p99, with
the spec-decode acceptance it reads from the server's /metrics. Every method is served with
its defaults (cost gate on, as a user runs it); vLLM's ``ngram`` with the bench's settings
and ``suffix`` (SuffixDecoding, ``make peers``) with theirs. Answers are greedy and compared
with plain decoding's at the same rate (same prompts, same order). Each rate has prompts of
its own (the next ``--num-prompts`` of the set): served again, the same prompts would find
their answers from the rate before in the drafters that learn from earlier requests
(``suffix``, ``ngrammys-history``), which then accept whole answers.

    python tools/serve_bench.py --model smollm2-135m \\
        --methods ngram,suffix,ngrammys-history,ngrammys-selfspec --dataset mtbench \\
        --num-prompts 16 --max-tokens 128 --request-rates 0.25,1,inf --json OUT.json

One server at a time; each finished cell (method, rate) is appended to ``OUT.log.jsonl``,
and ``--resume`` skips the cells it holds. Writes OUT.json (rows and a markdown table) and
OUT.png (time per output token and output throughput by request rate).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from vllm_selfspec.offline.bench import NGRAM_DEFAULTS, VLLM_METHODS, _check_suffix_installed
from vllm_selfspec.offline.serve_check import HOST, Server, method_configs

PLAIN = "baseline"
PERCENTILES = (50, 99)
METRICS = ("ttft", "tpot", "itl", "e2el")


@dataclass
class Settings:
    model: str = "smollm2-135m"
    methods: list[str] = field(default_factory=list)  # plain always runs first
    method_configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    dataset: str = "mtbench"
    num_prompts: int = 16
    max_tokens: int = 128
    request_rates: tuple[float, ...] = (0.25, 1.0, math.inf)
    max_prompt_tokens: int = 320
    max_model_len: int = 1024
    kv_cache_mib: int = 512
    start_timeout: float = 900.0
    bench_timeout: float = 1800.0

    def key(self) -> dict[str, Any]:
        """What a resumed run must share with the log it continues."""
        d = asdict(self)
        for k in ("methods", "start_timeout", "bench_timeout"):
            d.pop(k)
        d["request_rates"] = [str(r) for r in self.request_rates]
        return d


def speculative_config(method: str, s: Settings) -> dict[str, Any] | None:
    """The method's speculative config: its defaults, and ``--method-config`` on top."""
    if method == PLAIN:
        return None
    base = dict(NGRAM_DEFAULTS) if method == "ngram" else {}
    return {"method": method, **base, **s.method_configs.get(method, {})}


def check_methods(names: list[str]) -> None:
    from vllm_selfspec import methods

    for name in names:
        if name not in VLLM_METHODS and methods.lookup(name) is None:
            raise SystemExit(f"unknown method '{name}'; choose {', '.join(VLLM_METHODS)} or one "
                             f"of {', '.join(methods.METHODS)}")
        if name == "suffix":
            _check_suffix_installed()


def write_prompts(model_path: str, s: Settings, folder: Path) -> dict[float, Path]:
    """Each rate's prompts as vLLM's ``custom`` dataset (JSONL, one "prompt" per line;
    vLLM's benchmark applies the chat template): ``num_prompts`` of the set's test split
    per rate, in turn."""
    from transformers import AutoTokenizer

    from vllm_selfspec.builders.datasets import load_prompts

    tok = AutoTokenizer.from_pretrained(model_path)
    need = s.num_prompts * len(s.request_rates)
    ps = load_prompts(s.dataset, tok, "test", need, max_prompt_tokens=s.max_prompt_tokens)
    if len(ps) < need:
        raise SystemExit(f"{len(s.request_rates)} rates x {s.num_prompts} prompts: only "
                         f"{len(ps)} {s.dataset} prompts fit in {s.max_prompt_tokens} tokens")
    files = {}
    for i, rate in enumerate(s.request_rates):
        files[rate] = folder / f"prompts-{rate_name(rate)}.jsonl"
        files[rate].write_text("".join(json.dumps({"prompt": p.text}) + "\n"
                                       for p in ps[i * s.num_prompts:(i + 1) * s.num_prompts]))
    return files


def bench_command(port: int, served: str, model_path: str, prompts: Path, s: Settings,
                  rate: float, out: Path) -> list[str]:
    """``vllm bench serve`` for one request rate (greedy, prompts in file order)."""
    vllm_bin = Path(sys.executable).parent / "vllm"
    return [str(vllm_bin) if vllm_bin.exists() else "vllm", "bench", "serve",
            "--backend", "vllm", "--base-url", f"http://{HOST}:{port}", "--model", served,
            "--tokenizer", model_path, "--dataset-name", "custom", "--dataset-path", str(prompts),
            "--custom-output-len", str(s.max_tokens), "--num-prompts", str(s.num_prompts),
            "--disable-shuffle", "--request-rate", str(rate), "--temperature", "0",
            "--seed", "0", "--percentile-metrics", ",".join(METRICS),
            "--metric-percentiles", ",".join(map(str, PERCENTILES)),
            "--save-result", "--save-detailed", "--result-dir", str(out.parent),
            "--result-filename", out.name]


def cell(result: dict[str, Any]) -> dict[str, Any]:
    """What a table row keeps of vLLM's result file."""
    keep = {"completed", "failed", "duration", "request_throughput", "output_throughput",
            "total_output_tokens", "max_concurrent_requests", "spec_decode_acceptance_length",
            "spec_decode_acceptance_rate", "spec_decode_per_position_acceptance_rates"}
    out = {k: result.get(k) for k in keep}
    for m in METRICS:
        for p in PERCENTILES:
            out[f"p{p}_{m}_ms"] = result.get(f"p{p}_{m}_ms")
    out["texts"] = result.get("generated_texts") or []
    return out


def run_method(method: str, s: Settings, model_path: str, prompts: dict[float, Path],
               work: Path, todo: list[float],
               done: Callable[[float, dict[str, Any], float], None]) -> None:
    """One server for ``method``, ``vllm bench serve`` at each rate of ``todo``; each cell
    goes to ``done(rate, cell, server start seconds)`` as it finishes."""
    served = s.model
    server = Server(model_path, served, speculative_config(method, s),
                    s.kv_cache_mib << 20, s.max_model_len, work / f"{method}.server.log", {})
    t0 = time.time()
    why = server.start(s.start_timeout)
    start_s = round(time.time() - t0, 1)
    if why is not None:
        raise SystemExit(f"{method}: {why}")
    try:
        for rate in todo:
            out = work / f"{method}-{rate}.json"
            log = work / f"{method}-{rate}.bench.log"
            cmd = bench_command(server.port, served, model_path, prompts[rate], s, rate, out)
            with open(log, "wb") as f:
                rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT,
                                    timeout=s.bench_timeout).returncode
            if rc != 0 or not out.exists():
                raise SystemExit(f"{method} at {rate} req/s: vllm bench serve exited with {rc}:\n"
                                 + log.read_text(errors="replace")[-3000:])
            done(rate, cell(json.loads(out.read_text())), start_s)
    finally:
        server.stop()


def rate_name(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g}"


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (method, rate), with output throughput over plain decoding's at the same
    rate and how many answers are identical to plain decoding's."""
    plain = {r["rate"]: r for r in records if r["method"] == PLAIN}
    rows = []
    for r in records:
        base = plain.get(r["rate"])
        row = {k: v for k, v in r.items() if k not in ("texts", "settings")}
        if base is not None and base["output_throughput"]:
            row["throughput_vs_plain"] = round(r["output_throughput"] / base["output_throughput"], 4)
            row["tpot_p50_vs_plain"] = round(base["p50_tpot_ms"] / r["p50_tpot_ms"], 4) \
                if r["p50_tpot_ms"] else None
            row["identical"] = sum(a == b for a, b in zip(r["texts"], base["texts"]))
            row["compared"] = min(len(r["texts"]), len(base["texts"]))
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: a line per (rate, method)."""
    head = ("| request rate | method | output tok/s (x plain) | TPOT p50 / p99 ms | "
            "TTFT p50 / p99 ms | e2e p50 / p99 s | acceptance length | identical |")
    lines = [head, "|" + " --- |" * 8]

    def f(v: Any, d: int = 1) -> str:
        return "–" if v is None else f"{v:.{d}f}"

    for r in sorted(rows, key=lambda r: (r["rate"], r["method"] != PLAIN)):
        x = r.get("throughput_vs_plain")
        lines.append(
            f"| {rate_name(r['rate'])} | `{r['method']}` | {f(r['output_throughput'])}"
            f"{'' if x is None or r['method'] == PLAIN else f' ({x:.2f}x)'} | "
            f"{f(r['p50_tpot_ms'])} / {f(r['p99_tpot_ms'])} | "
            f"{f(r['p50_ttft_ms'], 0)} / {f(r['p99_ttft_ms'], 0)} | "
            f"{f((r['p50_e2el_ms'] or 0) / 1000, 2)} / {f((r['p99_e2el_ms'] or 0) / 1000, 2)} | "
            f"{f(r.get('spec_decode_acceptance_length'), 2)} | "
            f"{r.get('identical', '–')}/{r.get('compared', '–')} |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Time per output token (p50) and output throughput by request rate, a line per method
    (``inf`` drawn one step right of the largest finite rate)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = sorted({r["rate"] for r in rows})
    finite = [r for r in rates if not math.isinf(r)] or [1.0]
    pos = {r: (max(finite) * 2 if math.isinf(r) else r) for r in rates}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["rate"])
        xs = [pos[r["rate"]] for r in mine]
        axes[0].plot(xs, [r["p50_tpot_ms"] for r in mine], marker="o", label=method)
        axes[1].plot(xs, [r["output_throughput"] for r in mine], marker="o", label=method)
    for ax, title in zip(axes, ("time per output token, p50 (ms)", "output tokens/s")):
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks([pos[r] for r in rates], [rate_name(r) for r in rates])
        ax.set_xlabel("request rate (req/s)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(s: Settings, out_json: Path, resume: bool = False) -> dict[str, Any]:
    from tqdm import tqdm

    from vllm_selfspec.assets import resolve_model
    from vllm_selfspec.proposers.artifacts import append_jsonl, read_jsonl

    methods = [PLAIN] + [m for m in s.methods if m != PLAIN]
    check_methods(methods[1:])
    model_path = resolve_model(s.model)
    log_path = out_json.with_suffix(".log.jsonl")
    done: dict[tuple[str, float], dict[str, Any]] = {}
    if resume and log_path.exists():
        for r in read_jsonl(log_path):
            if r.get("settings") != s.key():
                raise SystemExit(f"{log_path} was written with other settings; run without "
                                 "--resume to start afresh")
            done[(r["method"], float(r["rate"]))] = r
    elif log_path.exists():
        log_path.unlink()
    work = Path(tempfile.mkdtemp(prefix="serve-bench-"))
    prompts = write_prompts(model_path, s, work)
    bar = tqdm(total=len(methods) * len(s.request_rates), desc="serve bench", unit="cell")
    bar.update(len(done))
    for method in methods:
        todo = [r for r in s.request_rates if (method, r) not in done]
        if not todo:
            continue

        def finished(rate: float, c: dict[str, Any], start_s: float, method: str = method) -> None:
            rec = {"settings": s.key(), "method": method, "rate": rate, "start_s": start_s, **c}
            append_jsonl(log_path, {**rec, "rate": str(rate)})
            done[(method, rate)] = rec
            bar.update(1)
            bar.set_postfix_str(f"{method} @ {rate_name(rate)}: "
                                f"{c['output_throughput']:.1f} tok/s")

        run_method(method, s, model_path, prompts, work, todo, finished)
    bar.close()
    records = [{**done[(m, r)], "rate": float(r)} for m in methods for r in s.request_rates]
    rows = summarize(records)
    result = {"settings": s.key(), "command": " ".join(sys.argv), "rows": rows,
              "table": table(rows), "logs": str(work)}
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(result, indent=1))
    plot(rows, out_json.with_suffix(".png"))
    return result


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Settings]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = Settings()
    p.add_argument("--model", default=d.model)
    p.add_argument("--methods", default="ngram,suffix,ngrammys-history,ngrammys-selfspec",
                   help="comma-separated; plain decoding (baseline) always runs first")
    p.add_argument("--method-config", action="append", default=[], metavar="METHOD=JSON")
    p.add_argument("--dataset", default=d.dataset)
    p.add_argument("--num-prompts", type=int, default=d.num_prompts)
    p.add_argument("--max-tokens", type=int, default=d.max_tokens)
    p.add_argument("--request-rates", default="0.25,1,inf",
                   help="comma-separated requests per second; inf: all at once")
    p.add_argument("--max-prompt-tokens", type=int, default=d.max_prompt_tokens)
    p.add_argument("--max-model-len", type=int, default=d.max_model_len)
    p.add_argument("--kv-cache-mib", type=int, default=d.kv_cache_mib)
    p.add_argument("--json", dest="json_out", required=True)
    p.add_argument("--resume", action="store_true", help="skip the cells OUT.log.jsonl holds")
    a = p.parse_args(argv)
    def refuse(message: str) -> None:
        raise SystemExit(message)

    configs = method_configs(a.method_config, refuse)
    try:
        rates = tuple(float(r) for r in a.request_rates.split(",") if r.strip())
    except ValueError:
        raise SystemExit(f"--request-rates: numbers or inf, got '{a.request_rates}'") from None
    if not rates or any(r <= 0 for r in rates):
        raise SystemExit("--request-rates: one or more rates above 0")
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    unknown = set(configs) - set(methods)
    if unknown:
        raise SystemExit(f"--method-config names {', '.join(sorted(unknown))}, not in --methods")
    s = Settings(model=a.model, methods=methods, method_configs=configs, dataset=a.dataset,
                 num_prompts=a.num_prompts, max_tokens=a.max_tokens, request_rates=rates,
                 max_prompt_tokens=a.max_prompt_tokens, max_model_len=a.max_model_len,
                 kv_cache_mib=a.kv_cache_mib)
    return a, s


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a, s = parse_args(argv)
    result = run(s, Path(a.json_out), resume=a.resume)
    print(result["table"])
    return result


if __name__ == "__main__":
    main()
