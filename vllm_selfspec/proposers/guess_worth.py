"""Which guessed tokens pay for their place in a draft pass.

A self-draft pass that feeds a guess (staged speculative decoding, Spector & Re 2023:
a cheaper draft's tokens checked by the draft model) costs more with every token fed:
on a CPU a pass of n tokens takes about a + b·n seconds. A guessed token that holds saves
a one-token pass (a + b); one that does not costs b for nothing. So position j of a guess
pays where the share of guesses whose first j + 1 tokens held is at least b / (a + b).

Both sides are measured as drafting goes: a, b by least squares over the passes' tokens and
seconds, and each position's share from every guess's tokens against the row's final drafts
(a guess cut short is still scored in full: the passes after it draft the positions it did
not feed), so cutting a guess never hides what its later tokens would have done. Counts
decay, so both follow the text and the machine.
"""

from __future__ import annotations

import numpy as np

DECAY = 0.995  # per observation: the last few hundred passes and guesses count
PRIOR = 2.0  # pseudo-guesses that held at every position: feed whole guesses at first
MIN_PASSES = 16.0  # (decayed) passes timed before the fit is used


class GuessWorth:
    """Per guess position: how often it held; per pass: seconds = a + b·tokens fed."""

    def __init__(self, positions: int) -> None:
        self.fed = np.full(max(int(positions), 1), PRIOR)
        self.kept = self.fed.copy()
        self.sums = np.zeros(5)  # decayed Σw, Σn, Σs, Σn², Σn·s over passes

    def observe_pass(self, tokens: int, seconds: float) -> None:
        n, s = float(tokens), float(seconds)
        self.sums = self.sums * DECAY + np.array([1.0, n, s, n * n, n * s])

    def observe_guess(self, length: int, held: int) -> None:
        """A guess of ``length`` tokens whose first ``held`` agreed with the row's drafts."""
        length = min(int(length), self.fed.size)
        if length <= 0:
            return
        self.fed *= DECAY
        self.kept *= DECAY
        self.fed[:length] += 1.0
        self.kept[: min(int(held), length)] += 1.0

    def cost(self) -> tuple[float, float] | None:
        """(a, b): seconds of a pass and of each token fed; None until measured."""
        w, n, s, nn, ns = self.sums
        var = w * nn - n * n
        if w < MIN_PASSES or var <= 1e-9 * max(w * nn, 1.0):
            return None
        b = (w * ns - n * s) / var
        a = (s - b * n) / w
        return (a, b) if a > 0 and b > 0 else None

    def break_even(self) -> float:
        """The share of guesses that must hold at a position for it to be fed."""
        ab = self.cost()
        return 0.0 if ab is None else ab[1] / (ab[0] + ab[1])

    def length(self, wanted: int) -> int:
        """How many tokens of a guess of ``wanted`` to feed: the leading positions whose
        tokens held often enough."""
        return self.lengths([wanted])[0]

    def lengths(self, wanted: list[int]) -> list[int]:
        """``length`` for each guess of a pass, with the bar and shares computed once."""
        below = np.flatnonzero(self.kept / self.fed < self.break_even())
        cut = int(below[0]) if below.size else self.fed.size
        return [min(int(n), cut) for n in wanted]

    def report(self) -> dict[str, object]:
        ab = self.cost()
        return {"guess_break_even": round(self.break_even(), 3),
                "guess_pass_ms": None if ab is None else [round(ab[0] * 1e3, 2),
                                                          round(ab[1] * 1e3, 3)],
                "guess_held": [round(float(x), 2) for x in self.kept / self.fed]}
