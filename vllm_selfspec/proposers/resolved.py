"""The artifacts a method drafts with, one typed field each, named as the method's key.

``ArtifactRefs`` is what the start-up stage (``vllm_selfspec.resolvers``) fixed: where each
artifact is, already checked against the model. It crosses from the front-end process to
the workers as JSON inside the plugin's config. ``ArtifactRefs.load`` reads the files in
the worker and gives ``Artifacts``, which a proposer takes next to its options
(``Proposer(k, options, artifacts)``). Tests and tools build ``Artifacts`` directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm_selfspec.proposers.artifacts import ModelStamp
from vllm_selfspec.proposers.skip_mask import SkipMask

if TYPE_CHECKING:
    from vllm_selfspec.proposers.chimera import ChimeraDraftModel
    from vllm_selfspec.proposers.datastore import Datastore
    from vllm_selfspec.proposers.ngram_tables import BigramTable


@dataclass(frozen=True)
class Artifacts:
    """Loaded artifacts (None: the method does without)."""
    skip_mask: SkipMask | None = None  # selfspec's mask, SWIFT's start, LayerSkip's exit
    bigram_table: BigramTable | None = None  # N-Grammys' model-derived rows
    datastore: Datastore | None = None  # REST's corpus
    checkpoint: ChimeraDraftModel | None = None  # Chimera's trained draft model
    draft_vocab: tuple[int, ...] | None = None  # target ids of the draft vocabulary
    mask_cache: str | None = None  # where SWIFT saves the layer set it finds


@dataclass(frozen=True)
class ArtifactRefs:
    """Where each artifact is, fixed and checked at start-up."""
    model: ModelStamp
    skip_mask: SkipMask | None = None
    bigram_table: str | None = None  # file
    datastore: str | None = None  # file
    checkpoint: str | None = None  # file
    draft_vocab: str | None = None  # the checkpoint file that stores the vocabulary
    draft_vocab_size: int = 0  # key draft_vocab: its N most frequent tokens
    mask_cache: str | None = None  # file SWIFT writes
    # key smoothing: activation scales of the draft's W8A8 layers (file; read by the
    # drafter's weight capture, vllm_selfspec.draft_weights, not by the proposer)
    activation_scales: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model.to_json()}
        if self.skip_mask is not None:
            out["skip_mask"] = self.skip_mask.to_wire()
        for name in ("bigram_table", "datastore", "checkpoint", "draft_vocab", "mask_cache",
                     "activation_scales"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.draft_vocab_size:
            out["draft_vocab_size"] = self.draft_vocab_size
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ArtifactRefs:
        mask = obj.get("skip_mask")
        return cls(model=ModelStamp.from_json(obj.get("model", {})),
                   skip_mask=SkipMask.from_wire(mask) if mask is not None else None,
                   bigram_table=obj.get("bigram_table"), datastore=obj.get("datastore"),
                   checkpoint=obj.get("checkpoint"), draft_vocab=obj.get("draft_vocab"),
                   draft_vocab_size=int(obj.get("draft_vocab_size", 0)),
                   mask_cache=obj.get("mask_cache"),
                   activation_scales=obj.get("activation_scales"))

    def load(self) -> Artifacts:
        """Read the files (in the worker)."""
        table = store = model = vocab = None
        if self.bigram_table:
            from vllm_selfspec.proposers.ngram_tables import BigramTable

            table = BigramTable.load(self.bigram_table)
        if self.datastore:
            from vllm_selfspec.proposers.datastore import Datastore

            store = Datastore.load(self.datastore)
        if self.checkpoint:
            from vllm_selfspec.proposers.chimera import load_checkpoint

            model = load_checkpoint(self.checkpoint)
        if self.draft_vocab and self.draft_vocab_size > 0:
            from vllm_selfspec.proposers.chimera import load_draft_vocab_ids

            vocab = tuple(load_draft_vocab_ids(self.draft_vocab, self.draft_vocab_size))
        return Artifacts(skip_mask=self.skip_mask, bigram_table=table, datastore=store,
                         checkpoint=model, draft_vocab=vocab, mask_cache=self.mask_cache)
