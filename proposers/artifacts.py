"""Model stamps for offline artifacts (skip masks, bigram tables, trained heads).

Every file an offline tool writes carries a ``ModelStamp``: what it was made for
(architecture, layer count, hidden size, vocabulary size and a weights
fingerprint). Loading it for another model is refused with a message that says
which model it was made for and what to do.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Any, Mapping

import torch

# Small replicated tensors (never sharded by tensor parallelism), read the same
# way from a safetensors file or from the live vLLM model.
FINGERPRINT_TENSORS = (
    "model.norm.weight",
    "model.layers.0.input_layernorm.weight",
    "model.layers.{last}.post_attention_layernorm.weight",
)


class ArtifactMismatchError(ValueError):
    """An artifact was made for another model."""


def fingerprint_names(num_layers: int) -> list[str]:
    return [n.format(last=num_layers - 1) for n in FINGERPRINT_TENSORS]


def weights_fingerprint(tensors: list[torch.Tensor]) -> str:
    """sha256 over the bf16 bytes of the fingerprint tensors (dtype-robust:
    the same weights loaded in fp32 or bf16 give the same value)."""
    h = hashlib.sha256()
    for t in tensors:
        b = t.detach().to("cpu", torch.bfloat16).contiguous().view(torch.int16)
        h.update(b.numpy().tobytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class ModelStamp:
    architecture: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    fingerprint: str | None = None  # None when the weights could not be read
    name: str | None = None  # informational only (never compared)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "ModelStamp":
        return cls(
            architecture=str(obj.get("architecture", "")),
            num_layers=int(obj.get("num_layers", -1)),
            hidden_size=int(obj.get("hidden_size", -1)),
            vocab_size=int(obj.get("vocab_size", -1)),
            fingerprint=obj.get("fingerprint"),
            name=obj.get("name"),
        )

    def describe(self) -> str:
        fp = f", weights {self.fingerprint}" if self.fingerprint else ""
        nm = f"{self.name}: " if self.name else ""
        return (
            f"{nm}{self.architecture}, {self.num_layers} layers, hidden {self.hidden_size}, "
            f"vocab {self.vocab_size}{fp}"
        )

    def mismatch(self, other: "ModelStamp") -> str | None:
        """Why an artifact stamped ``other`` does not fit this model, or None."""
        fields = [
            ("architecture", self.architecture, other.architecture),
            ("number of layers", self.num_layers, other.num_layers),
            ("hidden size", self.hidden_size, other.hidden_size),
            ("vocabulary size", self.vocab_size, other.vocab_size),
        ]
        for what, mine, theirs in fields:
            if theirs not in ("", -1) and mine != theirs:
                return f"{what} {theirs} != {mine}"
        if self.fingerprint and other.fingerprint and self.fingerprint != other.fingerprint:
            return f"weights fingerprint {other.fingerprint} != {self.fingerprint}"
        return None


def check_stamp(what: str, source: str, stamped: ModelStamp | None, model: ModelStamp,
                remedy: str) -> None:
    """Raise ArtifactMismatchError if ``stamped`` was made for another model."""
    if stamped is None:
        return
    why = model.mismatch(stamped)
    if why is not None:
        raise ArtifactMismatchError(
            f"{what} {source} was made for another model ({stamped.describe()}; {why}); "
            f"this model is {model.describe()}. {remedy}"
        )
