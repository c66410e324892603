"""Tokens per target call of N-Grammys strategies, replayed offline on the model's
own greedy continuations (paper Figure 2, §5.2; issue "ngrammys").

    python tools/ngrammys_calls.py --model smollm2-135m --table TABLE \\
        --datasets mtbench,humaneval --num-prompts 20 --max-tokens 128 --out-dir results/ngrammys

For each prompt the full model's greedy continuation is generated once (cached in
OUT-DIR). Greedy verification accepts exactly the longest prefix of a draft that
equals the continuation, so every strategy can be replayed without the engine:

* figure2: the paper's batched oracle (a step yields 1 + the longest match over
  all k rows) for unigram, bigram and extended bigram (w = 2, 3) rows against k;
* realizations: the engine's own proposer (proposers.ngrammys) run step by step —
  (a) one row per step chosen by ``selection``, (c) with ``keep_rows`` — next to
  (b), scoring all k rows with one extra no-write target forward (the oracle's
  accepted length, at two target calls per step), and the oracle itself;
  "est. speedup" charges each verified draft token ``verify_per_token`` of a
  decode step (results/draft-cost.json, measured on this machine).

* sources: where the chain comes from — the request's own context, earlier requests
  (``history_tokens``: the prompts and answers of the prompts replayed before it, in
  order, as an engine serving them one after another would hold them), the bigram
  table — alone and combined, with the engine's proposer.
* row choice (``--row-choice``): which of ``ngrammys-history``'s rows (context, earlier
  requests, bigram) a step drafts, by the engines' rules and by oracles that pick the row
  the target accepts longest — what any choice among today's rows could add.

Writes OUT-DIR/ngrammys-calls.json, figure2.png and a table on stdout.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np

from vllm_selfspec.proposers.base import DraftBatch, DraftRequest, agreed_prefix
from vllm_selfspec.proposers.datastore import Datastore
from vllm_selfspec.proposers.ngram_tables import BigramTable
from vllm_selfspec.proposers.ngrammys import NGrammysProposer, mixed_rows, mixed_rows_labelled
from vllm_selfspec.proposers.resolved import Artifacts

Rows = Callable[[np.ndarray], list[list[int]]]


def walk(prompt: list[int], cont: list[int], step: Callable[[np.ndarray, int], int]) -> int:
    """Decode ``cont`` after ``prompt`` as the engine does: the prefill yields its first
    token, then each target call verifies a draft and yields 1 + what ``step(history, t)``
    says was accepted of it (t: the index in ``cont`` of the token the call decides).
    Returns the target calls after the prefill."""
    hist, t, calls = list(prompt) + cont[:1], 1, 0
    while t < len(cont):
        a = step(np.asarray(hist), t)
        hist += cont[t: t + a + 1]
        t += a + 1
        calls += 1
    return calls


def replay(prompt: list[int], cont: list[int], rows_fn: Rows, calls_per_step: int = 1
           ) -> tuple[int, int, int]:
    """Tokens, target calls and drafted tokens when each step verifies ``rows_fn``'s rows
    and yields 1 + the longest match (one row: the engine; k rows: the batched oracle)."""
    drafted = 0

    def step(h: np.ndarray, t: int) -> int:
        nonlocal drafted
        limit = len(cont) - t - 1
        rows = [r[:limit] for r in rows_fn(h)] if limit > 0 else []
        drafted += max((len(r) for r in rows), default=0)
        return max((agreed_prefix(r, cont[t:]) for r in rows), default=0)

    calls = 1 + calls_per_step * walk(prompt, cont, step)  # the prefill is one call
    return len(cont), calls, drafted


def replay_proposer(prompt: list[int], cont: list[int], proposer: NGrammysProposer
                    ) -> tuple[int, int, int]:
    """``replay`` of the engine's proposer: its one chain per step."""
    def chain(h: np.ndarray) -> list[list[int]]:
        req = DraftRequest(row=0, req_id="r", position=len(h) - 1, token=int(h[-1]),
                           max_len=len(cont))
        return [proposer.propose(DraftBatch(["r"], [req], h[None], np.asarray([len(h)]))).drafts[0]]

    try:
        return replay(prompt, cont, chain)
    finally:
        proposer.finish({"r"})


