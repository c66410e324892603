"""LayerSkip's early exit as a skip mask, its proposer's fixed draft length (LayerSkip
§4.2, §4.3.1), and the exit chosen while serving."""

import random

import pytest
import torch

from vllm_selfspec.proposers import layerskip
from vllm_selfspec.proposers.base import DraftBatch, DraftRequest
from vllm_selfspec.proposers.cost_gate import CostGate
from vllm_selfspec.proposers.layerskip import (
    EXPLORE_STEPS,
    RETRY_EVERY,
    EarlyExitProposer,
    candidate_exits,
    default_exit_layer,
    early_exit_mask,
    exit_class,
)
from vllm_selfspec.proposers.resolved import Artifacts
from vllm_selfspec.proposers.skip_mask import SkipMaskError


def test_mask_skips_every_sub_layer_from_the_exit_on():
    m = early_exit_mask(3, 8)
    assert m.attention == m.mlp == frozenset(range(3, 8))
    assert m.metadata["exit_layer"] == 3 and m.kept_fraction(8) == pytest.approx(3 / 8)
    assert early_exit_mask(8, 8).num_skipped == 0  # E = L: the draft is the model


@pytest.mark.parametrize("bad", [0, 9, -1, 2.5, True, None])
def test_exit_layer_out_of_range(bad):
    with pytest.raises(SkipMaskError, match=r"exit_layer must be an integer in \[1, 8\]"):
        early_exit_mask(bad, 8)


def test_default_exit_layer_is_a_quarter_of_the_depth():
    assert [default_exit_layer(n) for n in (1, 2, 16, 30, 32, 80)] == [1, 1, 4, 8, 8, 20]


def test_fixed_number_of_speculations_unless_a_stop_threshold_is_given():
    p = EarlyExitProposer(6, {}, Artifacts(skip_mask=early_exit_mask(2, 4)))
    assert p.exit.threshold == 0.0 and not p.exit.cfg.adaptive
    p.exit.observe(6, 0)  # no adaptive update: LayerSkip's d is fixed
    assert p.exit.threshold == 0.0 and p.exit_layer == 2
    assert "no confidence stop" in p.describe()
    q = EarlyExitProposer(6, {"stop_threshold": 0.5}, Artifacts(skip_mask=early_exit_mask(2, 4)))
    assert q.exit.threshold == 0.5 and "0.50" in q.describe()


def test_candidate_exits_are_early_exits_deepest_first():
    assert candidate_exits(30) == (29, 28, 22, 15, 8)
    assert candidate_exits(16) == (15, 14, 12, 8, 4)
    assert candidate_exits(2) == (1,)
    assert candidate_exits(1) == ()  # no early exit in a one-layer model


def test_low_bit_draft_weights_make_the_whole_depth_a_candidate():
    """Through a low-bit copy all L layers cost about what L-1 do: L is searched too."""
    assert candidate_exits(30, low_bit=True) == (30, 29, 28, 22, 15, 8)
    assert candidate_exits(1, low_bit=True) == (1,)


