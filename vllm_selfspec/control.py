"""Functions to run inside the workers with ``LLM.collective_rpc`` (tools and tests).

Each takes the worker as its first argument (vLLM's collective_rpc contract) and
reaches our drafter at ``worker.model_runner.drafter``. Sending functions to the
workers needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` in the front-end's
environment (set by the tools that use this module; the engine is local).
"""

from __future__ import annotations

from typing import Any


def _drafter(worker: Any) -> Any:
    runner = getattr(worker, "model_runner", None)
    drafter = getattr(runner, "drafter", None)
    if drafter is None or not hasattr(drafter, "proposer"):
        raise RuntimeError("this engine does not run a vllm_selfspec method")
    return drafter


def drafter_stats(worker: Any) -> dict[str, Any]:
    """Proposer counters, draft-exit threshold and draft forward timing."""
    d = _drafter(worker)
    out: dict[str, Any] = dict(d.proposer.stats)
    view = d.view
    if view is not None:  # the proposer's own timing (Chimera's draft_seconds) wins
        for k, v in view.timing.items():
            out.setdefault(k, v)
    ex = getattr(d.proposer, "exit", None)
    if ex is not None:
        out["draft_exit_threshold"] = ex.threshold
    out["describe"] = d.proposer.describe()
    # the whole drafter per engine step (reading results, the gate, drafting, bookkeeping)
    out["drafter_calls"], out["drafter_seconds"] = d.calls, round(d.seconds, 4)
    out.update(d.proposer.report())
    if getattr(d, "low_bit", None) is not None:
        out.update(d.low_bit.report())
    gate = getattr(d, "gate", None)
    if gate is not None:
        out["cost_gate"] = {
            "plain_step_s": gate.t0, "draft_token_s": gate.c_draft, "draft_unit": gate.draft_unit,
            "verify_token_s": gate.c_verify,
            "drafted_step_overhead_s": gate.c_overhead, "plain_probes": gate.plain_probes,
            "mix_plain_steps": gate.mix_plain, "mix_classes_held": gate.mix_dropped,
            "shares": {name: round(gate.share(name), 4) for name in gate.shares},
            "step_table_s": gate.table.means(),
            "acceptance": [round(gate.acceptance(i, False), 4) for i in range(gate.k)],
            "classes": {name: {"acceptance": [round(gate.acceptance(i, False, name), 4)
                                              for i in range(gate.k)],
                               "first_tries": round(e.accept[0].tries, 1), "drafts": e.limit,
                               **({"draft_token_s": e.c_draft} if e.c_draft is not None else {})}
                        for name, e in gate.classes.items() if name},
            "winner": gate.winner, "describe": gate.describe(),
            "decisions": [list(h) for h in gate.history]}
    return out


def reset_stats(worker: Any) -> None:
    d = _drafter(worker)
    for k in d.proposer.stats:
        d.proposer.stats[k] = 0
    view = d.view
    if view is not None:
        for k in view.timing:
            view.timing[k] = 0


def set_skip_mask(worker: Any, mask: dict[str, Any], threshold: float | None = None) -> str:
    """Switch the skip mask (and optionally reset γ) without restarting the engine."""
    from vllm_selfspec.proposers.skip_mask import parse_mask

    d = _drafter(worker)
    num_layers = d.adapter.num_layers
    d.proposer.set_mask(parse_mask(mask, num_layers))
    if threshold is not None:
        d.proposer.exit.threshold = float(threshold)
        d.proposer.exit.acceptance = None
    return d.proposer.describe()


def set_draft_vocab(worker: Any, n: int) -> str:
    """Draft over the ``n`` most frequent tokens of the draft vocabulary loaded at start-up
    (the engine's key draft_vocab is the most), or over the full vocabulary (0)."""
    d = _drafter(worker)
    d.proposer.use_draft_vocab(int(n))
    return d.proposer.describe()


def set_compile_walks(worker: Any, enabled: bool) -> None:
    """Compile the layer-skip draft walk per settled mask, or run it eagerly (the default).
    For measurement only (tools/draft_cost.py), not a key: docs/results.md says why."""
    d = _drafter(worker)
    if not d.proposer.uses_target:
        raise RuntimeError(f"{d.proposer.describe()}: no layer-skip draft pass to compile")
    d.draft_pass.compile_walks = bool(enabled)  # compiled walks stay cached while off


