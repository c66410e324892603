"""vLLM entry point (``vllm.general_plugins``): version gate, then the patches.

vLLM calls ``register()`` once per process (front end, EngineCore, every worker;
``vllm/plugins/__init__.py: load_general_plugins``). The front end translates
our method names (P1) and validates everything at start-up; EngineCore reserves
lookahead KV slots (P2); workers fix the CPU sampler (P4) and, when our drafter
is constructed, install the runner bridge (P3).
"""

from __future__ import annotations

from typing import Any

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


def proposer_class(method: methods.Method) -> type:
    return method.proposer


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
    from vllm_selfspec.resolvers import prepare

    opts = prepare(method, opts, core, model_config)
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
