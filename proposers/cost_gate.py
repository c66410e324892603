"""Cost gate: draft only as much as drafting pays for itself on this machine.

None of the papers needs this: on their GPUs a draft token costs a small fraction of a
decode step. On 2 CPU cores a layer-skip draft token costs 0.2-1.25 decode steps
while verifying one more token costs ~0.03, so a drafter whose acceptance is too low
makes decoding slower than plain decoding. The gate notices and steps back, at a cost
of about 1% of the time when it cannot win.

It predicts instead of timing whole windows of drafted steps. Per engine step it
learns, from the steps themselves:

* t0, the plain step (steps that verified nothing and followed no drafting);
* c_d, the drafter's own time per draft token (timed around the draft call);
* c_v, the extra step time per verified draft token (prior: 0.03 t0);
* a_i, the acceptance of draft position i given positions < i were accepted
  (Beta counts that slowly forget, so they follow the text).

and drafts the d that maximizes the expected token rate of a step with n requests
drafting, ``n (1 + sum_{i<=d} prod_{j<=i} a_j) / (t0 + n d (c_d + c_v))``, when that
beats plain decoding (n / t0) by ``margin``. c_d and c_v are per draft token over the
whole batch, so with n requests in flight a step pays them n times: at 4 requests a
verified token costs four times its share of a plain step (measured: docs/results.md,
"At 4 requests in flight"); acceptance uses an upper confidence bound, so
positions seldom drafted keep being tried. While plain decoding wins, one probe step
drafts a single token every P steps (P doubling, up to ``max_probe_every``), which
keeps a_1 and c_d current for a few hundredths of a step each time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

DRAFT, PLAIN = "draft", "plain"


@dataclass
class CostGateConfig:
    verify_cost: float = 0.03  # prior c_v / t0 (measured on SmolLM2, 2 cores: +0.031)
    prior_accept: float = 0.5  # Beta prior mean of a_i ...
    prior_weight: float = 2.0  # ... worth this many observations
    forget: float = 0.995  # acceptance counts decay by this per verification
    timing_weight: float = 0.1  # EMA weight of a new timing sample
    ucb: float = 1.0  # standard deviations of optimism on a_i
    margin: float = 0.02  # draft when the predicted rate beats plain by this share
    warmup_steps: int = 4  # plain steps before the first probe (to know t0)
    probe_every: int = 8  # P: steps between probes while plain decoding wins ...
    max_probe_every: int = 512  # ... doubling up to this
    history: int = 4096  # decisions kept for plots (step, drafts, predicted gain)


@dataclass
class _Beta:
    hits: float = 0.0
    tries: float = 0.0


@dataclass
class CostGate:
    """Per-engine gate; ``k`` is the most drafts a step may have."""

    k: int = 8
    cfg: CostGateConfig = field(default_factory=CostGateConfig)

    def __post_init__(self) -> None:
        self.t0: float | None = None  # seconds per plain decode step
        self.c_draft: float | None = None  # seconds per draft token (drafter's own time)
        self.c_verify: float | None = None  # extra seconds per verified draft token
        self.accept = [_Beta() for _ in range(self.k)]
        self.steps = 0
        self.last_time: float | None = None
        self.last_drafts = 0  # draft tokens proposed at the previous call
        self.last_draft_seconds = 0.0
        self.probe_every = self.cfg.probe_every
        self.next_probe = self.cfg.warmup_steps
        self.decision = 0
        self.batch = 1  # requests drafting at the last plan()
        self.history: list[tuple[int, int, float]] = []  # (step, drafts, predicted gain)

    # ---- measurements ----------------------------------------------------------------------
    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.cfg.timing_weight * (new - old)

    def record(self, now: float, decode_only: bool, verified: int) -> None:
        """Start of a drafting call: ``verified`` draft tokens were verified by the step
        that just ran; ``decode_only`` is False when it did prefill work (not timed)."""
        if self.last_time is not None and decode_only:
            dt = now - self.last_time
            if verified == 0 and self.last_drafts == 0:
                self.t0 = self._ema(self.t0, dt)
            elif verified > 0 and self.t0 is not None:
                extra = (dt - self.last_draft_seconds - self.t0) / verified
                self.c_verify = self._ema(self.c_verify, max(0.0, extra))
        self.last_time = now
        self.steps += 1

    def skip_timing(self) -> None:
        """The step now running is not timed (it compiled the draft pass: a one-off)."""
        self.last_time = None

    def drafted(self, tokens: int, seconds: float) -> None:
        """The drafting call proposed ``tokens`` draft tokens in ``seconds``."""
        self.last_drafts = tokens
        self.last_draft_seconds = seconds
        if tokens > 0:
            self.c_draft = self._ema(self.c_draft, seconds / tokens)

    def observe(self, drafted: int, accepted: int) -> None:
        """One verification: positions 0..drafted-1 were tried in order, ``accepted`` kept."""
        for b in self.accept:
            b.hits *= self.cfg.forget
            b.tries *= self.cfg.forget
        for i in range(min(drafted, self.k)):
            if i > accepted:
                break
            self.accept[i].tries += 1
            self.accept[i].hits += float(i < accepted)

    # ---- decision ----------------------------------------------------------------------------
    def acceptance(self, i: int, optimistic: bool = True) -> float:
        c, b = self.cfg, self.accept[i]
        n = b.tries + c.prior_weight
        mean = (b.hits + c.prior_accept * c.prior_weight) / n
        if not optimistic:
            return mean
        return min(1.0, mean + c.ucb * math.sqrt(mean * (1 - mean) / (n + 1)))

    def predicted_gain(self, d: int, optimistic: bool = True, n: int = 1) -> float:
        """Expected token rate with d drafts for each of n requests over plain decoding's
        (1.0 = break even)."""
        if d == 0 or self.t0 is None or self.c_draft is None:
            return 1.0
        cv = self.c_verify if self.c_verify is not None else self.cfg.verify_cost * self.t0
        tokens, run = 1.0, 1.0
        for i in range(d):
            run *= self.acceptance(i, optimistic)
            tokens += run
        return tokens / (1.0 + max(1, n) * d * (self.c_draft + cv) / self.t0)

    def best(self, n: int | None = None) -> tuple[int, float]:
        """(d, predicted gain) of the best number of drafts for n requests (default: as
        many as at the last plan(); 0 when none pays)."""
        n = self.batch if n is None else n
        best_d, best_g = 0, 1.0
        for d in range(1, self.k + 1):
            g = self.predicted_gain(d, n=n)
            if g > best_g:
                best_d, best_g = d, g
        return (best_d, best_g) if best_g > 1.0 + self.cfg.margin else (0, best_g)

    def plan(self, n: int = 1) -> int:
        """Most drafts this step may have, for each of its ``n`` drafting requests: d* when
        drafting pays, 1 on a probe step, else 0."""
        self.batch = max(1, int(n))
        if self.t0 is None or self.steps <= self.cfg.warmup_steps:
            d, gain = 0, 1.0
        elif self.c_draft is None:
            d, gain = 1, 1.0  # first probe: learn what a draft token costs
        else:
            d, gain = self.best()
            if d > 0:
                self.probe_every = self.cfg.probe_every
            elif self.steps >= self.next_probe:
                d = 1
                self.next_probe = self.steps + self.probe_every
                self.probe_every = min(2 * self.probe_every, self.cfg.max_probe_every)
        self.decision = d
        if len(self.history) < self.cfg.history:
            self.history.append((self.steps, d, round(gain, 4)))
        return d

    @property
    def winner(self) -> str:
        return DRAFT if self.best()[0] > 0 else PLAIN

    def describe(self) -> str:
        if self.t0 is None or self.c_draft is None:
            return "cost gate: measuring"
        d, g = self.best()
        cv = self.c_verify if self.c_verify is not None else self.cfg.verify_cost * self.t0
        return (f"cost gate: plain step {1000 * self.t0:.1f} ms, draft token "
                f"{self.c_draft / self.t0:.2f} steps, verify +{cv / self.t0:.3f}, acceptance "
                f"{[round(self.acceptance(i, False), 2) for i in range(min(4, self.k))]} -> "
                f"{'draft ' + str(d) if d else 'plain'} (x{g:.2f})")