def set_draft_kernels(worker: Any, enabled: bool) -> None:
    """Run the eager layer-skip draft walk with vLLM's fused CPU kernels (the default,
    ``adapters.DraftKernels``) or with the native op forms (to measure the difference:
    tools/draft_cost.py --draft-kernels)."""
    d = _drafter(worker)
    if not d.proposer.uses_target:
        raise RuntimeError(f"{d.proposer.describe()}: no layer-skip draft pass")
    d.draft_pass.draft_kernels = bool(enabled)


def inject_faults(worker: Any, every: int, kind: str = "raise") -> None:
    """The test hook (``drafter.inject_faults``) in a running engine: every ``every``-th
    draft step faulty (0: off), by raising or by handing vLLM a wrong q."""
    from vllm_selfspec.drafter import inject_faults as inject

    inject(_drafter(worker).proposer, int(every), kind)


def worker_pid(worker: Any) -> int:
    """The worker's process id (a tool checks that an engine runs in its own process)."""
    import os

    return os.getpid()


def set_clock(worker: Any, clock: Any) -> None:
    """The clock the drafter's measurements across engine steps read (the cost gate's step
    times, SWIFT's budget; ``Proposer.clock``): for an engine in this process that a tool
    steps in turn with others, one that runs only while this engine steps. In-process
    engines only (the callable is not sent to another process)."""
    _drafter(worker).proposer.clock = clock


def set_drafting(worker: Any, enabled: bool) -> None:
    """Draft (True) or decode plainly (False) in the same engine."""
    _drafter(worker).drafting = bool(enabled)


def set_cost_gate(worker: Any, enabled: bool) -> None:
    """Switch the cost gate on (fresh measurements) or off."""
    from vllm_selfspec.proposers.cost_gate import CostGate

    d = _drafter(worker)
    d.gate = CostGate(k=d.k) if enabled else None


def set_draft_exit(worker: Any, threshold: float, adaptive: bool) -> None:
    """Fix the draft-exit threshold (threshold 0 + adaptive off: always draft K)."""
    ex = _drafter(worker).proposer.exit
    ex.threshold = float(threshold)
    ex.cfg.adaptive = bool(adaptive)
    ex.acceptance = None


