"""Refuse, at start-up, combinations the plugin's drafters cannot run correctly.

Each guard protects what a method actually touches (the proposer's class flags,
``proposers.base.Proposer``), so a method is refused only where it would break:

* every method: our drafter is vLLM's ``custom_class`` proposer behind the runner
  bridge (patches.P3 on the V1 ``GPUModelRunner``): pipeline parallelism (the drafter
  lives on the last pipeline rank only), Model Runner V2 (no ``custom_class`` and no
  bridge), async scheduling (the bridge drafts after the step's bookkeeping), and any
  rejection sampler but vLLM's lossless ``standard`` one;
* methods that read the target (``uses_target`` or ``uses_hidden_states``: its layers,
  embedding, LM head or hidden states): LoRA (adapters change the weights they read;
  punica's mapping is laid out for the target batch), KV connectors (never checked),
  multimodal models (M-RoPE, image embeddings) and architectures without a layer adapter;
* methods that run the target's layers on its KV cache (``uses_target``): MLA (writes KV
  inside forward, so drafts could not control their KV writes) and more than one
  KV-cache group (hybrid/recurrent models, layers mixing attention kinds: drafting uses
  one block table);
* methods that read hidden states (``uses_hidden_states``): tensor parallelism.

``ngrammys`` reads only token ids, like vLLM's own ``ngram``, so it runs wherever the
engine does minus the first group.
"""

from __future__ import annotations

import os
from typing import Any

from vllm_selfspec.adapters import SUPPORTED_ARCHITECTURES, describe_supported
from vllm_selfspec.methods import Method, SelfSpecConfigError

# vLLM's rejection samplers known to keep the target's distribution with our drafts
# (config/speculative.py RejectionSampleMethod): 0.32 adds 'synthetic' (benchmarking,
# ignores the drafts) and 'block' (Model Runner V2 only); 0.33 adds 'fly' (lossy).
LOSSLESS_REJECTION = ("standard",)


def _fail(method: Method, what: str, todo: str) -> SelfSpecConfigError:
    return SelfSpecConfigError(f"vllm_selfspec: method '{method.name}' does not support {what}. {todo}")


def _layer_types(hf_config: Any) -> set[str]:
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    types = getattr(text, "layer_types", None) or []
    return {str(t) for t in types}


def _env_bool(name: str) -> bool | None:
    """vLLM's reading of a boolean environment variable (envs.maybe_convert_bool)."""
    try:
        import vllm.envs as envs

        return getattr(envs, name)
    except Exception:  # pragma: no cover - older/newer vLLM without the variable
        value = os.environ.get(name)
        return None if value is None else value.strip().lower() in ("1", "true")


def v2_runner_reason(engine_args: Any) -> str | None:
    """What makes vLLM pick Model Runner V2 for this engine despite ``custom_class``
    (``VllmConfig.use_v2_model_runner``, vLLM 0.32/0.33), as the thing to undo; None
    when vLLM runs V1 (the CPU fallback without Triton included)."""
    if _env_bool("VLLM_USE_V2_MODEL_RUNNER") is True:
        return "VLLM_USE_V2_MODEL_RUNNER=1; unset VLLM_USE_V2_MODEL_RUNNER"
    if getattr(engine_args, "watermark_config", None) is not None:
        return "--watermark-config, which requires it; start without --watermark-config"
    attn = getattr(engine_args, "attention_config", None)
    hisparse = attn.get("hisparse_config") if isinstance(attn, dict) else \
        getattr(attn, "hisparse_config", None)
    kv = getattr(engine_args, "kv_transfer_config", None)
    if hisparse is not None or (hasattr(kv, "has_connector")
                                and kv.has_connector("HiSparseConnector")):
        return "HiSparse attention, which requires it; start without HiSparse"
    return None


