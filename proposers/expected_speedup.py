"""Expected speedup of a skip mask from teacher-forced agreement (a proxy objective).

Draft & Verify §3.3 optimizes the measured time per token f(z); SWIFT §4.1 scores
masks by "matchness", the share of the masked model's teacher-forced predictions
that equal what the full model generated. This module turns per-position
agreement and top-1 confidence into what the decoder would do: it replays greedy
self-speculative decoding over the full model's continuation (draft until the
confidence falls under γ or K tokens, accept the agreeing prefix, emit one more
token, update γ by §3.4), and prices every step with a cost model measured on
this machine (draft token = fixed part + kept attention and MLP sub-layers;
verification of n drafts = 1 + n·v plain decode steps).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

from .draft_exit import DraftExitConfig, DraftExitController
from .skip_mask import SkipMask


@dataclass
class CostModel:
    """Costs in units of one plain decode step."""

    draft_fixed: float  # embedding, final norm, LM head, per-step bookkeeping
    draft_attention: float  # per kept attention sub-layer
    draft_mlp: float  # per kept MLP sub-layer
    verify_per_token: float  # verifying n drafts costs 1 + n * this

    def draft_token(self, mask: SkipMask, num_layers: int) -> float:
        return (self.draft_fixed + self.draft_attention * (num_layers - len(mask.attention))
                + self.draft_mlp * (num_layers - len(mask.mlp)))

    def verify(self, n: int) -> float:
        return 1.0 + self.verify_per_token * n

    def to_json(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, float]) -> CostModel:
        return cls(**{k: float(obj[k]) for k in ("draft_fixed", "draft_attention", "draft_mlp",
                                                 "verify_per_token")})

    @classmethod
    def uniform(cls, num_layers: int, fixed: float = 0.16, verify_per_token: float = 0.15
                ) -> CostModel:
        """Equal cost per sub-layer; the defaults are SmolLM2 on 2 CPU cores
        (tools/draft_cost.py: draft token ≈ 0.79·f + 0.16 decode steps)."""
        per = (1.0 - fixed) / (2 * num_layers)
        return cls(fixed, per, per, verify_per_token)


@dataclass
class Replay:
    tokens: int = 0  # tokens emitted after the first (prefill) token
    steps: int = 0  # verification steps
    drafted: int = 0
    accepted: int = 0
    cost: float = 0.0  # in plain decode steps

    @property
    def speedup(self) -> float:
        """Plain decoding emits one token per decode step."""
        return self.tokens / self.cost if self.cost > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.steps if self.steps else 1.0


def replay(agree: Sequence[Sequence[bool]], confidence: Sequence[Sequence[float]],
           mask: SkipMask, num_layers: int, k: int, cost: CostModel,
           exit_cfg: DraftExitConfig | None = None) -> Replay:
    """Replay self-speculative decoding over teacher-forced sequences.

    ``agree[s][j]``: the draft's prediction for continuation token j of sequence
    s (given the true prefix) equals the full model's; ``confidence[s][j]`` its
    top-1 probability. Token 0 comes from prefill; each step drafts from token j0.
    """
    ctl = DraftExitController(exit_cfg or DraftExitConfig())
    c_draft = cost.draft_token(mask, num_layers)
    out = Replay()
    for ag, cf in zip(agree, confidence):
        n_tok = len(ag)
        j0 = 1
        while j0 < n_tok:
            n = 0
            while n < k and j0 + n < n_tok:
                n += 1
                if cf[j0 + n - 1] < ctl.threshold:
                    break
            acc = 0
            while acc < n and ag[j0 + acc]:
                acc += 1
            emitted = min(acc + 1, n_tok - j0)
            out.steps += 1
            out.drafted += n
            out.accepted += acc
            out.tokens += emitted
            out.cost += n * c_draft + cost.verify(n)
            ctl.observe(n, acc, reached_max=n >= k)
            j0 += emitted
    return out
