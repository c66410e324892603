"""Typed method options: one frozen dataclass per method, one home for each default.

Each field is declared with ``option(default, help, kind, ...)``: its default, what it
means (the README key tables are tested against these), the values it accepts and
the paper's symbol. ``vllm_selfspec.methods`` turns the fields into the keys users
may pass and validates them; proposers build their options once with ``build``
from the validated keys (missing keys take the defaults).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, TypeVar

from .low_bit import PRECISE_MARGIN

T = TypeVar("T")

KINDS = ("float", "int", "bool", "str", "mask")


def option(default: Any, help: str, kind: str, low: float | None = None,
           high: float | None = None, *, low_open: bool = False, high_open: bool = False,
           choices: tuple[Any, ...] | None = None, symbol: str = "") -> Any:
    """A dataclass field that is also a user key."""
    assert kind in KINDS, kind
    meta = dict(help=help, kind=kind, low=low, high=high, low_open=low_open,
                high_open=high_open, choices=choices, symbol=symbol)
    return dataclasses.field(default=default, metadata={"option": meta})


def option_fields(cls: type) -> list[tuple[str, Any, dict[str, Any]]]:
    """(name, default, metadata) of every user key of an options dataclass, in order."""
    return [(f.name, f.default, f.metadata["option"]) for f in dataclasses.fields(cls)
            if "option" in f.metadata]


def build(cls: type[T], values: Mapping[str, Any]) -> T:
    """``cls`` from the keys of ``values`` it knows (others are ignored: the glue's own)."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in values.items() if k in names})


def draft_vocab_option() -> Any:
    """Key ``draft_vocab`` of the layer-skip methods (selfspec, swift, layerskip)."""
    return option(
        0, "draft logits over the N most frequent tokens of the model's own answers (the draft "
        "vocabulary stored in the Chimera checkpoint cached or shipped for this model), mapped "
        "back to target ids; the target still verifies over the full vocabulary. 0: the full "
        "LM head", "int", 0, None)


# The default of key draft_weights for selfspec, swift, layerskip and chimera: int8 weights with int8
# activations where vLLM's CPU kernel is (each layer falls back to int8 weights with bfloat16
# activations, then to its own, where that is faster or the kernel missing). Measured in
# docs/results.md: on 2 CPU cores it makes the SmolLM2-135M self-draft the first that pays.
# Chimera's draft model takes the same default (docs/chimera.md, "Low-bit draft weights").
DRAFT_WEIGHTS_DEFAULT = "w8a8"


def draft_weights_option(default: str = DRAFT_WEIGHTS_DEFAULT) -> Any:
    """Key ``draft_weights`` of the layer-skip methods (selfspec, swift, layerskip)."""
    return option(
        default, "weights the draft pass reads: \"full\" (the target's own), \"int8\" "
        "(weight-only, a scale per output row; bfloat16 activations), \"w8a8\" (the same "
        "weights, activations quantized per token; CPU) or \"int4\" (groups of 32). Each "
        "linear layer and the LM head take its fastest kernel, or a more precise one timed "
        f"{PRECISE_MARGIN:.0%} faster, measured for its shape on this machine at start-up "
        "(proposers.low_bit)", "str",
        choices=("full", "int8", "w8a8", "int4"))


# SmoothQuant's migration strength (Xiao et al., 2023, §4: 0.5 for most models); measured on
# SmolLM2 in docs/results.md
SMOOTHING_DEFAULT = 0.5


def smoothing_option(default: float = SMOOTHING_DEFAULT) -> Any:
    """Key ``smoothing`` of the methods with key ``draft_weights``."""
    return option(
        default, "SmoothQuant's migration strength for the low-bit layers whose kernels "
        "quantize activations (draft_weights w8a8): each input channel's activations are "
        "divided by s = max|x|^a / max|w|^(1-a) and the weight's column multiplied by it, "
        "with max|x| measured once per model on ShareGPT text (builders.activation_scales); "
        "0: off", "float", 0.0, 1.0, high_open=True)


@dataclasses.dataclass(frozen=True)
class CommonOptions:
    """Keys every method takes."""

    cost_gate: bool = option(
        True, "predict the token rate from the measured draft cost and acceptance; draft only, "
        "and only as many tokens, as pays (steps back where the drafter cannot pay)", "bool")
    max_draft_prompt_tokens: int = option(
        0, "requests whose prompt has more tokens than this draft nothing (0: no limit); a "
        "request can still set its own limit (vllm_xargs num_speculative_tokens)", "int", 0,
        None)
    # vLLM's own key, kept in the speculative config; the proposers read it too
    draft_sample_method: str = "probabilistic"

    @property
    def sample_drafts(self) -> bool:
        """With temperature > 0, draw drafts from q and hand q to vLLM (else argmax)."""
        return self.draft_sample_method == "probabilistic"


@dataclasses.dataclass(frozen=True)
class DraftSamplerOptions(CommonOptions):
    """Keys of methods that sample their drafts from q when the request samples."""

    seed: int = option(0, "seed of the draft sampler (temperature > 0)", "int", 0, None)
