"""Chimera (Zeng et al., 2024): a lightweight draft model on top of the target's own
hidden states.

§4.1.1 trigram encoder: the embeddings of (x_{p-2}, x_{p-1}, x_p) concatenated
(3H; the first two positions collapse to unigram/bigram by repeating x_0), then an
MLP of two linear layers with SiLU (eq. 2). Its output g_p is the "green" state of
position p.
§4.1.2 full-context encoder: ONE decoder block over the target's final-norm
last-layer states h (the "mature" states) together with the trigram states g; a
query g_p attends to h_{<=p-1} and g_{<=p} (eq. 3; "as long as there is a future
token in a trigram, the trigram is masked"). Its output at g_p, through a final
norm, is z_p.
§4.1.3 residual decoding heads: head i sees [h_{n-1}; z] and predicts the token
i+1 positions after x_n (eq. 4). Drafting runs the heads in order: head i's
query is g_{n+i}, the trigram of the newest tokens including those drafted by
heads < i, attending to the mature states h_{<=n-1} and to g_{<=n+i}.
§4.2 losses: cross-entropy per head (eq. 5) plus an MSE that pulls z_p toward the
target's h_p (eq. 6), summed with weight ``distill_weight`` (eq. 7).

Decisions where the paper is silent or the authors' code (kafkayu/Chimera) does
not run as published (merge-conflict markers, undefined helpers, a mask that hides
everything, a frozen-base typo):

* Trigram MLP: W1 projects 3H->H first and W2 is a zero-initialised residual H->H
  block after SiLU. The authors' code puts the residual block at 3H (3H x 3H) before
  the projection: three times the weights, and a draft token's cost on a CPU is the
  bytes of weights it reads (SmolLM2: 12 MB of 31 MB would be that block).
* Heads. ``head_kind="shared"`` (default): head i is a 2H->H projection P_i
  (initialised to [0 | I]: the target's LM head on z, which eq. 6 pulls toward the
  target's state at the same position) followed by the target's own LM head restricted to
  a draft vocabulary (``proposers.draft_vocab``); nothing vocabulary-sized is
  trained or stored. ``head_kind="paper"``: head i is its own 2H->V linear,
  initialised to [W_lm | W_lm] as the authors' code does (234M parameters per
  model on SmolLM2; kept for fidelity).
* The encoder block is initialised from the target's last decoder layer and the
  final norm from the target's final norm (one version of the authors' code
  does; it helps with little data). The mature states enter the block as the
  target emits them (after its final norm).
* Head i is trained with the mask it meets when drafting: its query at p sees
  h_{<=p-1-i} (the target has not run over the drafted tokens) and g_{<=p}; the
  authors' code trains every head with one mask.
* The distillation term is applied to every head's z_p against h_p, averaged over
  the positions that have a label (the authors' code averages over padding).
* Labels are the target's own top-1 next tokens (self-distillation), the right
  labels for greedy acceptance; labels outside the draft vocabulary are ignored
  by the loss (and counted as misses by the accuracy).
* Inference keeps, per request, the encoder's keys and values of every mature and
  green state (a single block: an entry depends only on its own input and
  position, so the store is exact); the paper's LRU trigram cache is not used
  (the trigram MLP is a small part of a decode step).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from .artifacts import ModelStamp, open_stamped, save_stamped
from .draft_vocab import DraftVocab
from .low_bit import LowBitLinear

HEAD_KINDS = ("shared", "paper")
CHECKPOINT_FORMAT = "vllm_selfspec.chimera/1"


@dataclass(frozen=True)
class ChimeraConfig:
    """Shape of a Chimera draft model (the first fields mirror the target's config)."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    num_heads: int = 4  # decoding heads (the authors' chimera_num_heads)
    head_kind: str = "shared"
    draft_vocab_size: int = 8192  # N; the whole vocabulary when >= vocab_size

    def __post_init__(self) -> None:
        if self.head_kind not in HEAD_KINDS:
            raise ValueError(f"head_kind must be one of {HEAD_KINDS}, got {self.head_kind!r}")

    @classmethod
    def from_hf(cls, hf_config: Any, **kw: Any) -> ChimeraConfig:
        """From a (text) HF config of a Llama-like target."""
        c = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
        heads = int(c.num_attention_heads)
        rope = getattr(c, "rope_parameters", None) or {}
        theta = float(rope.get("rope_theta", getattr(c, "rope_theta", 10000.0)))
        return cls(hidden_size=int(c.hidden_size), intermediate_size=int(c.intermediate_size),
                   num_attention_heads=heads,
                   num_key_value_heads=int(getattr(c, "num_key_value_heads", heads)),
                   head_dim=int(getattr(c, "head_dim", None) or c.hidden_size // heads),
                   rms_norm_eps=float(c.rms_norm_eps), rope_theta=theta,
                   vocab_size=int(c.vocab_size), **kw)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ChimeraConfig:
        return cls(**{k: obj[k] for k in cls.__dataclass_fields__ if k in obj})


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (the HF/neox "rotate half" layout of Llama's q/k weights):
    x [..., n, heads, d], positions [..., n]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = positions.to(torch.float32).unsqueeze(-1) * inv  # [..., n, d/2]
    cos = torch.cat([ang.cos(), ang.cos()], dim=-1).unsqueeze(-2).to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], dim=-1).unsqueeze(-2).to(x.dtype)
    half = d // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