def summarize(runs: list[tuple[int, int, int]], verify_per_token: float) -> dict[str, float]:
    tokens = sum(r[0] for r in runs)
    calls = sum(r[1] for r in runs)
    drafted = sum(r[2] for r in runs)
    cost = calls + verify_per_token * drafted
    return {"tokens_per_call": tokens / calls, "est_speedup": tokens / cost,
            "drafted_per_call": drafted / calls}


def continuations(model_path: str, dataset: str, split: str, n: int, max_tokens: int,
                  cache: Path) -> tuple[list[list[int]], list[list[int]]]:
    from transformers import AutoTokenizer

    from vllm_selfspec.builders.datasets import load_prompts

    tok = AutoTokenizer.from_pretrained(model_path)
    ps = load_prompts(dataset, tok, split, n, 512)
    from tqdm import tqdm

    from vllm_selfspec.offline.hf_target import HFTarget, cached_continuations

    target: list[HFTarget] = []  # loaded only if the cache misses

    def generate(p: list[int], n: int) -> list[int]:
        if not target:
            target.append(HFTarget(model_path))
        return target[0].generate_greedy(p, n)

    prompts = [p.token_ids for p in ps]
    return prompts, cached_continuations(cache, [p.id for p in ps], prompts, max_tokens, generate,
                                         lambda it: tqdm(it, desc=f"{dataset} continuations"))


def figure2(data: list[tuple[list[int], list[int]]], table: BigramTable, ks: list[int],
            vpt: float) -> dict[str, list[dict[str, float]]]:
    strategies: dict[str, Callable[[int], Rows]] = {
        "unigram": lambda k: (lambda h: table.unigram_rows(k)),
        "bigram": lambda k: (lambda h: table.rows(int(h[-1]), k, 1)),
        "extended bigram w=2": lambda k: (lambda h: table.rows(int(h[-1]), k, 2)),
        "extended bigram w=3": lambda k: (lambda h: table.rows(int(h[-1]), k, 3)),
    }
    out: dict[str, list[dict[str, float]]] = {}
    for name, make in strategies.items():
        out[name] = []
        for k in ks:
            runs = [replay(p, c, make(k)) for p, c in data]
            out[name].append({"k": k, **summarize(runs, vpt)})
    return out


def realizations(data: list[tuple[list[int], list[int]]], table: BigramTable,
                 grid: list[dict[str, Any]], vpt: float, progress: Any) -> list[dict[str, Any]]:
    rows = []
    for cfg in progress(grid):
        w = cfg["w"]
        opts = {"num_rows": cfg["k"], "query_length": cfg["q"], "bigram_width": cfg["bw"],
                "selection": cfg["selection"], "keep_rows": cfg["keep_rows"]}
        prop = NGrammysProposer(w, opts, Artifacts(bigram_table=table))
        a = summarize([replay_proposer(p, c, prop) for p, c in data], vpt)

        def rows_fn(h: np.ndarray, cfg: dict[str, Any] = cfg) -> list[list[int]]:
            return mixed_rows(h, table, cfg["k"], cfg["w"], cfg["q"], 1, cfg["bw"])

        oracle = [replay(p, c, rows_fn) for p, c in data]
        b = summarize([(t, 2 * (n - 1) + 1, d) for t, n, d in oracle], vpt)
        o = summarize(oracle, vpt)
        rows.append({**cfg, "chain": a, "b_score_rows": b, "oracle": o})
    return rows


