"""Refuse, at start-up, combinations the plugin's drafters cannot run correctly.

The reasons: the drafter lives on the last pipeline rank only (PP > 1 impossible);
LoRA's punica mapping is laid out for the target batch; MLA backends write KV inside
forward, so drafts could not control their KV writes; vision models need M-RoPE;
drafting uses one block table, so one KV-cache group; KV connectors were never
checked.
"""

from __future__ import annotations

from typing import Any

from vllm_selfspec.adapters import SUPPORTED_ARCHITECTURES, describe_supported
from vllm_selfspec.methods import Method, SelfSpecConfigError


def _fail(method: Method, what: str, todo: str) -> SelfSpecConfigError:
    return SelfSpecConfigError(f"vllm_selfspec: method '{method.name}' does not support {what}. {todo}")


def _layer_types(hf_config: Any) -> set[str]:
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    types = getattr(text, "layer_types", None) or []
    return {str(t) for t in types}


def check_supported(method: Method, engine_args: Any, model_config: Any, parallel_config: Any,
                    proposer: Any) -> None:
    """Raise SelfSpecConfigError naming the first unsupported feature of ``proposer``
    (a ``proposers.base.Proposer`` class)."""
    uses_target_layers = bool(proposer.uses_target)
    reads_target = uses_target_layers or bool(getattr(proposer, "uses_hidden_states", False))
    pp = getattr(parallel_config, "pipeline_parallel_size", 1) or 1
    if pp > 1:
        raise _fail(method, f"pipeline parallelism (pipeline_parallel_size={pp})",
                    "vLLM runs custom drafters on the last pipeline rank only; use "
                    "pipeline_parallel_size=1 (tensor parallelism works).")
    if getattr(engine_args, "enable_lora", False):
        raise _fail(method, "LoRA adapters (enable_lora)", "Start the engine without --enable-lora.")
    if getattr(engine_args, "kv_transfer_config", None) is not None:
        raise _fail(method, "KV connectors (kv_transfer_config)",
                    "Start the engine without --kv-transfer-config.")
    if getattr(model_config, "is_multimodal_model", False):
        raise _fail(method, "multimodal models", "Use a text-only model.")
    if getattr(model_config, "use_mla", False):
        raise _fail(method, "MLA attention (DeepSeek-style latent attention)",
                    "Use a model with standard multi-head/grouped-query attention.")
    if getattr(model_config, "is_hybrid", False) or getattr(model_config, "has_inner_state", False):
        raise _fail(method, "hybrid/recurrent models (more than one KV-cache group)",
                    "Use a model whose layers all use full attention.")
    kinds = _layer_types(model_config.hf_config)
    if len(kinds) > 1:
        raise _fail(method, f"models mixing attention kinds {sorted(kinds)} (more than one "
                    "KV-cache group)", "Use a model whose layers all use the same attention.")
    if getattr(engine_args, "speculative_config", None) and \
            engine_args.speculative_config.get("rejection_sample_method") == "synthetic":
        raise _fail(method, "rejection_sample_method='synthetic'",
                    "It is a benchmarking mode of vLLM that ignores the drafts; use 'standard'.")
    tp = getattr(parallel_config, "tensor_parallel_size", 1) or 1
    if tp > 1 and getattr(proposer, "uses_hidden_states", False):
        raise _fail(method, f"tensor parallelism (tensor_parallel_size={tp})",
                    "Its draft model reads the target's embedding and LM head, which are "
                    "sharded across ranks; use tensor_parallel_size=1.")
    if reads_target:
        archs = list(getattr(model_config.hf_config, "architectures", None) or [])
        arch = archs[0] if archs else "<unknown>"
        if arch not in SUPPORTED_ARCHITECTURES:
            raise _fail(method, f"architecture {arch} (no layer adapter)",
                        f"Supported: {describe_supported()}. vLLM's own method 'ngram' works "
                        "with any model.")
