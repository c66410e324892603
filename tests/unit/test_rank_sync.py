"""Tensor parallelism: every rank runs the drafter; rank 0's decisions hold on all of them.

Ranks are threads here and the TP group is a fake whose collectives are barriers: a rank
that runs a collective the other rank does not run breaks the barrier (in vLLM it would
wait forever). The fake target's draft and scoring forwards are collectives too, as the
target's all-reduces are.
"""

from __future__ import annotations

import math
import pickle
import threading
import time
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import pytest
import torch

from vllm_selfspec.bridge import DraftContext
from vllm_selfspec.drafter import PluginDrafter
from vllm_selfspec.proposers.base import DraftBatch, DraftRequest
from vllm_selfspec.proposers.draft_verify import SelfSpecProposer
from vllm_selfspec.proposers.resolved import Artifacts
from vllm_selfspec.proposers.skip_mask import SkipMask
from vllm_selfspec.proposers.swift import SwiftProposer
from vllm_selfspec.rank_sync import NOT_READY, RankSync, for_engine
from vllm_selfspec.target import DraftPass

V = 16
L = 8


class Diverged(Exception):
    """Ranks ran different collectives: vLLM would wait forever (or mix shapes)."""


class Hub:
    """What the fake ranks share: one slot per rank and a barrier."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.slots: list[Any] = [None] * n
        self.barrier = threading.Barrier(n, timeout=5)


class FakeGroup:
    def __init__(self, hub: Hub, rank: int) -> None:
        self.hub, self.rank, self.size = hub, rank, hub.n
        self.collectives: list[str] = []

    def exchange(self, what: str, value: Any) -> list[Any]:
        self.collectives.append(what)
        self.hub.slots[self.rank] = (what, value)
        try:
            self.hub.barrier.wait()
            # what the other ranks sent, as copies (vLLM pickles), taken before they go on
            got = [v if r == self.rank else pickle.loads(pickle.dumps(v))
                   for r, v in enumerate(self.hub.slots)]
            self.hub.barrier.wait()
        except threading.BrokenBarrierError:
            raise Diverged("another rank left the collective") from None
        kinds = {w for w, _ in got}
        if len(kinds) != 1:
            raise Diverged(f"ranks ran different collectives: {sorted(kinds)}")
        return [v for _, v in got]

    def min_all(self, values: list[int]) -> list[int]:
        return [min(col) for col in zip(*self.exchange("min_all", values))]

    def from_first(self, obj: Any) -> Any:
        return self.exchange("from_first", obj)[0]


def run_ranks(n: int, fn: Callable[[FakeGroup], Any]) -> list[Any]:
    """fn(group) on n thread-ranks; a rank's exception (a broken barrier: a hang in vLLM)
    is raised here."""
    hub = Hub(n)
    out: list[Any] = [None] * n
    errors: list[BaseException] = []

    def body(rank: int) -> None:
        try:
            out[rank] = fn(FakeGroup(hub, rank))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
            hub.barrier.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    diverged = [e for e in errors if isinstance(e, Diverged)]
    if errors:
        raise (diverged or errors)[0]
    return out


class TPTarget:
    """Next token = (token + 1) % V. Each draft forward is a collective (the target's
    all-reduces). ``wobble`` is this rank's last-bits difference: it moves the top-1
    probability of the positions in ``near`` just across the draft-exit threshold."""

    num_layers = L
    vocab_size = V
    device = torch.device("cpu")

    def __init__(self, group: FakeGroup, near: set[int] = frozenset(), wobble: float = 0.0,
                 score_noise: float = 0.0) -> None:
        self.group, self.near, self.wobble, self.score_noise = group, set(near), wobble, score_noise
        self.forwards = 0

    def draft_step(self, rows, tokens, positions, mask, draft_index, head=None, settled=False):
        self.group.exchange(f"draft forward of {int(rows.numel())} rows", None)
        self.forwards += 1
        logits = torch.full((len(rows), V), -10.0)
        for i, (t, p) in enumerate(zip(tokens.tolist(), positions.tolist())):
            logits[i, (t + 1) % V] = 10.0
            if p in self.near:  # top-1 probability 0.5 +- this rank's wobble
                logits[i] = 0.0
                logits[i, (t + 1) % V] = math.log(V - 1) + self.wobble
        return logits

    def score_masks(self, windows, masks):
        self.group.exchange(f"score forward of {len(masks)} masks", None)
        self.forwards += 1
        n = sum(len(w.inputs) for w in windows)
        g = torch.Generator().manual_seed(len(masks) * 1000 + self.group.rank)
        p = 0.5 + self.score_noise * torch.rand(len(masks), 1, generator=g)
        return torch.rand(len(masks), n, generator=torch.Generator().manual_seed(7)) < p


def _synced(p: Any, group: FakeGroup, synced: bool) -> RankSync:
    sync = RankSync(group)
    if synced:
        p.agree = sync.share
    return sync


# ---- RankSync ------------------------------------------------------------------------------
def test_plan_is_rank_0s_limit_and_no_rank_drafts_a_step_one_could_not_set_up():
    limits = {0: 3, 1: 0}
    assert run_ranks(2, lambda g: RankSync(g).plan(limits[g.rank])) == [3, 3]
    limits = {0: 0, 1: 5}
    assert run_ranks(2, lambda g: RankSync(g).plan(limits[g.rank])) == [0, 0]
    limits = {0: 4, 1: NOT_READY}
    assert run_ranks(2, lambda g: RankSync(g).plan(limits[g.rank])) == [NOT_READY] * 2
    limits = {0: NOT_READY, 1: 2}
    assert run_ranks(2, lambda g: RankSync(g).plan(limits[g.rank])) == [NOT_READY] * 2


def test_share_is_rank_0s_value():
    assert run_ranks(3, lambda g: RankSync(g).share(("x", g.rank))) == [("x", 0)] * 3


def test_no_sync_at_tp_1():
    cfg = SimpleNamespace(parallel_config=SimpleNamespace(tensor_parallel_size=1))
    assert for_engine(cfg) is None
    assert SelfSpecProposer(4, {}).agree is None


# ---- selfspec / layerskip drafting loop ----------------------------------------------------
def _draft(group: FakeGroup, synced: bool, sampled: bool = False):
    p = SelfSpecProposer(6, {"draft_exit_threshold": 0.5, "adaptive_threshold": False},
                         Artifacts(skip_mask=SkipMask(frozenset({1}), frozenset())))
    # rank 0's top-1 probability at position 12 is just above 0.5, rank 1's just below
    t = TPTarget(group, near={12}, wobble=1e-3 if group.rank == 0 else -1e-3)
    p.bind(t)
    _synced(p, group, synced)
    temp = 0.8 if sampled else 0.0
    batch = DraftBatch(["a", "b"], [DraftRequest(0, "a", 10, 0, 6, temperature=temp),
                                    DraftRequest(1, "b", 30, 5, 6, temperature=temp)])
    out = p.propose(batch)
    return out.drafts, t.forwards


def test_unsynced_ranks_would_hang_on_a_confidence_that_differs_in_the_last_bits():
    with pytest.raises(Diverged):
        run_ranks(2, lambda g: _draft(g, synced=False))


def test_synced_ranks_draft_rank_0s_tokens_with_the_same_forwards():
    (d0, f0), (d1, f1) = run_ranks(2, lambda g: _draft(g, synced=True))
    assert d0 == d1 and f0 == f1
    assert d0 == [[1, 2, 3, 4, 5, 6], [6, 7, 8, 9, 10, 11]]  # rank 0 kept going at 12
    (d0, f0), (d1, f1) = run_ranks(2, lambda g: _draft(g, synced=True, sampled=True))
    assert d0 == d1 and f0 == f1


# ---- swift: the optimization budget is wall time -------------------------------------------
def _swift(group: FakeGroup, synced: bool, steps: int = 60):
    # rank 1's clock says the budget is spent (a tiny budget); rank 0 may optimize
    budget = 1.0 if group.rank == 0 else 1e-9
    p = SwiftProposer(4, {"context_window": 8, "bayes_interval": 0, "max_tolerance_iter": 20,
                          "max_opt_iter": 40, "optimization_budget": budget, "cost_gate": False})
    t = TPTarget(group, score_noise=0.3)  # scores that differ per rank
    p.bind(t)
    _synced(p, group, synced)
    toks = np.arange(2 * 120).reshape(2, 120) % V
    for _ in range(steps):
        reqs = [DraftRequest(row=i, req_id=f"r{i}", position=100, token=1, max_len=2,
                             num_output_tokens=40) for i in range(2)]
        p.propose(DraftBatch(["r0", "r1"], reqs, token_ids=toks, num_tokens=np.full(2, 101)))
        time.sleep(0.0005)
    return p.stats["opt_steps"], p.phase, p.mask.to_json(), t.forwards


def test_unsynced_swift_ranks_would_hang_on_the_budget():
    with pytest.raises(Diverged):
        run_ranks(2, lambda g: _swift(g, synced=False, steps=5))


def test_synced_swift_ranks_run_one_search():
    r0, r1 = run_ranks(2, lambda g: _swift(g, synced=True))
    assert r0 == r1
    assert r0[0] > 0  # rank 0's budget allowed optimization steps: rank 1 ran them too


# ---- the drafter: one plan per step --------------------------------------------------------
class Gate:
    """A cost gate whose decision is this rank's own (wall-time) business."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def record(self, *a: Any, **kw: Any) -> None: ...

    def observe(self, *a: Any) -> None: ...

    def drafted(self, *a: Any) -> None: ...

    def landed(self, *a: Any) -> None: ...

    def plan(self, n: int = 1) -> int:
        return self.limit


