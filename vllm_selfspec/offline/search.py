"""Offline skip-mask search (Draft & Verify §3.3): Bayesian optimization over z ∈ {0,1}^{2L}.

The search space is one variable in [0, 1] per attention and per MLP sub-layer
(attention first, then MLP, offsets by L for any L), thresholded at 0.5 — or,
with a fixed skip budget N, the N largest variables are skipped (SWIFT's rule).
The optimizer is ``bayesian-optimization`` 3.x (UCB acquisition; ConstantLiar
for batches of suggestions evaluated in parallel). Known masks can be probed
first. Every trial is appended to a JSONL log (``artifacts.append_jsonl``) that
``resume`` replays into the optimizer. The objectives live in ``offline.objectives``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from vllm_selfspec.proposers.artifacts import append_jsonl, read_jsonl
from vllm_selfspec.proposers.skip_mask import SkipMask, uniform_mask

TOOL_VERSION = "1"


# ---- search space ------------------------------------------------------------------------
def keys(num_layers: int) -> list[str]:
    return [f"x{i:03d}" for i in range(2 * num_layers)]


def params_to_vector(params: dict[str, float], num_layers: int) -> list[float]:
    return [float(params[k]) for k in keys(num_layers)]


def vector_to_params(z: Iterable[float], num_layers: int) -> dict[str, float]:
    return dict(zip(keys(num_layers), (float(v) for v in z)))


def vector_to_mask(z: list[float], num_layers: int, budget: int | None = None) -> SkipMask:
    """Threshold at 0.5 (D&V), or skip the ``budget`` largest entries (SWIFT)."""
    if budget is None:
        return SkipMask.from_vector(z, num_layers)
    order = sorted(range(len(z)), key=lambda i: (-z[i], i))[:budget]
    bits = [0] * len(z)
    for i in order:
        bits[i] = 1
    return SkipMask.from_vector(bits, num_layers)


def mask_key(mask: SkipMask) -> str:
    return json.dumps([sorted(mask.attention), sorted(mask.mlp)])


def layout_masks(num_layers: int, n_attn: int, n_mlp: int, seed: int = 0) -> dict[str, SkipMask]:
    """First / middle / last / random masks with the same number of skipped
    attention and MLP sub-layers (D&V Table 7, Figure 7)."""
    import random

    def first(n: int) -> frozenset[int]:
        return frozenset(range(n))

    def last(n: int) -> frozenset[int]:
        return frozenset(range(num_layers - n, num_layers))

    def middle(n: int) -> frozenset[int]:
        start = (num_layers - n) // 2
        return frozenset(range(start, start + n))

    rng = random.Random(seed)
    return {
        "first": SkipMask(first(n_attn), first(n_mlp), source="first"),
        "middle": SkipMask(middle(n_attn), middle(n_mlp), source="middle"),
        "last": SkipMask(last(n_attn), last(n_mlp), source="last"),
        "random": SkipMask(frozenset(rng.sample(range(num_layers), n_attn)),
                           frozenset(rng.sample(range(num_layers), n_mlp)), source="random"),
    }


def default_probes(num_layers: int, budget: int | None) -> list[SkipMask]:
    """Known masks probed first: uniform masks (SWIFT's starting point) at a few
    ratios and the empty mask, or the uniform mask at the budget."""
    inner = 2 * (num_layers - 2)
    if budget is not None:
        return [uniform_mask(num_layers, min(budget / inner, 0.999))]
    return [SkipMask(source="empty")] + [uniform_mask(num_layers, r) for r in (0.1, 0.2, 0.3)]


# ---- the search ----------------------------------------------------------------------------
@dataclass
class SearchConfig:
    num_layers: int
    iterations: int
    seed: int = 0
    budget: int | None = None
    batch: int = 1  # suggestions evaluated in parallel per round (Ray)
    kappa: float = 2.576
    # acquisition maximization: random points, then L-BFGS-B from the best few.
    # bayes_opt's defaults (10000, 10) cost ~10 s per suggestion in 60 dimensions
    # on 2 cores, ten times a proxy evaluation.
    acq_random: int = 2000
    acq_starts: int = 3


def make_optimizer(cfg: SearchConfig) -> Any:
    from vllm_selfspec.proposers.layer_set_search import light_optimizer

    return light_optimizer(2 * cfg.num_layers, cfg.seed, cfg.kappa, cfg.acq_random,
                           cfg.acq_starts, batch=cfg.batch)


def search(cfg: SearchConfig, evaluate_batch: Callable[[list[SkipMask]], list[dict[str, Any]]],
           log_path: Path, probes: list[SkipMask] | None = None,
           progress: Callable[..., Any] | None = None) -> list[dict[str, Any]]:
    """Run (or resume) the search; return all trial records."""
    opt = make_optimizer(cfg)
    trials = read_jsonl(log_path)
    for t in trials:  # --resume: the optimizer relearns every finished trial
        opt.register(vector_to_params(t["z"], cfg.num_layers), float(t["value"]))
    seen = {t["mask_key"]: t for t in trials}
    queue = [m for m in (probes or []) if mask_key(m) not in seen]
    bar = progress(total=cfg.iterations, initial=len(trials)) if progress else None
    while len(trials) < cfg.iterations:
        n = min(cfg.batch, cfg.iterations - len(trials))
        zs: list[list[float]] = []
        for _ in range(n):
            if queue:
                m = queue.pop(0)
                zs.append([float(b) for b in m.to_vector(cfg.num_layers)])
            else:
                zs.append(params_to_vector(opt.suggest(), cfg.num_layers))
        masks = [vector_to_mask(z, cfg.num_layers, cfg.budget) for z in zs]
        todo = [m for m in masks if mask_key(m) not in seen]
        uniq = list({mask_key(m): m for m in todo}.values())
        results = evaluate_batch(uniq) if uniq else []
        fresh = {mask_key(m): r for m, r in zip(uniq, results)}
        for z, m in zip(zs, masks):
            k = mask_key(m)
            r = fresh.get(k) or {key: v for key, v in seen[k].items()
                                 if key not in ("iteration", "z", "time", "cached")}
            rec = {"iteration": len(trials), "z": z, "mask_key": k,
                   "attention": sorted(m.attention), "mlp": sorted(m.mlp),
                   **{kk: vv for kk, vv in r.items() if kk not in ("mask_key", "attention", "mlp")},
                   "cached": k not in fresh, "time": time.time()}
            opt.register(vector_to_params(z, cfg.num_layers), float(rec["value"]))
            append_jsonl(log_path, rec)
            trials.append(rec)
            seen.setdefault(k, rec)
            if bar is not None:
                bar.update(1)
                best = max(t["value"] for t in trials)
                bar.set_postfix(best=f"{best:.3f}", last=f"{rec['value']:.3f}")
    if bar is not None:
        bar.close()
    return trials


def best_trial(trials: list[dict[str, Any]]) -> dict[str, Any]:
    return max(trials, key=lambda t: (t["value"], -t["iteration"]))