class Clock:
    """Simulated seconds: the proposer's ``time.perf_counter`` in these tests, advanced by
    the fake target's draft passes (no sleeping: the figures do not depend on the load)."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(layerskip, "time", c)
    return c


class ExitTarget:
    """A target whose early exit after E layers agrees with the model with probability
    ``agree[E]`` per token and costs ``per_layer`` seconds per layer it runs (on ``clock``)."""

    num_layers = 8
    vocab_size = 16
    device = torch.device("cpu")

    def __init__(self, agree: dict[int, float], clock: Clock, per_layer: float = 2e-4) -> None:
        self.agree, self.clock, self.per_layer = agree, clock, per_layer
        self.exits: list[int] = []

    def draft_step(self, rows, tokens, positions, mask, draft_index, head=None, settled=False):
        e = self.num_layers - len(mask.attention)
        self.exits.append(e)
        self.clock.now += self.per_layer * e
        logits = torch.full((len(rows), self.vocab_size), -10.0)
        logits[:, 1] = 10.0
        return logits


def serve(p: EarlyExitProposer, target: ExitTarget, steps: int, gated: bool = True,
          seed: int = 0) -> CostGate:
    """The drafter's loop (vllm_selfspec.drafter) around ``p`` with a cost gate: a plain step
    takes 4 ms, a verified draft token 0.1 ms more; draft i of exit E is accepted with
    probability agree[E] while every draft before it was."""
    rng = random.Random(seed)
    gate, clock, last = CostGate(k=p.k), target.clock, None
    for _ in range(steps):
        verified = last[0] if last else 0
        gate.record(clock.now, True, verified)
        if last is not None and last[0]:
            gate.observe(*last)
        limit = gate.plan(1) if gated else p.k
        last, step = None, 0.004
        if limit == 0:
            gate.drafted(0, 0.0)
        else:
            batch = DraftBatch(["a"], [DraftRequest(0, "a", 100, 1, min(p.k, limit))],
                               limit=gate.limit if gated else None,
                               worth=gate.worth if gated else None)
            t0 = clock.now
            out = p.propose(batch)  # the draft passes advance the clock
            secs = clock.now - t0
            gate.drafted(len(out.drafts[0]), secs, out.timed)
            n = len(out.drafts[0])
            if n:
                a = target.agree[target.exits[-1]]
                accepted = 0
                while accepted < n and rng.random() < a:
                    accepted += 1
                label = out.evidence[0] if out.evidence else ""
                last = (n, accepted, label)
                step += 0.0001 * n + 0.0004
        clock.now += step
    return gate


def test_the_exit_is_chosen_by_the_cost_gates_measured_gain(clock):
    """Without exit_layer every candidate exit drafts, each as its own evidence class, and
    drafting settles on the exit whose measured gain is highest, here not the deepest one;
    a quarter of the depth (the mask it starts from) is only a candidate."""
    target = ExitTarget({7: 0.5, 6: 0.92, 4: 0.05, 2: 0.02}, clock)
    p = EarlyExitProposer(4, {}, Artifacts(skip_mask=early_exit_mask(2, 8)))
    p.bind(target)
    assert p.exits == (7, 6, 4, 2)
    gate = serve(p, target, 400)
    assert set(p.by_exit) == {7, 6, 4, 2}
    steps = {e: n[0] for e, n in p.by_exit.items()}
    assert steps[6] > 0.7 * sum(steps.values()), steps
    # the runner-up pays too: it had its steps to be judged, and is tried again later
    assert steps[7] > EXPLORE_STEPS and p.retry_every[7] > RETRY_EVERY, (steps, p.retry_every)
    assert gate.best(evidence=exit_class(6))[0] > 0  # it pays ...
    # ... more than any other exit, as the gate predicts (the others from a few drafts)
    assert all(gate.worth(exit_class(6)) > gate.worth(exit_class(e)) for e in (7, 4, 2))
    assert "chosen while serving among exits 7, 6, 4, 2" in p.describe()
    assert p.report()["drafted_by_exit"]["6"]["steps"] == steps[6]


def test_through_low_bit_weights_the_whole_depth_is_searched_and_wins(clock):
    """A target drafting through a low-bit copy (``low_bit`` set) has the whole depth among
    the candidates; where it agrees with the model far more than the exits under it, at
    about their cost, the search settles on it."""
    target = ExitTarget({8: 0.95, 7: 0.5, 6: 0.4, 4: 0.05, 2: 0.02}, clock)
    target.low_bit = object()
    p = EarlyExitProposer(4, {}, Artifacts(skip_mask=early_exit_mask(2, 8)))
    p.bind(target)
    assert p.exits == (8, 7, 6, 4, 2)
    serve(p, target, 400)
    steps = {e: n[0] for e, n in p.by_exit.items()}
    assert steps[8] > 0.7 * sum(steps.values()), steps


def test_a_given_exit_or_no_gate_keeps_one_exit(clock):
    target = ExitTarget({7: 0.92, 6: 0.5, 4: 0.05, 2: 0.02}, clock)
    fixed = EarlyExitProposer(4, {"exit_layer": 6}, Artifacts(skip_mask=early_exit_mask(6, 8)))
    fixed.bind(target)
    assert fixed.exits == ()
    serve(fixed, target, 60)
    assert set(target.exits) == {6}
    target.exits.clear()
    # no cost gate (batch.worth None): the mask it starts from, a quarter of the depth
    free = EarlyExitProposer(4, {}, Artifacts(skip_mask=early_exit_mask(2, 8)))
    free.bind(target)
    serve(free, target, 20, gated=False)
    assert set(target.exits) == {2} and free.by_exit == {}
