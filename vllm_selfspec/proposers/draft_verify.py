"""Draft & Verify (Zhang et al., ACL 2024): self-speculative drafting by skipping
sub-layers of the target model itself.

§3.2, Algorithm 2/3: the draft model is p(x | z*, x_1..x_j), the target with the
attention and MLP sub-layers in the skip mask z* bypassed; it drafts
autoregressively through the target's own layers (and, in vLLM, its own paged
KV cache: the glue writes draft KV at the draft positions only).
§3.4: drafting stops when the draft's top-1 probability falls under the adaptive
draft-exit threshold γ (proposers.draft_exit). As in Algorithm 3, the token that
fell under γ is still proposed, then drafting stops.
Appendix K, Algorithm 4: with sampling, drafts are drawn from q and q is handed
to vLLM's rejection sampler.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch

from .base import (
    DraftBatch,
    DraftRequest,
    LayerSkipTarget,
    Proposal,
    Proposer,
    Verification,
    agreed_prefix,
)
from .draft_exit import DraftExitConfig, DraftExitController
from .draft_vocab import DraftVocab
from .guess_worth import GuessWorth
from .options import (
    DraftSamplerOptions,
    draft_vocab_option,
    draft_weights_option,
    option,
    smoothing_option,
)
from .resolved import Artifacts
from .sampling import choose_tokens
from .skip_mask import SkipMask

logger = logging.getLogger("vllm.vllm_selfspec")

# a row's fresh guess from its drafts so far: (batch row, drafts) -> tokens
GuessAgain = Callable[[int, list[int]], Sequence[int]]

_DE = DraftExitConfig  # D&V's draft-exit defaults live there (Table 6, Appendix B)


@dataclass(frozen=True)
class SelfSpecOptions(DraftSamplerOptions):
    """Method ``selfspec``'s keys."""

    skip_mask: Any = option(
        None, "skip mask: JSON file path or inline {\"attention\": [...], \"mlp\": [...]} "
        "(0-based ids, D&V/SWIFT format). Default: the cached searched mask for this model, "
        "else the uniform mask", "mask")
    skip_mask_key: str | None = option(None, "entry to use in a model-keyed mask file", "str")
    skip_ratio: float = option(0.0, "share of the 2(L-2) inner sub-layers the uniform mask "
                               "skips (used when no mask is given; with low-bit draft weights "
                               "the draft is cheap without skipping, and on the small models "
                               "each skipped sub-layer costs acceptance)", "float", 0.0, 1.0,
                               high_open=True)
    draft_exit_threshold: float = option(
        _DE.threshold, "initial draft-exit threshold: drafting stops when the draft's top-1 "
        "probability is below it", "float", 0.0, 1.0, symbol="γ0")
    adaptive_threshold: bool = option(_DE.adaptive, "update the threshold after every "
                                      "verification (D&V §3.4)", "bool")
    target_acceptance: float = option(_DE.target_acceptance, "acceptance rate the adaptive "
                                      "threshold aims for", "float", 0.0, 1.0, symbol="α")
    threshold_step: float = option(_DE.step, "threshold update step", "float", 0.0, 1.0,
                                   symbol="ε")
    beta1: float = option(_DE.beta1, "smoothing of the acceptance rate", "float", 0.0, 1.0,
                          high_open=True, symbol="β1")
    beta2: float = option(_DE.beta2, "smoothing of the threshold", "float", 0.0, 1.0,
                          high_open=True, symbol="β2")
    draft_vocab: int = draft_vocab_option()
    draft_weights: str = draft_weights_option()
    smoothing: float = smoothing_option()

    def draft_exit(self) -> DraftExitConfig:
        return DraftExitConfig(threshold=self.draft_exit_threshold,
                               target_acceptance=self.target_acceptance,
                               step=self.threshold_step, beta1=self.beta1, beta2=self.beta2,
                               adaptive=self.adaptive_threshold)