def trigram_ids(tokens: torch.Tensor) -> torch.Tensor:
    """[..., T] token ids -> [..., T, 3] ids of (x_{p-2}, x_{p-1}, x_p); the first two
    positions repeat x_0 (eq. 2: unigram, bigram)."""
    t = tokens.shape[-1]
    idx = torch.arange(t, device=tokens.device)
    cols = [(idx - 2).clamp_min(0), (idx - 1).clamp_min(0), idx]
    return torch.stack([tokens[..., c] for c in cols], dim=-1)


class TrigramEncoder(nn.Module):
    """§4.1.1, eq. 2, an MLP with two linear layers and SiLU:
    g = x + W2 SiLU(x), x = W1 [emb(x_{p-2}); emb(x_{p-1}); emb(x_p)] (W1: 3H->H, W2: H->H,
    zero-initialised so the block starts as the projection)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.proj = nn.Linear(3 * hidden, hidden, bias=False)
        self.res = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.res.weight)
        nn.init.zeros_(self.res.bias)

    def forward(self, e3: torch.Tensor) -> torch.Tensor:
        x = self.proj(e3)
        return x + self.res(F.silu(x))


class EncoderBlock(nn.Module):
    """§4.1.2: one pre-norm Llama decoder block whose keys/values come from both
    mature (h) and green (g) states and whose queries are green states only."""

    def __init__(self, cfg: ChimeraConfig) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.cfg = cfg
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.q_proj = nn.Linear(h, cfg.num_attention_heads * d, bias=False)
        self.k_proj = nn.Linear(h, cfg.num_key_value_heads * d, bias=False)
        self.v_proj = nn.Linear(h, cfg.num_key_value_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * d, h, bias=False)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.gate_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, h, bias=False)

    def kv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (rotated) and values of states x [..., n, H] at ``positions`` [..., n]:
        [..., n, kv_heads, d] each."""
        c = self.cfg
        n = self.input_layernorm(x)
        shape = (*x.shape[:-1], c.num_key_value_heads, c.head_dim)
        k = rotate(self.k_proj(n).view(shape), positions, c.rope_theta)
        return k, self.v_proj(n).view(shape)

    def query(self, g: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        q = self.q_proj(self.input_layernorm(g)).view(*g.shape[:-1], c.num_attention_heads,
                                                       c.head_dim)
        return rotate(q, positions, c.rope_theta)

    def finish(self, g: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual + o_proj of the attention output [..., n, heads*d], then the MLP."""
        x = g + self.o_proj(attn)
        y = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))

    @torch.no_grad()
    def init_from_layer(self, layer: Mapping[str, torch.Tensor]) -> None:
        """Copy a target decoder layer's weights (HF names below ``model.layers.N.``)."""
        names = {"input_layernorm.weight": self.input_layernorm.weight,
                 "post_attention_layernorm.weight": self.post_attention_layernorm.weight,
                 "self_attn.q_proj.weight": self.q_proj.weight,
                 "self_attn.k_proj.weight": self.k_proj.weight,
                 "self_attn.v_proj.weight": self.v_proj.weight,
                 "self_attn.o_proj.weight": self.o_proj.weight,
                 "mlp.gate_proj.weight": self.gate_proj.weight,
                 "mlp.up_proj.weight": self.up_proj.weight,
                 "mlp.down_proj.weight": self.down_proj.weight}
        for name, param in names.items():
            param.copy_(layer[name].to(param.dtype))


@dataclass
class TrainOutput:
    loss: torch.Tensor
    ce: list[torch.Tensor]  # per head
    mse: torch.Tensor
    kl: list[torch.Tensor] = field(default_factory=list)  # per head, with kd_weight > 0
    # per head: [topk] counts of labels within the head's top-1..top-k, and the label count
    correct: list[torch.Tensor] = field(default_factory=list)
    counted: list[int] = field(default_factory=list)


class ChimeraDraftModel(nn.Module):
    """Trigram encoder + full-context encoder + residual decoding heads.

    The target's token embedding and LM head are used, never stored: call
    ``bind_target`` with them before use. Trained parameters: the trigram MLP, the
    block, the final norm and the heads (P_i, or 2H->V linears for ``paper``)."""

    def __init__(self, cfg: ChimeraConfig, draft_vocab: DraftVocab | None = None) -> None:
        super().__init__()
        h = cfg.hidden_size
        vocab = draft_vocab or DraftVocab.full(cfg.vocab_size)
        if cfg.head_kind == "paper":
            vocab = DraftVocab.full(cfg.vocab_size)  # one vocabulary-sized head each
        self.cfg = cfg = replace(cfg, draft_vocab_size=vocab.size)
        self.register_buffer("draft_ids", vocab.ids.clone(), persistent=True)
        self.trigram = TrigramEncoder(h)
        self.block = EncoderBlock(cfg)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        out = h if cfg.head_kind == "shared" else cfg.vocab_size
        self.heads = nn.ModuleList(nn.Linear(2 * h, out, bias=False) for _ in range(cfg.num_heads))
        if cfg.head_kind == "shared":
            # P_i = [0 | I]: each head starts as the target's LM head on z, which the
            # distillation term pulls toward the target's own state there (eq. 6)
            for head in self.heads:
                with torch.no_grad():
                    head.weight.copy_(torch.cat([torch.zeros(h, h), torch.eye(h)], dim=1))
        self.embed_weight: torch.Tensor | None = None  # [V, H] (the target's, shared)
        self.lm_rows: torch.Tensor | None = None  # [N, H] LM-head rows of the draft vocabulary
        # x -> x @ lm_rows.T through a low-bit copy of the rows (``use_low_bit``)
        self.lm_rows_fn: Callable[[torch.Tensor], torch.Tensor] | None = None

    # ---- set-up -------------------------------------------------------------------------
    @property
    def vocab(self) -> DraftVocab:
        return DraftVocab(self.draft_ids, self.cfg.vocab_size)

    def set_draft_vocab(self, vocab: DraftVocab) -> None:
        """Draft over another vocabulary (``head_kind`` "shared" only: a head's logits are
        the target's LM-head rows, so any rows serve; training saw the checkpoint's own).
        ``bind_target`` again after it."""
        if self.cfg.head_kind != "shared":
            raise ValueError("only shared heads (the target's LM-head rows) can change their "
                             "draft vocabulary")
        self.draft_ids = vocab.ids.clone().to(self.draft_ids.device)
        self.cfg = replace(self.cfg, draft_vocab_size=vocab.size)
        self.lm_rows, self.lm_rows_fn = None, None

    def with_heads(self, k: int) -> ChimeraDraftModel:
        """This draft model with ``k`` heads: its own, then copies of its last head (head i
        differs from head i-1 only by its projection and by one more step of lag behind the
        mature states, §4.1.3, so the last head stands in for deeper ones, untrained). Itself
        when it has ``k`` or more; ``bind_target`` the new one."""
        have = self.cfg.num_heads
        if k <= have:
            return self
        deeper = ChimeraDraftModel(replace(self.cfg, num_heads=k), self.vocab)
        state = self.state_dict()
        for i in range(have, k):
            state[f"heads.{i}.weight"] = state[f"heads.{have - 1}.weight"].clone()
        deeper.load_state_dict(state)
        w = self.norm.weight
        return deeper.to(device=w.device, dtype=w.dtype).train(self.training)

    def bind_target(self, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor) -> None:
        """Share the target's embedding [V(+pad), H] and LM head [V(+pad), H] (frozen)."""
        self.embed_weight = embed_weight.detach()
        if self.cfg.head_kind == "shared":
            self.lm_rows = self.vocab.rows(lm_head_weight.detach()).to(
                self.heads[0].weight.dtype).contiguous()

    @torch.no_grad()
    def init_from_target(self, state: Mapping[str, torch.Tensor], num_layers: int) -> None:
        """Block from the target's last layer, norm from its final norm, ``paper``
        heads from [W_lm | W_lm] (HF state-dict names)."""
        last = f"model.layers.{num_layers - 1}."
        self.block.init_from_layer({k[len(last):]: v for k, v in state.items()
                                    if k.startswith(last)})
        self.norm.weight.copy_(state["model.norm.weight"].to(self.norm.weight.dtype))
        if self.cfg.head_kind == "paper":
            w = state.get("lm_head.weight", state["model.embed_tokens.weight"])
            for head in self.heads:
                head.weight.copy_(torch.cat([w, w], dim=1).to(head.weight.dtype))

    def linear_weights(self) -> dict[str, torch.Tensor]:
        """Every weight a draft token multiplies by: the linear layers' (by module name)
        and the draft vocabulary's LM-head rows (``lm_rows``, after ``bind_target``)."""
        out = {name: mod.weight for name, mod in self.named_modules()
               if isinstance(mod, nn.Linear)}
        if self.lm_rows is not None:
            out["lm_rows"] = self.lm_rows
        return out

    def use_low_bit(self, forms: Mapping[str, LowBitLinear]) -> None:
        """Run the weights named in ``forms`` (``linear_weights`` names) through those
        low-bit copies from now on, for inputs of two dimensions [n, K] (the drafter's; the
        training and teacher-forced passes keep the float weights)."""
        dtype = self.norm.weight.dtype
        for name, lin in forms.items():
            if name == "lm_rows":
                self.lm_rows_fn = lin.bound(None, dtype)
            else:
                mod = self.get_submodule(name)
                mod.forward = lin.bound(mod.bias, dtype)  # type: ignore[method-assign]

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    # ---- pieces shared by training and drafting -----------------------------------------
    def green(self, tri: torch.Tensor) -> torch.Tensor:
        """Trigram states g for trigram ids [..., 3] -> [..., H]."""
        assert self.embed_weight is not None, "bind_target() was not called"
        e = F.embedding(tri, self.embed_weight).to(self.heads[0].weight.dtype)
        return self.trigram(e.flatten(-2))

    def head_logits(self, i: int, h_last: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Head i over [h_{n-1}; z]: logits over the draft vocabulary [..., N]."""
        x = self.heads[i](torch.cat([h_last.to(z.dtype), z], dim=-1))
        if self.cfg.head_kind == "shared":
            if self.lm_rows_fn is not None:
                return self.lm_rows_fn(x)
            assert self.lm_rows is not None, "bind_target() was not called"
            return x @ self.lm_rows.T
        return x

    def encode(self, g: torch.Tensor, q_positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: torch.Tensor | None) -> torch.Tensor:
        """z for queries g [B, T, H] against keys/values [B, S, kv, d]: [B, T, H]."""
        c = self.cfg
        q = self.block.query(g, q_positions).transpose(1, 2)  # [B, heads, T, d]
        a = F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=mask, enable_gqa=True)
        a = a.transpose(1, 2).reshape(*g.shape[:-1], c.num_attention_heads * c.head_dim)
        return self.norm(self.block.finish(g, a))

    # ---- training (§4.2) -----------------------------------------------------------------
    def teacher_forced(self, tokens: torch.Tensor, hidden: torch.Tensor,
                       select: torch.Tensor | None = None
                       ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Per head i, (positions [B, T] bool, z [n, H], logits [n, N]) at the query
        positions p with ``select`` (default all) and p >= i + 1, with the mask drafting
        meets: g_p attends to h_{<=p-1-i} and g_{<=p}; head i's input is [h_{p-1-i}; z_p].
        ``tokens`` [B, T], ``hidden`` [B, T, H] the target's final-norm states. Only the
        selected positions run the block's query path (training: the answer tokens)."""
        b, t = tokens.shape
        dev = tokens.device
        pos = torch.arange(t, device=dev).expand(b, t)
        hidden = hidden.to(self.heads[0].weight.dtype)
        g = self.green(trigram_ids(tokens))
        kh, vh = self.block.kv(hidden, pos)
        kg, vg = self.block.kv(g, pos)
        k, v = torch.cat([kh, kg], dim=1), torch.cat([vh, vg], dim=1)
        if select is None:
            select = torch.ones(b, t, dtype=torch.bool, device=dev)
        # pack each row's selected positions to the left: queries [B, Q]
        counts = select.sum(dim=1)
        q_len = max(1, int(counts.max()))
        rows, cols = select.nonzero(as_tuple=True)
        rank = torch.arange(rows.numel(), device=dev) - (counts.cumsum(0) - counts)[rows]
        q_pos = torch.zeros(b, q_len, dtype=torch.long, device=dev)
        q_pos[rows, rank] = cols
        q_valid = torch.zeros(b, q_len, dtype=torch.bool, device=dev)
        q_valid[rows, rank] = True
        gq = g.gather(1, q_pos.unsqueeze(-1).expand(b, q_len, g.shape[-1]))
        j = torch.arange(t, device=dev).view(1, 1, t)
        qp = q_pos.unsqueeze(-1)
        out = []
        for i in range(self.cfg.num_heads):
            mask = torch.cat([j <= qp - 1 - i, j <= qp], dim=-1).unsqueeze(1)  # [B, 1, Q, 2T]
            z = self.encode(gq, q_pos, k, v, mask)[q_valid]  # [n, H], in select's order
            keep = cols >= i + 1
            where = torch.zeros_like(select)
            where[rows[keep], cols[keep]] = True
            zs = z[keep]
            h_last = hidden[rows[keep], cols[keep] - 1 - i]
            out.append((where, zs, self.head_logits(i, h_last, zs)))
        return out

    def train_forward(self, tokens: torch.Tensor, hidden: torch.Tensor, labels: torch.Tensor,
                      loss_mask: torch.Tensor, distill_weight: float = 1.0,
                      topk: int = 5, kd_weight: float = 0.0) -> TrainOutput:
        """Losses over sequences: ``tokens`` [B, T], the target's final-norm states
        ``hidden`` [B, T, H] at every position, ``labels`` [B, T] the target's top-1
        after each position (-1: none), ``loss_mask`` [B, T] the positions that count.

        ``kd_weight`` w: each head's term is (1 - w) CE(top-1) + w KL(p || q), p the
        target's own next-token distribution over the draft vocabulary (its LM-head rows
        on h_p, the state the label came from) and q the head's: the target's whole
        distribution instead of its argmax (the paper trains on labels only, eq. 5)."""
        if kd_weight > 0 and self.cfg.head_kind != "shared":
            raise ValueError("distilling the target's distribution needs head_kind='shared' "
                             "(the target's LM-head rows)")
        dev = tokens.device
        vocab_index = torch.full((self.cfg.vocab_size,), -100, dtype=torch.long, device=dev)
        vocab_index[self.draft_ids] = torch.arange(self.draft_ids.numel(), device=dev)
        in_vocab = vocab_index[labels.clamp_min(0)]
        out = TrainOutput(loss=torch.zeros((), device=dev), ce=[], mse=torch.zeros((), device=dev))
        mse_terms, heads = [], []
        hidden = hidden.to(self.heads[0].weight.dtype)
        select = loss_mask & (labels >= 0)
        if kd_weight > 0:
            # the target's log-probabilities over the draft vocabulary, once per labelled
            # position (every head's positions are among them); row of a position: row_of
            assert self.lm_rows is not None, "bind_target() was not called"
            row_of = torch.full(select.shape, -1, dtype=torch.long, device=dev)
            row_of[select] = torch.arange(int(select.sum()), device=dev)
            with torch.no_grad():
                p_log = F.log_softmax(hidden[select].float() @ self.lm_rows.float().T, dim=-1)
        for where, z, logits in self.teacher_forced(tokens, hidden, select):
            lg = logits.float()
            target = in_vocab[where]
            h = hidden[where].float()
            ce = F.cross_entropy(lg, target, ignore_index=-100) \
                if bool((target >= 0).any()) else lg.sum() * 0.0
            out.ce.append(ce)
            if kd_weight > 0:
                kl = F.kl_div(F.log_softmax(lg, dim=-1), p_log[row_of[where]], log_target=True,
                              reduction="batchmean")
                out.kl.append(kl)
                heads.append((1.0 - kd_weight) * ce + kd_weight * kl)
            else:
                heads.append(ce)
            mse_terms.append(F.mse_loss(z.float(), h))
            if topk > 0:  # accuracy counts (evaluation); training steps pass 0
                with torch.no_grad():
                    top = lg.topk(min(topk, lg.shape[-1]), dim=-1).indices
                    hit = (top == target.unsqueeze(1)).cumsum(dim=1).clamp_max(1)
                    out.correct.append(hit.sum(dim=0))
                    out.counted.append(int(target.numel()))
        out.mse = torch.stack(mse_terms).mean()
        out.loss = torch.stack(heads).mean() + distill_weight * out.mse
        return out


# ---- checkpoints ---------------------------------------------------------------------------
TRAIN_REMEDY = ("Train one for this model: python tools/train_chimera.py --model MODEL "
                "--tokens 300000 --out CKPT.safetensors, then pass {\"checkpoint\": \"CKPT.safetensors\"}.")


def save_checkpoint(path: str | Path, model: ChimeraDraftModel, stamp: ModelStamp,
                    training: Mapping[str, Any], dtype: torch.dtype = torch.bfloat16) -> None:
    """Trained weights (``dtype``) and the draft vocabulary, stamped with the target and
    with how they were trained (safetensors metadata; proposers.artifacts)."""
    tensors = {name: (t.to(dtype) if t.is_floating_point() else t).contiguous().cpu()
               for name, t in model.state_dict().items()}
    save_stamped(path, tensors, CHECKPOINT_FORMAT, stamp,
                 {"config": model.cfg.to_json(), "training": dict(training)})


def check_checkpoint(path: str | Path, model: ModelStamp) -> dict[str, Any]:
    """Start-up check from the file header only: made for this model; returns its
    metadata ({"config", "training"})."""
    header, _ = open_stamped(path, CHECKPOINT_FORMAT, "Chimera checkpoint", TRAIN_REMEDY,
                             arrays=False, expect=model)
    return header["meta"]


def load_checkpoint(path: str | Path, model: ModelStamp | None = None,
                    dtype: torch.dtype = torch.float32) -> ChimeraDraftModel:
    """The draft model of a checkpoint (refused for another model when ``model`` is given)."""
    header, tensors = open_stamped(path, CHECKPOINT_FORMAT, "Chimera checkpoint", TRAIN_REMEDY,
                                   expect=model)
    cfg = ChimeraConfig.from_json(header["meta"]["config"])
    net = ChimeraDraftModel(cfg, DraftVocab(tensors["draft_ids"].long(), cfg.vocab_size))
    net.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v
                         for k, v in tensors.items()})
    return net.to(dtype).eval()


def expected_tokens_per_step(accept: list[float]) -> float:
    """1 + sum over heads of the probability that heads 0..i are all accepted, from
    per-head conditional acceptance probabilities (chain drafting)."""
    total, run = 1.0, 1.0
    for a in accept:
        run *= a
        total += run
    return total


def load_draft_vocab_ids(path: str | Path, n: int) -> list[int]:
    """The first (most frequent) ``n`` target ids of a checkpoint's draft vocabulary."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return f.get_tensor("draft_ids")[:n].long().tolist()
