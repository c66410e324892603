"""Chimera's drafting inside a serving engine (paper §4.4, as a chain).

Per request the drafter keeps the full-context encoder's keys and values of every
mature state (the target's final-norm last-layer state h_p of a verified token)
and every green state (trigram state g_p) it has seen: ``ContextStore``. A single
block means an entry depends only on its own input and position, so the store is
exact; it grows as tokens are verified and is freed when the request leaves the
batch (finished or preempted).

Each step the glue hands over the mature states the target just computed
(``TargetStates``: prefill chunks, and for verified drafts only the accepted
positions). They wait, copied, until a draft is due (or ``PENDING_ROWS`` pile up)
and are then taken in with every green state they lack in one batched pass:
most steps of a gated-off engine draft nothing, and a per-step pass over one
state costs mostly small-op overhead. A request
whose states restart below what the store holds (it was preempted and is
recomputed) starts a fresh store. Positions whose states were
never computed (a prefix-cache hit skips the prompt's cached part) are left out:
the encoder attends to the green states of those tokens (rebuilt from the token
ids) and to the mature states it has; drafts get worse, output stays exact.

Drafting for a request whose newest token x_n sits at position n: head i's query
is g_{n+i} (from x_n and the tokens drafted by heads < i), attending to the store
plus the green entries of the drafts before it (written past the store's end as
scratch, never kept); head i predicts x_{n+i+1} from [h_{n-1}; z_{n+i}]. Drafting
stops after ``num_speculative_tokens`` heads, or once the draft's top-1
probability falls under ``stop_threshold`` (as SWIFT §4.2; the paper verifies a
tree instead, which vLLM v1 cannot). With sampling, drafts are drawn from q over
the draft vocabulary and q, scattered into the full vocabulary, goes to vLLM's
rejection sampler.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Protocol

import torch

from .base import DraftBatch, Proposal, Proposer, TargetStates
from .chimera import ChimeraDraftModel, trigram_ids
from .low_bit import DRAFT_WEIGHTS, choose_forms
from .options import DRAFT_WEIGHTS_DEFAULT, DraftSamplerOptions, option
from .resolved import Artifacts
from .sampling import draft_distribution


class HiddenStateTarget(Protocol):
    """What Chimera needs of the target (vllm_selfspec.target.HiddenStateView)."""

    device: torch.device
    dtype: torch.dtype
    vocab_size: int
    embed_weight: torch.Tensor  # [V(+pad), H]
    lm_head_weight: torch.Tensor  # [V(+pad), H]


@dataclass(frozen=True)
class ChimeraOptions(DraftSamplerOptions):
    """Method ``chimera``'s keys."""

    checkpoint: str | None = option(
        None, "Chimera checkpoint from tools/train_chimera.py. Default: the checkpoint cached or "
        "shipped for this model (the embedded model has one)", "str")
    stop_threshold: float = option(
        0.0, "drafting stops early when the draft's top-1 probability is below it (0: every "
        "head drafts)", "float", 0.0, 1.0)
    draft_weights: str = option(
        DRAFT_WEIGHTS_DEFAULT, "weights the draft model's linear layers and LM-head rows "
        "read: \"full\" (the checkpoint's, in the target's dtype), \"int8\", \"w8a8\" or "
        "\"int4\" (as the self-draft's key of that name: each shape takes its fastest kernel "
        "of that format or a more precise one, timed on this machine, proposers.low_bit)",
        "str", choices=DRAFT_WEIGHTS)