class SelfSpecProposer(Proposer):
    """Method ``selfspec``: a fixed skip mask (searched offline) + adaptive draft exit."""

    writes_target_kv = True
    uses_target = True
    options_class = SelfSpecOptions

    def __init__(self, num_speculative_tokens: int, options: Mapping[str, Any],
                 artifacts: Artifacts | None = None) -> None:
        super().__init__(num_speculative_tokens, options, artifacts)
        self.exit = DraftExitController(self.draft_exit_config())
        self.sample_drafts = self.cfg.sample_drafts
        self.mask: SkipMask = self.artifacts.skip_mask or SkipMask()
        self.target: LayerSkipTarget | None = None
        self.generator: torch.Generator | None = None
        # draft vocabulary (key draft_vocab): target ids of the N most frequent tokens, most
        # frequent first, resolved at start-up (artifacts.draft_vocab); bound in bind()
        self.vocab: DraftVocab | None = None
        self.head: torch.Tensor | None = None  # [N, H] LM-head rows of the draft vocabulary
        self.vocab_ids: list[int] | None = (list(self.artifacts.draft_vocab)
                                            if self.artifacts.draft_vocab else None)
        self._vocab_size: int | None = None  # asked for before bind()
        # guessed tokens fed to the first pass, and those drafted as guessed (propose); of
        # those, drafted where the draft alone was unsure (``agreement``)
        self.stats.update({"guessed_tokens": 0, "guesses_kept": 0, "kept_by_agreement": 0,
                           "guessed_again": 0, "guess_tokens_cut": 0})
        # where the draft is unsure of a token but drafts the guessed one, draft on through
        # the guess (set by a method that guesses: ngrammys-selfspec's key ``agreement``)
        self.agreement = False
        # feed only the guessed positions that pay for their place in a pass (set by a
        # method that guesses: ngrammys-selfspec's key ``guess_cut``)
        self.guess_worth: GuessWorth | None = None
        self._guessed: list[tuple[int, int, list[int]]] = []  # (row, depth, whole guess)

    def draft_exit_config(self) -> DraftExitConfig:
        """When drafting stops (D&V §3.4: the adaptive threshold)."""
        return self.cfg.draft_exit()

    def bind(self, target: LayerSkipTarget) -> None:
        self.target = target
        self.generator = torch.Generator(device=target.device)
        self.generator.manual_seed(self.cfg.seed)
        if self.vocab_ids is not None:
            self.use_draft_vocab(self._vocab_size if self._vocab_size is not None
                                 else len(self.vocab_ids))

    def use_draft_vocab(self, n: int) -> None:
        """Draft over the first ``n`` (most frequent) ids loaded at start-up; 0: the full
        vocabulary (vllm_selfspec.control.set_draft_vocab switches it in a running engine)."""
        have = 0 if self.vocab_ids is None else len(self.vocab_ids)
        if n > have:
            raise ValueError(f"draft vocabulary of {n} tokens: {have} were loaded at start-up "
                             "(key draft_vocab)")
        if self.target is None:  # the glue binds at the first draft step: apply it then
            self._vocab_size = n
            return
        if n <= 0:
            self.set_draft_vocab(None)
            return
        self.set_draft_vocab(DraftVocab(torch.as_tensor(self.vocab_ids[:n], dtype=torch.long),
                                        int(self.target.vocab_size)))

    def set_draft_vocab(self, vocab: DraftVocab | None) -> None:
        """Draft over ``vocab`` (None or the full vocabulary: the target's own LM head).
        The rows are views of the target's LM head, gathered once: [N, H]."""
        assert self.target is not None, "bind() first"
        if vocab is None or vocab.is_full:
            self.vocab = self.head = None
            return
        weight = self.target.lm_head_weight  # type: ignore[attr-defined]
        if weight.shape[0] < vocab.vocab_size:
            # tensor parallelism: this rank holds a shard of the head; every rank takes the
            # same decision (same shapes), so the draft forwards stay matched
            logger.warning("draft_vocab: the LM head is sharded (%d of %d rows on this rank); "
                           "drafting over the full vocabulary", weight.shape[0], vocab.vocab_size)
            self.vocab = self.head = None
            return
        self.vocab = vocab
        self.head = vocab.rows(weight.detach()).contiguous()
        prepare = getattr(self.target, "prepare_head", None)
        if prepare is not None:  # a low-bit copy of the rows (draft_weights), made now
            prepare(self.head)

    @property
    def mask_settled(self) -> bool:
        """The mask drafts for long: a target that compiles its draft pass compiles it."""
        return True

    def set_mask(self, mask: SkipMask) -> None:
        """Switch the skip mask between steps (vllm_selfspec.control.set_skip_mask)."""
        self.mask = mask

    def describe(self) -> str:
        return (f"selfspec: {self.mask.describe()}, draft-exit threshold "
                f"{self.exit.threshold:.2f}{self.describe_vocab()}")

    def describe_vocab(self) -> str:
        if self.vocab is not None:
            return f", draft vocabulary {self.vocab.size}"
        if self.target is None and self.vocab_ids is not None:  # applied by bind()
            n = self._vocab_size if self._vocab_size is not None else len(self.vocab_ids)
            if n > 0:
                return f", draft vocabulary {n} (from the first draft step)"
        return ""

    def observe(self, results: list[Verification]) -> None:
        super().observe(results)
        for r in results:
            self.exit.observe(r.drafted, r.accepted, reached_max=r.drafted >= self.k)

    @torch.inference_mode()
    def propose(self, batch: DraftBatch,
                guesses: Mapping[int, Sequence[int]] | None = None,
                guess_again: GuessAgain | None = None) -> Proposal:
        """Draft autoregressively through the kept sub-layers until the draft-exit threshold
        or the length limit stops a row. ``guesses`` (batch row -> tokens, e.g. an n-gram
        match's continuation): the first pass feeds each row's newest token and its guess
        at once (``draft_chunk``) and keeps the guess up to the first token the draft
        itself would not have drafted; so the drafts are the ones this loop drafts without
        guesses, in fewer passes where the guess is right (``_guessed_pass``).
        ``guess_again`` (batch row, the row's drafts so far -> tokens): before every later
        pass, a fresh guess for each row that drafts on; a pass where some row has one is
        a guessed pass too (the same drafts again, in fewer passes where it holds)."""
        assert self.target is not None, "bind() was not called"
        drafts: list[list[int]] = [[] for _ in batch.req_ids]
        reqs = [r for r in batch.requests if r.max_len > 0]
        if not reqs:
            return Proposal(drafts)
        self.stats["steps"] += 1
        dev = self.target.device
        rows = torch.tensor([r.row for r in reqs], device=dev)
        tokens = torch.tensor([r.token for r in reqs], device=dev)
        positions = torch.tensor([r.position for r in reqs], device=dev)
        max_len = torch.tensor([min(r.max_len, self.k) for r in reqs], device=dev)
        temperature = torch.tensor([r.temperature for r in reqs], device=dev)
        sampled = (temperature > 0) & self.sample_drafts
        any_sampled = bool(sampled.any())
        top_k = torch.tensor([r.top_k for r in reqs], device=dev) if any_sampled else None
        top_p = torch.tensor([r.top_p for r in reqs], device=dev) if any_sampled else None
        probs = (torch.zeros(len(batch.req_ids), self.k, self.target.vocab_size, device=dev)
                 if any_sampled else None)
        sampling = (sampled, temperature, top_k, top_p)

        active = torch.arange(len(reqs), device=dev)
        depth = torch.zeros(len(reqs), dtype=torch.long, device=dev)  # drafts per row so far
        self._guessed = []
        if guesses and any(guesses.get(r.row) for r in reqs):
            active = self._guessed_pass(list(range(len(reqs))), reqs, guesses, rows, tokens,
                                        positions, max_len, depth, sampling, drafts, probs)
        vocab, head = self.vocab, self.head
        d = 0
        while active.numel() > 0:
            if guess_again is not None:
                on = active.tolist()
                again = {reqs[i].row: guess_again(reqs[i].row, drafts[reqs[i].row])
                         for i in on}
                if any(again.values()):
                    self.stats["guessed_again"] += 1
                    active = self._guessed_pass(on, reqs, again, rows, tokens, positions,
                                                max_len, depth, sampling, drafts, probs)
                    d += 1
                    continue
            at = depth[active]
            # with a draft vocabulary, logits over it only [n, N]
            t0 = time.perf_counter()
            logits = self.target.draft_step(rows[active], tokens[active], positions[active] + at,
                                            self.mask, d, head=head, settled=self.mask_settled)
            if self.guess_worth is not None:
                self.guess_worth.observe_pass(int(active.numel()), time.perf_counter() - t0)
            # the threshold reads the draft-vocabulary softmax; q is scattered into the full
            # vocabulary (zero outside it: exactly what the draft was drawn from)
            nxt, conf, q = choose_tokens(
                logits, sampled[active], temperature[active],
                None if top_k is None else top_k[active],
                None if top_p is None else top_p[active], self.generator)
            if vocab is not None:
                nxt = vocab.to_target(nxt)
                q = None if q is None else vocab.scatter(q)
            if probs is not None and q is not None:
                probs[rows[active], at] = q
            keep = (conf >= self.exit.threshold) & (at + 1 < max_len[active])
            if self.agree is not None:  # TP: rank 0's tokens and stops on every rank
                nxt_l, keep_l = self.agree((nxt.tolist(), keep.tolist()))
                nxt = torch.tensor(nxt_l, dtype=nxt.dtype, device=dev)
                keep = torch.tensor(keep_l, dtype=torch.bool, device=dev)
            for i, t in zip(rows[active].tolist(), nxt.tolist()):
                drafts[i].append(t)
            tokens[active] = nxt
            depth[active] += 1
            active = active[keep]
            d += 1
        if self.guess_worth is not None:  # every guess in full against the final drafts
            for row, d0, g in self._guessed:
                self.guess_worth.observe_guess(len(g), agreed_prefix(drafts[row][d0:], g))
        # one pass drafts a position for every row: priced per position (CostGate.drafted)
        return Proposal(drafts, probs, depth={"": max(map(len, drafts))})

    def _guessed_pass(self, idx: list[int], reqs: list[DraftRequest],
                      guesses: Mapping[int, Sequence[int]], rows: torch.Tensor,
                      tokens: torch.Tensor, positions: torch.Tensor, max_len: torch.Tensor,
                      depth: torch.Tensor, sampling: tuple[Any, ...], drafts: list[list[int]],
                      probs: torch.Tensor | None) -> torch.Tensor:
        """A draft pass with guesses for the rows ``idx`` (indices into ``reqs``): row i
        feeds its newest token (the request's, or its last draft) and up to
        ``max_len - depth - 1`` guessed tokens in one chunk, and drafts at each fed position
        as a draft step would (argmax, or a sample from that position's q). The row's drafts
        run while the draft equals the guess (the next position's logits then hold for
        the draft too: they were computed after that token), up to and including the first
        draft that differs from it, falls under the threshold or reaches the limit. With
        ``agreement``, a draft under the threshold that equals the guess does not stop the
        row: two drafters that agree on a token are taken at their word (more tokens from
        the same pass; the drafts are then no longer the loop's alone, and verification
        decides as for any draft). Sampled rows: a draw at position j is used only when the
        draws before it equalled the guess, so each draft is drawn from q given the drafts
        before it, as the loop draws. Returns the rows that draft on (``tokens``/``depth``
        updated in place)."""
        assert self.target is not None
        sampled, temperature, top_k, top_p = sampling
        dev = self.target.device
        sel = torch.tensor(idx, dtype=torch.long, device=dev)
        start_l, limit_l = depth[sel].tolist(), max_len[sel].tolist()
        whole = [[int(t) for t in (guesses.get(reqs[i].row) or ())][: limit - d0 - 1]
                 for i, d0, limit in zip(idx, start_l, limit_l)]
        keep = [len(g) for g in whole]
        if self.guess_worth is not None:  # the positions that pay (key guess_cut)
            keep = self.guess_worth.lengths(keep)
            if self.agree is not None:  # TP: rank 0's cut (its timings) on every rank
                keep = self.agree(keep)
            self._guessed.extend((reqs[i].row, d0, g) for i, d0, g in zip(idx, start_l, whole)
                                 if g)
            self.stats["guess_tokens_cut"] += sum(map(len, whole)) - sum(keep)
        fed, lens, guessed = [], [], []
        for tok, g, m in zip(tokens[sel].tolist(), whole, keep):
            fed.append(tok)
            fed.extend(g[:m])
            lens.append(m + 1)
            guessed.append(g[:m])
        per_token = torch.tensor(lens, device=dev)
        t0 = time.perf_counter()
        logits = self.target.draft_chunk(rows[sel], torch.tensor(fed, device=dev), lens,
                                         positions[sel] + depth[sel], self.mask, head=self.head)
        if self.guess_worth is not None:
            self.guess_worth.observe_pass(len(fed), time.perf_counter() - t0)

        def expand(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x[sel].repeat_interleave(per_token)

        nxt, conf, q = choose_tokens(logits, expand(sampled), expand(temperature), expand(top_k),
                                     expand(top_p), self.generator)
        if self.vocab is not None:
            nxt = self.vocab.to_target(nxt)
            q = None if q is None else self.vocab.scatter(q)
        nxt_l, sure_l = nxt.tolist(), (conf >= self.exit.threshold).tolist()
        if self.agree is not None:  # TP: rank 0's drafts on every rank
            nxt_l, sure_l = self.agree((nxt_l, sure_l))
        on, base = [], 0
        confirmed = agreed = 0
        for n, i in enumerate(idx):
            row, g, d0, limit = reqs[i].row, guessed[n], start_l[n], limit_l[n]
            j = 0
            while True:  # draft d0 + j comes from fed token j (the newest, then the guess)
                t = nxt_l[base + j]
                drafts[row].append(t)
                if probs is not None and q is not None:
                    probs[row, d0 + j] = q[base + j]
                j += 1
                agrees = j <= len(g) and t == g[j - 1]
                if d0 + j >= limit:
                    break
                if not sure_l[base + j - 1]:
                    if not (self.agreement and agrees):
                        break  # stopped, as the loop would stop
                    agreed += 1  # unsure, but the guess drafted it too: on through the guess
                elif not agrees:
                    on.append(i)  # the draft left the guess: the loop drafts on from t
                    break
            # the guessed tokens drafted: the new drafts' leading run equal to the guess
            confirmed += agreed_prefix(drafts[row][d0:], g)
            tokens[i], depth[i] = t, d0 + j
            base += lens[n]
        self.stats["guessed_tokens"] += sum(map(len, guessed))
        self.stats["guesses_kept"] += confirmed
        self.stats["kept_by_agreement"] += agreed
        return torch.tensor(on, dtype=torch.long, device=dev)
