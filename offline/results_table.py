"""Render tools/bench.py JSON reports as the markdown tables the README shows.

    python tools/results_table.py results/bench-mtbench.json [more.json ...]
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
    lines = [f"`{c['command']}`", "",
             f"{c['dataset']} ({c['split']} split), {c['num_prompts']} prompts × {c['max_tokens']} "
             f"tokens, {c['dtype']}, temperature {c['temperature']}, concurrency "
             f"{c['concurrency']}, {'eager' if c.get('enforce_eager') else 'torch.compile'} target; "
             f"{m.get('cores')} CPU cores, vLLM {m.get('vllm')}, torch {m.get('torch')}", "",
             "| method | tok/s | speedup | mean acceptance length | acceptance rate | tokens/step "
             "| identical to plain |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in report["results"]:
        lines.append(f"| {r['method']} | {fmt(r['tokens_per_s'], 1)} | {fmt(r['speedup'])}x | "
                     f"{fmt(r['mean_acceptance_length'])} | {fmt(r['acceptance_rate'])} | "
                     f"{fmt(r.get('tokens_per_step'))} | {fmt(r['identical_to_baseline'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+", help="tools/bench.py JSON reports")
    for p in ap.parse_args(argv).reports:
        with open(p) as f:
            print(table(json.load(f)))
            print()


if __name__ == "__main__":
    main()
