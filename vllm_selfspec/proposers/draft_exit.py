"""Adaptive draft-exiting (Draft & Verify §3.4, eqs. 2-4; Appendix B, Table 6).

Drafting stops once the draft's top-1 probability falls under a threshold γ.
After every verification stage e with acceptance rate AR_e:

    AR  <- β1·AR + (1-β1)·AR_e          (β1 = 0 for the first stage)
    γ~  =  γ + ε  if AR <= α  else  γ - ε
    γ   <- β2·γ + (1-β2)·γ~

so the acceptance rate stays near the target α. As in the authors' code
(`essg` in dilab-zju/self-speculative-decoding), γ is not lowered after a draft
that already reached the maximum length: a lower γ could not lengthen it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DraftExitConfig:
    threshold: float = 0.6  # γ0
    target_acceptance: float = 0.90  # α
    step: float = 0.01  # ε
    beta1: float = 0.5  # smoothing of AR
    beta2: float = 0.9  # smoothing of γ
    adaptive: bool = True


class DraftExitController:
    """Holds γ and the smoothed acceptance rate for one input stream (an engine)."""

    def __init__(self, cfg: DraftExitConfig) -> None:
        self.cfg = cfg
        self.threshold = cfg.threshold
        self.acceptance: float | None = None  # AR; None before the first stage
        self.stages = 0

    def observe(self, drafted: int, accepted: int, reached_max: bool = False) -> None:
        """Update after one verification stage of a draft of length ``drafted``."""
        if drafted <= 0 or not self.cfg.adaptive:
            return
        ar_e = min(accepted, drafted) / drafted
        b1 = self.cfg.beta1 if self.acceptance is not None else 0.0
        self.acceptance = b1 * (self.acceptance or 0.0) + (1.0 - b1) * ar_e
        self.stages += 1
        if self.acceptance <= self.cfg.target_acceptance:
            target = self.threshold + self.cfg.step
        elif reached_max:
            target = self.threshold
        else:
            target = self.threshold - self.cfg.step
        b2 = self.cfg.beta2
        self.threshold = min(1.0, max(0.0, b2 * self.threshold + (1.0 - b2) * target))

    def should_exit(self, confidence: float) -> bool:
        return confidence < self.threshold
