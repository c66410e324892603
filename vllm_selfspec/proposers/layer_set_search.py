"""SWIFT's layer-set optimization (Xia et al., ICLR 2025, §4.1.2): random search plus
Bayesian optimization every β steps over the skipped sub-layers, at a fixed skip ratio.

Search space, as in the authors' code: the 2(L-2) attention and MLP sub-layers of
layers 1..L-2 (the first and last layers are never skipped); a candidate skips
exactly ``int(2(L-2)·r)`` of them. Random search draws that many uniformly; Bayesian
optimization (``bayesian-optimization`` 3.x, UCB) proposes a point of [0, 1]^{2(L-2)}
whose largest coordinates are skipped. Each candidate is scored by matchness (the
caller's teacher-forced pass); the best-scoring layer set is kept.

Stopping (§4.1.2 "termination", Appendix C): the best set's matchness reaches
``max_score``, or no improvement for ``max_tolerance_iter`` steps, or
``max_opt_iter`` steps.

Serving departure, documented in the README: windows change from step to step
(several requests feed one engine), so a candidate is compared with the current
best *on the same window* (the best's score on a window is measured once, in the
same forward as that step's candidates, and reused while the window repeats), and
the best's matchness used for stopping is its mean over the windows it was scored
on, after at least ``min_windows`` of them (one repetitive window scores every set
~1).
The Gaussian process sees each layer set once (its mean matchness) and at most
``gp_points`` recently scored sets, and the acquisition is maximized over random
points only, which bounds the cost of a suggestion (~0.1 s on 2 cores for L = 30;
an engine step must not stall).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from .skip_mask import SkipMask, uniform_mask


@dataclass
class LayerSetSearchConfig:
    num_layers: int
    skip_ratio: float = 0.45  # r
    bayes_interval: int = 25  # β
    max_opt_iter: int = 1000  # S
    max_tolerance_iter: int = 300
    max_score: float = 0.95
    seed: int = 0
    kappa: float = 2.5  # UCB, as the authors' code
    gp_points: int = 64  # layer sets the GP is fitted on (most recently scored)
    acq_random: int = 500  # acquisition maximization: random points ...
    acq_starts: int = 0  # ... and no L-BFGS-B polish (it costs ~1 s in 56 dimensions here)
    min_windows: int = 4  # windows the best set must be scored on before max_score can stop


def light_optimizer(num_vars: int, seed: int, kappa: float, n_random: int, n_smart: int,
                    batch: int = 1) -> Any:
    """A ``bayes_opt.BayesianOptimization`` with UCB over [0, 1]^num_vars whose
    acquisition maximization is cheaper than the library's default (shared with
    the offline search, ``vllm_selfspec.offline.search``)."""
    from bayes_opt import BayesianOptimization, acquisition

    def lighter(base: type) -> type:
        class Lighter(base):  # type: ignore[misc, valid-type]
            def suggest(self, *a: Any, **kw: Any) -> Any:
                kw["n_random"], kw["n_smart"] = n_random, n_smart
                return super().suggest(*a, **kw)

        return Lighter

    acq: Any = lighter(acquisition.UpperConfidenceBound)(kappa=kappa)
    if batch > 1:
        acq = lighter(acquisition.ConstantLiar)(acq, strategy="max")
    opt = BayesianOptimization(f=None, pbounds={f"x{i:03d}": (0.0, 1.0) for i in range(num_vars)},
                               acquisition_function=acq, random_state=seed, verbose=0,
                               allow_duplicate_points=True)
    opt.set_gp_params(alpha=1e-2)  # as both authors' searching code
    return opt


class LayerSetSearch:
    """One optimization phase: suggest candidates, take their scores, keep the best."""

    def __init__(self, cfg: LayerSetSearchConfig, start: SkipMask | None = None) -> None:
        L = cfg.num_layers
        if L < 3:
            raise ValueError(f"SWIFT needs at least 3 layers (first and last are kept), got {L}")
        self.cfg = cfg
        self.slots = [("attention", i) for i in range(1, L - 1)] + [("mlp", i) for i in range(1, L - 1)]
        self.skip_count = int(len(self.slots) * cfg.skip_ratio)
        self.best = start if start is not None else uniform_mask(L, cfg.skip_ratio)
        self.best_score: float | None = None  # mean matchness of the best set ...
        self.best_windows = 0  # ... over this many windows
        self.iterations = 0
        self.since_improvement = 0
        # layer set (as a 0/1 tuple) -> [sum of matchness, count], most recently scored last
        self.history: dict[tuple[float, ...], list[float]] = {}
        self.rng = random.Random(cfg.seed)
        self.stop_reason: str | None = None

    # ---- candidates ----------------------------------------------------------------------
    def _mask(self, skipped: list[int], source: str) -> SkipMask:
        attn = frozenset(i for k, (kind, i) in enumerate(self.slots) if k in skipped and kind == "attention")
        mlp = frozenset(i for k, (kind, i) in enumerate(self.slots) if k in skipped and kind == "mlp")
        return SkipMask(attn, mlp, source=source)

    def vector(self, mask: SkipMask) -> list[float]:
        return [1.0 if i in (mask.attention if kind == "attention" else mask.mlp) else 0.0
                for kind, i in self.slots]

    def random_candidate(self) -> SkipMask:
        return self._mask(self.rng.sample(range(len(self.slots)), self.skip_count), "swift random")

    def bayes_candidate(self) -> SkipMask:
        opt = light_optimizer(len(self.slots), self.cfg.seed + self.iterations, self.cfg.kappa,
                              self.cfg.acq_random, self.cfg.acq_starts)
        for z, (total, count) in list(self.history.items())[-self.cfg.gp_points:]:
            opt.register({f"x{i:03d}": v for i, v in enumerate(z)}, total / count)
        params = opt.suggest()
        z = [params[f"x{i:03d}"] for i in range(len(self.slots))]
        top = sorted(range(len(z)), key=lambda i: (-z[i], i))[: self.skip_count]
        return self._mask(top, "swift bayes")

    def suggest(self, n: int = 1) -> list[SkipMask]:
        """n candidates for this step: Bayesian optimization on every β-th step
        (once there is something to fit), random search otherwise."""
        out = []
        for j in range(n):
            step = self.iterations + 1
            if (j == 0 and self.cfg.bayes_interval > 0 and step % self.cfg.bayes_interval == 0
                    and len(self.history) >= 2):
                out.append(self.bayes_candidate())
            else:
                out.append(self.random_candidate())
        return out

    # ---- scores --------------------------------------------------------------------------
    def register(self, best_score: float, candidates: list[SkipMask], scores: list[float],
                 fresh: bool = True) -> bool:
        """Scores of the current best and of the candidates on the same window.
        ``fresh``: the best was scored on this window now (it counts toward its
        mean matchness); False: ``best_score`` is its score on this window from an
        earlier step (windows repeat; the caller caches it). Returns True if a
        candidate became the best."""
        if fresh:
            n = self.best_windows
            self.best_score = (best_score + n * (self.best_score or 0.0)) / (n + 1)
            self.best_windows = n + 1
            self._remember(self.best, best_score)
        improved = False
        top = best_score
        for m, s in zip(candidates, scores):
            self._remember(m, s)
            if s > top:
                top, self.best, improved = s, m, True
        if improved:
            self.best_score, self.best_windows = top, 1
            self.since_improvement = 0
        else:
            self.since_improvement += 1
        self.iterations += 1
        self._check_stop()
        return improved

    def _remember(self, mask: SkipMask, score: float) -> None:
        z = tuple(self.vector(mask))
        total, count = self.history.pop(z, (0.0, 0))
        self.history[z] = [total + score, count + 1]  # re-inserted: most recent last
        while len(self.history) > 4 * self.cfg.gp_points:
            del self.history[next(iter(self.history))]

    def _check_stop(self) -> None:
        if (self.best_score is not None and self.best_windows >= self.cfg.min_windows
                and self.best_score >= self.cfg.max_score):
            self.stop_reason = f"matchness {self.best_score:.3f} >= max_score {self.cfg.max_score}"
        elif self.since_improvement >= self.cfg.max_tolerance_iter:
            self.stop_reason = f"no improvement in {self.since_improvement} steps"
        elif self.iterations >= self.cfg.max_opt_iter:
            self.stop_reason = f"max_opt_iter {self.cfg.max_opt_iter} reached"

    @property
    def done(self) -> bool:
        return self.stop_reason is not None
