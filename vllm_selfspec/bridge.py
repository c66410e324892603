"""The runner bridge: what our drafter sees of one engine step, in proposer terms.

``DraftContext`` carries the arguments of ``GPUModelRunner.propose_draft_token_ids``
(vLLM 0.32 ``gpu_model_runner.py:4748``; same in 0.33) plus the batch's request
ids, captured before anything can reorder the batch. ``read_feedback`` and
``draft_requests`` turn runner state into ``proposers.base`` types; they run after
vLLM's bookkeeping (the custom_class path drafts after ``_bookkeeping_sync``), so
``input_batch.token_ids_cpu`` and ``num_tokens_no_spec`` already include this
step's accepted and bonus tokens (``gpu_model_runner.py: _bookkeeping_sync``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from vllm_selfspec.log import log_once
from vllm_selfspec.proposers.base import DraftRequest, TargetStates, Verification

GREEDY_EPS = 1e-5  # vLLM treats temperature below this as greedy (sampling_params.py)
# A request's own draft limit: SamplingParams.extra_args (the OpenAI server fills it from
# ``vllm_xargs`` in the request body), validated in the front-end (patches P9)
REQUEST_KEY = "num_speculative_tokens"
REQUEST_KEY_MAX = 128


class RequestKeyError(ValueError):
    """A request's ``num_speculative_tokens`` is not an integer in [0, 128]."""


def request_draft_cap(extra_args: Any) -> int | None:
    """The most drafts a request asks for (``extra_args["num_speculative_tokens"]``: 0 turns
    drafting off), or None when it sets none. A value that is no integer in [0, 128]
    raises ``RequestKeyError`` (one line, said back to the client)."""
    if not extra_args or REQUEST_KEY not in extra_args:
        return None
    value = extra_args[REQUEST_KEY]
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)  # vllm_xargs may carry numbers as strings
    if isinstance(value, bool) or not isinstance(value, int) \
            or not 0 <= value <= REQUEST_KEY_MAX:
        raise RequestKeyError(
            f"vllm_selfspec: {REQUEST_KEY} in vllm_xargs / SamplingParams.extra_args must be an "
            f"integer in [0, {REQUEST_KEY_MAX}] (0: no drafts for this request), got {value!r}")
    return value


@dataclass
class DraftContext:
    scheduler_output: Any
    sampled_token_ids: list[list[int]]  # per batch row: accepted + bonus ([] = no new token)
    sampling_metadata: Any
    hidden_states: Any
    sample_hidden_states: Any
    spec_decode_metadata: Any
    common_attn_metadata: Any
    req_ids: list[str]


def read_feedback(ctx: DraftContext) -> list[Verification]:
    """Acceptance of the drafts verified this step (as vLLM's scheduler counts it,
    ``scheduler.py: update_from_output``): the scheduled
    spec tokens are the truth (the scheduler may have trimmed our proposal)."""
    scheduled = getattr(ctx.scheduler_output, "scheduled_spec_decode_tokens", None) or {}
    out = []
    for row, req_id in enumerate(ctx.req_ids):
        drafted = scheduled.get(req_id)
        if not drafted:
            continue
        emitted = ctx.sampled_token_ids[row] if row < len(ctx.sampled_token_ids) else []
        if not emitted:
            continue  # discarded row (e.g. preempted); no verdict
        out.append(Verification(req_id, len(drafted), max(0, len(emitted) - 1)))
    return out


def draft_requests(runner: Any, ctx: DraftContext, k: int,
                   prompt_limit: int = 0) -> list[DraftRequest]:
    """The rows that may draft now, with their position, newest token and limits: the
    engine's k, the request's own ``num_speculative_tokens`` (``request_draft_cap``), none
    when its prompt is longer than ``prompt_limit`` tokens (0: no limit)."""
    batch = runner.input_batch
    num_tokens = batch.num_tokens_no_spec
    token_ids = batch.token_ids_cpu
    max_model_len = runner.max_model_len
    out = []
    for row, req_id in enumerate(ctx.req_ids):
        if row >= len(ctx.sampled_token_ids) or not ctx.sampled_token_ids[row]:
            continue  # partial prefill or discarded: nothing new to draft from
        state = runner.requests.get(req_id)
        sp = getattr(state, "sampling_params", None)
        if sp is None:
            continue  # pooling request
        position = int(num_tokens[row]) - 1
        token = int(token_ids[row, position])
        n_out = len(state.output_token_ids)
        limit = k
        if sp.max_tokens is not None:
            limit = min(limit, sp.max_tokens - n_out - 1)  # the bonus token needs one
        limit = min(limit, max_model_len - 1 - position)
        if (not sp.ignore_eos and n_out >= (sp.min_tokens or 0)
                and token in sp.all_stop_token_ids):
            limit = 0  # the request ends with this token
        if sp.extra_args:
            try:
                cap = request_draft_cap(sp.extra_args)
            except RequestKeyError:  # refused in the front-end (P9); never here
                cap = None
            if cap is not None:
                limit = min(limit, cap)
        if prompt_limit and position + 1 - n_out > prompt_limit:
            limit = 0
        if limit <= 0:
            continue
        greedy = sp.temperature < GREEDY_EPS
        out.append(DraftRequest(
            row=row, req_id=req_id, position=position, token=token, max_len=limit,
            num_output_tokens=n_out,
            temperature=0.0 if greedy else float(sp.temperature),
            top_k=int(sp.top_k) if sp.top_k and sp.top_k > 0 else 0,
            top_p=float(sp.top_p)))
    return out


def computed_before_step(scheduler_output: Any) -> dict[str, int]:
    """Tokens each scheduled request had computed before this step: the position of its
    first scheduled token (vLLM ``NewRequestData`` / ``CachedRequestData``)."""
    out = {r.req_id: int(r.num_computed_tokens)
           for r in getattr(scheduler_output, "scheduled_new_reqs", None) or ()}
    cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
    if cached is not None:
        out.update(zip(cached.req_ids, (int(n) for n in cached.num_computed_tokens)))
    return out


def target_states(ctx: DraftContext) -> list[TargetStates]:
    """The target's final-norm last-layer states of the tokens verified this step, per
    request (Chimera): all scheduled tokens of a prefill chunk (partial prefills
    included), and for a verified draft only the newest token and the accepted drafts
    (the states at rejected positions belong to tokens that were thrown away).
    ``hidden_states`` rows follow ``query_start_loc`` (the batch order of this step)."""
    so = ctx.scheduler_output
    start = computed_before_step(so)
    spec = getattr(so, "scheduled_spec_decode_tokens", None) or {}
    qsl = ctx.common_attn_metadata.query_start_loc_cpu
    out = []
    for row, req_id in enumerate(ctx.req_ids):
        n_sched = int(so.num_scheduled_tokens.get(req_id, 0))
        if n_sched == 0 or req_id not in start or row + 1 >= len(qsl):
            continue
        a, b = int(qsl[row]), int(qsl[row + 1])
        if b - a != n_sched:
            log_once(logging.WARNING, "states-layout", "vllm_selfspec: hidden states of request "
                     "%s do not line up with its scheduled tokens (%d vs %d); its states are "
                     "left out", req_id, b - a, n_sched)
            continue
        sampled = ctx.sampled_token_ids[row] if row < len(ctx.sampled_token_ids) else []
        valid = len(sampled) if spec.get(req_id) else n_sched
        if valid > 0:
            out.append(TargetStates(row, req_id, start[req_id], ctx.hidden_states[a: a + valid]))
    return out
