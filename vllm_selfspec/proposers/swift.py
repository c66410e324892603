"""SWIFT (Xia et al., ICLR 2025): on-the-fly self-speculative decoding. The skip set
is optimized during inference from the tokens the model has just generated; no
offline search.

§4.1 optimization phase: start from the uniform layer set (skip ratio r); once a
request has generated ``context_window`` tokens, every engine step runs one
optimization step before drafting: candidates from random search (Bayesian
optimization every β steps, ``layer_set_search``) are scored by *matchness*, the
share of the last ``context_window`` generated tokens that the skipped model
predicts teacher-forced (one forward for all candidates, reusing the target's KV
cache and writing none). Drafting goes on with the best set found so far.
§4.2 acceleration phase: the optimization step is gone; the best set drafts and a
draft stops once its top-1 probability falls under ``stop_threshold``
(confidence-aware drafting). vLLM v1 verifies one chain per request, so the
paper's confidence-aware top-k *tree* becomes this chain (README: what it costs).

Serving semantics the paper leaves open (README "SWIFT in a server"):
* one optimizer per engine (the input stream), fed by all running requests: each
  optimization step scores the window of one request, round-robin; a request's
  window is its latest complete chunk of ``context_window`` generated tokens, so
  a window repeats for several steps and the best set's score on it is measured
  once (comparisons on one window are exact, and most steps score the candidates
  only);
* the work per step is bounded: one forward over at most (1 + candidates_per_step)
  x context_window tokens and, every β steps, one GP suggestion on at most
  ``gp_points`` observations;
* the acceleration phase watches the acceptance rate over the last
  ``reoptimize_window`` verifications; when it falls ``reoptimize_drop`` below the
  rate seen right after optimizing (a new task arrived), optimization re-enters,
  starting from the current best set;
* the best set is saved when a phase ends (the authors' ``--cache-hit``): with
  ``cache_hit`` the next start skips the first optimization phase.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from .base import ContextWindow, DraftBatch, Proposal, Verification
from .draft_exit import DraftExitConfig
from .draft_verify import SelfSpecProposer
from .layer_set_search import LayerSetSearch, LayerSetSearchConfig
from .options import (
    CommonOptions,
    draft_vocab_option,
    draft_weights_option,
    option,
    smoothing_option,
)
from .resolved import Artifacts
from .skip_mask import SkipMask, uniform_mask

OPTIMIZE, ACCELERATE = "optimize", "accelerate"
MAX_TRACE = 4096  # optimization steps kept for plots (matchness per step)


@dataclass(frozen=True)
class SwiftOptions(CommonOptions):
    """Method ``swift``'s keys (defaults: SWIFT §5.1 and the authors' code)."""

    skip_ratio: float = option(
        0.05, "share r of the 2(L-2) inner sub-layers every layer set skips (first and last "
        "layers are never skipped; the paper's 0.45 is for 13B+ models with full-precision "
        "drafts: with low-bit draft weights a skipped sub-layer saves little and costs "
        "acceptance)", "float", 0.0, 1.0, low_open=True, high_open=True, symbol="r")
    context_window: int = option(32, "generated tokens matchness is computed over", "int", 2,
                                 1024, symbol="γ")
    bayes_interval: int = option(
        25, "Bayesian optimization proposes the candidate every this many optimization steps "
        "(random search otherwise; 0: random search only)", "int", 0, None, symbol="β")
    max_opt_iter: int = option(1000, "most optimization steps per phase", "int", 1, None,
                               symbol="S")
    max_tolerance_iter: int = option(300, "end the phase after this many steps without a "
                                     "better layer set", "int", 1, None)
    max_score: float = option(0.95, "end the phase once the best layer set's matchness reaches "
                              "this", "float", 0.0, 1.0, low_open=True)
    stop_threshold: float = option(0.8, "drafting stops when the draft's top-1 probability is "
                                   "below it (confidence-aware drafting, §4.2)", "float", 0.0,
                                   1.0)
    candidates_per_step: int = option(1, "candidates scored per optimization step, in the same "
                                      "forward as the current best layer set", "int", 1, 16)
    reoptimize_drop: float = option(
        0.3, "re-enter optimization when the acceptance rate over the last reoptimize_window "
        "verifications falls this far (relative) below the rate right after optimizing; 0: "
        "never", "float", 0.0, 1.0, high_open=True)
    reoptimize_window: int = option(256, "verifications the acceptance rate for re-entry is "
                                    "taken over", "int", 4, 100000)
    skip_mask: Any = option(
        None, "layer set to start from instead of the uniform one (file path or inline "
        "{\"attention\": [...], \"mlp\": [...]}, e.g. from tools/search_mask.py)", "mask")
    skip_mask_key: str | None = option(None, "entry to use in a model-keyed mask file", "str")
    cache_hit: bool = option(False, "start from the layer set saved by an earlier run "
                             "(mask_cache) and skip the first optimization phase", "bool")
    mask_cache: str | None = option(
        None, "file the best layer set is saved to when an optimization phase ends (default: "
        "<cache>/swift/<arch>-<L>L-<fingerprint>.json)", "str")
    optimization_budget: float = option(
        0.01, "share of engine time the optimization steps may take: a step runs only while "
        "the optimizer's time so far, plus the dearest step yet, is under this share of the time served (the phase takes "
        "longer in wall time, serving never slows by more)", "float", 0.0, 1.0, low_open=True)
    seed: int = option(0, "seed of the search and of the draft sampler", "int", 0, None)
    draft_vocab: int = draft_vocab_option()
    draft_weights: str = draft_weights_option()
    smoothing: float = smoothing_option()


class SwiftProposer(SelfSpecProposer):
    """Method ``swift``."""

    options_class = SwiftOptions
    tracks_steps = True

    def __init__(self, num_speculative_tokens: int, options: Mapping[str, Any],
                 artifacts: Artifacts | None = None) -> None:
        super().__init__(num_speculative_tokens, options, artifacts)
        c = self.cfg
        self.context_window = c.context_window
        self.candidates_per_step = c.candidates_per_step
        self.reoptimize_drop = c.reoptimize_drop
        self.recent: deque[tuple[int, int]] = deque(maxlen=c.reoptimize_window)
        self.reference: float | None = None  # acceptance rate right after optimizing
        self.phase = ACCELERATE if c.cache_hit else OPTIMIZE
        self.search: LayerSetSearch | None = None
        self.round_robin = 0
        # the best set's matchness on each request's current window: req_id -> (start, score)
        self.best_on_window: dict[str, tuple[int, float]] = {}
        self.finished = 0
        self.steps = 0
        self.events: list[dict[str, Any]] = []
        self.trace: list[tuple[int, float, float]] = []  # (step, best, best candidate)
        self._last_call: float | None = None
        self._step_s = 0.0  # the dearest optimization step so far (the budget's forecast)
        self.stats.update({"opt_steps": 0, "opt_fresh_windows": 0, "opt_seconds": 0.0,
                           "served_seconds": 0.0,
                           "opt_phases": 0, "bayes_suggestions": 0})
        self._event("start", phase=self.phase, mask=self.mask.describe())

    # ---- phases ----------------------------------------------------------------------------
    @property
    def optimizing(self) -> bool:
        return self.phase == OPTIMIZE

    @property
    def mask_settled(self) -> bool:
        """Only the acceleration phase's layer set drafts for long (§4.2): compiling the
        optimization phase's best-so-far sets would compile one per improvement."""
        return self.phase == ACCELERATE

    def draft_exit_config(self) -> DraftExitConfig:
        """§4.2: a fixed confidence threshold, not D&V's adaptive one."""
        return DraftExitConfig(threshold=self.cfg.stop_threshold, adaptive=False)

    def _search_config(self) -> LayerSetSearchConfig:
        c = self.cfg
        assert self.target is not None
        return LayerSetSearchConfig(
            num_layers=self.target.num_layers, skip_ratio=c.skip_ratio,
            bayes_interval=c.bayes_interval, max_opt_iter=c.max_opt_iter,
            max_tolerance_iter=c.max_tolerance_iter, max_score=c.max_score,
            seed=c.seed + self.stats["opt_phases"])

    def bind(self, target: Any) -> None:
        super().bind(target)
        if self.artifacts.skip_mask is None:
            self.mask = uniform_mask(target.num_layers, self.cfg.skip_ratio)
        if self.cfg.bayes_interval > 0:
            import bayes_opt  # noqa: F401  (import now: ~0.3 s the first time)
        if self.phase == OPTIMIZE:
            self._enter_optimization("start")

    def _enter_optimization(self, reason: str) -> None:
        self.search = LayerSetSearch(self._search_config(), start=self.mask)
        self.phase = OPTIMIZE
        self.stats["opt_phases"] += 1
        self.phase_changes += 1
        self._event("optimize", reason=reason)

    def _end_optimization(self) -> None:
        assert self.search is not None
        s = self.search
        self.best_on_window.clear()
        self.mask = SkipMask(s.best.attention, s.best.mlp, source="swift")
        self.phase = ACCELERATE
        self.phase_changes += 1
        self.reference = None
        self.recent.clear()
        info = {"matchness": s.best_score, "iterations": s.iterations, "reason": s.stop_reason}
        self._event("accelerate", **info, mask=self.mask.describe())
        self.search = None
        if self.artifact_saver is not None:
            self.artifact_saver(self.mask, info)

    def _event(self, kind: str, **info: Any) -> None:
        self.events.append({"event": kind, "step": self.steps, "finished_requests": self.finished,
                            "time": time.time(), **info})

    # ---- §4.1.2 one optimization step ------------------------------------------------------
    def _window(self, batch: DraftBatch) -> tuple[str, ContextWindow] | None:
        """The next ready request (round-robin) and its latest complete chunk of
        ``context_window`` generated tokens: the inputs are the tokens before each
        target, whose KV is in the cache (the first input may be the last prompt
        token, which predicted the first generated one)."""
        n = self.context_window
        ready = [r for r in batch.requests if r.num_output_tokens >= n]
        if not ready or batch.token_ids is None:
            return None  # still accumulating context (§4.1.1)
        r = ready[self.round_robin % len(ready)]
        self.round_robin += 1
        first = r.position - r.num_output_tokens + 1  # position of the first generated token
        start = first + (r.num_output_tokens // n - 1) * n - 1
        toks = batch.token_ids[r.row, start: start + n + 1].tolist()
        return r.req_id, ContextWindow(r.row, start, toks[:-1], toks[1:])

    def optimization_step(self, batch: DraftBatch) -> None:
        assert self.search is not None and self.target is not None
        picked = self._window(batch)
        if picked is None:
            return
        req_id, window = picked
        t0 = time.perf_counter()
        bayes_due = self.search.cfg.bayes_interval > 0 and \
            (self.search.iterations + 1) % self.search.cfg.bayes_interval == 0
        candidates = self.search.suggest(self.candidates_per_step)
        known = self.best_on_window.get(req_id)
        fresh = known is None or known[0] != window.start
        masks = [self.search.best, *candidates] if fresh else candidates
        scores = self.target.score_masks([window], masks).float().mean(dim=1).tolist()
        if self.agree is not None:  # TP: one search on every rank, from rank 0's scores
            scores = self.agree(scores)
        best_here = scores.pop(0) if fresh else known[1]  # type: ignore[index]
        if self.search.register(best_here, candidates, scores, fresh=fresh):
            best_here = max(scores)
            self.best_on_window.clear()  # a new best: its scores elsewhere are unknown
        self.best_on_window[req_id] = (window.start, best_here)
        self.stats["opt_steps"] += 1
        self.stats["opt_fresh_windows"] += int(fresh)
        self.stats["bayes_suggestions"] += int(bayes_due and len(self.search.history) > 2)
        took = time.perf_counter() - t0
        self.stats["opt_seconds"] += took
        self._step_s = max(self._step_s, took)
        if len(self.trace) < MAX_TRACE:
            self.trace.append((self.steps, float(self.search.best_score or 0.0), max(scores)))
        self.mask = self.search.best
        if self.search.done:
            self._end_optimization()

    # ---- vLLM-facing -----------------------------------------------------------------------
    def _within_budget(self) -> bool:
        """Engine time served so far (gaps over a second are idle time, not counted) and
        whether the optimizer's share of it is under ``optimization_budget``."""
        now = self.clock()
        if self._last_call is not None:
            self.stats["served_seconds"] += min(now - self._last_call, 1.0)
        self._last_call = now
        if self.cfg.optimization_budget >= 1.0:
            return True
        # the next step must fit too (its cost: the dearest step so far), so the share
        # never overshoots by a step
        return self.stats["opt_seconds"] + self._step_s <= self.cfg.optimization_budget * \
            self.stats["served_seconds"]

    def track(self, batch: DraftBatch) -> None:
        """A step the cost gate keeps plain still optimizes, within the budget."""
        self.steps += 1
        due = self._within_budget() and self.phase == OPTIMIZE and bool(batch.requests)
        if self.agree is not None:  # TP: the budget is wall time; rank 0's call holds
            due = bool(self.agree(due))
        if due:
            self.optimization_step(batch)

    @torch.inference_mode()
    def propose(self, batch: DraftBatch) -> Proposal:
        before = self.stats["opt_seconds"]
        self.track(batch)
        proposal = super().propose(batch)
        # an optimization step here (tens of ms) is no draft token's cost: with a low-bit
        # draft (a few ms a token) one such step priced the draft at 1.9 decode steps
        proposal.excluded_seconds = self.stats["opt_seconds"] - before
        return proposal

    def observe(self, results: list[Verification]) -> None:
        super().observe(results)
        if self.phase != ACCELERATE or self.reoptimize_drop <= 0:
            return
        for r in results:
            self.recent.append((r.drafted, r.accepted))
        if len(self.recent) < (self.recent.maxlen or 1):
            return
        drafted = sum(d for d, _ in self.recent)
        rate = sum(a for _, a in self.recent) / drafted if drafted else 0.0
        if self.reference is None:
            self.reference = rate
            self._event("reference", acceptance_rate=rate)
        elif rate < (1.0 - self.reoptimize_drop) * self.reference and self.target is not None:
            self._event("acceptance_drop", acceptance_rate=rate, reference=self.reference)
            self.recent.clear()
            self._enter_optimization(
                f"acceptance {rate:.2f} < {1 - self.reoptimize_drop:.2f} x {self.reference:.2f}")

    def finish(self, req_ids: set[str]) -> None:
        self.finished += len(req_ids)
        for r in req_ids:
            self.best_on_window.pop(r, None)

    def describe(self) -> str:
        extra = ""
        if self.search is not None and self.search.best_score is not None:
            extra = f", matchness {self.search.best_score:.2f} after {self.search.iterations} steps"
        return f"swift ({self.phase}{extra}): {self.mask.describe()}, stop threshold " \
               f"{self.exit.threshold:.2f}{self.describe_vocab()}"

    def report(self) -> dict[str, Any]:
        """Phase, events and matchness trace (vllm_selfspec.control.drafter_stats)."""
        return {"phase": self.phase, "events": list(self.events), "trace": list(self.trace),
                "mask": self.mask.to_json(), "reference_acceptance": self.reference}
