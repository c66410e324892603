"""LayerSkip (Elhoushi et al., ACL 2024): self-speculative decoding by early exit.

§4.2: the model exits after its first E layers; the hidden state goes through the
model's own final norm and its shared LM head (no auxiliary heads). Models trained
with the LayerSkip recipe (§4.1: layer dropout + early-exit loss, e.g. the
``facebook/layerskip-*`` checkpoints) predict well from early layers; other
models do not, and early-exit drafting then rarely pays (README).

§4.3.1 self-drafting: d = ``num_speculative_tokens`` tokens, autoregressively,
through layers 0..E-1 of the target itself. Here that is the Draft & Verify
machinery with the skip mask "every attention and MLP sub-layer from E on", so it
shares the target's weights and paged KV cache (§4.3.3 "single KV cache": layers
< E write their draft KV at the draft positions, the same values the verify pass
computes). The paper drafts a fixed d (its generator has no confidence stop);
``stop_threshold`` > 0 adds one, as SWIFT §4.2 does.
§4.3.2 self-verification is vLLM's own verify pass over the full model. The
exit-query cache of §4.3.3 is not used: vLLM's verify forward starts at layer 0,
so the first E layers are recomputed over the d drafts (paper Table 6: 5-12% of
the time per token on CPU).
With sampling, drafts are drawn from q and q goes to vLLM's rejection sampler
(as in ``draft_verify``).

Choosing E. The paper picks the exit per model by a sweep (§5, the authors' ``sweep.py``):
a quarter of the depth suits its early-exit-trained checkpoints, while a model not trained
for it agrees with itself only near the top (docs/results.md). Without ``exit_layer`` the
sweep runs while serving: each candidate exit (``candidate_exits``) drafts as its own
evidence class of the cost gate (proposers.cost_gate), which measures what its draft tokens
cost and how often they are accepted, and every step drafts through the exit the gate
predicts pays most. With low-bit draft weights the whole depth is a candidate too
(``candidate_exits``): the sweep's answer for a model not trained for early exit. Among the
exits the gate lets draft, each first gets a few steps of its own, and one not chosen is
tried again now and then, at doubling intervals; one on its probe step is worth trying
(``CostGate.worth``).
Without the gate (or under tensor parallelism, where it does not rank classes) the exit
is a quarter of the depth.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from .base import DraftBatch, Proposal
from .draft_exit import DraftExitConfig
from .draft_verify import SelfSpecProposer
from .options import (
    DraftSamplerOptions,
    draft_vocab_option,
    draft_weights_option,
    option,
    smoothing_option,
)
from .skip_mask import SkipMask, SkipMaskError


def default_exit_layer(num_layers: int) -> int:
    """A quarter of the depth: the exit of LayerSkip's llama3.2-1B (4 of 16) and
    llama2-7B (8 of 32) examples."""
    return max(1, round(num_layers / 4))


EXPLORE_STEPS = 16  # drafting steps every candidate exit gets before the gate's figures choose
RETRY_EVERY = 64  # then one not chosen drafts again after this many drafting steps ...
MAX_RETRY_EVERY = 1024  # ... doubling up to this


def candidate_exits(num_layers: int, low_bit: bool = False) -> tuple[int, ...]:
    """The exits the search while serving tries, deepest first: a quarter of the depth
    (the paper's examples), half and three quarters of it, and the two layers under the
    top (L-2, L-1). With the target's own weights L is not a candidate: that draft is the
    model, as dear as the step it drafts for. With ``low_bit`` draft weights it is: all L
    layers through the low-bit copy cost about what L-1 of them do, and a model not
    trained for early exit agrees with itself most there (the exit re-chosen for the
    cheaper pass, as the skip set is for ``selfspec``)."""
    L = num_layers
    found = {default_exit_layer(L), round(L / 2), round(3 * L / 4), L - 2, L - 1, L}
    top = L if low_bit else L - 1
    return tuple(sorted((e for e in found if 1 <= e <= top), reverse=True))


def exit_class(exit_layer: int) -> str:
    """The cost gate's evidence class of the drafts of exit ``exit_layer``."""
    return f"exit-{exit_layer}"


def early_exit_mask(exit_layer: int, num_layers: int) -> SkipMask:
    """The skip mask of an early exit after layer ``exit_layer`` - 1 (LayerSkip's
    ``forward_early``: ``layers[:exit_layer]``, then norm and LM head). With
    ``exit_layer == num_layers`` nothing is skipped (the draft is the model)."""
    if isinstance(exit_layer, bool) or not isinstance(exit_layer, int) \
            or not 1 <= exit_layer <= num_layers:
        raise SkipMaskError(
            f"layerskip exit_layer must be an integer in [1, {num_layers}] for this "
            f"{num_layers}-layer model (the draft runs layers 0..exit_layer-1), got {exit_layer!r}")
    later = frozenset(range(exit_layer, num_layers))
    return SkipMask(later, later, metadata={"exit_layer": exit_layer},
                    source=f"early exit after {exit_layer} of {num_layers} layers")


def fixed_speculations(stop_threshold: float = 0.0) -> DraftExitConfig:
    """LayerSkip drafts a fixed d a step (§4.3.1): no adaptive threshold; an optional
    fixed confidence stop (0: none)."""
    return DraftExitConfig(threshold=stop_threshold, adaptive=False)


@dataclass(frozen=True)
class LayerSkipOptions(DraftSamplerOptions):
    """Method ``layerskip``'s keys."""

    exit_layer: int | None = option(
        None, "E: the draft runs layers 0..E-1, then the final norm and LM head (an integer in "
        "[1, L]; L drafts with the whole model). Default: chosen while serving among "
        "candidate exits by the cost gate's measured gain (a quarter of the layers without "
        "the gate)", "int", 1,
        None, symbol="E")
    stop_threshold: float = option(
        0.0, "drafting stops early when the draft's top-1 probability is below it (0: always "
        "num_speculative_tokens drafts, as the paper)", "float", 0.0, 1.0)
    draft_vocab: int = draft_vocab_option()
    draft_weights: str = draft_weights_option()
    smoothing: float = smoothing_option()


class EarlyExitProposer(SelfSpecProposer):
    """Method ``layerskip``: draft with the first E layers and the shared LM head."""

    options_class = LayerSkipOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.exits: tuple[int, ...] = ()  # candidates of the search (none: E is fixed)
        self.masks: dict[int, SkipMask] = {}
        self.names: dict[int, str] = {}  # E -> its evidence class (exit_class), made once
        self.by_exit: dict[int, list[int]] = {}  # E -> [steps drafted, tokens drafted]
        self.drafting_steps = 0  # steps that drafted through any exit
        self.retry_every: dict[int, int] = {}  # E -> its retry interval (drafting steps)
        self.retry_at: dict[int, int] = {}  # E -> drafting step of its next retry

    def bind(self, target: Any) -> None:
        super().bind(target)
        if self.cfg.exit_layer is None:  # no exit given: search among the candidates
            L = int(target.num_layers)
            # a TargetView drafting through a low-bit copy (key draft_weights) has one
            self.exits = candidate_exits(L, getattr(target, "low_bit", None) is not None)
            self.masks = {e: early_exit_mask(e, L) for e in self.exits}
            self.names = {e: exit_class(e) for e in self.exits}

    def _choose(self, batch: DraftBatch) -> int:
        """The exit to draft through this step, among those the cost gate lets draft: one
        with fewer than ``EXPLORE_STEPS`` drafting steps (deepest first), else one due its
        retry (each candidate not chosen drafts again after ``RETRY_EVERY`` drafting steps,
        doubling: a few early drafts, a slow first call, must not judge an exit for good),
        else the one whose evidence class the gate predicts pays most (ties: deeper)."""
        assert batch.worth is not None
        lim, names = batch.limit, self.names
        open_ = [e for e in self.exits if lim is None or lim(names[e]) > 0]
        if not open_:
            return self.exits[0]
        for e in open_:
            row = self.by_exit.get(e)
            if row is None or row[0] < EXPLORE_STEPS:
                return e
        for e in open_:
            if self.drafting_steps >= self.retry_at.get(e, RETRY_EVERY):
                every = self.retry_every.get(e, RETRY_EVERY)
                self.retry_at[e] = self.drafting_steps + every
                self.retry_every[e] = min(2 * every, MAX_RETRY_EVERY)
                return e
        best, best_w = open_[0], -math.inf
        for e in open_:
            w = batch.worth(names[e])
            if w > best_w:
                best, best_w = e, w
        return best

    @torch.inference_mode()
    def propose(self, batch: DraftBatch) -> Proposal:
        if not self.exits or batch.worth is None:
            return super().propose(batch)
        e = self._choose(batch)
        name = self.names[e]
        self.mask = self.masks[e]
        reqs = [dataclasses.replace(r, max_len=batch.cap(r, name)) for r in batch.requests]
        reqs = [r for r in reqs if r.max_len > 0]
        if not reqs:
            return Proposal([[] for _ in batch.req_ids])
        t0 = time.perf_counter()
        out = super().propose(DraftBatch(batch.req_ids, reqs, batch.token_ids,
                                         batch.num_tokens))
        n = sum(len(d) for d in out.drafts)
        if n:
            self.drafting_steps += 1
            row = self.by_exit.setdefault(e, [0, 0])
            row[0] += 1
            row[1] += n
        out.evidence = [name if d else "" for d in out.drafts]
        out.timed = {name: (n, time.perf_counter() - t0)}
        out.depth = {name: (out.depth or {}).get("", 0)}
        return out

    def draft_exit_config(self) -> DraftExitConfig:
        return fixed_speculations(self.cfg.stop_threshold)

    @property
    def exit_layer(self) -> int:
        return int(self.mask.metadata.get("exit_layer", 0))

    def describe(self) -> str:
        stop = (f"stop below top-1 probability {self.exit.threshold:.2f}" if self.exit.threshold > 0
                else "no confidence stop")
        chosen = ""
        if self.exits:
            used = ", ".join(f"{e}: {n[0]} steps" for e, n in sorted(self.by_exit.items(),
                                                                     reverse=True))
            chosen = (f" (chosen while serving among exits {', '.join(map(str, self.exits))}; "
                      f"drafted at {used or 'none yet'})")
        return (f"layerskip: {self.mask.source}{chosen}, up to {self.k} draft tokens, "
                f"{stop}{self.describe_vocab()}")

    def report(self) -> dict[str, Any]:
        """The exit search: candidates and, per exit, steps and tokens drafted through it."""
        return {**super().report(), "exit_candidates": list(self.exits),
                "drafted_by_exit": {str(e): {"steps": n[0], "tokens": n[1]}
                                    for e, n in sorted(self.by_exit.items(), reverse=True)}}
