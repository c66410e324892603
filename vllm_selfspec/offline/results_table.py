"""Render tools/bench.py JSON reports as the markdown tables the README and docs show.

    python tools/results_table.py results/bench-mtbench.json [more.json ...]
    python tools/results_table.py --runs results/x/check-mtbench-{1,2,3}.json

``--runs``: the reports are repeated runs of one command; one table with each method's
median speedup and the spread (lowest–highest) beside it, the median mean acceptance
length, and whether every run was identical to plain decoding (float32) or how many
requests agreed with it (bfloat16, where verifying several tokens at once changes the
arithmetic).
"""

from __future__ import annotations

import json
from typing import Any


def fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "**no**"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def table(report: dict[str, Any]) -> str:
    c = report["config"]
    m = c.get("machine", {})
    cpu = f" ({m['cpu_model']})" if m.get("cpu_model") else ""
    lines = [f"`{c['command']}`", "",
             f"{c['dataset']} ({c['split']} split), {c['num_prompts']} prompts × {c['max_tokens']} "
             f"tokens, {c['dtype']}, temperature {c['temperature']}, concurrency "
             f"{c['concurrency']}, {'eager' if c.get('enforce_eager') else 'torch.compile'} target; "
             f"{m.get('cores')} CPU cores{cpu}, vLLM {m.get('vllm')}, torch {m.get('torch')}", "",
             "| method | tok/s | speedup | mean acceptance length | acceptance rate | tokens/step "
             "| identical to plain |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in report["results"]:
        lines.append(f"| {r['method']} | {fmt(r['tokens_per_s'], 1)} | {fmt(r['speedup'])}x | "
                     f"{fmt(r['mean_acceptance_length'])} | {fmt(r['acceptance_rate'])} | "
                     f"{fmt(r.get('tokens_per_step'))} | {fmt(r['identical_to_baseline'])} |")
    return "\n".join(lines)


def runs_table(reports: list[dict[str, Any]]) -> str:
    """One table over repeated runs of one command: per method the median speedup with
    its spread, the median mean acceptance length and identity in every run."""
    import statistics

    first = reports[0]["config"]
    lines = [f"`{first['command']}` — {len(reports)} runs; median (lowest–highest)", "",
             "| method | speedup | mean acceptance length | identical to plain |",
             "| --- | --- | --- | --- |"]
    methods = [r["method"] for r in reports[0]["results"]]
    for m in methods:
        rows = [next(r for r in rep["results"] if r["method"] == m) for rep in reports]
        sp = [r["speedup"] for r in rows]
        al = [r["mean_acceptance_length"] for r in rows if r["mean_acceptance_length"]]
        same = [r["identical_to_baseline"] for r in rows]
        agree = [r.get("agreement") for r in rows]
        if all(same):
            ident = "yes" if m != methods[0] else "–"
        elif all(isinstance(a, dict) for a in agree):
            req = statistics.median(a["requests"] for a in agree)
            tok = statistics.median(a["tokens_before_difference"] for a in agree)
            ident = f"{req:.2f} of requests; {tok:.2f} of tokens before a difference"
        else:
            ident = f"**{sum(bool(x) for x in same)} of {len(same)} runs**"
        lines.append(f"| {m} | {statistics.median(sp):.2f}x ({min(sp):.2f}–{max(sp):.2f}) | "
                     f"{fmt(statistics.median(al)) if al else '–'} | {ident} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+", help="tools/bench.py JSON reports")
    ap.add_argument("--runs", action="store_true",
                    help="the reports are runs of one command: one table of medians")
    args = ap.parse_args(argv)
    reports = []
    for p in args.reports:
        with open(p) as f:
            reports.append(json.load(f))
    if args.runs:
        print(runs_table(reports))
        return
    for rep in reports:
        print(table(rep))
        print()


if __name__ == "__main__":
    main()
