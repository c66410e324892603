"""vLLM's CPU attention kernels called straight from the draft walk.

``CPUAttentionBackendImpl.forward`` and ``do_kv_cache_update`` (vLLM 0.32,
``vllm/v1/attention/backends/cpu_attn.py:344-490``) view the layer's paged KV cache as
key and value halves, then call ``torch.ops._C.cpu_attn_reshape_and_cache`` and
``torch.ops._C.cpu_attention_with_kv_cache``. A one-token draft pass calls both once per
layer and token; the wrappers' views, checks and keyword plumbing cost about as much as
the KV write itself. ``LayerAttention`` makes the views once per cache tensor and calls
the two kernels with the same arguments, for the one case the draft walk meets: a decoder
layer whose cache is unquantized, without attention sinks (``LayerAttention.why_not``);
any other layer goes through the backend's own methods.
"""

from __future__ import annotations

from typing import Any

import torch


class LayerAttention:
    """One attention layer's KV write and paged attention through vLLM's CPU kernels."""

    def __init__(self, attn: Any) -> None:
        impl = attn.impl
        self.attn = attn
        self.scale = float(impl.scale)
        self.alibi_slopes = impl.alibi_slopes
        self.sliding_window = impl.sliding_window
        self.softcap = impl.logits_soft_cap
        self.kv_cache_dtype = impl.kv_cache_dtype
        self.isa: str | None = None  # set on the layer by the metadata builder (cpu_attn.py)
        self.k_scale = float(attn._k_scale_float)
        self.v_scale = float(attn._v_scale_float)
        self._kv: torch.Tensor | None = None
        self._halves: tuple[torch.Tensor, torch.Tensor] | None = None
        self._write = torch.ops._C.cpu_attn_reshape_and_cache
        self._attend = torch.ops._C.cpu_attention_with_kv_cache

    @staticmethod
    def why_not(attn: Any) -> str | None:
        """Why this layer's attention must go through the backend's own methods (None: it
        need not)."""
        try:
            from vllm.v1.attention.backend import AttentionType
            from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl
        except ImportError as e:
            return f"no CPU attention backend ({e})"
        impl = getattr(attn, "impl", None)
        if type(impl) is not CPUAttentionBackendImpl:
            return f"attention backend {type(impl).__name__}"
        if impl.attn_type != AttentionType.DECODER:
            return f"attention type {impl.attn_type}"
        if getattr(impl, "sinks", None) is not None:
            return "attention sinks"
        if impl.kv_cache_dtype != "auto":
            return "quantized KV cache"
        for op in ("cpu_attn_reshape_and_cache", "cpu_attention_with_kv_cache"):
            if not hasattr(torch.ops._C, op):
                return f"no torch.ops._C.{op}"
        return None

    def _cache(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The key and value halves of the layer's cache [blocks, kv heads, block, 2·head]
        as ``forward`` views them; made again only when vLLM hands the layer a new tensor."""
        kv = self.attn.kv_cache
        if kv is not self._kv or self._halves is None:
            self.isa = self.attn.isa
            blocks, heads, block, _ = kv.size()
            k, v = kv.view((blocks, heads, block * 2, -1)).chunk(2, dim=2)
            self._kv, self._halves = kv, (k, v)
        return self._halves

    def write(self, key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor) -> None:
        """``do_kv_cache_update``: key/value [n, kv heads, head] into ``slots``."""
        k, v = self._cache()
        self._write(key, value, k, v, slots, self.isa, self.k_scale, self.v_scale,
                    self.kv_cache_dtype)

    def attend(self, query: torch.Tensor, output: torch.Tensor, metadata: Any) -> None:
        """``forward`` for a decoder layer: query [n, heads, head] over the cache, into
        ``output`` [n, heads, head]."""
        k, v = self._cache()
        n = metadata.num_actual_tokens
        self._attend(query[:n], k, v, output[:n], metadata.query_start_loc, metadata.seq_lens,
                     self.scale, metadata.causal, self.alibi_slopes, self.sliding_window,
                     metadata.block_table, self.softcap, metadata.scheduler_metadata, None,
                     metadata.dynamic_causal, self.k_scale, self.v_scale, self.kv_cache_dtype)
