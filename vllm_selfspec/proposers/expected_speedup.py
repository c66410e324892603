"""Expected speedup of a skip mask from teacher-forced agreement (a proxy objective).

Draft & Verify §3.3 optimizes the measured time per token f(z); SWIFT §4.1 scores
masks by "matchness", the share of the masked model's teacher-forced predictions
that equal what the full model generated. This module turns per-position
agreement and top-1 confidence into what the decoder would do: it replays greedy
self-speculative decoding over the full model's continuation (draft until the
confidence falls under γ or K tokens, accept the agreeing prefix, emit one more
token, update γ by §3.4), and prices every step with a cost model measured on
this machine (draft token = fixed part + kept attention and MLP sub-layers;
verification of n drafts = 1 + n·v plain decode steps, or, with the engine's measured
step table, what a step of n + 1 tokens cost there: ``CostModel.with_step_table``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Mapping, Sequence

from .draft_exit import DraftExitConfig, DraftExitController
from .skip_mask import SkipMask


@dataclass
class CostModel:
    """Costs in units of one plain decode step."""

    draft_fixed: float  # embedding, final norm, LM head, per-step bookkeeping
    draft_attention: float  # per kept attention sub-layer
    draft_mlp: float  # per kept MLP sub-layer
    verify_per_token: float  # verifying n drafts costs 1 + n * this (without verify_steps)
    # verify_steps[n]: a step verifying n drafts (n + 1 tokens), as the engine measured it;
    # past its end, verify_per_token more per draft. Empty: the line above.
    verify_steps: tuple[float, ...] = ()

    def draft_token(self, mask: SkipMask, num_layers: int) -> float:
        return (self.draft_fixed + self.draft_attention * (num_layers - len(mask.attention))
                + self.draft_mlp * (num_layers - len(mask.mlp)))

    def verify(self, n: int) -> float:
        s = self.verify_steps
        if not s:
            return 1.0 + self.verify_per_token * n
        if n < len(s):
            return s[n]
        return s[-1] + self.verify_per_token * (n - len(s) + 1)

    def with_step_table(self, table: Mapping[str, float]) -> CostModel:
        """This model with the step shape an engine measured: ``table`` is the cost gate's
        step table as ``tools/bench.py`` exports it (``drafter.cost_gate.step_table_s``:
        seconds of a plain step, ``"1"``, and of a drafted step of N tokens, ``"N+"``).
        On CPU it is far from a line: a drafted step pays a fixed overhead, and 2-6 tokens
        cost about the same (docs/results.md, the step table). Sizes the table lacks are
        interpolated between their measured neighbours."""
        plain = float(table.get("1") or 0.0)
        drafted = {int(k[:-1]) - 1: float(v) / plain for k, v in table.items()
                   if k.endswith("+") and k[:-1].isdigit() and int(k[:-1]) >= 2 and v
                   } if plain > 0 else {}
        if not drafted:
            raise ValueError("a step table needs a plain step (\"1\") and at least one "
                             "drafted step (\"N+\")")
        ns = sorted(drafted)
        steps = [1.0]
        for n in range(1, ns[-1] + 1):
            lo = max((m for m in ns if m <= n), default=ns[0])
            hi = min((m for m in ns if m >= n), default=ns[-1])
            w = 0.0 if hi == lo else (n - lo) / (hi - lo)
            steps.append((1 - w) * drafted[lo] + w * drafted[hi])
        return replace(self, verify_steps=tuple(steps))

    def to_json(self) -> dict[str, float | list[float]]:
        d: dict[str, float | list[float]] = {k: v for k, v in asdict(self).items()
                                             if k != "verify_steps"}
        if self.verify_steps:
            d["verify_steps"] = list(self.verify_steps)
        return d

    @classmethod
    def from_json(cls, obj: Mapping[str, float | list[float]]) -> CostModel:
        return cls(**{k: float(obj[k]) for k in ("draft_fixed", "draft_attention",  # type: ignore[arg-type]
                                                 "draft_mlp", "verify_per_token")},
                   verify_steps=tuple(float(x) for x in obj.get("verify_steps") or ()))  # type: ignore[union-attr]

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
