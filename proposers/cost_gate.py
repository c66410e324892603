"""Cost gate: draft only while drafting pays for itself, measured on this machine.

None of the papers needs this: on their GPUs a layer-skip draft token costs a
small fraction of a decode step. On 2 CPU cores a draft token costs 0.8·f + 0.16
decode steps and verifying k tokens costs more than one step (tools/draft_cost.py
measures both), so a drafter whose acceptance is too low makes
decoding slower than plain decoding. The gate notices and steps back.

It times engine steps in windows of W decode steps. A cycle is
[W steps without drafts][W steps with drafts][E·W steps with the faster arm],
E doubling (up to a cap) while the same arm keeps winning;
throughput is generated tokens per second of decode-only steps (steps doing
prefill work are not counted). A step's tokens and duration are credited to the
arm chosen at the previous step (drafts made then are verified now). Estimates
are smoothed over cycles (EMA) so one noisy window does not flip the decision.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DRAFT, PLAIN = "draft", "plain"


@dataclass
class CostGateConfig:
    window: int = 16  # W: decode steps per measurement window
    exploit_windows: int = 8  # E: windows on the winning arm before measuring again
    max_exploit_windows: int = 64  # E doubles while the same arm keeps winning (back-off)
    smoothing: float = 0.5  # weight of the newest measurement in the EMA
    margin: float = 1.0  # draft when rate(draft) > margin * rate(plain)


@dataclass
class _Window:
    tokens: int = 0
    seconds: float = 0.0
    steps: int = 0


@dataclass
class CostGate:
    cfg: CostGateConfig = field(default_factory=CostGateConfig)

    def __post_init__(self) -> None:
        self.rate: dict[str, float | None] = {DRAFT: None, PLAIN: None}
        self.windows: dict[str, _Window] = {DRAFT: _Window(), PLAIN: _Window()}
        self.phase = PLAIN  # measuring plain first
        self.phase_steps = 0
        self.exploiting = False
        self.last_arm: str | None = None
        self.last_time: float | None = None
        self.streak = 0  # cycles in a row the same arm won
        self.last_winner: str | None = None
        self.history: list[tuple[str, float]] = []  # (arm, tokens/s) per finished window

    @property
    def winner(self) -> str:
        d, p = self.rate[DRAFT], self.rate[PLAIN]
        if d is None or p is None:
            return DRAFT
        return DRAFT if d > self.cfg.margin * p else PLAIN

    def record(self, now: float, tokens: int, decode_only: bool) -> None:
        """Called at the start of every engine step's drafting with the tokens the
        step emitted; credits them to the arm used one step earlier."""
        if self.last_arm is not None and self.last_time is not None and decode_only and tokens > 0:
            w = self.windows[self.last_arm]
            w.tokens += tokens
            w.seconds += now - self.last_time
            w.steps += 1
        self.last_time = now

    def should_draft(self) -> bool:
        """The arm for this step (advances the schedule)."""
        if self.exploiting:
            arm = self.winner
            self.phase_steps += 1
            if self.phase_steps >= self.exploit_windows * self.cfg.window:
                self.exploiting, self.phase, self.phase_steps = False, PLAIN, 0
                self.windows = {DRAFT: _Window(), PLAIN: _Window()}  # measure afresh
        else:
            arm = self.phase
            if self.windows[arm].steps >= self.cfg.window:
                self._close(arm)
                if arm == PLAIN:
                    self.phase = DRAFT
                else:
                    self.exploiting, self.phase_steps = True, 0
                    w = self.winner
                    self.streak = self.streak + 1 if w == self.last_winner else 0
                    self.last_winner = w
                arm = self.winner if self.exploiting else self.phase
        self.last_arm = arm
        return arm == DRAFT

    @property
    def exploit_windows(self) -> int:
        return min(self.cfg.exploit_windows * 2 ** self.streak, self.cfg.max_exploit_windows)

    def _close(self, arm: str) -> None:
        w = self.windows[arm]
        if w.seconds > 0:
            r = w.tokens / w.seconds
            old = self.rate[arm]
            a = self.cfg.smoothing
            self.rate[arm] = r if old is None else a * r + (1 - a) * old
            self.history.append((arm, r))
        self.windows[arm] = _Window()

    def describe(self) -> str:
        def fmt(x: float | None) -> str:
            return "?" if x is None else f"{x:.1f}"

        return (f"cost gate: {fmt(self.rate[DRAFT])} tok/s drafting vs {fmt(self.rate[PLAIN])} "
                f"plain -> {self.winner}")