class RecycledSuccessors:
    """Token Recycling (Luo et al., 2024) as a one-chain source: an adjacency table of
    each token's successor as the target last predicted it at a verified position,
    learnt online across requests; the chain follows it from the newest token, the
    static bigram table where a token has not been seen. Under greedy verification the
    target's top-1 at a verified position is the token it emitted there, so the table
    is learnt from emitted tokens; the paper's other top-k entries feed its draft
    tree, which one verified chain per request cannot use. Replay only."""

    def __init__(self, static: BigramTable) -> None:
        self.static = static
        self.successor = np.full(static.vocab_size, -1, dtype=np.int64)
        self.source = "recycled"

    @property
    def vocab_size(self) -> int:
        return self.static.vocab_size

    def learn(self, tokens: np.ndarray, start: int) -> None:
        """Record tokens[i] -> tokens[i + 1] for i >= start (later pairs win)."""
        start = max(0, start)
        if tokens.shape[0] - start >= 2:
            self.successor[tokens[start:-1]] = tokens[start + 1:]

    def rows(self, token: int, k: int, w: int) -> list[list[int]]:
        if not 0 <= token < self.vocab_size or self.successor[token] < 0:
            return self.static.rows(token, k, w)
        row, x = [], token
        for _ in range(w):
            y = int(self.successor[x])
            x = y if y >= 0 else int(self.static.bigram_ids[x, 0])
            row.append(x)
        return [row]


class RecyclingProposer(NGrammysProposer):
    """``ngrammys`` with ``RecycledSuccessors`` in the bigram table's place; it learns
    from each request's output tokens as they are verified."""

    def __init__(self, num_speculative_tokens: int, options: dict[str, Any],
                 artifacts: Artifacts | None = None) -> None:
        super().__init__(num_speculative_tokens, options, artifacts)
        assert self.table is not None
        self.table = self.recycled = RecycledSuccessors(self.table)  # type: ignore[assignment]
        self.learnt: dict[str, int] = {}

    def candidates(self, history: np.ndarray, req_id: str | None = None
                   ) -> tuple[list[list[int]], list[str]]:
        key = req_id or ""
        self.recycled.learn(history, self.learnt.get(key, int(history.shape[0]) - 2))
        self.learnt[key] = int(history.shape[0]) - 1
        return super().candidates(history, req_id)

    def finish(self, req_ids: set[str]) -> None:
        for r in req_ids:
            self.learnt.pop(r, None)
        super().finish(req_ids)


