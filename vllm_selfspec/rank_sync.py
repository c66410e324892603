"""Tensor parallelism: the drafter's decisions, taken once and shared by every rank.

With ``tensor_parallel_size`` > 1 vLLM builds the drafter in every worker and calls it
on every rank at every step (``gpu_model_runner.py``: the custom_class proposer of each
runner). What each rank does with it:

* the drafts of TP rank 0 alone reach the scheduler (``multiproc_executor.py:
  take_draft_token_ids`` asks ``output_rank`` only, ``ray_executor`` keeps
  ``output[0]``), which sends them back to every rank as the next step's scheduled
  tokens; the other ranks' draft token ids are thrown away;
* but every rank verifies them with its own rejection sampler, which reads that rank's
  own draft probabilities (the runner bridge, ``patches.py`` P3), so with sampled drafts
  each rank's q must be rank 0's;
* a draft that runs the target's layers (selfspec, swift, layerskip) or SWIFT's scoring
  forward does the target's collectives (all-reduces after attention and MLP, the logits
  all-gather): if one rank runs a draft forward that another does not, it waits forever.

Decisions taken from wall time (the cost gate's plan, SWIFT's optimization budget)
differ between ranks; decisions taken from the target's logits (draft-exit confidence,
SWIFT's matchness) agree as long as the gathered logits agree to the last bit, which vLLM
also relies on for its own sampling. ``RankSync`` makes both kinds identical: rank 0
decides and the other ranks take its decision.

* ``plan(limit)``: once per engine step, one all-reduce (MIN) of two integers on the
  group's CPU (gloo) process group: every rank drafts rank 0's limit, and no rank drafts
  or optimizes in a step that some rank could not set up (-1).
* ``share(value)``: rank 0's value of a decision inside the step (each draft position's
  tokens and stops, SWIFT's "optimize now" and its scores), through vLLM's shared-memory
  broadcaster of the TP group (``GroupCoordinator.broadcast_object``).

Every rank calls them at the same points, since everything else the drafter sees (the
scheduler's output, the batch, the verified tokens) is identical on all ranks. At
TP = 1 the drafter holds no ``RankSync`` and nothing here runs. Method ``ngrammys``
needs none either: it runs no collective and draws no q, so its rank-local decisions
only shape drafts that are thrown away.
"""

from __future__ import annotations

from typing import Any, Protocol

NOT_READY = -1  # plan(): some rank could not set this step up
_ANY = 1 << 62  # what ranks other than 0 put in the MIN for the limit


class Group(Protocol):
    """The tensor-parallel group as RankSync uses it (``VllmTPGroup``; tests fake it)."""

    rank: int
    size: int

    def min_all(self, values: list[int]) -> list[int]:
        """Element-wise minimum over all ranks (every rank gets it)."""
        ...

    def from_first(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        ...


class VllmTPGroup:
    """vLLM's TP ``GroupCoordinator`` (``vllm.distributed.parallel_state``)."""

    def __init__(self, coordinator: Any) -> None:
        self.coordinator = coordinator
        self.rank = int(coordinator.rank_in_group)
        self.size = int(coordinator.world_size)

    def min_all(self, values: list[int]) -> list[int]:
        import torch
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.int64)  # CPU tensor on the gloo group
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.coordinator.cpu_group)
        return [int(v) for v in t.tolist()]

    def from_first(self, obj: Any) -> Any:
        return self.coordinator.broadcast_object(obj, src=0)


class RankSync:
    """Rank 0 decides, every rank of the group takes the decision."""

    def __init__(self, group: Group) -> None:
        self.group = group
        self.calls = {"plan": 0, "share": 0}

    @property
    def leader(self) -> bool:
        return self.group.rank == 0

    def plan(self, limit: int) -> int:
        """Rank 0's draft limit for this step (0: no drafts), or ``NOT_READY`` (-1) on
        every rank when any rank passes -1 (it could not set the step up)."""
        self.calls["plan"] += 1
        ok = int(limit >= 0)
        mine = int(limit) if self.leader and ok else _ANY
        first, all_ok = self.group.min_all([mine, ok])
        return NOT_READY if not all_ok else first

    def share(self, value: Any) -> Any:
        """Rank 0's ``value`` (picklable) on every rank."""
        self.calls["share"] += 1
        return self.group.from_first(value)


def for_engine(vllm_config: Any) -> RankSync | None:
    """The drafter's RankSync: None at tensor_parallel_size 1."""
    parallel = getattr(vllm_config, "parallel_config", None)
    tp = int(getattr(parallel, "tensor_parallel_size", 1) or 1)
    if tp <= 1:
        return None
    from vllm.distributed.parallel_state import get_tp_group

    return RankSync(VllmTPGroup(get_tp_group()))
