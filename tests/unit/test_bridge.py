"""Runner state -> proposer types, and the draft-failure guard."""

from types import SimpleNamespace

import numpy as np
import pytest

from vllm_selfspec import log
from vllm_selfspec.bridge import (
    DraftContext,
    RequestKeyError,
    draft_requests,
    read_feedback,
    request_draft_cap,
)
from vllm_selfspec.drafter import InjectedFault, inject_faults, safe_propose
from vllm_selfspec.proposers.base import DraftBatch, DraftRequest, Proposal, Proposer


def _sp(**kw):
    base = dict(temperature=0.0, top_k=0, top_p=1.0, max_tokens=100, min_tokens=0,
                ignore_eos=False, all_stop_token_ids={2}, extra_args=None)
    base.update(kw)
    return SimpleNamespace(**base)


def _runner(rows):
    tok = np.zeros((len(rows), 64), dtype=np.int32)
    num = np.zeros(len(rows), dtype=np.int32)
    reqs = {}
    for i, (rid, ids, sp, n_out) in enumerate(rows):
        tok[i, : len(ids)] = ids
        num[i] = len(ids)
        reqs[rid] = SimpleNamespace(sampling_params=sp, output_token_ids=[0] * n_out)
    return SimpleNamespace(input_batch=SimpleNamespace(token_ids_cpu=tok, num_tokens_no_spec=num),
                           requests=reqs, max_model_len=64)


def _ctx(req_ids, sampled, scheduled):
    return DraftContext(scheduler_output=SimpleNamespace(scheduled_spec_decode_tokens=scheduled),
                        sampled_token_ids=sampled, sampling_metadata=None, hidden_states=None,
                        sample_hidden_states=None, spec_decode_metadata=None,
                        common_attn_metadata=None, req_ids=req_ids)


def test_feedback_uses_scheduled_drafts():
    ctx = _ctx(["a", "b", "c"], [[5, 6, 7], [9], []], {"a": [5, 6, 1, 1], "b": [3, 3], "c": [4]})
    fb = read_feedback(ctx)
    assert [(v.req_id, v.drafted, v.accepted) for v in fb] == [("a", 4, 2), ("b", 2, 0)]


def test_draft_requests_positions_limits_and_sampling():
    runner = _runner([
        ("a", [1, 10, 11, 12], _sp(), 3),                 # normal greedy row
        ("b", [1, 20, 21], _sp(max_tokens=3), 2),         # one token left: no draft
        ("c", [1, 30, 2], _sp(), 2),                      # ended with EOS: no draft
        ("d", [1, 40], _sp(temperature=0.7, top_k=5, top_p=0.9, max_tokens=4), 1),
        ("e", [1, 50, 51], _sp(), 2),                     # partial prefill: nothing sampled
    ])
    ctx = _ctx(["a", "b", "c", "d", "e"], [[12], [21], [2], [40], []], {})
    out = {r.req_id: r for r in draft_requests(runner, ctx, k=8)}
    assert set(out) == {"a", "d"}
    assert out["a"].position == 3 and out["a"].token == 12 and out["a"].max_len == 8
    assert out["d"].max_len == 2 and out["d"].temperature == 0.7 and out["d"].top_k == 5


def test_a_request_sets_its_own_draft_limit_and_long_prompts_draft_nothing():
    """``num_speculative_tokens`` in a request's extra_args (vllm_xargs): 0 turns drafting
    off for it, N caps it; the engine's max_draft_prompt_tokens turns it off for long
    prompts. Other requests keep the engine's k."""
    runner = _runner([
        ("off", [1, 10, 11, 12], _sp(extra_args={"num_speculative_tokens": 0}), 1),
        ("two", [1, 20, 21, 22], _sp(extra_args={"num_speculative_tokens": "2"}), 1),
        ("big", [1, 30, 31, 32], _sp(extra_args={"num_speculative_tokens": 50}), 1),
        ("other", [1, 40, 41, 42], _sp(extra_args={"kv_transfer_params": {}}), 1),
        ("long", [1, 2, 3, 4, 5, 6, 7, 50], _sp(), 1),  # a 7-token prompt
    ])
    ctx = _ctx(["off", "two", "big", "other", "long"], [[12], [22], [32], [42], [50]], {})
    out = {r.req_id: r.max_len for r in draft_requests(runner, ctx, k=8, prompt_limit=6)}
    assert out == {"two": 2, "big": 8, "other": 8}
    assert {r.req_id for r in draft_requests(runner, ctx, k=8)} == {"two", "big", "other",
                                                                      "long"}


@pytest.mark.parametrize("value", [-1, 129, 2.5, True, "two", [3], None])
def test_a_malformed_request_limit_is_refused_in_one_line(value):
    with pytest.raises(RequestKeyError, match=r"must be an integer in \[0, 128\]") as e:
        request_draft_cap({"num_speculative_tokens": value})
    assert "\n" not in str(e.value)
    assert request_draft_cap(None) is None and request_draft_cap({"x": 1}) is None


class Boom(Proposer):
    def propose(self, batch):
        raise RuntimeError("kaboom")


class WrongRows(Proposer):
    def propose(self, batch):
        return Proposal([[1]])


def test_failing_draft_step_drafts_nothing(caplog):
    batch = DraftBatch(["a", "b"], [DraftRequest(0, "a", 3, 1, 4)])
    p = Boom(4, {})
    for _ in range(3):
        out = safe_propose(p, batch)
        assert out.drafts == [[], []] and out.probs is None
    assert p.stats["failures"] == 3
    assert sum("draft step failed" in r.getMessage() for r in caplog.records) <= 1
    assert safe_propose(WrongRows(4, {}), batch).drafts == [[], []]


class Echo(Proposer):
    def propose(self, batch):
        return Proposal([[7] for _ in batch.req_ids])


def test_injected_faults_are_survived(caplog):
    """The VLLM_SELFSPEC_FAULT_EVERY test hook: every 3rd step raises inside the proposer
    call; those steps draft nothing, the others draft, one log line."""
    batch = DraftBatch(["a"], [DraftRequest(0, "a", 3, 1, 4)])
    p = Echo(4, {})
    log._once.discard(f"draft-failure-{id(p)}")  # ids are reused after an earlier test
    inject_faults(p, 3)
    drafts = [safe_propose(p, batch).drafts for _ in range(7)]
    assert drafts == [[[7]], [[7]], [[]], [[7]], [[7]], [[]], [[7]]]
    assert p.stats["failures"] == 2
    failed = [r for r in caplog.records if "draft step failed" in r.getMessage()]
    assert len(failed) == 1 and "InjectedFault" in failed[0].getMessage()
    p.propose(batch)  # the 8th call
    with pytest.raises(InjectedFault, match="VLLM_SELFSPEC_FAULT_EVERY=3"):
        p.propose(batch)


def test_finished_requests_include_those_the_scheduler_reported_to_an_empty_step():
    """The last running request's finish goes to a step with nothing to run (no draft
    step follows it), so the drafter also counts requests the runner no longer holds."""
    from vllm_selfspec.drafter import PluginDrafter

    d = SimpleNamespace(known=set())
    step = lambda live, fin=(): PluginDrafter._finished(  # noqa: E731
        d, SimpleNamespace(requests=dict.fromkeys(live)),
        SimpleNamespace(scheduler_output=SimpleNamespace(finished_req_ids=set(fin))))
    assert step(["a"]) == set()
    assert step(["b"]) == {"a"}  # a's finish was handed to an empty step
    assert step(["b", "c"], {"x"}) == {"x"}
    assert step([]) == {"b", "c"}