def check_supported(method: Method, engine_args: Any, model_config: Any, parallel_config: Any,
                    proposer: Any, core: dict[str, Any] | None = None,
                    opts: dict[str, Any] | None = None) -> None:
    """Raise SelfSpecConfigError naming the first unsupported feature of ``proposer``
    (a ``proposers.base.Proposer`` class); ``core``: the vLLM keys of the speculative
    config (default: ``engine_args.speculative_config``); ``opts``: the plugin's validated
    keys."""
    uses_target_layers = bool(getattr(proposer, "uses_target", False))
    uses_states = bool(getattr(proposer, "uses_hidden_states", False))
    reads_target = uses_target_layers or uses_states
    sc = core if core is not None else getattr(engine_args, "speculative_config", None) or {}

    # every method: the custom_class drafter behind the V1 runner bridge
    pp = getattr(parallel_config, "pipeline_parallel_size", 1) or 1
    if pp > 1:
        raise _fail(method, f"pipeline parallelism (pipeline_parallel_size={pp})",
                    "vLLM runs custom drafters on the last pipeline rank only; use "
                    "pipeline_parallel_size=1.")
    v2 = v2_runner_reason(engine_args)
    if v2 is not None:
        raise _fail(method, f"Model Runner V2 (forced by {v2.split('; ')[0]})",
                    f"The plugin's methods run on the V1 model runner; {v2.split('; ')[1]}.")
    if getattr(engine_args, "async_scheduling", None) is True:
        raise _fail(method, "async scheduling (--async-scheduling)",
                    "Its drafts are made after each step's bookkeeping; start without "
                    "--async-scheduling.")
    rsm = sc.get("rejection_sample_method", "standard") if isinstance(sc, dict) else "standard"
    if rsm not in LOSSLESS_REJECTION:
        raise _fail(method, f"rejection_sample_method={rsm!r}",
                    "Only vLLM's lossless rejection sampler keeps the target's outputs; use "
                    + " or ".join(repr(r) for r in LOSSLESS_REJECTION) + " (the default).")

    # methods that read the target's weights or states
    if reads_target:
        if getattr(engine_args, "enable_lora", False):
            raise _fail(method, "LoRA adapters (enable_lora)", "Start the engine without "
                        "--enable-lora; method 'ngrammys' works with LoRA.")
        if getattr(engine_args, "kv_transfer_config", None) is not None:
            raise _fail(method, "KV connectors (kv_transfer_config)", "Start the engine without "
                        "--kv-transfer-config; method 'ngrammys' works with KV connectors.")
        if getattr(model_config, "is_multimodal_model", False):
            raise _fail(method, "multimodal models", "Use a text-only model, or method "
                        "'ngrammys'.")

    # methods that run the target's layers on its KV cache
    if uses_target_layers:
        if getattr(model_config, "use_mla", False):
            raise _fail(method, "MLA attention (DeepSeek-style latent attention)",
                        "Use a model with standard multi-head/grouped-query attention, or "
                        "method 'ngrammys'.")
        if getattr(model_config, "is_hybrid", False) or \
                getattr(model_config, "has_inner_state", False):
            raise _fail(method, "hybrid/recurrent models (more than one KV-cache group)",
                        "Use a model whose layers all use full attention, or method 'ngrammys'.")
        weights = (opts or {}).get("draft_weights", "full")
        quantized = getattr(model_config, "quantization", None)
        if weights != "full" and quantized:
            raise _fail(method, f"draft_weights={weights!r} on a quantized model "
                        f"(quantization={quantized!r})",
                        "Its low-bit copies are made from unquantized weights; use "
                        "draft_weights \"full\".")
        kinds = _layer_types(model_config.hf_config)
        if len(kinds) > 1:
            raise _fail(method, f"models mixing attention kinds {sorted(kinds)} (more than one "
                        "KV-cache group)", "Use a model whose layers all use the same "
                        "attention, or method 'ngrammys'.")

    tp = getattr(parallel_config, "tensor_parallel_size", 1) or 1
    if tp > 1 and uses_states:
        raise _fail(method, f"tensor parallelism (tensor_parallel_size={tp})",
                    "Its draft model reads the target's embedding and LM head, which are "
                    "sharded across ranks; use tensor_parallel_size=1.")
    if reads_target:
        archs = list(getattr(model_config.hf_config, "architectures", None) or [])
        arch = archs[0] if archs else "<unknown>"
        if arch not in SUPPORTED_ARCHITECTURES:
            raise _fail(method, f"architecture {arch} (no layer adapter)",
                        f"Supported: {describe_supported()}. Method 'ngrammys' and vLLM's "
                        "'ngram' work with any model.")
