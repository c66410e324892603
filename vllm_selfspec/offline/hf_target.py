"""The target model through transformers, for offline tools (no vLLM needed).

``HFTarget`` implements what the mask search's proxy objective needs
(tools/search_mask.py; the same semantics as SWIFT's matchness, §4.1):

* ``prepare``: one full forward per sequence (prompt + the full model's greedy
  continuation) that keeps every layer's keys and values;
* ``score``: the teacher-forced draft pass of a skip mask over the continuation
  positions. Queries come from the masked residual stream; keys and values are
  the full model's at every position (as in the engine's no-write scoring pass of
  ``vllm_selfspec.target``: prefix KV is the verified, full-model KV, and nothing
  is written). Returns, per position, whether the draft's argmax equals the token
  the full model generated, and the draft's top-1 probability;
* ``time_costs``: a cost model measured with the same passes (one query token
  over the cached K/V behaves like a decode step).

Supported like the engine adapters: Llama, Mistral, Qwen2, Qwen3 (pre-norm
decoders with rotary attention).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch
import torch.nn.functional as F

from vllm_selfspec.adapters import SUPPORTED_ARCHITECTURES, UnsupportedModelError
from vllm_selfspec.proposers.artifacts import ModelStamp, atomic_path
from vllm_selfspec.proposers.expected_speedup import CostModel
from vllm_selfspec.proposers.skip_mask import SkipMask


def cached_continuations(path: Path | None, prompt_ids: list[str], prompts: list[list[int]],
                         max_tokens: int, generate: Callable[[list[int], int], list[int]],
                         progress: Callable[[Iterable[Any]], Iterable[Any]] = lambda x: x
                         ) -> list[list[int]]:
    """The full model's greedy continuations of ``prompts``, generated once and cached in
    ``path`` (JSON keyed by the prompt ids and length; written atomically, since Ray
    workers may share it)."""
    if path is not None and path.exists():
        try:
            cached = json.loads(path.read_text())
        except json.JSONDecodeError:
            cached = {}
        if cached.get("prompt_ids") == prompt_ids and cached.get("max_tokens") == max_tokens:
            return cached["continuations"]
    conts = [generate(p, max_tokens) for p in progress(prompts)]
    if path is not None:
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps({"prompt_ids": prompt_ids, "max_tokens": max_tokens,
                                       "continuations": conts}))
    return conts


@dataclass
class Prepared:
    """One sequence after the full pass."""

    tokens: torch.Tensor  # [S] prompt + continuation
    prompt_len: int
    keys: list[torch.Tensor] = field(default_factory=list)  # per layer [kv_heads, S, head_dim]
    values: list[torch.Tensor] = field(default_factory=list)
    cos: torch.Tensor | None = None  # [1, S, head_dim]
    sin: torch.Tensor | None = None

    @property
    def num_continuation(self) -> int:
        return int(self.tokens.numel()) - self.prompt_len


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class HFTarget:
    def __init__(self, model_path: str, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", random_weights: bool = False) -> None:
        """``random_weights``: build the architecture from ``config.json`` alone, weights
        drawn at random and no tokenizer (for timing only: tools/draft_cost_hf.py)."""
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        if random_weights:
            torch.manual_seed(0)
            # built on the device in the target dtype: a 13B shape drawn on the CPU in
            # float32 first did not finish in 7 minutes
            with torch.device(device):
                self.model = AutoModelForCausalLM.from_config(
                    AutoConfig.from_pretrained(model_path), dtype=dtype)
            self.tokenizer = None
        else:
            self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
            self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model.to(device).eval()
        cfg = self.model.config
        arch = (cfg.architectures or [type(self.model).__name__])[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(f"{arch}: no layer adapter (supported: "
                                        f"{', '.join(SUPPORTED_ARCHITECTURES)})")
        self.architecture = arch
        self.device = torch.device(device)
        self.inner = self.model.model
        self.layers = list(self.inner.layers)
        self.num_layers = len(self.layers)
        self.vocab_size = int(cfg.vocab_size)
        a = self.layers[0].self_attn
        self.head_dim = int(a.head_dim)
        self.num_heads = int(cfg.num_attention_heads)
        self.num_kv_heads = int(cfg.num_key_value_heads)
        self.scaling = float(a.scaling)
        self.name = model_path

    # ---- identity ------------------------------------------------------------------
    def stamp(self) -> ModelStamp:
        from vllm_selfspec.model_info import stamp_from_model

        return stamp_from_model(self.model, str(self.name))

    # ---- full model ------------------------------------------------------------------
    @torch.inference_mode()
    def generate_greedy(self, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        ids = torch.tensor([prompt_ids], device=self.device)
        out = self.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                  max_new_tokens=max_new_tokens,
                                  pad_token_id=self.tokenizer.eos_token_id)
        return out[0, len(prompt_ids):].tolist()

    def _qkv(self, layer: Any, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             want_kv: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        a = layer.self_attn
        t = h.shape[0]
        q = a.q_proj(h).view(t, self.num_heads, self.head_dim)
        if hasattr(a, "q_norm"):
            q = a.q_norm(q)
        q = q.transpose(0, 1)  # [heads, T, d]
        q = q * cos + _rotate_half(q) * sin
        if not want_kv:
            return q, None, None
        k = a.k_proj(h).view(t, self.num_kv_heads, self.head_dim)
        if hasattr(a, "k_norm"):
            k = a.k_norm(k)
        k = k.transpose(0, 1)
        k = k * cos + _rotate_half(k) * sin
        v = a.v_proj(h).view(t, self.num_kv_heads, self.head_dim).transpose(0, 1)
        return q, k, v

    def _attend(self, layer: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                q_pos: torch.Tensor) -> torch.Tensor:
        """Causal attention of queries at ``q_pos`` over keys 0..S-1 (GQA)."""
        rep = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(rep, dim=0)
        v = v.repeat_interleave(rep, dim=0)
        kpos = torch.arange(k.shape[1], device=q.device)
        allowed = kpos.unsqueeze(0) <= q_pos.unsqueeze(1)  # [T, S]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=self.scaling)
        return layer.self_attn.o_proj(out.transpose(0, 1).reshape(q.shape[1], -1))

    def _rope(self, positions: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.inner.rotary_emb(like, positions.unsqueeze(0))
        return cos.to(like.dtype), sin.to(like.dtype)  # [1, T, d]

    @torch.inference_mode()
    def prepare(self, prompt_ids: list[int], continuation: list[int]) -> Prepared:
        """The full pass over prompt + continuation, keeping K/V of every layer."""
        tokens = torch.tensor(list(prompt_ids) + list(continuation), device=self.device)
        s = tokens.numel()
        pos = torch.arange(s, device=self.device)
        h = self.inner.embed_tokens(tokens)
        cos, sin = self._rope(pos, h)
        prep = Prepared(tokens=tokens, prompt_len=len(prompt_ids), cos=cos, sin=sin)
        for layer in self.layers:
            x = layer.input_layernorm(h)
            q, k, v = self._qkv(layer, x, cos, sin, want_kv=True)
            prep.keys.append(k)
            prep.values.append(v)
            h = h + self._attend(layer, q, k, v, pos)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return prep

    # ---- draft (masked, no KV written) -------------------------------------------------
    @torch.inference_mode()
    def score(self, prep: Prepared, mask: SkipMask, positions: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced draft predictions for every continuation token.

        Returns (agree [n] bool, confidence [n] float) where entry j is about
        continuation token j, predicted at position prompt_len - 1 + j.
        """
        if positions is None:
            positions = torch.arange(prep.prompt_len - 1, prep.tokens.numel() - 1,
                                     device=self.device)
        logits = self.model.lm_head(self.draft_hidden(prep, mask, positions)).float()
        probs = torch.softmax(logits, dim=-1)
        conf, pred = probs.max(dim=-1)
        target = prep.tokens[positions + 1]
        return (pred == target).cpu(), conf.cpu()

    def draft_hidden(self, prep: Prepared, mask: SkipMask, positions: torch.Tensor) -> torch.Tensor:
        """The draft pass's final-normed hidden states at ``positions``: the walk through
        the sub-layers ``mask`` keeps, over the full model's cached K/V (nothing written;
        Draft & Verify §3.1, the engine's ``vllm_selfspec.target`` walk)."""
        h = self.inner.embed_tokens(prep.tokens[positions])
        cos, sin = prep.cos[:, positions], prep.sin[:, positions]
        for i, layer in enumerate(self.layers):
            if i not in mask.attention:
                q, _, _ = self._qkv(layer, layer.input_layernorm(h), cos, sin, want_kv=False)
                h = h + self._attend(layer, q, prep.keys[i], prep.values[i], positions)
            if i not in mask.mlp:
                h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.inner.norm(h)

    # ---- low-bit draft weights (key draft_weights) -----------------------------------------
    def low_bit_copies(self, draft_weights: str) -> dict[torch.nn.Module, Any]:
        """Low-bit copies (``proposers.low_bit``) of every decoder linear layer and the LM
        head in the format ``draft_weights`` (a layer without a kernel for it, or whose
        shape it cannot take, keeps its own weights: no entry)."""
        from vllm_selfspec.proposers.low_bit import low_bit_forms

        out = {}
        mods = [m for layer in self.layers for m in layer.modules()
                if isinstance(m, torch.nn.Linear)] + [self.model.lm_head]
        for m in mods:
            form = low_bit_forms(m.weight, [draft_weights]).get(draft_weights)
            if form is not None:
                out[m] = form
        return out

    @contextlib.contextmanager
    def draft_weights(self, copies: dict[torch.nn.Module, Any]) -> Iterator[None]:
        """Run the linear layers of ``copies`` through their low-bit copy (bias kept)."""
        try:
            for m, lin in copies.items():
                m.__dict__["forward"] = (lambda x, lin=lin, b=m.bias: lin(x, b))
            yield
        finally:
            for m in copies:
                m.__dict__.pop("forward", None)

    # ---- cost model --------------------------------------------------------------------
    def time_costs(self, prep: Prepared, repeats: int = 15, verify_n: int = 4) -> CostModel:
        """Per-sub-layer costs from timed single-token passes over cached K/V."""
        last = torch.tensor([prep.tokens.numel() - 2], device=self.device)
        inner = frozenset(range(1, self.num_layers - 1))

        def timed(mask: SkipMask, pos: torch.Tensor) -> float:
            samples = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                self.score(prep, mask, pos)
                samples.append(time.perf_counter() - t0)
            return statistics.median(samples)

        self.score(prep, SkipMask(), last)  # warm up
        full = timed(SkipMask(), last)
        no_attn = timed(SkipMask(inner, frozenset()), last)
        no_mlp = timed(SkipMask(frozenset(), inner), last)
        n = len(inner)
        per_attn = max(full - no_attn, 0.0) / n / full
        per_mlp = max(full - no_mlp, 0.0) / n / full
        fixed = max(1.0 - self.num_layers * (per_attn + per_mlp), 0.0)
        span = torch.arange(int(last) - verify_n, int(last) + 1, device=self.device)
        verify = timed(SkipMask(), span)
        return CostModel(draft_fixed=fixed, draft_attention=per_attn, draft_mlp=per_mlp,
                         verify_per_token=max(verify / full - 1.0, 0.0) / verify_n)
