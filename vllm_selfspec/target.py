"""The target model as self-speculative drafters see it, inside vLLM.

Implements ``proposers.base.LayerSkipTarget`` on the live vLLM model: draft tokens
run through the target's own layers (eagerly, via ``adapters``), attending to and
writing into the target's own paged KV cache:

* per-step attention metadata is built like EAGLE's drafting loop
  (``vllm/v1/spec_decode/llm_base_proposer.py:660-770``): one query token per
  row at ``position``, ``seq_len = position + 1``, slots from the block table;
* KV is written only for the attention layers the mask keeps, and only at draft
  positions (>= the newest token's position), never over the verified prefix
  (they would overwrite what the target verified); the scheduler reserved the slots (P2);
* the compiled ``model.forward`` is never called (trace-once has no guards for
  Python-level skip flags);
* SWIFT's candidate scoring (``score_masks``) is a teacher-forced pass over
  already-verified context tokens that writes NO KV at all (``slot_mapping={}``:
  writing over the verified prefix corrupts the output).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import torch

from vllm_selfspec.adapters import (
    DirectWalk,
    PreNormDecoderAdapter,
    UnsupportedModelError,
    module_linear,
)
from vllm_selfspec.proposers.base import ContextWindow
from vllm_selfspec.proposers.skip_mask import SkipMask


@dataclass
class DraftPass:
    """How the eager layer-skip draft walk runs: one object, held by the drafter and
    shared with its view (``control.set_compile_walks`` / ``set_draft_kernels`` set it).

    ``compile_walks``: compile the walk once per settled skip mask (for measurement only,
    not a key: docs/results.md, "A compiled draft pass"). ``draft_kernels``: run vLLM's
    fused CPU kernels (adapters.DraftKernels); off only to measure the native op forms."""

    compile_walks: bool = False
    draft_kernels: bool = True


class TargetView:
    def __init__(self, runner: Any, adapter: PreNormDecoderAdapter,
                 low_bit: Any = None) -> None:
        from vllm.v1.worker.utils import AttentionGroup

        self.runner = runner
        self.adapter = adapter
        self.vllm_config = runner.vllm_config
        self.device = torch.device(runner.device)
        self.num_layers = adapter.num_layers
        self.vocab_size = runner.model_config.get_vocab_size()
        groups = runner.kv_cache_config.kv_cache_groups
        if len(groups) != 1 or len(runner.attn_groups) != 1:
            raise UnsupportedModelError(f"{len(groups)} KV-cache groups (drafting needs exactly one)")
        attn_groups = list(runner.attn_groups[0])
        if self.device.type != "cpu":
            # GPU builders own persistent buffers used by CUDA-graph replay of the
            # target; drafting builds metadata with private copies, as EAGLE's drafter does
            # (llm_base_proposer.py:1740-1761).
            private = []
            for g in attn_groups:
                pg = AttentionGroup(backend=g.backend, layer_names=g.layer_names,
                                    kv_cache_spec=g.kv_cache_spec,
                                    kv_cache_group_id=g.kv_cache_group_id)
                pg.create_metadata_builders(self.vllm_config, self.device,
                                            kernel_block_size=g.kernel_block_size)
                private.append(pg)
            attn_groups = private
        self.attn_groups = attn_groups
        self.block_size = int(attn_groups[0].kv_cache_spec.block_size)
        self.block_table: torch.Tensor | None = None
        # wall time of draft forwards (tools/draft_cost.py reads it)
        self.timing = {"draft_calls": 0, "draft_rows": 0, "draft_seconds": 0.0, "chunk_tokens": 0,
                       "score_calls": 0, "score_tokens": 0, "score_seconds": 0.0,
                       "compiles": 0, "compile_seconds": 0.0}
        self.draft_pass = DraftPass()  # the drafter puts its own here (drafter.py)
        self.low_bit = low_bit  # draft_weights.LowBitDraft (key draft_weights), or None
        self._walks: dict[tuple[frozenset[int], frozenset[int]], Any] = {}
        # the direct walk (adapters.DirectWalk) where it runs: on CPU with vLLM's kernels
        # and a model it supports; built here, not in a timed draft step
        self._direct_why = DirectWalk.supported(adapter)
        self._direct: DirectWalk | None = None
        if self._direct_why is None:
            if low_bit is not None:
                self._direct = DirectWalk(adapter, low_bit.linear, low_bit.walk_dtype, fold=low_bit)
            else:
                self._direct = DirectWalk(adapter, module_linear, adapter.embed_weight.dtype)
        self._arange = torch.arange(runner.max_num_reqs + 1, dtype=torch.int32, device=self.device)

    def begin_step(self, common_attn_metadata: Any) -> None:
        """Take this step's block table (rows = the runner's batch rows)."""
        self.block_table = common_attn_metadata.block_table_tensor

    def slots(self, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        assert self.block_table is not None
        bt = self.block_table[rows]
        block = bt.gather(1, (positions // self.block_size).long().unsqueeze(1)).squeeze(1)
        return block.long() * self.block_size + positions.long() % self.block_size

    def _attn_metadata(self, rows: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                       draft_index: int, query_start_loc: torch.Tensor | None = None,
                       max_query_len: int = 1) -> dict[str, Any]:
        """One query token per row at ``positions`` (a draft step), or with
        ``query_start_loc`` several per row, ``positions`` then being each row's last
        (a chunk: ``draft_chunk``)."""
        from vllm.v1.attention.backend import CommonAttentionMetadata

        n = int(rows.numel())
        seq_lens = (positions + 1).to(torch.int32)
        seq_lens_cpu = seq_lens.cpu()
        qsl = self._arange[: n + 1] if query_start_loc is None else query_start_loc
        cm = CommonAttentionMetadata(
            query_start_loc=qsl, query_start_loc_cpu=qsl.cpu(), seq_lens=seq_lens, num_reqs=n,
            num_actual_tokens=int(slots.numel()), max_query_len=max_query_len,
            max_seq_len=int(seq_lens_cpu.max()),
            block_table_tensor=self.block_table[rows], slot_mapping=slots, causal=True,
            seq_lens_cpu_upper_bound=seq_lens_cpu)
        per_layer: dict[str, Any] = {}
        for g in self.attn_groups:
            md = g.build_metadata_for_drafting(cm, draft_index)
            for name in g.layer_names:
                per_layer[name] = md
        return per_layer

    @property
    def lm_head_weight(self) -> torch.Tensor:
        """[V(+pad), H] LM head (this rank's shard under tensor parallelism)."""
        return self.adapter.lm_head_weight

    def draft_step(self, rows: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                   mask: SkipMask, draft_index: int, head: torch.Tensor | None = None,
                   settled: bool = False) -> torch.Tensor:
        from vllm.forward_context import set_forward_context

        t0 = time.perf_counter()
        walk, compiled, fresh = self._walk(mask, settled)
        n = int(rows.numel())
        if n == 1 and compiled:
            # a compiled walk takes >= 2 rows (adapters.compiled_run): the row twice. The
            # copy writes the same KV at the same slot (draft positions only).
            rows, tokens, positions = rows.repeat(2), tokens.repeat(2), positions.repeat(2)
        positions = positions.long()
        slots = self.slots(rows, positions)
        md = self._attn_metadata(rows, positions, slots, draft_index)
        names = self.adapter.attn_layer_names
        write = {names[i]: slots for i in range(self.num_layers) if i not in mask.attention}
        with set_forward_context(md, self.vllm_config, num_tokens=int(rows.numel()),
                                 slot_mapping=write):
            embedded = self.adapter.embed(tokens.long())
            direct = None if compiled else self.direct()
            hidden = (direct.run(embedded, positions, mask.attention, mask.mlp, md, write)
                      if direct is not None else walk(embedded, positions))
        # a draft vocabulary's LM-head rows [N, H] (proposers.draft_vocab), else the model's
        # own head over the full vocabulary
        hidden = hidden[:n]
        logits = self._logits(hidden, head)
        seconds = time.perf_counter() - t0
        if fresh:  # this call compiled the walk: a one-off, not the draft pass's cost
            self.timing["compiles"] += 1
            self.timing["compile_seconds"] += seconds
            return logits
        self.timing["draft_calls"] += 1
        self.timing["draft_rows"] += n
        self.timing["draft_seconds"] += seconds
        return logits

    def draft_chunk(self, rows: torch.Tensor, tokens: torch.Tensor, lens: list[int],
                    starts: torch.Tensor, mask: SkipMask,
                    head: torch.Tensor | None = None) -> torch.Tensor:
        """Several draft tokens per row in one pass, as vLLM's verification runs a row's
        drafts: row i feeds ``lens[i]`` of ``tokens`` (rows in turn) at positions
        ``starts[i]..``, writing their KV there (draft positions: ``starts`` are the rows'
        newest tokens' positions and the chunk stays within the K reserved slots), and gets
        logits at every token fed [sum(lens), V] (``head``: over a draft vocabulary). Each
        token attends to the cache before ``starts[i]`` and to the tokens before it in its
        chunk (causal), so the logits are those of one-token draft steps over the same
        tokens, up to the kernels' arithmetic."""
        from vllm.forward_context import set_forward_context

        t0 = time.perf_counter()
        dev = self.device
        qlens = torch.tensor(lens, dtype=torch.int32)
        qsl_cpu = torch.zeros(len(lens) + 1, dtype=torch.int32)
        torch.cumsum(qlens, 0, out=qsl_cpu[1:])
        starts = starts.long()
        offsets = torch.arange(int(qsl_cpu[-1]), dtype=torch.long) \
            - qsl_cpu[:-1].long().repeat_interleave(qlens.long())
        positions = starts.cpu().repeat_interleave(qlens.long()) + offsets
        positions = positions.to(dev)
        slots = self.slots(rows.repeat_interleave(qlens.to(dev).long()), positions)
        md = self._attn_metadata(rows, starts + qlens.to(dev) - 1, slots, 0,
                                 query_start_loc=qsl_cpu.to(dev), max_query_len=max(lens))
        names = self.adapter.attn_layer_names
        write = {names[i]: slots for i in range(self.num_layers) if i not in mask.attention}
        with set_forward_context(md, self.vllm_config, num_tokens=int(slots.numel()),
                                 slot_mapping=write):
            embedded = self.adapter.embed(tokens.long())
            direct = self.direct()
            hidden = (direct.run(embedded, positions, mask.attention, mask.mlp, md, write)
                      if direct is not None else self._eager_walk(mask)(embedded, positions))
        logits = self._logits(hidden, head)
        self.timing["draft_calls"] += 1
        self.timing["draft_rows"] += len(lens)
        self.timing["chunk_tokens"] += int(slots.numel())
        self.timing["draft_seconds"] += time.perf_counter() - t0
        return logits

    def direct(self) -> DirectWalk | None:
        """The direct walk, unless vLLM's kernels are switched off for the draft pass
        (``DraftPass.draft_kernels``, to measure the native forms) or it cannot run here."""
        return self._direct if self.draft_pass.draft_kernels else None

    def prepare_head(self, head: torch.Tensor) -> None:
        """A draft vocabulary's head rows [N, H] will draft: make their low-bit copy now."""
        if self.low_bit is not None:
            self.low_bit.prepare_subset(head)

    def _logits(self, hidden: torch.Tensor, head: torch.Tensor | None) -> torch.Tensor:
        """The draft's logits: over the full vocabulary, or over a draft vocabulary's head
        rows ``head`` [N, H]; through their low-bit copy where ``draft_weights`` chose one."""
        low = self.low_bit
        if low is not None:
            out = low.logits(hidden) if head is None else low.subset_logits(hidden, head)
            if out is not None:
                return out
        hidden = hidden.to(self.adapter.embed_weight.dtype)  # a bfloat16 walk's
        return self.adapter.logits(hidden) if head is None \
            else self.adapter.subset_logits(hidden, head)

    def _walk(self, mask: SkipMask, settled: bool) -> tuple[Any, bool, bool]:
        """(the sub-layer walk of ``mask``, whether it is compiled, whether this call
        compiles it). With ``compile_walks`` a settled mask's walk is compiled once and
        cached; anything else runs eagerly (the same operations, each dispatched from
        Python)."""
        if not (self.draft_pass.compile_walks and settled):
            return self._eager_walk(mask), False, False
        key = (mask.attention, mask.mlp)
        walk = self._walks.get(key)
        if walk is not None:
            return walk, True, False
        walk = self._walks[key] = self.adapter.compiled_run(*key)
        return walk, True, True

    def _kernels(self) -> Any:
        """vLLM's fused CPU kernels (adapters.DraftKernels) for the draft walk and the
        scoring pass, or None: switched off (``DraftPass.draft_kernels``) or none here."""
        kernels = self.adapter.kernels
        return kernels if self.draft_pass.draft_kernels and len(kernels) else None

    def _passes(self) -> contextlib.ExitStack:
        """The draft pass's swaps, for the walk and the scoring pass: vLLM's fused CPU
        kernels (``_kernels``) and the low-bit linear layers (``draft_weights``)."""
        stack = contextlib.ExitStack()
        kernels = self._kernels()
        if kernels is not None:
            stack.enter_context(kernels.active())
        if self.low_bit is not None:
            stack.enter_context(self.low_bit.active())
        return stack

    def _eager_walk(self, mask: SkipMask) -> Any:
        adapter, attention, mlp = self.adapter, mask.attention, mask.mlp

        def walk(h: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
            with self._passes():
                return adapter.run(h, p, attention, mlp)

        return walk

    def score_masks(self, windows: list[ContextWindow], masks: list[SkipMask]) -> torch.Tensor:
        """SWIFT §4.1.2, parallel candidate evaluation: every mask predicts every
        window's tokens teacher-forced, in ONE forward. Each (mask, window) pair is
        a virtual request sharing the window's block-table row; its queries are
        the window's input tokens at their own positions and attend to the
        target's cached KV (the paper reuses the target's KV for the prefix). No
        KV is written (``slot_mapping={}``), so sharing rows is safe. Returns
        [C, sum of window lengths] bools: argmax == the token the model emitted."""
        from vllm.forward_context import set_forward_context
        from vllm.v1.attention.backend import CommonAttentionMetadata

        t0 = time.perf_counter()
        assert self.block_table is not None
        dev, nc = self.device, len(masks)
        lens = [len(w.inputs) for w in windows]
        inputs = torch.tensor([t for w in windows for t in w.inputs], device=dev)
        targets = torch.tensor([t for w in windows for t in w.targets], device=dev)
        positions = torch.cat([torch.arange(w.start, w.start + n, device=dev)
                               for w, n in zip(windows, lens)])
        tw = int(inputs.numel())
        rows = torch.tensor([w.row for w in windows], device=dev).repeat(nc)
        qlens = torch.tensor(lens, dtype=torch.int32).repeat(nc)
        qsl_cpu = torch.zeros(len(qlens) + 1, dtype=torch.int32)
        torch.cumsum(qlens, 0, out=qsl_cpu[1:])
        seq_lens_cpu = torch.tensor([w.start + n for w, n in zip(windows, lens)],
                                    dtype=torch.int32).repeat(nc)
        cm = CommonAttentionMetadata(
            query_start_loc=qsl_cpu.to(dev), query_start_loc_cpu=qsl_cpu,
            seq_lens=seq_lens_cpu.to(dev), num_reqs=len(qlens), num_actual_tokens=nc * tw,
            max_query_len=max(lens), max_seq_len=int(seq_lens_cpu.max()),
            block_table_tensor=self.block_table[rows],
            slot_mapping=torch.full((nc * tw,), -1, dtype=torch.long, device=dev), causal=True,
            seq_lens_cpu_upper_bound=seq_lens_cpu)
        md: dict[str, Any] = {}
        for g in self.attn_groups:
            m = g.build_metadata_for_drafting(cm, 0)
            for name in g.layer_names:
                md[name] = m
        keep_a = torch.tensor([[0.0 if i in m.attention else 1.0 for i in range(self.num_layers)]
                               for m in masks], device=dev).repeat_interleave(tw, dim=0)
        keep_m = torch.tensor([[0.0 if i in m.mlp else 1.0 for i in range(self.num_layers)]
                               for m in masks], device=dev).repeat_interleave(tw, dim=0)
        # vLLM's fused CPU kernels here too, as in the draft walk: the native forms of its
        # custom ops run torch.compile'd when called eagerly, and compiling them for the
        # scoring pass's shapes took 0.4-1.8 s at the first optimization step (SWIFT's
        # budget: a short stream's whole share)
        with set_forward_context(md, self.vllm_config, num_tokens=nc * tw, slot_mapping={}), \
                self._passes():
            hidden = self.adapter.run_per_token(self.adapter.embed(inputs.repeat(nc)),
                                                positions.repeat(nc), keep_a, keep_m)
        pred = self._logits(hidden, None).argmax(dim=-1).view(nc, tw)
        self.timing["score_calls"] += 1
        self.timing["score_tokens"] += nc * tw
        self.timing["score_seconds"] += time.perf_counter() - t0
        return pred == targets.unsqueeze(0)


class HiddenStateView:
    """The target as Chimera sees it (``proposers.chimera_drafting.HiddenStateTarget``):
    its token embedding and LM head weights, shared, never copied (vLLM's
    ``VocabParallelEmbedding`` / ``ParallelLMHead``; rows past the vocabulary are
    padding). The hidden states themselves come through the runner bridge."""

    def __init__(self, runner: Any, adapter: PreNormDecoderAdapter) -> None:
        self.device = torch.device(runner.device)
        self.vocab_size = int(runner.model_config.get_vocab_size())
        self.embed_weight = adapter.embed_weight
        self.lm_head_weight = adapter.lm_head_weight
        self.dtype = self.embed_weight.dtype
        self.timing = {"draft_calls": 0, "draft_seconds": 0.0}
