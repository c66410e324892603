"""LayerSkip (Elhoushi et al., ACL 2024): self-speculative decoding by early exit.

§4.2: the model exits after its first E layers; the hidden state goes through the
model's own final norm and its shared LM head (no auxiliary heads). Models trained
with the LayerSkip recipe (§4.1: layer dropout + early-exit loss, e.g. the
``facebook/layerskip-*`` checkpoints) predict well from early layers; other
models do not, and early-exit drafting then rarely pays (README).

§4.3.1 self-drafting: d = ``num_speculative_tokens`` tokens, autoregressively,
through layers 0..E-1 of the target itself. Here that is the Draft & Verify
machinery with the skip mask "every attention and MLP sub-layer from E on", so it
shares the target's weights and paged KV cache (§4.3.3 "single KV cache": layers
< E write their draft KV at the draft positions, the same values the verify pass
computes). The paper drafts a fixed d (its generator has no confidence stop);
``stop_threshold`` > 0 adds one, as SWIFT §4.2 does.
§4.3.2 self-verification is vLLM's own verify pass over the full model. The
exit-query cache of §4.3.3 is not used: vLLM's verify forward starts at layer 0,
so the first E layers are recomputed over the d drafts (paper Table 6: 5-12% of
the time per token on CPU).
With sampling, drafts are drawn from q and q goes to vLLM's rejection sampler
(as in ``draft_verify``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .draft_exit import DraftExitConfig
from .draft_verify import SelfSpecProposer
from .options import DraftSamplerOptions, draft_vocab_option, draft_weights_option, option
from .skip_mask import SkipMask, SkipMaskError


def default_exit_layer(num_layers: int) -> int:
    """A quarter of the depth: the exit of LayerSkip's llama3.2-1B (4 of 16) and
    llama2-7B (8 of 32) examples."""
    return max(1, round(num_layers / 4))


def early_exit_mask(exit_layer: int, num_layers: int) -> SkipMask:
    """The skip mask of an early exit after layer ``exit_layer`` - 1 (LayerSkip's
    ``forward_early``: ``layers[:exit_layer]``, then norm and LM head). With
    ``exit_layer == num_layers`` nothing is skipped (the draft is the model)."""
    if isinstance(exit_layer, bool) or not isinstance(exit_layer, int) \
            or not 1 <= exit_layer <= num_layers:
        raise SkipMaskError(
            f"layerskip exit_layer must be an integer in [1, {num_layers}] for this "
            f"{num_layers}-layer model (the draft runs layers 0..exit_layer-1), got {exit_layer!r}")
    later = frozenset(range(exit_layer, num_layers))
    return SkipMask(later, later, metadata={"exit_layer": exit_layer},
                    source=f"early exit after {exit_layer} of {num_layers} layers")


def fixed_speculations(stop_threshold: float = 0.0) -> DraftExitConfig:
    """LayerSkip drafts a fixed d a step (§4.3.1): no adaptive threshold; an optional
    fixed confidence stop (0: none)."""
    return DraftExitConfig(threshold=stop_threshold, adaptive=False)


@dataclass(frozen=True)
class LayerSkipOptions(DraftSamplerOptions):
    """Method ``layerskip``'s keys."""

    exit_layer: int | None = option(
        None, "E: the draft runs layers 0..E-1, then the final norm and LM head (an integer in "
        "[1, L]; L drafts with the whole model). Default: a quarter of the layers", "int", 1,
        None, symbol="E")
    stop_threshold: float = option(
        0.0, "drafting stops early when the draft's top-1 probability is below it (0: always "
        "num_speculative_tokens drafts, as the paper)", "float", 0.0, 1.0)
    draft_vocab: int = draft_vocab_option()
    draft_weights: str = draft_weights_option()


class EarlyExitProposer(SelfSpecProposer):
    """Method ``layerskip``: draft with the first E layers and the shared LM head."""

    options_class = LayerSkipOptions

    def draft_exit_config(self) -> DraftExitConfig:
        return fixed_speculations(self.cfg.stop_threshold)

    @property
    def exit_layer(self) -> int:
        return int(self.mask.metadata.get("exit_layer", 0))

    def describe(self) -> str:
        stop = (f"stop below top-1 probability {self.exit.threshold:.2f}" if self.exit.threshold > 0
                else "no confidence stop")
        return (f"layerskip: {self.mask.source}, up to {self.k} draft tokens, "
                f"{stop}{self.describe_vocab()}")
