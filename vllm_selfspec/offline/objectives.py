"""Objectives of the skip-mask search (Draft & Verify §3.3); both maximize a speedup
over plain decoding and return ``{"value": speedup, ...details}`` from ``evaluate``.

* ``ProxyObjective`` — teacher-forced, hardware-light: the full model's greedy
  continuations of the dev prompts are generated once; each candidate costs one
  masked pass over them (``offline.hf_target.HFTarget.score``), replayed through the
  draft-exit rule and priced by a measured cost model
  (``proposers.expected_speedup``).
* ``MeasuredObjective`` — the paper's: wall time per generated token of
  ``selfspec`` decoding of the dev prompts inside ONE vLLM engine, the mask
  switched between trials (``control.set_skip_mask``), against plain decoding
  timed in the same engine.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from vllm_selfspec.offline.dev_set import DevSet, agreement
from vllm_selfspec.proposers.draft_exit import DraftExitConfig
from vllm_selfspec.proposers.expected_speedup import CostModel, replay
from vllm_selfspec.proposers.skip_mask import SkipMask


def read_cost_model(path: str | None, step_table: str | None = None) -> tuple[
        CostModel | None, dict[str, float] | None]:
    """The proxy's pricing from the tools' files: ``path``, a JSON with a ``cost_model``
    block (tools/draft_cost.py); ``step_table``, ``BENCH.json[:METHOD]``: the cost gate's
    step table a tools/bench.py run measured (that method's, else the one with the most
    step sizes), for ``CostModel.with_step_table``. Either may be None."""
    cost = (CostModel.from_json(json.loads(Path(path).read_text())["cost_model"])
            if path else None)
    if not step_table:
        return cost, None
    file, _, method = step_table.partition(":")
    tables = {r["method"]: r["drafter"]["cost_gate"]["step_table_s"]
              for r in json.loads(Path(file).read_text()).get("results", [])
              if ((r.get("drafter") or {}).get("cost_gate") or {}).get("step_table_s")}
    if method and method not in tables:
        raise SystemExit(f"--step-table {step_table}: no step table for '{method}' in {file} "
                         f"(methods with one: {', '.join(tables) or 'none'})")
    if not tables:
        raise SystemExit(f"--step-table {file}: no method there has a step table (a bench "
                         "JSON of a gated method, tools/bench.py --json)")
    return cost, tables[method or max(tables, key=lambda m: len(tables[m]))]


class ProxyObjective:
    name = "proxy"

    def __init__(self, model_path: str, dev: DevSet, max_tokens: int, k: int,
                 exit_cfg: DraftExitConfig, cost: CostModel | None = None,
                 continuations_path: Path | None = None, device: str = "cpu",
                 progress: Callable[[Iterable[Any]], Iterable[Any]] = lambda x: x,
                 step_table: dict[str, float] | None = None,
                 draft_weights: str = "full") -> None:
        """``cost``: the draft pass's price (default: timed now with the proxy's passes);
        ``step_table``: the engine's measured step shape for the verification
        (``CostModel.with_step_table``; default: linear); ``draft_weights``: the draft
        pass scores (and, by default, is timed) through low-bit copies of the linear
        layers and head (key draft_weights), the continuations stay the full model's."""
        from vllm_selfspec.offline.hf_target import HFTarget, cached_continuations

        self.target = HFTarget(model_path, device=device)
        self.draft_weights = draft_weights
        self.k, self.exit_cfg = k, exit_cfg
        self.dev = dev
        dev.continuations = cached_continuations(continuations_path, dev.prompt_ids,
                                                 dev.prompts, max_tokens,
                                                 self.target.generate_greedy, progress)
        self.prepared = [self.target.prepare(p, c) for p, c in zip(dev.prompts, dev.continuations)]
        self.copies = ({} if draft_weights == "full"
                       else self.target.low_bit_copies(draft_weights))
        with self.target.draft_weights(self.copies):
            self.cost = cost or self.target.time_costs(self.prepared[0])
        if step_table:
            self.cost = self.cost.with_step_table(step_table)

    @property
    def num_layers(self) -> int:
        return self.target.num_layers

    def teacher_forced(self, mask: SkipMask) -> tuple[list[list[bool]], list[list[float]]]:
        """Per dev prompt: does the masked model's top-1 match the continuation, and its
        top-1 probability, at every position (one forward per prompt)."""
        agree, conf = [], []
        with self.target.draft_weights(self.copies):
            for prep in self.prepared:
                a, c = self.target.score(prep, mask)
                agree.append(a.tolist())
                conf.append(c.tolist())
        return agree, conf

    def evaluate(self, mask: SkipMask) -> dict[str, Any]:
        return self.evaluate_priced(mask, [self.cost])[0]

    def evaluate_priced(self, mask: SkipMask, costs: list[CostModel]) -> list[dict[str, Any]]:
        """The expected speedup of ``mask`` under each cost model, from one teacher-forced
        pass (the replay is cheap; the pass is not)."""
        t0 = time.perf_counter()
        agree, conf = self.teacher_forced(mask)
        matchness = agreement(agree)
        return [self._result(replay(agree, conf, mask, self.num_layers, self.k, c, self.exit_cfg),
                             matchness, t0) for c in costs]

    @staticmethod
    def _result(r: Any, matchness: float, t0: float) -> dict[str, Any]:
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
                 replan_every: int = 10, draft_weights: str = "full") -> None:
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        from vllm import SamplingParams, TokensPrompt

        from vllm_selfspec import control
        from vllm_selfspec.offline import engines

        self.control = control
        self.dev, self.k, self.exit_cfg = dev, k, exit_cfg
        self.llm = engines.start(
            model_path, dtype=dtype, max_model_len=2048, block_size=32,
            kv_cache_memory_bytes=1 << 30, max_num_seqs=1, seed=0, enforce_eager=enforce_eager,
            speculative_config={"method": "selfspec", "num_speculative_tokens": k,
                                "skip_mask": {"attention": [], "mlp": []}, "cost_gate": False,
                                "draft_exit_threshold": exit_cfg.threshold,
                                "adaptive_threshold": exit_cfg.adaptive,
                                "target_acceptance": exit_cfg.target_acceptance,
                                "draft_weights": draft_weights})
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
        from vllm_selfspec.offline import engines

        engines.shutdown(self.llm)