class ContextStore:
    """The encoder's keys/values of one request: entries in arrival order (attention
    does not care about order; positions are inside the rotated keys)."""

    def __init__(self, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 capacity: int = 256) -> None:
        self.k = torch.empty(capacity, kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.empty_like(self.k)
        self.count = 0
        self.next_mature = 0  # position after the newest mature state
        self.next_green = 0  # green entries cover positions [0, next_green)
        self.last_hidden: torch.Tensor | None = None  # h at next_mature - 1

    def reserve(self, extra: int) -> None:
        need = self.count + extra
        if need <= self.k.shape[0]:
            return
        cap = max(need, 2 * self.k.shape[0])
        for name in ("k", "v"):
            old = getattr(self, name)
            new = old.new_empty(cap, *old.shape[1:])
            new[: self.count] = old[: self.count]
            setattr(self, name, new)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        n = int(k.shape[0])
        self.reserve(n)
        self.k[self.count: self.count + n] = k
        self.v[self.count: self.count + n] = v
        self.count += n

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2


def single_query_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One query [heads, d] over keys/values [n, kv_heads, d] (grouped-query): [heads * d].
    Two small matmuls; ``scaled_dot_product_attention`` is far slower for this shape on
    CPU (strided keys, grouped heads)."""
    heads, d = q.shape
    kvh = k.shape[1]
    qg = q.view(kvh, heads // kvh, d)  # [kv, group, d]
    scores = torch.matmul(qg, k.permute(1, 2, 0)) * (d ** -0.5)  # [kv, group, n]
    out = torch.matmul(torch.softmax(scores.float(), dim=-1).to(v.dtype), v.transpose(0, 1))
    return out.reshape(heads * d)


# pending mature states taken in at once, even if no draft is due (bounds their memory)
PENDING_ROWS = 1024


class ChimeraProposer(Proposer):
    """Method ``chimera``: the trained draft model over the target's hidden states."""

    uses_hidden_states = True
    tracks_steps = True
    options_class = ChimeraOptions
    # the evidence class a composed proposer files Chimera's drafts under: its tokens and
    # seconds go to the cost gate as ``Proposal.timed`` (None: the call's cost is theirs)
    timed_evidence: str | None = None

    def __init__(self, num_speculative_tokens: int, options: Mapping[str, Any],
                 artifacts: Artifacts | None = None) -> None:
        super().__init__(num_speculative_tokens, options, artifacts)
        self.model: ChimeraDraftModel | None = self.artifacts.checkpoint
        self.stores: dict[str, ContextStore] = {}
        self.pending: list[TargetStates] = []  # mature states not yet taken in, in order
        self.pending_rows = 0
        self.target: HiddenStateTarget | None = None
        self.generator: torch.Generator | None = None
        self.low_bit_formats: dict[str, str] = {}  # weight name -> its kernel (bind)
        # time spent drafting (per draft token: the cost tools/chimera_eval.py prices) and
        # taking in states; store_resets: recomputed requests; missing_states: positions
        # never computed (prefix-cache hits)
        self.stats.update({"store_resets": 0, "missing_states": 0, "draft_seconds": 0.0,
                           "draft_tokens": 0, "track_seconds": 0.0})

    def bind(self, target: HiddenStateTarget) -> None:
        assert self.model is not None, "ChimeraProposer needs options['model']"
        self.target = target
        self.model = self.model.to(device=target.device, dtype=target.dtype).eval()
        self.model.bind_target(target.embed_weight, target.lm_head_weight)
        forms = choose_forms(self.model.linear_weights(), self.cfg.draft_weights, target.dtype)
        self.model.use_low_bit(forms)
        self.low_bit_formats = {name: lin.fmt for name, lin in forms.items()}
        self.generator = torch.Generator(device=target.device)
        self.generator.manual_seed(int(self.cfg.seed))

    @property
    def heads(self) -> int:
        assert self.model is not None
        return min(self.k, self.model.cfg.num_heads)

    def describe(self) -> str:
        c = self.model.cfg if self.model is not None else None
        if c is None:
            return "chimera (no model)"
        kernels = Counter(self.low_bit_formats.values())
        weights = ", ".join(f"{n} {f}" for f, n in sorted(kernels.items())) or "full"
        return (f"chimera: {c.num_heads} heads ({c.head_kind}), draft vocabulary "
                f"{self.model.draft_ids.numel()}, up to {self.heads} draft tokens, stop below "
                f"{self.cfg.stop_threshold:.2f}, draft weights {self.cfg.draft_weights} "
                f"({weights})")

    # ---- the context store ------------------------------------------------------------------
    def _store(self, req_id: str) -> ContextStore:
        s = self.stores.get(req_id)
        if s is None:
            assert self.model is not None and self.target is not None
            c = self.model.cfg
            s = ContextStore(c.num_key_value_heads, c.head_dim, self.target.dtype,
                             self.target.device)
            self.stores[req_id] = s
        return s

    @torch.inference_mode()
    def ingest(self, states: list[TargetStates]) -> None:
        """Take in mature states, in the order they were computed (one batched key/value
        projection; a request may have several steps' states)."""
        assert self.model is not None
        todo = []
        for st in states:
            n = int(st.hidden.shape[0])
            if n == 0:
                continue
            s = self._store(st.req_id)
            if st.start < s.next_mature:  # recomputed after preemption
                self.stores.pop(st.req_id)
                self.stats["store_resets"] += 1
                s = self._store(st.req_id)
            if st.start > s.next_mature:
                self.stats["missing_states"] += st.start - s.next_mature  # prefix-cache hit
            s.next_mature = st.start + n
            todo.append((s, st.start, st.hidden))
        if not todo:
            return
        dev = todo[0][2].device
        hidden = torch.cat([h for _, _, h in todo]).to(self.model.norm.weight.dtype)
        pos = torch.cat([torch.arange(p, p + h.shape[0], device=dev) for _, p, h in todo])
        k, v = self.model.block.kv(hidden, pos)
        at = 0
        for s, _, h in todo:
            n = int(h.shape[0])
            s.append(k[at: at + n], v[at: at + n])
            s.last_hidden = hidden[at + n - 1].clone()
            at += n

    @torch.inference_mode()
    def extend_green(self, rows: list[tuple[str, torch.Tensor]]) -> None:
        """Green entries up to each request's newest known token: ``rows`` are
        (req_id, all known token ids [n] as a LongTensor)."""
        assert self.model is not None
        todo = []
        for req_id, toks in rows:
            s = self._store(req_id)
            n = int(toks.numel())
            if n > s.next_green:
                lo = max(0, s.next_green - 2)  # the trigram of position p needs p-2, p-1
                tri = trigram_ids(toks[lo:n])[s.next_green - lo:]
                todo.append((s, s.next_green, n, tri))
        if not todo:
            return
        dev = self.target.device if self.target is not None else torch.device("cpu")
        tri = torch.cat([t for *_, t in todo]).to(dev)
        pos = torch.cat([torch.arange(a, b, device=dev) for _, a, b, _ in todo])
        g = self.model.green(tri)
        k, v = self.model.block.kv(g, pos)
        at = 0
        for s, a, b, _ in todo:
            s.append(k[at: at + b - a], v[at: at + b - a])
            s.next_green = b
            at += b - a

    def finish(self, req_ids: set[str]) -> None:
        for r in req_ids:
            self.stores.pop(r, None)
        if self.pending and any(st.req_id in req_ids for st in self.pending):
            self.pending = [st for st in self.pending if st.req_id not in req_ids]
            self.pending_rows = sum(int(st.hidden.shape[0]) for st in self.pending)

    @property
    def store_bytes(self) -> int:
        return sum(s.nbytes for s in self.stores.values())

    # ---- drafting -----------------------------------------------------------------------
    @torch.inference_mode()
    def track(self, batch: DraftBatch) -> None:
        """Keep this step's mature states (copies: the runner reuses its buffers) until
        a draft is due (``prepare``)."""
        t0 = time.perf_counter()
        try:
            for st in batch.states or []:
                n = int(st.hidden.shape[0])
                if n:
                    self.pending.append(TargetStates(st.row, st.req_id, st.start,
                                                     st.hidden.clone()))
                    self.pending_rows += n
            if self.pending_rows >= PENDING_ROWS:
                self._take_pending()
        finally:
            self.stats["track_seconds"] += time.perf_counter() - t0

    def _take_pending(self) -> None:
        pending, self.pending, self.pending_rows = self.pending, [], 0
        self.ingest(pending)

    @torch.inference_mode()
    def prepare(self, batch: DraftBatch, requests: list[Any] | None = None) -> float:
        """Before drafting: take in the pending mature states and the green states of
        every known token of ``requests`` (default: the batch's rows that may draft).
        Returns the seconds it took (also added to the ``track_seconds`` stat)."""
        t0 = time.perf_counter()
        try:
            self._take_pending()
            if batch.token_ids is not None and batch.num_tokens is not None:
                self.extend_green([(r.req_id, torch.from_numpy(
                    batch.token_ids[r.row, : int(batch.num_tokens[r.row])]).long())
                    for r in (batch.requests if requests is None else requests)
                    if r.max_len > 0])
        finally:
            seconds = time.perf_counter() - t0
            self.stats["track_seconds"] += seconds
        return seconds

    @torch.inference_mode()
    def propose(self, batch: DraftBatch) -> Proposal:
        assert self.model is not None and self.target is not None, "bind() was not called"
        drafts: list[list[int]] = [[] for _ in batch.req_ids]
        self.track(batch)
        if batch.token_ids is None:
            return Proposal(drafts)
        self.prepare(batch)
        reqs = self.ready(batch.requests)
        if not reqs:
            return Proposal(drafts)
        self.stats["steps"] += 1
        return self._draft(batch, reqs, drafts)

    def ready(self, requests: list[Any]) -> list[Any]:
        """The requests whose context store holds every state up to the newest token."""
        out = []
        for r in requests:
            s = self.stores.get(r.req_id)
            if r.max_len > 0 and s is not None and s.last_hidden is not None \
                    and s.next_mature == r.position and s.next_green == r.position + 1:
                out.append(r)
        return out

    def _draft(self, batch: DraftBatch, reqs: list[Any], drafts: list[list[int]]) -> Proposal:
        t0 = time.perf_counter()
        before = sum(len(drafts[r.row]) for r in reqs)
        out = self._draft_heads(batch, reqs, drafts)
        seconds = time.perf_counter() - t0
        tokens = sum(len(drafts[r.row]) for r in reqs) - before
        self.stats["draft_seconds"] += seconds
        self.stats["draft_tokens"] += tokens
        if self.timed_evidence is not None:
            out.timed = {self.timed_evidence: (tokens, seconds)}
        return out

    def _draft_heads(self, batch: DraftBatch, reqs: list[Any], drafts: list[list[int]]
                     ) -> Proposal:
        m, dev = self.model, self.target.device
        assert m is not None and batch.token_ids is not None
        b = len(reqs)
        stores = [self.stores[r.req_id] for r in reqs]
        h_last = torch.stack([s.last_hidden for s in stores])  # type: ignore[misc]
        max_len = torch.tensor([min(r.max_len, self.heads) for r in reqs])
        temperature = torch.tensor([r.temperature for r in reqs], device=dev)
        sample = (temperature > 0) & self.cfg.sample_drafts
        any_sampled = bool(sample.any())
        probs = (torch.zeros(len(batch.req_ids), self.k, self.target.vocab_size, device=dev)
                 if any_sampled else None)
        # the last three known tokens per request, then the drafts
        hist = torch.tensor([[int(batch.token_ids[r.row, max(0, r.position - j)]) for j in (2, 1, 0)]
                             for r in reqs], device=dev)
        positions = torch.tensor([r.position for r in reqs], device=dev)
        active = torch.ones(b, dtype=torch.bool)
        for s in stores:
            s.reserve(self.heads)
        for i in range(self.heads):
            idx = active.nonzero().squeeze(1)
            if idx.numel() == 0:
                break
            idx_d = idx.to(dev)
            p = positions[idx_d] + i
            g = m.green(hist[idx_d])  # [n, H]
            q = m.block.query(g, p)  # [n, heads, d]
            if i > 0:
                k, v = m.block.kv(g, p)
                for j, r in enumerate(idx.tolist()):
                    s = stores[r]
                    s.k[s.count + i - 1] = k[j]
                    s.v[s.count + i - 1] = v[j]
            attn = [single_query_attention(q[j], stores[r].k[: stores[r].count + i],
                                           stores[r].v[: stores[r].count + i])
                    for j, r in enumerate(idx.tolist())]
            z = m.norm(m.block.finish(g, torch.stack(attn)))
            logits = m.head_logits(i, h_last[idx_d], z).float()
            conf, tok = torch.softmax(logits, dim=-1).max(dim=-1)
            sampled_rows = sample[idx_d]
            if bool(sampled_rows.any()):
                sel = sampled_rows.nonzero().squeeze(1)
                rq = [reqs[int(idx[s_])] for s_ in sel.tolist()]
                q_d = draft_distribution(
                    logits[sel], temperature[idx_d][sel],
                    torch.tensor([x.top_k for x in rq], device=dev),
                    torch.tensor([x.top_p for x in rq], device=dev))
                drawn = torch.multinomial(q_d, 1, generator=self.generator).squeeze(1)
                tok = tok.clone()
                tok[sel] = drawn
                conf = conf.clone()
                conf[sel] = q_d.max(dim=-1).values
                assert probs is not None
                q_full = m.vocab.scatter(q_d)
                for s_, qrow in zip(sel.tolist(), q_full):
                    probs[reqs[int(idx[s_])].row, i] = qrow
            ids = m.vocab.to_target(tok)
            for j, r in enumerate(idx.tolist()):
                drafts[reqs[r].row].append(int(ids[j]))
            hist[idx_d] = torch.cat([hist[idx_d, 1:], ids.unsqueeze(1)], dim=1)
            keep = (conf.cpu() >= self.cfg.stop_threshold) & (max_len[idx] > i + 1)
            active[idx[~keep]] = False
        return Proposal(drafts, probs)