def _runner(rows: int = 2):
    tok = np.zeros((rows, 64), dtype=np.int32)
    for i in range(rows):
        tok[i, :4] = [1, 5, 6, 7 + i]
    sp = SimpleNamespace(temperature=0.0, top_k=0, top_p=1.0, max_tokens=100, min_tokens=0,
                         ignore_eos=False, all_stop_token_ids={2}, extra_args=None)
    reqs = {f"r{i}": SimpleNamespace(sampling_params=sp, output_token_ids=[0]) for i in range(rows)}
    return SimpleNamespace(input_batch=SimpleNamespace(token_ids_cpu=tok,
                                                       num_tokens_no_spec=np.full(rows, 4)),
                           requests=reqs, max_model_len=64)


def _ctx(rows: int = 2) -> DraftContext:
    so = SimpleNamespace(scheduled_spec_decode_tokens={}, num_scheduled_tokens={},
                         finished_req_ids=set())
    return DraftContext(scheduler_output=so, sampled_token_ids=[[7 + i] for i in range(rows)],
                        sampling_metadata=None, hidden_states=None, sample_hidden_states=None,
                        spec_decode_metadata=None, common_attn_metadata=None,
                        req_ids=[f"r{i}" for i in range(rows)])


def _drafter(group: FakeGroup, gate_limit: int, fail_setup: bool = False) -> PluginDrafter:
    d = PluginDrafter.__new__(PluginDrafter)  # the parts propose_with_runner uses
    d.k, d.opts, d.drafting, d._phase_changes, d.known = 4, {}, True, 0, set()
    d.publisher, d.calls, d.seconds = None, 0, 0.0
    d.draft_pass = DraftPass()
    d._last_stats = time.monotonic()
    d.proposer = SelfSpecProposer(4, {}, Artifacts(skip_mask=SkipMask(frozenset({1}), frozenset())))
    d.view = TPTarget(group)
    d.proposer.bind(d.view)
    d.gate = Gate(gate_limit)
    d.sync = RankSync(group)
    d.proposer.agree = d.sync.share
    if fail_setup:
        def boom(*a: Any) -> Any:
            raise RuntimeError("this rank's setup failed")
        d._batch = boom  # type: ignore[method-assign]
    return d


def test_drafter_drafts_rank_0s_length_on_every_rank():
    limits = {0: 2, 1: 0}  # rank 1's gate would keep the step plain
    out = run_ranks(2, lambda g: (_drafter(g, limits[g.rank]).propose_with_runner(
        _runner(), _ctx())[0], g.collectives))
    (d0, c0), (d1, c1) = out
    assert d0 == d1 == [[8, 9], [9, 10]] and c0 == c1
    limits = {0: 0, 1: 3}  # rank 0 keeps it plain: nobody drafts
    out = run_ranks(2, lambda g: _drafter(g, limits[g.rank]).propose_with_runner(
        _runner(), _ctx())[0])
    assert out == [[[], []], [[], []]]


def test_a_step_one_rank_cannot_set_up_drafts_nothing_anywhere(caplog):
    out = run_ranks(2, lambda g: _drafter(g, 3, fail_setup=g.rank == 1).propose_with_runner(
        _runner(), _ctx()))
    assert out == [([[], []], None)] * 2
