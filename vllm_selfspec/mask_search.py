"""Offline skip-mask search (Draft & Verify §3.3): Bayesian optimization over z ∈ {0,1}^{2L}.

The search space is one variable in [0, 1] per attention and per MLP sub-layer
(attention first, then MLP, offsets by L for any L), thresholded at 0.5 — or,
with a fixed skip budget N, the N largest variables are skipped (SWIFT's rule).
The optimizer is ``bayesian-optimization`` 3.x (UCB acquisition; ConstantLiar
for batches of suggestions evaluated in parallel). Known masks can be probed
first. Every trial is appended to a JSONL log that ``resume`` replays into the
optimizer.

Objectives (both maximize a speedup over plain decoding):

* ``ProxyObjective`` — teacher-forced, hardware-light: the full model's greedy
  continuations of the dev prompts are generated once; each candidate costs one
  masked pass over them (``hf_target.HFTarget.score``), replayed through the
  draft-exit rule and priced by a measured cost model
  (``proposers.expected_speedup``).
* ``MeasuredObjective`` — the paper's: wall time per generated token of
  ``selfspec`` decoding of the dev prompts inside ONE vLLM engine, the mask
  switched between trials (``control.set_skip_mask``), against plain decoding
  timed in the same engine.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

from vllm_selfspec.proposers.draft_exit import DraftExitConfig
from vllm_selfspec.proposers.expected_speedup import CostModel, replay
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


# ---- objectives ----------------------------------------------------------------------------
class Objective(Protocol):
    name: str

    def evaluate(self, mask: SkipMask) -> dict[str, Any]:
        """{"value": speedup (higher is better), ...details}"""
        ...

    def describe(self) -> dict[str, Any]: ...


@dataclass
class DevSet:
    dataset: str
    prompt_ids: list[str]
    prompts: list[list[int]]
    continuations: list[list[int]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "split": "dev", "num_prompts": len(self.prompts),
                "prompt_ids": self.prompt_ids}


def add_dev_set_args(p: argparse.ArgumentParser) -> None:
    """The options every proxy tool shares: model, dev prompts and continuation length."""
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dataset", default="mtbench")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128, help="continuation length per prompt")


def agreement(agree: list[list[bool]]) -> float:
    """Share of positions where the draft's top-1 is the continuation's token (matchness)."""
    return sum(sum(a) for a in agree) / max(1, sum(len(a) for a in agree))


def load_dev_set(dataset: str, tokenizer: Any, num_prompts: int, max_prompt_tokens: int = 512
                 ) -> DevSet:
    from vllm_selfspec.datasets import load_prompts

    ps = load_prompts(dataset, tokenizer, "dev", num_prompts, max_prompt_tokens)
    if len(ps) < num_prompts:
        raise SystemExit(f"{dataset} has only {len(ps)} dev prompts of at most "
                         f"{max_prompt_tokens} tokens")
    return DevSet(dataset, [p.id for p in ps], [p.token_ids for p in ps])


class ProxyObjective:
    name = "proxy"

    def __init__(self, model_path: str, dev: DevSet, max_tokens: int, k: int,
                 exit_cfg: DraftExitConfig, cost: CostModel | None = None,
                 continuations_path: Path | None = None, device: str = "cpu",
                 progress: Callable[[Iterable[Any]], Iterable[Any]] = lambda x: x) -> None:
        from vllm_selfspec.hf_target import HFTarget, cached_continuations

        self.target = HFTarget(model_path, device=device)
        self.k, self.exit_cfg = k, exit_cfg
        self.dev = dev
        dev.continuations = cached_continuations(continuations_path, dev.prompt_ids,
                                                 dev.prompts, max_tokens,
                                                 self.target.generate_greedy, progress)
        self.prepared = [self.target.prepare(p, c) for p, c in zip(dev.prompts, dev.continuations)]
        self.cost = cost or self.target.time_costs(self.prepared[0])

    @property
    def num_layers(self) -> int:
        return self.target.num_layers

    def teacher_forced(self, mask: SkipMask) -> tuple[list[list[bool]], list[list[float]]]:
        """Per dev prompt: does the masked model's top-1 match the continuation, and its
        top-1 probability, at every position (one forward per prompt)."""
        agree, conf = [], []
        for prep in self.prepared:
            a, c = self.target.score(prep, mask)
            agree.append(a.tolist())
            conf.append(c.tolist())
        return agree, conf

    def evaluate(self, mask: SkipMask) -> dict[str, Any]:
        t0 = time.perf_counter()
        agree, conf = self.teacher_forced(mask)
        r = replay(agree, conf, mask, self.num_layers, self.k, self.cost, self.exit_cfg)
        matchness = agreement(agree)
        return {"value": r.speedup, "acceptance_rate": r.acceptance_rate,
                "mean_acceptance_length": r.mean_acceptance_length, "matchness": matchness,
                "tokens_per_step": r.tokens / r.steps if r.steps else 1.0,
                "eval_seconds": time.perf_counter() - t0}

    def describe(self) -> dict[str, Any]:
        return {"objective": self.name, "k": self.k, "cost_model": self.cost.to_json(),
                "draft_exit": vars(self.exit_cfg)}


class MeasuredObjective:
    """Wall time per token of selfspec decoding inside one vLLM engine."""

    name = "measured"

    def __init__(self, model_path: str, dev: DevSet, max_tokens: int, k: int,
                 exit_cfg: DraftExitConfig, dtype: str = "float32", enforce_eager: bool = True,
                 replan_every: int = 10) -> None:
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        from vllm import SamplingParams, TokensPrompt

        from vllm_selfspec import control
        from vllm_selfspec.llm import LLM

        self.control = control
        self.dev, self.k, self.exit_cfg = dev, k, exit_cfg
        self.llm = LLM(model_path, dtype=dtype, max_model_len=2048, block_size=32,
                       kv_cache_memory_bytes=1 << 30, max_num_seqs=1, seed=0,
                       enforce_eager=enforce_eager,
                       speculative_config={"method": "selfspec", "num_speculative_tokens": k,
                                           "skip_mask": {"attention": [], "mlp": []},
                                           "cost_gate": False,
                                           "draft_exit_threshold": exit_cfg.threshold,
                                           "adaptive_threshold": exit_cfg.adaptive,
                                           "target_acceptance": exit_cfg.target_acceptance})
        self.prompts = [TokensPrompt(prompt_token_ids=p) for p in dev.prompts]
        self.sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        self.num_layers = self.llm.llm_engine.model_config.hf_config.num_hidden_layers
        self.llm.generate(self.prompts[:1], self.sp, use_tqdm=False)  # warm up
        self.replan_every = replan_every
        self.trials = 0
        self.plain_tps = self._plain()

    def _run(self) -> tuple[int, float]:
        tokens, seconds = 0, 0.0
        for p in self.prompts:
            t0 = time.perf_counter()
            out = self.llm.generate([p], self.sp, use_tqdm=False)
            seconds += time.perf_counter() - t0
            tokens += len(out[0].outputs[0].token_ids)
        return tokens, seconds

    def _plain(self) -> float:
        self.llm.collective_rpc(self.control.set_drafting, args=(False,))
        try:
            tokens, seconds = self._run()
        finally:
            self.llm.collective_rpc(self.control.set_drafting, args=(True,))
        return tokens / seconds

    def evaluate(self, mask: SkipMask) -> dict[str, Any]:
        self.trials += 1
        if self.replan_every and self.trials % self.replan_every == 0:
            self.plain_tps = 0.5 * self.plain_tps + 0.5 * self._plain()  # follow machine drift
        self.llm.collective_rpc(self.control.set_skip_mask,
                                args=(mask.to_json(), self.exit_cfg.threshold))
        self.llm.collective_rpc(self.control.reset_stats)
        tokens, seconds = self._run()
        st = self.llm.collective_rpc(self.control.drafter_stats)[0]
        drafted, accepted = st.get("drafted", 0), st.get("accepted", 0)
        drafts = st.get("drafts", 0)
        tps = tokens / seconds
        return {"value": tps / self.plain_tps, "seconds_per_token": seconds / tokens,
                "tokens_per_s": tps, "plain_tokens_per_s": self.plain_tps,
                "acceptance_rate": accepted / drafted if drafted else 0.0,
                "mean_acceptance_length": 1.0 + accepted / drafts if drafts else 1.0}

    def describe(self) -> dict[str, Any]:
        return {"objective": self.name, "k": self.k, "draft_exit": vars(self.exit_cfg)}

    def close(self) -> None:
        try:
            self.llm.llm_engine.engine_core.shutdown()
        except Exception:
            pass


# ---- trials log ----------------------------------------------------------------------------
def read_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a torn last line from an interrupted run
    return out


def append_log(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


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
    trials = read_log(log_path)
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
            append_log(log_path, rec)
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
