"""The dev prompts an offline search or sweep tunes on, and the options every such tool shares.

Prompts come from the dataset's ``dev`` split (``builders.datasets``); evaluation
(tools/bench.py) uses the ``test`` split, so nothing is measured on the prompts it
was tuned on.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any


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
    from vllm_selfspec.builders.datasets import load_prompts

    ps = load_prompts(dataset, tokenizer, "dev", num_prompts, max_prompt_tokens)
    if len(ps) < num_prompts:
        raise SystemExit(f"{dataset} has only {len(ps)} dev prompts of at most "
                         f"{max_prompt_tokens} tokens")
    return DevSet(dataset, [p.id for p in ps], [p.token_ids for p in ps])
