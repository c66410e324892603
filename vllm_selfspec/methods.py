"""Method names, aliases, per-method defaults, and validation of user keys.

``{"method": "selfspec", ...}`` in ``--speculative-config`` is split (patches.P1)
into vLLM's own keys, which stay in the speculative config, and the plugin's
keys, which are validated here and travel to every process in
``VllmConfig.additional_config["vllm_selfspec"]``.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from vllm_selfspec import resolvers
from vllm_selfspec.errors import SelfSpecConfigError as SelfSpecConfigError  # re-exported
from vllm_selfspec.proposers.chimera_drafting import ChimeraOptions, ChimeraProposer
from vllm_selfspec.proposers.draft_verify import SelfSpecOptions, SelfSpecProposer
from vllm_selfspec.proposers.layerskip import EarlyExitProposer, LayerSkipOptions
from vllm_selfspec.proposers.ngrammys import DEFAULT_WIDTH, NGrammysOptions, NGrammysProposer
from vllm_selfspec.proposers.ngrammys_chimera import DEFAULT_WIDTH as NGRAMMYS_CHIMERA_WIDTH
from vllm_selfspec.proposers.ngrammys_chimera import NGrammysChimeraOptions, NGrammysChimeraProposer
from vllm_selfspec.proposers.ngrammys_history import (
    NGrammysHistoryOptions,
    NGrammysHistoryProposer,
)
from vllm_selfspec.proposers.ngrammys_selfspec import (
    NGrammysSelfSpecOptions,
    NGrammysSelfSpecProposer,
)
from vllm_selfspec.proposers.options import option_fields
from vllm_selfspec.proposers.swift import SwiftOptions, SwiftProposer

PLUGIN_KEY = "vllm_selfspec"
DRAFTER_CLASS = "vllm_selfspec.drafter.PluginDrafter"

# vLLM SpeculativeConfig keys that keep their meaning with our methods.
CORE_KEYS = frozenset({
    "num_speculative_tokens", "draft_sample_method", "rejection_sample_method",
    "max_model_len", "enforce_eager", "disable_padded_drafter_batch",
})
# vLLM keys that make no sense with a self-speculative plugin method.
FOREIGN_CORE_KEYS = frozenset({
    "model", "draft_tensor_parallel_size", "quantization", "revision", "code_revision",
    "prompt_lookup_max", "prompt_lookup_min", "num_speculative_tokens_per_batch_size",
    "parallel_drafting", "use_heterogeneous_vocab", "attention_backend", "kv_cache_dtype",
})


@dataclass(frozen=True)
class Key:
    name: str
    default: Any
    help: str
    kind: str  # "float", "int", "bool", "str", "mask"
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[Any, ...] | None = None
    symbol: str = ""  # the paper's symbol, for the README table

    def range_text(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        if self.low is None and self.high is None:
            return {"float": "a number", "int": "an integer", "bool": "true or false",
                    "str": "a string", "mask": "a file path or {\"attention\": [...], \"mlp\": [...]}"}[self.kind]
        lo = "(" if self.low_open else "["
        hi = ")" if self.high_open else "]"
        what = "an integer" if self.kind == "int" else "a number"
        return f"{what} in {lo}{self.low if self.low is not None else '-inf'}, {self.high if self.high is not None else 'inf'}{hi}"

    def validate(self, method: str, value: Any) -> Any:
        def fail() -> SelfSpecConfigError:
            return SelfSpecConfigError(
                f"vllm_selfspec: key '{self.name}' of method '{method}' must be {self.range_text()}, got {value!r}")
        if value is None:
            if self.default is None:
                return None
            raise fail()
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise fail()
            return value
        if self.kind in ("float", "int"):
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise fail()
            if self.kind == "int" and not float(value).is_integer():
                raise fail()
            v = int(value) if self.kind == "int" else float(value)
            if self.low is not None and (v < self.low or (self.low_open and v == self.low)):
                raise fail()
            if self.high is not None and (v > self.high or (self.high_open and v == self.high)):
                raise fail()
            return v
        if self.kind == "str":
            if not isinstance(value, str) or (self.choices and value not in self.choices):
                raise fail()
            return value
        if self.kind == "mask":
            if not isinstance(value, (str, Mapping)):
                raise fail()
            return value
        raise AssertionError(self.kind)


def keys_of(options: type) -> tuple[Key, ...]:
    """The user keys of a method's typed options (``proposers.options.option`` fields):
    name, default, help, kind and range come from the dataclass (one home)."""
    return tuple(Key(name, default, meta["help"], meta["kind"], meta["low"], meta["high"],
                     meta["low_open"], meta["high_open"], meta["choices"], meta["symbol"])
                 for name, default, meta in option_fields(options))


@dataclass(frozen=True)
class Method:
    name: str
    aliases: tuple[str, ...]
    proposer: type  # the algorithm's class (vllm_selfspec.proposers.*)
    default_k: int | None  # None: fixed at start-up by ``prepare`` (e.g. Chimera's heads)
    options: type  # the proposer's typed options (proposers.options): the user keys
    summary: str
    # constraints between keys, on the validated options (raise SelfSpecConfigError)
    check: Callable[[dict[str, Any]], None] | None = None
    # (opts, ModelInfo) -> SkipMask: picks the draft's skip mask at start-up (resolvers.py),
    # for methods that draft through the target's layers
    skip_mask: Callable[[dict[str, Any], Any], Any] | None = None
    # (opts, ModelInfo, core keys) -> the ArtifactRefs fields of the method's other
    # artifacts, found and checked at start-up (resolvers.py: tables, datastores, checkpoints)
    prepare: Callable[[dict[str, Any], Any, dict[str, Any]], dict[str, Any]] | None = None

    @property
    def keys(self) -> tuple[Key, ...]:
        return keys_of(self.options)

    def key(self, name: str) -> Key | None:
        return next((k for k in self.keys if k.name == name), None)


SELFSPEC = Method(
    name="selfspec",
    aliases=("draft_verify", "draft-and-verify", "self_speculative"),
    proposer=SelfSpecProposer,
    skip_mask=resolvers.resolve_skip_mask,
    prepare=resolvers.resolve_self_draft_artifacts,
    default_k=12,
    summary="Draft & Verify: the model drafts for itself with a skip mask over attention/MLP "
            "sub-layers; adaptive draft exit",
    options=SelfSpecOptions,
)

SWIFT = Method(
    name="swift",
    aliases=("swift_ots",),
    proposer=SwiftProposer,
    skip_mask=resolvers.resolve_swift_mask,
    prepare=resolvers.resolve_swift_artifacts,
    default_k=12,
    summary="SWIFT: the skip set is optimized on the fly from the tokens just generated "
            "(random search + interval Bayesian optimization scored by matchness), then "
            "confidence-aware drafting",
    options=SwiftOptions,
    check=lambda o: _check_swift(o),
)


LAYERSKIP = Method(
    name="layerskip",
    aliases=("layer_skip", "early_exit"),
    proposer=EarlyExitProposer,
    skip_mask=resolvers.resolve_exit_mask,
    prepare=resolvers.resolve_self_draft_artifacts,
    default_k=6,  # the LayerSkip README's --num_speculations 6
    summary="LayerSkip: drafts with the first exit_layer layers and the model's shared LM "
            "head (early exit), verified by the full model",
    options=LayerSkipOptions,
)


def _check_swift(opts: dict[str, Any]) -> None:
    if opts["cache_hit"] and opts["skip_mask"] is not None:
        raise SelfSpecConfigError("vllm_selfspec: swift takes either skip_mask (a layer set to "
                                  "start optimizing from) or cache_hit (the saved set), not both")


def _check_query_lengths(opts: dict[str, Any]) -> None:
    if opts["min_query_length"] > opts["query_length"]:
        raise SelfSpecConfigError(
            f"vllm_selfspec: min_query_length ({opts['min_query_length']}) must not exceed "
            f"query_length ({opts['query_length']})")


NGRAMMYS = Method(
    name="ngrammys",
    aliases=("n-grammys", "n_grammys"),
    proposer=NGrammysProposer,
    prepare=resolvers.resolve_ngrammys_artifacts,
    default_k=DEFAULT_WIDTH,
    summary="N-Grammys: learning-free drafts from context n-grams, then the model-derived "
            "(extended) bigram table; one chain of k candidate rows per step",
    options=NGrammysOptions,
    check=_check_query_lengths,
)

# ngrammys with earlier requests on: the same bigram table, width and checks
NGRAMMYS_HISTORY = dataclasses.replace(
    NGRAMMYS,
    name="ngrammys-history",
    aliases=("ngrammys_history",),
    proposer=NGrammysHistoryProposer,
    summary="N-Grammys' context n-grams, else earlier requests' prompts and outputs "
            "(SuffixDecoding's cross-request idea), else a datastore of ShareGPT answers "
            "(REST), else the model-derived bigram rows",
    options=NGrammysHistoryOptions,
)

CHIMERA = Method(
    name="chimera",
    aliases=(),
    proposer=ChimeraProposer,
    prepare=resolvers.resolve_checkpoint,
    default_k=None,  # the checkpoint's number of decoding heads
    summary="Chimera: a small trained draft model (trigram encoder, one encoder block, "
            "residual heads) over the target's own last-layer hidden states",
    options=ChimeraOptions,
)

NGRAMMYS_CHIMERA = Method(
    name="ngrammys-chimera",
    aliases=("ngrammys_chimera",),
    proposer=NGrammysChimeraProposer,
    prepare=resolvers.resolve_checkpoint,
    default_k=NGRAMMYS_CHIMERA_WIDTH,
    summary="context n-grams (N-Grammys §4.2) where the context has a match, Chimera's heads "
            "where it has none",
    options=NGrammysChimeraOptions,
    check=_check_query_lengths,
)

NGRAMMYS_SELFSPEC = Method(
    name="ngrammys-selfspec",
    aliases=("ngrammys_selfspec",),
    proposer=NGrammysSelfSpecProposer,
    skip_mask=resolvers.resolve_skip_mask,
    prepare=resolvers.resolve_ngrammys_selfspec_artifacts,
    default_k=12,
    summary="context n-grams, earlier requests and a datastore where they match; the model's "
            "own low-bit self-draft (Draft & Verify through low-bit weights) elsewhere",
    options=NGrammysSelfSpecOptions,
    check=_check_query_lengths,
)

METHODS: dict[str, Method] = {m.name: m for m in (SELFSPEC, SWIFT, LAYERSKIP, NGRAMMYS,
                                                  NGRAMMYS_HISTORY, CHIMERA, NGRAMMYS_CHIMERA,
                                                  NGRAMMYS_SELFSPEC)}
ALIASES: dict[str, str] = {a: m.name for m in METHODS.values() for a in (m.name, *m.aliases)}


def lookup(name: Any) -> Method | None:
    if not isinstance(name, str):
        return None
    return METHODS.get(ALIASES.get(name.lower(), ""))


def split_config(raw: Mapping[str, Any]) -> tuple[Method, dict[str, Any], dict[str, Any]]:
    """Split a user speculative config into (method, vLLM keys, validated plugin keys)."""
    sc = {str(k).replace("-", "_"): v for k, v in raw.items()}
    method = lookup(sc.pop("method", None))
    assert method is not None
    core: dict[str, Any] = {}
    opts: dict[str, Any] = {}
    for k, v in sc.items():
        if k in CORE_KEYS:
            core[k] = v
        elif k in FOREIGN_CORE_KEYS:
            raise SelfSpecConfigError(
                f"vllm_selfspec: key '{k}' does not apply to method '{method.name}' (it drafts with "
                f"the target model itself); remove it")
        elif method.key(k) is not None:
            opts[k] = method.key(k).validate(method.name, v)  # type: ignore[union-attr]
        else:
            valid = sorted([key.name for key in method.keys] + list(CORE_KEYS))
            raise SelfSpecConfigError(
                f"vllm_selfspec: unknown key '{k}' for method '{method.name}'. Valid keys: "
                + ", ".join(valid))
    k = core.get("num_speculative_tokens")
    if k is None:
        if method.default_k is not None:
            core["num_speculative_tokens"] = method.default_k
    elif isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 128:
        raise SelfSpecConfigError(
            f"vllm_selfspec: num_speculative_tokens must be an integer in [1, 128], got {k!r}")
    dsm = core.setdefault("draft_sample_method", "probabilistic")
    if dsm not in ("greedy", "probabilistic"):
        raise SelfSpecConfigError(
            f"vllm_selfspec: draft_sample_method must be 'greedy' or 'probabilistic', got {dsm!r}")
    for key in method.keys:
        opts.setdefault(key.name, key.default)
    if method.check is not None:
        method.check(opts)
    opts["method"] = method.name
    opts["draft_sample_method"] = dsm
    return method, core, opts
