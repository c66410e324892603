"""The proposer contract: what a drafting algorithm sees and returns each step.

Modelled on vLLM's own proposers (``vllm/v1/spec_decode/ngram_proposer.py``:
one job, ragged ``list[list[int]]`` drafts, per-request state dropped when the
request finishes) and on transformers' ``candidate_generator.py`` (feedback
after every verification is part of the contract: ``observe``). Nothing here
imports vLLM; ``vllm_selfspec.drafter`` translates the runner's state into these
types.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Protocol, Sequence

import numpy as np
import torch

from .options import CommonOptions, build
from .resolved import Artifacts
from .skip_mask import SkipMask


def agreed_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share (a draft's accepted run against the
    tokens it is checked with)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class DraftRequest:
    """One running request that may draft after this step."""

    row: int  # row in the runner's batch (index into DraftBatch.req_ids)
    req_id: str
    position: int  # position of the newest token; KV exists for positions < this
    token: int  # the newest token (accepted or bonus), not yet in the KV cache
    max_len: int  # most drafts allowed for this request now (<= K)
    num_output_tokens: int = 0  # tokens the model generated so far (the newest included)
    temperature: float = 0.0  # 0 = greedy verification
    top_k: int = 0  # 0 = off
    top_p: float = 1.0


@dataclass
class ContextWindow:
    """Tokens a request already verified, for teacher-forced scoring (SWIFT §4.1.2):
    ``inputs`` sit at positions ``start..start+n-1`` (their KV is in the cache) and
    ``targets[i]`` is the token the model emitted after ``inputs[i]``."""

    row: int
    start: int
    inputs: list[int]
    targets: list[int]


@dataclass
class TargetStates:
    """The target's final-norm last-layer hidden states of one request's tokens that
    were verified this step (prefill chunks; for drafts, the accepted positions only)."""

    row: int
    req_id: str
    start: int  # position of hidden[0]
    hidden: torch.Tensor  # [n, H]


@dataclass
class DraftBatch:
    req_ids: list[str]  # every row of the runner's batch, in row order
    requests: list[DraftRequest]  # the rows that may draft
    token_ids: np.ndarray | None = None  # [rows, max_len] token ids (prompt + output)
    num_tokens: np.ndarray | None = None  # [rows] valid length of token_ids per row
    states: list[TargetStates] | None = None  # for proposers with uses_hidden_states
    # the cost gate's most drafts per evidence class (proposers.cost_gate); None: no limit
    limit: Callable[[str], int] | None = None
    # the cost gate's predicted gain per evidence class (CostGate.worth); None: not known
    worth: Callable[[str], float] | None = None

    def cap(self, req: DraftRequest, evidence: str) -> int:
        """Most drafts ``req`` may have from a source of class ``evidence``."""
        return req.max_len if self.limit is None else min(req.max_len, self.limit(evidence))

    def prefers(self, evidence: str, over: str) -> bool:
        """Whether the cost gate predicts drafts of class ``evidence`` pay more than
        drafts of class ``over`` (False where it does not know)."""
        return self.worth is not None and self.worth(evidence) > self.worth(over)


@dataclass
class Verification:
    """Outcome of verifying one request's draft (vLLM's scheduled spec tokens)."""

    req_id: str
    drafted: int
    accepted: int


@dataclass
class Proposal:
    drafts: list[list[int]]  # one (possibly empty) list per batch row
    # q for sampled drafts: [rows, K, V] float32, rows as DraftBatch.req_ids;
    # None when every draft is an argmax (vLLM then treats drafts as one-hot).
    probs: torch.Tensor | None = None
    # per batch row, the evidence class of its draft (cost gate feedback); None: unlabelled
    evidence: list[str] | None = None
    # per evidence class the proposer timed itself: (draft tokens, seconds); the cost gate
    # prices that class's tokens on their own (proposers.cost_gate.CostGate.drafted)
    timed: dict[str, tuple[int, float]] | None = None
    # per evidence class ("": the call's own drafts) drafted by passes that run every row
    # at once (self-drafting): its deepest row's draft length; the cost gate prices that
    # class per draft position rather than per row-token (CostGate.drafted)
    depth: dict[str, int] | None = None
    # verifications of drafts not made: (evidence class, drafted, accepted) of a source the
    # proposer passed over, scored against the tokens the target then produced; the cost gate
    # counts them as that class's evidence (CostGate.observe with age=False)
    shadows: list[tuple[str, int, int]] | None = None
    # requests the call looked up in n-gram sources (the context, earlier requests, a
    # datastore): the call's time less ``timed`` is that lookup's, paid per row whatever the
    # rows then draft, and the cost gate prices it per row (CostGate.drafted); 0: per token
    rows: int = 0
    # seconds of the call spent on other work than drafting (SWIFT's optimization step):
    # neither a draft token's cost nor the step's, so the cost gate prices neither with it
    excluded_seconds: float = 0.0


class LayerSkipTarget(Protocol):
    """The target model seen by self-speculative drafters (vllm_selfspec.target)."""

    num_layers: int
    vocab_size: int
    device: torch.device

    def draft_step(self, rows: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                   mask: SkipMask, draft_index: int, head: torch.Tensor | None = None,
                   settled: bool = False) -> torch.Tensor:
        """Run ``tokens`` at ``positions`` through the sub-layers ``mask`` keeps,
        writing their KV at those positions, and return logits [n, V] (with ``head``,
        LM-head rows [N, H] of a draft vocabulary: logits [n, N] over those rows only;
        needs ``lm_head_weight``). ``settled``: the mask will draft for long (not a
        SWIFT candidate of the moment), so a target that compiles its draft pass may
        compile this mask's."""
        ...

    def draft_chunk(self, rows: torch.Tensor, tokens: torch.Tensor, lens: list[int],
                    starts: torch.Tensor, mask: SkipMask,
                    head: torch.Tensor | None = None) -> torch.Tensor:
        """Several tokens per row in one pass: row i's ``lens[i]`` tokens (``tokens``
        holds the rows' in turn) at positions ``starts[i]``, ``starts[i] + 1``, ...,
        writing their KV there; logits at every token [sum(lens), V] (or [.., N] with
        ``head``), each as a draft step over the same tokens would give them."""
        ...

    def score_masks(self, windows: list[ContextWindow], masks: list[SkipMask]) -> torch.Tensor:
        """Teacher-forced agreement of each mask over the windows, writing no KV:
        [len(masks), total window tokens] bools."""
        ...


