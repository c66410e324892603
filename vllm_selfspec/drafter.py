"""The object vLLM instantiates for our methods (``method="custom_class"``).

vLLM's contract (``vllm/v1/spec_decode/custom_class_proposer.py``): constructed
with the VllmConfig only, in the worker; ``load_model(target)`` (required on CPU,
``cpu_model_runner.py:74-76``); ``propose(...)``. Through the runner bridge (P3)
vLLM calls ``propose_with_runner(runner, ctx)`` instead, which feeds acceptance
back to the proposer, builds the batch of rows that may draft, and returns the
drafts (ragged lists) and draft probabilities.

A failure inside a draft step never takes the engine down: it is logged once
(with its traceback) and that step drafts nothing. ``VLLM_SELFSPEC_FAULT_EVERY``
is a test hook that injects such failures (``inject_faults``).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import torch

from vllm_selfspec import methods, metrics, rank_sync
from vllm_selfspec.bridge import DraftContext, draft_requests, read_feedback, target_states
from vllm_selfspec.log import log_once, logger
from vllm_selfspec.proposers.base import DraftBatch, Proposal, Proposer
from vllm_selfspec.proposers.cost_gate import CostGate
from vllm_selfspec.proposers.resolved import ArtifactRefs
from vllm_selfspec.rank_sync import NOT_READY

STATS_INTERVAL_S = 30.0
FAULT_ENV = "VLLM_SELFSPEC_FAULT_EVERY"



class InjectedFault(RuntimeError):
    """The exception the ``VLLM_SELFSPEC_FAULT_EVERY`` test hook raises."""


FAULTS = ("raise", "uniform_q")


def inject_faults(proposer: Proposer, every: int, kind: str = "raise") -> None:
    """THE TEST HOOK, not a feature. From now on every ``every``-th call of
    ``proposer.propose`` (0: none; the hook is taken off) is faulty:

    * ``"raise"``: it raises ``InjectedFault`` before the proposer runs, so a test can show
      that a failing draft step is survived: logged once, that step drafts nothing, later
      steps draft again (tools/serve_check.py, tests/serving/). The drafter turns it on
      when ``VLLM_SELFSPEC_FAULT_EVERY=N`` (N > 0) is set at start-up;
    * ``"uniform_q"``: sampled drafts are handed to vLLM with a uniform q instead of the
      distribution they were drawn from, which breaks the rejection sampler's guarantee:
      the sampling test (tests/engine/test_sampling_engine.py) must see it.
    """
    if kind not in FAULTS:
        raise ValueError(f"fault {kind!r}: one of {', '.join(FAULTS)}")
    propose = getattr(proposer, "_unfaulted_propose", None) or proposer.propose
    proposer._unfaulted_propose = propose  # type: ignore[attr-defined]
    if every <= 0:
        proposer.propose = propose  # type: ignore[method-assign]
        return
    calls = [0]

    def faulty(batch: DraftBatch) -> Proposal:
        calls[0] += 1
        if calls[0] % every:
            return propose(batch)
        if kind == "raise":
            raise InjectedFault(f"injected by the test hook {FAULT_ENV}={every} (draft step "
                                f"{calls[0]})")
        out = propose(batch)
        if out.probs is not None:
            out.probs = torch.full_like(out.probs, 1.0 / out.probs.shape[-1])
        return out

    proposer.propose = faulty  # type: ignore[method-assign]


def decode_only(scheduler_output: Any) -> bool:
    """True if every scheduled request only verified drafts / decoded one token."""
    scheduled = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
    spec = getattr(scheduler_output, "scheduled_spec_decode_tokens", None) or {}
    return bool(scheduled) and all(n == 1 + len(spec.get(rid, ())) for rid, n in scheduled.items())


def _source(proposal: Proposal, row: int) -> str | None:
    """The evidence class row ``row`` drafted from, or could have under a longer limit (a
    labelled proposer names the class it capped to nothing); None: no source."""
    if proposal.evidence is not None:
        return proposal.evidence[row] or (None if not proposal.drafts[row] else "")
    return "" if proposal.drafts[row] else None


def safe_propose(proposer: Proposer, batch: DraftBatch, draft: bool = True) -> Proposal:
    """``proposer.propose(batch)`` (``proposer.track(batch)`` when this step drafts
    nothing), or no drafts if it raises (logged once)."""
    try:
        if not draft:
            proposer.track(batch)
            return Proposal([[] for _ in batch.req_ids])
        proposal = proposer.propose(batch)
        if len(proposal.drafts) != len(batch.req_ids):
            raise RuntimeError(f"{len(proposal.drafts)} draft rows for {len(batch.req_ids)} requests")
        return proposal
    except Exception as e:  # noqa: BLE001 - a draft step must never crash the engine
        proposer.stats["failures"] = proposer.stats.get("failures", 0) + 1
        log_once(logging.ERROR, f"draft-failure-{id(proposer)}",
                 "vllm_selfspec: a draft step failed (%s: %s); that step drafts nothing and "
                 "decoding goes on. Further failures are counted in the stats, not logged.",
                 type(e).__name__, e, exc_info=True)
        return Proposal([[] for _ in batch.req_ids])


class PluginDrafter:
    """One per worker. Holds the proposer (the paper's algorithm) and its target view."""

    def __init__(self, vllm_config: Any) -> None:
        from vllm_selfspec import patches
        from vllm_selfspec.plugin import plugin_options, proposer_class

        opts = plugin_options(vllm_config)
        if opts is None:
            raise RuntimeError("vllm_selfspec.drafter.PluginDrafter is set up by the plugin; use "
                               "speculative_config={'method': 'selfspec', ...}")
        self.vllm_config = vllm_config
        self.opts = dict(opts)
        self.method = methods.METHODS[opts["method"]]
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.known: set[str] = set()  # the runner's requests at the last draft step
        # how the layer-skip draft walk runs (target.DraftPass), shared with the view
        from vllm_selfspec.target import DraftPass

        self.draft_pass = DraftPass()
        cls = proposer_class(self.method)
        # what the start-up stage fixed (resolvers.py), read here (resolved.py)
        self.refs = ArtifactRefs.from_json(opts["artifacts"])
        self.proposer: Proposer = cls(self.k, opts, self.refs.load())
        fault_every = int(os.environ.get(FAULT_ENV) or 0)  # test hook, read once
        if fault_every > 0:
            logger.warning("vllm_selfspec: test hook %s=%d: every %d-th draft step raises",
                           FAULT_ENV, fault_every, fault_every)
            inject_faults(self.proposer, fault_every)
        self.target_model: Any = None  # never `self.model` (the runner would wrap/register it)
        self.view: Any = None
        self._last_stats = time.monotonic()
        self.gate = CostGate(k=self.k) if opts.get("cost_gate", False) else None
        # the figures on /metrics (metrics.py): source mix, steps withheld, draft time
        self.publisher = metrics.publisher_for(vllm_config, self.method.name)
        # every call's seconds, gate and bookkeeping included (tools: control.drafter_stats)
        self.calls, self.seconds = 0, 0.0
        # TP > 1 and drafts that run the target's collectives: rank 0 decides for all ranks
        self.sync = rank_sync.for_engine(vllm_config) if self.proposer.uses_target else None
        if self.sync is not None:
            self.proposer.agree = self.sync.share
        self._phase_changes = 0
        self.evidence: dict[str, str] = {}  # req_id -> evidence class of its pending draft
        self.drafting = True  # tools switch drafting off to time plain decoding (control.py)
        # key draft_weights: low-bit copies of the linear layers, made while vLLM loads the
        # model (P8), chosen per shape in load_model (draft_weights.py)
        self.low_bit: Any = None
        self.capture: Any = None
        if self.proposer.uses_target and opts.get("draft_weights", "full") != "full":
            from vllm_selfspec.draft_weights import WeightCapture
            from vllm_selfspec.proposers.low_bit import allowed_kernels

            scales: dict[str, Any] = {}
            if self.refs.activation_scales:  # key smoothing (resolvers.py)
                from vllm_selfspec.builders.activation_scales import load_scales

                scales = load_scales(self.refs.activation_scales)
            self.capture = WeightCapture(allowed_kernels(opts["draft_weights"]), scales,
                                         float(opts.get("smoothing") or 0.0))
            patches.capture_weights(self.capture)
        patches.patch_runner_bridge()
        patches.patch_cpu_expand()  # in case the platform registered kernels before us
        patches.patch_top_k_empty()
        patches.patch_plain_steps()

    # ---- vLLM custom_class contract -------------------------------------------------
    def load_model(self, target_model: Any, *args: Any, **kwargs: Any) -> None:
        self.target_model = target_model
        if self.proposer.uses_target or self.proposer.uses_hidden_states:
            from vllm_selfspec.adapters import make_adapter
            from vllm_selfspec.proposers.artifacts import (
                ModelStamp,
                check_stamp,
                weights_fingerprint,
            )
            from vllm_selfspec.proposers.skip_mask import SEARCH_REMEDY

            stamp = self.refs.model
            self.adapter = make_adapter(target_model, stamp.architecture)
            if not stamp.fingerprint:
                # Hub model not on disk at start-up: check a stamped mask now.
                live = ModelStamp(stamp.architecture, stamp.num_layers, stamp.hidden_size,
                                  stamp.vocab_size,
                                  weights_fingerprint(self.adapter.named_fingerprint_tensors()))
                mask = self.refs.skip_mask
                meta = dict(mask.metadata) if mask is not None else {}
                if mask is not None and isinstance(meta.get("model"), dict):
                    check_stamp("skip mask", mask.source, ModelStamp.from_json(meta["model"]),
                                live, SEARCH_REMEDY)
        if self.capture is not None:
            from vllm_selfspec import patches
            from vllm_selfspec.draft_weights import LowBitDraft

            patches.capture_weights(None)
            self.low_bit = LowBitDraft(self.adapter, self.opts["draft_weights"], self.capture,
                                       stamp.vocab_size)
            self.capture = None
            logger.info("vllm_selfspec: %s", self.low_bit.describe())

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: Any,
                token_ids_cpu: Any, slot_mappings: Any = None) -> list[list[int]]:
        """Plain custom_class path, used only if the runner bridge is missing."""
        log_once(logging.WARNING, "no-bridge", "vllm_selfspec: the runner bridge is not active; "
                 "drafting nothing")
        return [[] for _ in sampled_token_ids]

    # ---- runner bridge (P3) ---------------------------------------------------------
    def _target_view(self, runner: Any) -> Any:
        if self.view is None and (self.proposer.uses_target or self.proposer.uses_hidden_states):
            from vllm_selfspec.target import HiddenStateView, TargetView

            if self.proposer.uses_target:
                self.view = TargetView(runner, self.adapter, self.low_bit)
                self.view.draft_pass = self.draft_pass
            else:
                self.view = HiddenStateView(runner, self.adapter)
            self.proposer.bind(self.view)
            if self.refs.mask_cache and (self.sync is None or self.sync.leader):
                self.proposer.artifact_saver = self._save_mask  # one rank writes the file
            logger.info("vllm_selfspec: %s", self.proposer.describe())
        return self.view

    def _finished(self, runner: Any, ctx: DraftContext) -> set[str]:
        """Requests finished since the last draft step. The scheduler's
        ``finished_req_ids`` alone miss some: when the last running request finishes,
        vLLM hands its id to a step with no tokens to run, which returns before sampling
        (``GPUModelRunner.execute_model``), so the drafter never sees it. A request the
        runner no longer holds (``runner.requests``, cleared in ``_update_states``) has
        finished too (or was preempted: its state is rebuilt when it resumes)."""
        finished = set(getattr(ctx.scheduler_output, "finished_req_ids", None) or ())
        live = getattr(runner, "requests", None)
        if isinstance(live, dict):
            finished |= self.known - live.keys()
            self.known = set(live.keys())
        return finished

    @torch.inference_mode()
    def propose_with_runner(self, runner: Any, ctx: DraftContext
                            ) -> tuple[list[list[int]], torch.Tensor | None]:
        t0 = time.monotonic()
        if self.publisher is not None:
            self.publisher.step(t0)
        try:
            return self._propose(runner, ctx)
        finally:
            t1 = time.monotonic()
            self.calls += 1
            self.seconds += t1 - t0
            if self.publisher is not None:
                self.publisher.figures.draft_seconds += t1 - t0
                self.publisher.maybe_write(self.proposer.stats, t1)

    def _propose(self, runner: Any, ctx: DraftContext
                 ) -> tuple[list[list[int]], torch.Tensor | None]:
        finished = self._finished(runner, ctx)
        nothing: list[list[int]] = [[] for _ in ctx.req_ids]
        batch: DraftBatch | None = None
        try:
            results = read_feedback(ctx)
            self.proposer.observe(results)
            if finished:
                self.proposer.finish(set(finished))
                for r in finished:
                    self.evidence.pop(r, None)
            limit = self._gate_limit(ctx, results) if self.drafting else 0
            # with TP every rank sets the step up: rank 0's limit is known only after plan()
            if limit > 0 or self.proposer.tracks_steps or self.sync is not None:
                batch = self._batch(runner, ctx)
        except Exception as e:  # noqa: BLE001
            log_once(logging.ERROR, f"draft-setup-{id(self)}", "vllm_selfspec: preparing a draft "
                     "step failed (%s: %s); drafting nothing for this step.", type(e).__name__, e,
                     exc_info=True)
            limit = NOT_READY
        if self.sync is not None:
            limit = self.sync.plan(limit)  # rank 0's limit on every rank (rank_sync.py)
        if limit == NOT_READY:
            return nothing, None
        if limit == 0 and (batch is None or not self.proposer.tracks_steps):
            self._drafted(0, 0.0)
            return nothing, None
        assert batch is not None
        if limit > 0:  # the cost gate's (rank 0's) draft length
            for r in batch.requests:
                r.max_len = min(r.max_len, limit)
        t0 = time.perf_counter()
        if limit == 0:
            # a step without drafts: proposers that track the target's states keep them
            safe_propose(self.proposer, batch, draft=False)
            self._drafted(0, 0.0)
            return nothing, None
        watch = self.draft_pass.compile_walks  # only a compiled walk can stall a step
        compiled = self._compile_seconds() if watch else 0.0
        proposal = safe_propose(self.proposer, batch)
        seconds = time.perf_counter() - t0
        stall = self._compile_seconds() - compiled if watch else 0.0
        stall += proposal.excluded_seconds
        if stall > 0 and self.gate is not None:
            # this step compiled the draft pass (control.set_compile_walks), or the proposer did
            # other work (SWIFT's optimization step): neither what a draft token costs nor
            # what verifying one costs
            self.gate.skip_timing()
        self._drafted(sum(len(d) for d in proposal.drafts), seconds - stall, proposal.timed,
                      proposal.depth, proposal.rows)
        if self.gate is not None:
            self.gate.landed([_source(proposal, r.row) for r in batch.requests])
        if proposal.evidence is not None and self.gate is not None:
            for req_id, draft, label in zip(ctx.req_ids, proposal.drafts, proposal.evidence):
                if draft:
                    self.evidence[req_id] = label
        if proposal.shadows and self.gate is not None:
            for label, drafted, accepted in proposal.shadows:
                self.gate.observe(drafted, accepted, label, age=False)
        self._maybe_log_stats()
        return proposal.drafts, proposal.probs

    def _batch(self, runner: Any, ctx: DraftContext) -> DraftBatch:
        """The rows that may draft this step (up to k drafts each), in proposer terms."""
        view = self._target_view(runner)
        if view is not None and hasattr(view, "begin_step"):
            view.begin_step(ctx.common_attn_metadata)
        return DraftBatch(req_ids=ctx.req_ids,
                          requests=draft_requests(runner, ctx, self.k,
                                                  int(self.opts.get("max_draft_prompt_tokens", 0))),
                          token_ids=runner.input_batch.token_ids_cpu,
                          num_tokens=runner.input_batch.num_tokens_no_spec,
                          states=target_states(ctx) if self.proposer.uses_hidden_states
                          else None,
                          # per-class lengths are rank-local: not where ranks must agree
                          limit=self.gate.limit if self.gate is not None and self.sync is None
                          else None,
                          worth=self.gate.worth if self.gate is not None and self.sync is None
                          else None)

    def _save_mask(self, mask: Any, info: dict[str, Any]) -> None:
        """SWIFT found a layer set: save it for ``cache_hit`` (never fatal)."""
        from vllm_selfspec.masks import save_swift_mask

        path = self.refs.mask_cache
        try:
            save_swift_mask(path, mask, self.refs.model.to_json(), info)
            logger.info("vllm_selfspec: swift saved its layer set (%s) to %s", mask.describe(), path)
        except OSError as e:
            log_once(logging.WARNING, "swift-save", "vllm_selfspec: could not save the swift "
                     "layer set to %s (%s)", path, e)

    def _gate_limit(self, ctx: DraftContext, results: list[Any]) -> int:
        """Most drafts per request this step (0: none), by the cost gate. A new phase of
        the proposer (SWIFT's) starts the gate afresh, since the drafter changed."""
        if self.gate is None:
            return self.k
        changes = self.proposer.phase_changes
        if changes != self._phase_changes:
            self._phase_changes = changes
            self.gate = CostGate(k=self.k)
        scheduled = getattr(ctx.scheduler_output, "num_scheduled_tokens", None) or {}
        self.gate.record(self.proposer.clock(), decode_only(ctx.scheduler_output),
                         sum(r.drafted for r in results), requests=len(scheduled))
        for r in results:
            self.gate.observe(r.drafted, r.accepted, self.evidence.pop(r.req_id, ""))
        # requests that get a new token this step, and so may draft: each pays the verify cost
        limit = self.gate.plan(max(1, sum(1 for t in ctx.sampled_token_ids if t)))
        if limit == 0 and self.publisher is not None:
            self.publisher.figures.gate_withheld_steps += 1
        return limit

    def _compile_seconds(self) -> float:
        timing = getattr(self.view, "timing", None) or {}
        return float(timing.get("compile_seconds", 0.0))

    def _drafted(self, tokens: int, seconds: float,
                 timed: dict[str, tuple[int, float]] | None = None,
                 depth: dict[str, int] | None = None, rows: int = 0) -> None:
        if self.gate is not None:
            self.gate.drafted(tokens, seconds, timed, depth, rows)

    def _maybe_log_stats(self) -> None:
        now = time.monotonic()
        if now - self._last_stats < STATS_INTERVAL_S:
            return
        self._last_stats = now
        s = self.proposer.stats
        rate = s["accepted"] / s["drafted"] if s["drafted"] else 0.0
        gate = f" | {self.gate.describe()}" if self.gate is not None else ""
        failed = f", failed steps {s['failures']}" if s.get("failures") else ""
        logger.info("vllm_selfspec: %s | drafts %d, drafted %d, accepted %d (%.1f%%)%s%s",
                    self.proposer.describe(), s["drafts"], s["drafted"], s["accepted"], 100 * rate,
                    failed, gate)