def sources(data: list[tuple[list[int], list[int]]], table: BigramTable, width: int,
            history_tokens: int, vpt: float, store: Datastore | None = None,
            store_sizes: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    """Tokens per call of each draft source alone and combined (one chain per step, the
    engine's proposer; one proposer over all prompts so earlier requests accumulate).
    With ``store``, the REST datastore too: whole, and cut to each of ``store_sizes``
    tokens (its first documents)."""
    combos: dict[str, tuple[bool, bool, bool, Datastore | None]] = {
        "context": (False, False, False, None),
        "context + history": (False, True, False, None),
        "context + bigram (ngrammys)": (True, False, False, None),
        "context + history + bigram": (True, True, False, None),
        "context + recycled": (True, False, True, None),
        "context + history + recycled": (True, True, True, None)}
    if store is not None:
        combos["context + datastore + bigram"] = (True, False, False, store)
        for n in sorted(set(store_sizes)):
            if 0 < n < store.corpus_tokens:
                cut = Datastore(store.tokens[store.max_query: store.max_query + n])
                combos[f"context + history + datastore ({n} tokens) + bigram"] = (
                    True, True, False, cut)
        combos[f"context + history + datastore ({store.corpus_tokens} tokens) + bigram "
               "(ngrammys-history)"] = (True, True, False, store)
    out = []
    for name, (bigram, history, recycled, ds) in combos.items():
        make = RecyclingProposer if recycled else NGrammysProposer
        prop = make(width, {"bigram_table": None if bigram else "none",
                            "history_tokens": history_tokens if history else 0},
                    Artifacts(bigram_table=table if bigram else None, datastore=ds))
        out.append({"sources": name, "chain": summarize(
            [replay_proposer(p, c, prop) for p, c in data], vpt)})
    return out


def draw(fig: dict[str, dict[str, list[dict[str, float]]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    f, axes = plt.subplots(1, len(fig), figsize=(5 * len(fig), 4), squeeze=False)
    for ax, (ds, curves) in zip(axes[0], fig.items()):
        for name, pts in curves.items():
            ax.plot([p["k"] for p in pts], [p["tokens_per_call"] for p in pts], marker="o",
                    label=name)
        ax.set_title(f"{ds}: batched oracle (Figure 2)")
        ax.set_xlabel("k (rows per step)")
        ax.set_ylabel("tokens per call")
        ax.grid(alpha=0.3)
        ax.legend()
    f.tight_layout()
    f.savefig(path, dpi=120)


Label = Callable[[str, np.ndarray, list[int]], str]


def chain_steps(data: list[tuple[list[int], list[int]]], prop: NGrammysProposer,
                cut: dict[str, int] | None = None, label: Label | None = None
                ) -> list[tuple[str, int, int]]:
    """(source, drafted, accepted) of every step of the engine's proposer over ``data``
    (one proposer, requests in order, as ``sources``); ``cut``: the most tokens drafted
    from each source; ``label``: the source's name from (evidence class, history, row)."""
    steps: list[tuple[str, int, int]] = []
    for i, (prompt, cont) in enumerate(data):
        rid = f"r{i}"

        def step(h: np.ndarray, t: int, rid: str = rid, cont: list[int] = cont) -> int:
            rows, srcs = prop.candidates(h, rid)
            j = prop.choose(h, rows, srcs)
            src = srcs[j] if j >= 0 else "none"
            row = rows[j][: max(0, len(cont) - t - 1)] if j >= 0 else []
            if label is not None and row:
                src = label(src, h, row)
            if cut is not None:
                row = row[: cut.get(src, len(row))]
            a = agreed_prefix(row, cont[t:])
            steps.append((src, len(row), a))
            return a

        walk(prompt, cont, step)
        prop.finish({rid})
    return steps


def lengths_by_source(steps: list[tuple[str, int, int]], width: int, vpt: float
                      ) -> dict[str, Any]:
    """Per source of ``chain_steps``: the acceptance of each chain position given the ones
    before it were accepted, and the length that maximises (1 + E[accepted]) / (1 + d vpt)."""
    per_source: dict[str, Any] = {}
    for src in sorted({s for s, _, _ in steps}):
        tries, hits = np.zeros(width), np.zeros(width)
        for s, d, a in steps:
            if s != src:
                continue
            for i in range(min(d, width)):
                if i > a:
                    break
                tries[i] += 1
                hits[i] += i < a
        cond = [float(h / t) if t else 0.0 for h, t in zip(hits, tries)]
        reach = np.cumprod(cond)
        gains = [(1 + reach[:d].sum()) / (1 + d * vpt) for d in range(width + 1)]
        per_source[src] = {"steps": sum(1 for s, _, _ in steps if s == src),
                           "acceptance_given_reached": [round(c, 3) for c in cond],
                           "tried": tries.astype(int).tolist(), "best_length": int(np.argmax(gains))}
    return per_source


def bigram_agreement(table: BigramTable) -> Label:
    """A finer evidence class: does the row's first token agree with the bigram table's
    top-1 successor of the newest token ("b1") or not ("b0")? Bigram rows always do."""
    def label(src: str, h: np.ndarray, row: list[int]) -> str:
        if src == "bigram":
            return src
        prev = int(h[-1])
        top = int(table.bigram_ids[prev, 0]) if 0 <= prev < table.vocab_size else -1
        return f"{src}:{'b1' if row[0] == top else 'b0'}"
    return label


def agreement(dev: list[tuple[list[int], list[int]]], test: list[tuple[list[int], list[int]]],
              table: BigramTable, width: int, history_tokens: int, vpts: list[float],
              min_agreements: tuple[float, ...] = (0.0,)) -> list[dict[str, Any]]:
    """Would the cost gate's evidence classes gain from splitting each class by
    ``bigram_agreement``, or context rows from being cut where the earlier occurrences stop
    agreeing (key ``min_agreement``, each of ``min_agreements``)? Lengths per class are
    fitted on ``dev`` and replayed on ``test`` (out of sample), at each verify cost per
    drafted token in ``vpts`` (a request's share of a step: about 0.031 with one request in
    flight, 0.3 with four)."""
    out = []
    tokens = sum(len(c) for _, c in test)
    variants = [(c, lab, m) for m in min_agreements
                for c, lab in (("evidence classes", None),
                               ("classes x bigram agreement", bigram_agreement(table)))
                if m == 0 or lab is None]
    for name, hist in (("ngrammys", 0), ("ngrammys + history", history_tokens)):
        for classes, label, share in variants:
            def proposer(hist: int = hist, share: float = share) -> NGrammysProposer:
                return NGrammysProposer(width, {"history_tokens": hist, "min_agreement": share},
                                        Artifacts(bigram_table=table))

            dev_steps = chain_steps(dev, proposer(), label=label)
            for vpt in vpts:
                cut = {s: v["best_length"]
                       for s, v in lengths_by_source(dev_steps, width, vpt).items()}
                steps = chain_steps(test, proposer(), cut, label)
                calls = len(steps) + len(test)
                drafted = sum(d for _, d, _ in steps)
                out.append({"drafter": name, "classes": classes, "min_agreement": share,
                            "verify_per_token": vpt, "tokens_per_call": tokens / calls,
                            "drafted_per_step": drafted / len(steps),
                            "est_speedup": tokens / (calls + vpt * drafted)})
    return out


def draft_length(data: list[tuple[list[int], list[int]]], table: BigramTable, width: int,
                 history_tokens: int, vpt: float) -> list[dict[str, Any]]:
    """A per-request draft length, measured before it is built: the acceptance
    of each chain position given the ones before it were accepted, per source; the
    length per source that maximises (1 + E[accepted]) / (1 + d * verify cost); the
    estimated speedup with those lengths; and the ceiling (every step drafts exactly
    what the target accepts: no length rule can beat it)."""
    out = []
    for name, hist in (("ngrammys", 0), ("ngrammys + history", history_tokens)):
        def proposer(hist: int = hist) -> NGrammysProposer:
            return NGrammysProposer(width, {"history_tokens": hist},
                                    Artifacts(bigram_table=table))

        steps = chain_steps(data, proposer())
        tokens = sum(len(c) for _, c in data)
        calls = len(steps) + len(data)
        per_source = lengths_by_source(steps, width, vpt)
        cut = {src: v["best_length"] for src, v in per_source.items()}
        cut_steps = chain_steps(data, proposer(), cut)
        fixed = sum(d for _, d, _ in steps)
        accepted = sum(a for _, _, a in steps)
        cut_calls = len(cut_steps) + len(data)
        out.append({
            "drafter": name, "sources": per_source,
            "fixed": {"tokens_per_call": tokens / calls, "drafted_per_step": fixed / len(steps),
                      "est_speedup": tokens / (calls + vpt * fixed)},
            "per_source_length": {
                "tokens_per_call": tokens / cut_calls,
                "drafted_per_step": sum(d for _, d, _ in cut_steps) / len(cut_steps),
                "est_speedup": tokens / (cut_calls + vpt * sum(d for _, d, _ in cut_steps))},
            "ceiling": {"tokens_per_call": tokens / calls, "drafted_per_step": accepted / len(steps),
                        "est_speedup": tokens / (calls + vpt * accepted)}})
    return out


ROW_CHOICES: dict[str, Callable[[dict[str, list[int]], list[int]], list[int]]] = {
    # the engine's rules: the first source that has a row, in this order
    "ngrammys (context, else bigram)":
        lambda rows, fut: rows["context"] or rows["bigram"],
    "ngrammys-history (context, else history, else bigram)":
        lambda rows, fut: rows["context"] or rows["history"] or rows["bigram"],
    "history before context":
        lambda rows, fut: rows["history"] or rows["context"] or rows["bigram"],
    # bounds: the row that matches the continuation longest (no rule can beat them)
    "oracle: the better of context and history, else bigram":
        lambda rows, fut: max((r for r in (rows["context"], rows["history"]) if r),
                              key=lambda r: agreed_prefix(r, fut), default=rows["bigram"]),
    "oracle: the best of all three":
        lambda rows, fut: max((r for r in rows.values() if r), key=lambda r: agreed_prefix(r, fut),
                              default=[]),
}


def three_rows(prop: NGrammysProposer, table: BigramTable, h: np.ndarray, rid: str,
               width: int) -> dict[str, list[int]]:
    """The rows ``ngrammys-history`` chooses from at this step, each [] where its source has
    none: the first context row, earlier requests' row (``h`` remembered for ``rid``), the
    bigram row of the newest token."""
    ctx, _ = mixed_rows_labelled(h, None, 1, width, prop.max_query, prop.min_query)
    big = next(iter(table.rows(int(h[-1]), 1, width)), [])
    return {"context": ctx[0] if ctx else [], "history": prop.past_draft(rid, h, width, True),
            "bigram": [int(x) for x in big]}


def row_choice(data: list[tuple[list[int], list[int]]], table: BigramTable, width: int,
               history_tokens: int, vpt: float) -> list[dict[str, Any]]:
    """How much can choosing among ``ngrammys-history``'s three rows (the request's
    own context, earlier requests, the bigram table) add? Each step builds all three as the
    engine's proposer does (one buffer of earlier requests over ``data`` in order), drafts
    the one a rule picks and yields 1 + its match; the oracles pick the row that matches
    the target's continuation longest."""
    out = []
    for name, rule in ROW_CHOICES.items():
        prop = NGrammysProposer(width, {"history_tokens": history_tokens},
                                Artifacts(bigram_table=table))
        runs = []
        for i, (prompt, cont) in enumerate(data):
            def rows_fn(h: np.ndarray, rid: str = f"r{i}", cont: list[int] = cont,
                        start: int = len(prompt), prop: NGrammysProposer = prop,
                        rule: Callable[..., list[int]] = rule) -> list[list[int]]:
                future = cont[len(h) - start:]  # from the token this call decides
                return [list(rule(three_rows(prop, table, h, rid, width), future))]

            runs.append(replay(prompt, cont, rows_fn))
            prop.finish({f"r{i}"})
        out.append({"rule": name, "chain": summarize(runs, vpt)})
    return out


def load_datastore(spec: str, model_path: str) -> Datastore | None:
    """``--datastore``: a file, this model's cached one ("cached", None if not built) or
    "none"."""
    if spec == "none":
        return None
    if spec != "cached":
        return Datastore.load(spec)
    from vllm_selfspec.model_info import stamp_from_path
    from vllm_selfspec.proposers.artifacts import artifact_path

    cached = artifact_path("datastore", stamp_from_path(model_path))
    return Datastore.load(cached) if cached is not None and cached.exists() else None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--table", required=True)
    p.add_argument("--datasets", default="mtbench,humaneval")
    p.add_argument("--split", default="test", choices=("dev", "test"))
    p.add_argument("--num-prompts", type=int, default=20)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--ks", default="1,2,5,10,15,20,25")
    p.add_argument("--widths", default="4,8,12")
    p.add_argument("--bigram-widths", default="2",
                   help="widths of the bigram rows tried besides w itself")
    p.add_argument("--queries", default="1,2,3")
    p.add_argument("--grid-ks", default="1,5,10,25")
    p.add_argument("--cost", default="results/draft-cost.json",
                   help="draft-cost JSON with cost_model.verify_per_token")
    p.add_argument("--history-tokens", type=int, default=262_144,
                   help="bound of the earlier-requests buffer in the sources table")
    p.add_argument("--datastore", default="cached",
                   help="REST datastore for the sources table: a file from "
                        "tools/build_datastore.py, 'cached' (this model's, if built) or 'none'")
    p.add_argument("--datastore-sizes", default="1000000,2000000",
                   help="also replay the datastore cut to these many tokens")
    p.add_argument("--sources-only", action="store_true",
                   help="only the draft-sources table (writes OUT-DIR/sources.json)")
    p.add_argument("--draft-length", action="store_true",
                   help="only the draft-length study (writes OUT-DIR/draft-length.json): "
                        "acceptance per chain position and source, the best length per "
                        "source, and the ceiling of any length rule")
    p.add_argument("--agreement", action="store_true",
                   help="only the agreement study (writes OUT-DIR/agreement.json): lengths per "
                        "evidence class fitted on the dev split, replayed on the test split, "
                        "with and without splitting each class by whether its first token is "
                        "the bigram table's top-1, and with context rows cut at each of "
                        "--min-agreements")
    p.add_argument("--min-agreements", default="0",
                   help="key min_agreement's values in the agreement study (0: whole rows)")
    p.add_argument("--row-choice", action="store_true",
                   help="only the row-choice study (writes OUT-DIR/row-choice.json): tokens per "
                        "call when each step drafts the context, earlier-requests or bigram row "
                        "by a rule, against oracles that pick the best of them")
    p.add_argument("--out-dir", default="results/ngrammys")
    args = p.parse_args(argv)
    from tqdm import tqdm

    from vllm_selfspec.assets import resolve_model

    out = Path(args.out_dir)
    path = resolve_model(args.model)
    table = BigramTable.load(args.table)
    vpt = float(json.loads(Path(args.cost).read_text())["cost_model"]["verify_per_token"]) \
        if Path(args.cost).exists() else 0.0
    only = args.agreement or args.draft_length or args.row_choice  # no sources table
    store = None if only else load_datastore(args.datastore, path)
    ks = [int(x) for x in args.ks.split(",")]
    bws = [int(x) for x in args.bigram_widths.split(",")]
    grid = [{"k": k, "w": w, "bw": bw, "q": q, "selection": s, "keep_rows": kr}
            for k, w, q, s, kr in itertools.product(
                [int(x) for x in args.grid_ks.split(",")], [int(x) for x in args.widths.split(",")],
                [int(x) for x in args.queries.split(",")], ("first", "likelihood"), (False, True))
            for bw in sorted({min(b, w) for b in bws} | {w})]
    report: dict[str, Any] = {"config": vars(args), "verify_per_token": vpt, "figure2": {},
                              "realizations": {}, "sources": {}, "draft_length": {},
                              "agreement": {}, "row_choice": {}}
    for ds in args.datasets.split(","):
        prompts, conts = continuations(path, ds, args.split, args.num_prompts, args.max_tokens,
                                       out / f"continuations-{ds}-{args.split}.json")
        data = list(zip(prompts, conts))
        if args.agreement:
            dev = list(zip(*continuations(path, ds, "dev", args.num_prompts, args.max_tokens,
                                          out / f"continuations-{ds}-dev.json")))
            report["agreement"][ds] = agreement(
                dev, data, table, 8, args.history_tokens, [vpt, 0.1, 0.3],
                tuple(float(x) for x in args.min_agreements.split(",")))
            continue
        if args.draft_length:
            report["draft_length"][ds] = draft_length(data, table, 8, args.history_tokens, vpt)
            continue
        if args.row_choice:
            report["row_choice"][ds] = row_choice(data, table, 8, args.history_tokens, vpt)
            continue
        report["figure2"][ds] = figure2(data, table, ks, vpt)
        report["sources"][ds] = sources(data, table, 8, args.history_tokens, vpt, store,
                                        tuple(int(x) for x in args.datastore_sizes.split(",") if x))
        if args.sources_only:
            continue
        report["realizations"][ds] = realizations(
            data, table, grid, vpt, lambda it, ds=ds: tqdm(it, desc=f"{ds} realizations"))
    out.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.split == "test" else f"-{args.split}"
    if args.agreement:
        (out / "agreement.json").write_text(json.dumps(report, indent=1) + "\n")
        print_tables(report)
        return report
    if args.row_choice:
        (out / f"row-choice{suffix}.json").write_text(json.dumps(report, indent=1) + "\n")
        print_tables(report)
        return report
    if args.draft_length:
        (out / f"draft-length{suffix}.json").write_text(json.dumps(report, indent=1) + "\n")
        print_tables(report)
        return report
    if args.sources_only:
        (out / f"sources{suffix}.json").write_text(json.dumps(report, indent=1) + "\n")
        print_tables(report)
        return report
    (out / f"ngrammys-calls{suffix}.json").write_text(json.dumps(report, indent=1) + "\n")
    draw(report["figure2"], out / f"figure2{suffix}.png")
    print_tables(report)
    return report


def print_tables(report: dict[str, Any]) -> None:
    for ds, curves in report.get("figure2", {}).items():
        print(f"\n### {ds}: tokens per call of the batched oracle (Figure 2)")
        ks = [p["k"] for p in next(iter(curves.values()))]
        print("| strategy | " + " | ".join(f"k={k}" for k in ks) + " |")
        print("|---|" + "---:|" * len(ks))
        for name, pts in curves.items():
            print(f"| {name} | " + " | ".join(f"{p['tokens_per_call']:.2f}" for p in pts) + " |")
    for section, title, col in (("sources", "draft sources", "sources"),
                                ("row_choice", "which row to draft", "rule")):
        for ds, rows in report.get(section, {}).items():
            print(f"\n### {ds}: {title} (one chain of 8 per step)")
            print(f"| {col} | tok/call | est. speedup |")
            print("|---|---:|---:|")
            for r in rows:
                print(f"| {r[col]} | {r['chain']['tokens_per_call']:.2f} | "
                      f"{r['chain']['est_speedup']:.2f} |")
    for ds, rows in report.get("draft_length", {}).items():
        print(f"\n### {ds}: draft length (est. speedup charges {report['verify_per_token']:.3f} "
              "of a decode step per drafted token)")
        print("| drafter | fixed: drafted/step, est. | per-source length: drafted/step, est. "
              "| ceiling: drafted/step, est. | lengths | P(accept position i \\| reached) |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            f, c, top = r["fixed"], r["per_source_length"], r["ceiling"]
            lengths = ", ".join(f"{s} {v['best_length']}" for s, v in r["sources"].items())
            accept = "; ".join(f"{s}: " + " ".join(f"{x:.2f}" for x in v["acceptance_given_reached"]
                                                    if x) for s, v in r["sources"].items())
            print(f"| {r['drafter']} | {f['drafted_per_step']:.2f}, {f['est_speedup']:.3f} | "
                  f"{c['drafted_per_step']:.2f}, {c['est_speedup']:.3f} | "
                  f"{top['drafted_per_step']:.2f}, {top['est_speedup']:.3f} | {lengths} | {accept} |")
    for ds, rows in report.get("agreement", {}).items():
        print(f"\n### {ds}: lengths per class fitted on dev, replayed on test (est. speedup)")
        vpts = sorted({r["verify_per_token"] for r in rows})
        print("| drafter | classes | min_agreement | "
              + " | ".join(f"verify {v:.3f}" for v in vpts) + " |")
        print("|---|---|---:|" + "---:|" * len(vpts))

        def key_of(r: dict[str, Any]) -> tuple[str, str, float]:
            return r["drafter"], r["classes"], r.get("min_agreement", 0.0)

        for key in dict.fromkeys(key_of(r) for r in rows):
            est = {r["verify_per_token"]: r["est_speedup"] for r in rows if key_of(r) == key}
            print(f"| {key[0]} | {key[1]} | {key[2]:g} | "
                  + " | ".join(f"{est[v]:.3f}" for v in vpts) + " |")
    for ds, rows in report.get("realizations", {}).items():
        best = sorted(rows, key=lambda r: -r["chain"]["est_speedup"])[:8]
        print(f"\n### {ds}: realizations, best 8 by estimated speedup of the chain")
        print("| k | w | bigram w | q | selection | keep_rows | (a/c) chain tok/call | est. speedup "
              "| (b) score rows tok/call | oracle tok/call |")
        print("|---:|---:|---:|---:|---|---|---:|---:|---:|---:|")
        for r in best:
            print(f"| {r['k']} | {r['w']} | {r['bw']} | {r['q']} | {r['selection']} | {r['keep_rows']} | "
                  f"{r['chain']['tokens_per_call']:.2f} | {r['chain']['est_speedup']:.2f} | "
                  f"{r['b_score_rows']['tokens_per_call']:.2f} | "
                  f"{r['oracle']['tokens_per_call']:.2f} |")


if __name__ == "__main__":
    main()