class Proposer(ABC):
    """A drafting algorithm. Subclasses name the paper section they follow."""

    # The drafter writes draft KV into the target's paged cache (needs vLLM to
    # reserve lookahead slots).
    writes_target_kv: ClassVar[bool] = False
    # The drafter runs the target's own layers (needs the runner bridge).
    uses_target: ClassVar[bool] = False
    # The drafter reads the target's last-layer hidden states (DraftBatch.states).
    uses_hidden_states: ClassVar[bool] = False
    # ``track(batch)`` must see the steps the cost gate keeps plain too (Chimera takes in the
    # target's states, SWIFT optimizes its layer set).
    tracks_steps: ClassVar[bool] = False

    # The method's typed keys (proposers.options); ``self.cfg`` is built once from them.
    options_class: ClassVar[type] = CommonOptions

    # Called by the proposer with (artifact, info) when it found something worth keeping
    # for the next start (SWIFT's layer set); set by the glue where the user wants it saved.
    artifact_saver: Callable[[Any, dict[str, Any]], None] | None = None

    # Tensor parallelism: returns TP rank 0's value of a decision that could differ
    # between ranks (``vllm_selfspec.rank_sync``), so drafts that run the target's
    # collectives run the same forwards on every rank. Every rank calls it at the same
    # points; None at TP = 1.
    agree: Callable[[Any], Any] | None = None

    def __init__(self, num_speculative_tokens: int, options: Mapping[str, Any],
                 artifacts: Artifacts | None = None) -> None:
        self.k = num_speculative_tokens
        # what the method drafts with, resolved at start-up (resolved.py); one typed field each
        self.artifacts = artifacts if artifacts is not None else Artifacts()
        # bumped whenever the drafter changes how it drafts (SWIFT's phases): measurements
        # of the old drafter (the cost gate's) no longer apply
        self.phase_changes = 0
        self.options = dict(options)  # the method's validated keys
        self.cfg: Any = build(self.options_class, options)
        self.stats: dict[str, float] = {"steps": 0, "drafts": 0, "drafted": 0, "accepted": 0}

    def clock(self) -> float:
        """Seconds of engine time, for measurements that span engine steps (SWIFT's budget,
        the cost gate's step times): wall time, unless a tool that steps several engines in
        turn in one process hands each engine a clock that runs only while it steps (an
        instance attribute set by ``vllm_selfspec.control.set_clock``, tools/bench.py)."""
        return time.perf_counter()

    def bind(self, target: Any) -> None:
        """Receive the target view once the model is loaded."""

    @abstractmethod
    def propose(self, batch: DraftBatch) -> Proposal: ...

    def observe(self, results: list[Verification]) -> None:
        """Feedback from the verification of the previous step's drafts."""
        for r in results:
            self.stats["drafts"] += 1
            self.stats["drafted"] += r.drafted
            self.stats["accepted"] += r.accepted

    def track(self, batch: DraftBatch) -> None:
        """A step that drafts nothing (cost gate, drafting off), for proposers with
        ``tracks_steps``: keep per-request state current."""

    def finish(self, req_ids: set[str]) -> None:
        """Drop state of finished requests."""

    def report(self) -> dict[str, Any]:
        """Method-specific state for tools (vllm_selfspec.control.drafter_stats)."""
        return {}

    def describe(self) -> str:
        return type(self).__name__