def install_step_timer(worker: Any) -> None:
    """Time the runner's decode and verification steps (no prefill work): per step
    ``execute_model`` (input preparation + forward) keyed by tokens per request,
    and for plain one-token steps also ``sample_tokens`` (tools/draft_cost.py)."""
    import time

    from vllm_selfspec.drafter import decode_only

    runner = worker.model_runner
    timer = getattr(runner, "_selfspec_step_timer", None)
    if timer is not None:
        timer.update(steps=0, seconds=0.0, forward={}, pending=None)
        return
    timer = {"steps": 0, "seconds": 0.0, "forward": {}, "pending": None}
    execute, sample = runner.execute_model, runner.sample_tokens

    def timed_execute(scheduler_output: Any, *a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        out = execute(scheduler_output, *a, **kw)
        dt = time.perf_counter() - t0
        n = len(scheduler_output.num_scheduled_tokens)
        timer["pending"] = None
        if n > 0 and decode_only(scheduler_output):
            per_req = scheduler_output.total_num_scheduled_tokens // n
            timer["forward"].setdefault(per_req, []).append(dt)
            if per_req == 1:
                timer["pending"] = dt
        return out

    def timed_sample(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        out = sample(*a, **kw)
        if timer["pending"] is not None:
            timer["steps"] += 1
            timer["seconds"] += timer["pending"] + time.perf_counter() - t0
            timer["pending"] = None
        return out

    runner.execute_model, runner.sample_tokens = timed_execute, timed_sample
    runner._selfspec_step_timer = timer


def step_timer(worker: Any) -> dict[str, Any]:
    """Plain decode steps (count, seconds) and mean forward seconds per tokens-per-request."""
    import statistics

    t = worker.model_runner._selfspec_step_timer
    return {"steps": t["steps"], "seconds": t["seconds"],
            "forward": {n: statistics.median(v) for n, v in t["forward"].items() if v}}


def capture_states(worker: Any) -> None:
    """Keep the model's final-norm last-layer states of every token the runner computes from
    now on, per request, with their positions and tokens (patch P10), until
    ``write_states`` takes them: the corpus tool's answers and Chimera's training states in
    one generation. The engine must run without prefix caching (a cached prefix is never
    computed) and is meant for that tool alone (the states of every request are kept)."""
    import numpy as np
    import torch

    from vllm_selfspec import patches

    runner = worker.model_runner
    store: dict[str, list[tuple[Any, Any, Any]]] = getattr(runner, "_selfspec_states", {})
    runner._selfspec_states = store

    def sink(input_ids: Any, positions: Any, out: Any) -> None:
        batch = runner.input_batch
        n = int(batch.num_reqs)
        if n == 0 or input_ids is None:
            return
        qsl = runner.query_start_loc.np[: n + 1]
        total = int(qsl[n])
        hidden = out[0] if isinstance(out, tuple) else out
        h = hidden[:total].to(dtype=torch.float16).cpu().numpy()
        pos = positions[:total].cpu().numpy().astype(np.int64)
        ids = input_ids[:total].cpu().numpy().astype(np.int64)
        for i, rid in enumerate(batch.req_ids[:n]):
            a, b = int(qsl[i]), int(qsl[i + 1])
            if b > a:
                store.setdefault(rid, []).append((pos[a:b], ids[a:b], h[a:b]))

    patches.patch_state_capture(runner, sink)


def forget_states(worker: Any, request_ids: list[str]) -> int:
    """Drop what ``capture_states`` kept for these requests (caller's or engine ids, as in
    ``write_states``); the number dropped."""
    store = getattr(worker.model_runner, "_selfspec_states", {})
    engine_ids = _engine_ids(store)
    return sum(_pop_request(store, engine_ids, q) is not None for q in request_ids)


def _engine_ids(store: dict[str, Any]) -> dict[str, str]:
    """Caller's id -> vLLM's engine id of a request, which carries a suffix
    (input_processor.py: assign_request_id): "<id>-<8 characters>"."""
    return {k.rsplit("-", 1)[0]: k for k in store}


def _pop_request(store: dict[str, Any], engine_ids: dict[str, str], req_id: str) -> Any:
    """What the store kept for a request named by either id (None if nothing)."""
    return store.pop(req_id if req_id in store else engine_ids.get(req_id, req_id), None)


def write_states(worker: Any, path: str, records: list[tuple[str, str, list[int], list[int]]]
                 ) -> dict[str, Any]:
    """One states shard at ``path`` (the format of ``offline.chimera_data.collect_states``)
    from what ``capture_states`` kept, for ``records`` = (request id, record id,
    prompt ids, response ids), and forget those requests. A record is left out (its id in
    ``missing``) unless every position but the last was computed with the token the record
    holds there; the last token is never fed to the model, so its state stays zero (the
    trainer never reads it: no label follows it). Returns {"file", "ids", "tokens",
    "missing"}."""
    from pathlib import Path

    import numpy as np

    store = worker.model_runner._selfspec_states
    engine_ids = _engine_ids(store)
    cols: dict[str, list[Any]] = {"tokens": [], "hidden": [], "labels": [], "loss_mask": []}
    ids, missing, lens = [], [], []
    for req_id, rec_id, prompt, response in records:
        parts = _pop_request(store, engine_ids, req_id) or []
        seq = np.asarray(list(prompt) + list(response), dtype=np.int64)
        n = len(seq)
        if not parts or not response:
            missing.append(rec_id)
            continue
        width = parts[0][2].shape[1]
        hidden = np.zeros((n, width), dtype=np.float16)
        seen = np.zeros(n, dtype=bool)
        ok = True
        for pos, tok, h in parts:  # later parts win (a recomputed prefix after preemption)
            if pos.max() >= n or not np.array_equal(seq[pos], tok):
                ok = False
                break
            hidden[pos] = h
            seen[pos] = True
        if not ok or not seen[: n - 1].all():
            missing.append(rec_id)
            continue
        p = len(prompt)
        labels = np.full(n, -1, dtype=np.int32)
        labels[p - 1: n - 1] = seq[p:]  # greedy answers: the model's top-1 is the next token
        mask = np.zeros(n, dtype=bool)
        mask[p - 1: n - 1] = True
        for k, v in (("tokens", seq.astype(np.int32)), ("hidden", hidden), ("labels", labels),
                     ("loss_mask", mask)):
            cols[k].append(v)
        ids.append(rec_id)
        lens.append(n)
    out = Path(path)
    if ids:
        tmp = out.with_name(out.name + ".tmp.npz")
        np.savez(tmp, **{k: np.concatenate(v) for k, v in cols.items()},
                 offsets=np.cumsum([0, *lens]).astype(np.int64))
        tmp.replace(out)
    return {"file": out.name, "ids": ids, "tokens": int(sum(lens)), "missing": missing}
