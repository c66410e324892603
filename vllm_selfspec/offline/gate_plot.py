"""The cost gate's decisions over a run: for each method of a ``tools/bench.py``
report whose drafter has a cost gate (``vllm_selfspec/proposers/cost_gate.py``), the most drafts it
allowed per step and the gain over plain decoding it predicted, one panel per method. The
gain is the best evidence class's, with acceptance read one standard deviation optimistic
(``CostGate.plan``: what the gate decides on), so it bounds the measured speedup from above.

    python tools/gate_plot.py results/all/every-method-humaneval.json [--out PNG]

``tools/bench.py --json OUT`` draws the same next to its report (``OUT`` with ``.gate.png``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def gated(report: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(method, its result row, its gate's export) for the rows with gate decisions."""
    out = []
    for row in report.get("results", []):
        gate = (row.get("drafter") or {}).get("cost_gate") or {}
        if gate.get("decisions"):
            out.append((row["method"], row, gate))
    return out


def default_path(report_path: str | Path) -> Path:
    p = Path(report_path)
    return p.with_name(p.stem + ".gate.png")


def draw(report: dict[str, Any], path: str | Path) -> bool:
    """Draw the panels to ``path``; False (nothing written) when no row has a gate."""
    rows = gated(report)
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(rows), 1, figsize=(8, 1.9 * len(rows) + 0.6), sharex=False,
                             squeeze=False)
    for ax, (method, row, gate) in zip(axes[:, 0], rows):
        steps = [d[0] for d in gate["decisions"]]
        drafts = [d[1] for d in gate["decisions"]]
        gains = [d[2] for d in gate["decisions"]]
        ax.step(steps, drafts, where="post", color="C0", lw=0.8)
        ax.set_ylabel("drafts", color="C0")
        ax.set_ylim(-0.3, max(drafts + [1]) + 0.5)
        twin = ax.twinx()
        twin.plot(steps, gains, color="C1", lw=0.8)
        twin.axhline(1.0, color="grey", ls=":", lw=0.8)
        twin.set_ylabel("gain bound", color="C1")
        probes = gate.get("plain_probes")
        extra = f", {probes} plain probes" if probes else ""
        ax.set_title(f"{method}: {row.get('speedup', 0):.2f}x measured, "
                     f"{sum(d > 0 for d in drafts)} of {len(drafts)} steps drafted{extra}",
                     fontsize=9)
    axes[-1, 0].set_xlabel("engine step")
    c = report.get("config", {})
    fig.suptitle(f"cost gate decisions: {c.get('dataset', '')}, {c.get('num_prompts', '')} "
                 f"prompts, concurrency {c.get('concurrency', '')}\ngain bound: the best class's "
                 "predicted gain, acceptance read optimistic", fontsize=10)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> list[str]:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+", help="tools/bench.py JSON reports")
    ap.add_argument("--out", help="the PNG (one report only; default: REPORT.gate.png)")
    args = ap.parse_args(argv)
    if args.out and len(args.reports) > 1:
        ap.error("--out takes one report")
    written = []
    for rp in args.reports:
        out = Path(args.out) if args.out else default_path(rp)
        if draw(json.loads(Path(rp).read_text()), out):
            print(f"wrote {out}")
            written.append(str(out))
        else:
            print(f"{rp}: no method with a cost gate")
    return written


if __name__ == "__main__":
    main()
