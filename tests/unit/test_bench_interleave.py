"""tools/bench.py's ``--interleave steps``: engines take turns one engine step at a time,
each timed by its own clock, and their outputs come back in prompt order."""

import platform
from types import SimpleNamespace

import pytest

from vllm_selfspec.offline import bench
from vllm_selfspec.offline.bench import EngineClock, Entry, interleave_mode, merge_twin, step_round
from vllm_selfspec.proposers.swift import SwiftProposer

NOW = [0.0]  # the fake perf_counter the engine clocks read (``fake_time``)


@pytest.fixture(autouse=True)
def fake_time(monkeypatch):
    """The engine clocks read ``NOW``, which only the fake engines' steps advance: a real
    sleep overran any bound on a busy machine (the unit tests run at the lowest priority
    beside the engine tests)."""
    NOW[0] = 100.0
    monkeypatch.setattr("vllm_selfspec.offline.bench.time",
                        SimpleNamespace(perf_counter=lambda: NOW[0]))


class FakeEngine:
    """An engine whose requests finish after ``steps`` steps of ``seconds`` each (a
    faster method: fewer steps). ``log`` records which engine stepped, in order."""

    def __init__(self, name: str, steps: int, seconds: float, log: list[str]) -> None:
        self.name, self.steps, self.seconds, self.log = name, steps, seconds, log
        self.pending: list[list] = []
        self.llm_engine = self

    def enqueue(self, batch, sp, use_tqdm=False):
        ids = [str(len(self.pending) + i) for i in range(len(batch))]
        self.pending += [[rid, self.steps + int(rid) % 2, p] for rid, p in zip(ids, batch)]
        return [f"{rid}-internal" for rid in ids]  # vLLM's internal ids, not the outputs'

    def step(self):
        self.log.append(self.name)
        NOW[0] += self.seconds
        out = []
        for r in self.pending:
            r[1] -= 1
            if r[1] == 0:
                out.append(SimpleNamespace(request_id=r[0], finished=True, prompt=r[2]))
        self.pending = [r for r in self.pending if r[1] > 0]
        return out

    def has_unfinished_requests(self):
        return bool(self.pending)


def entry(name, steps, seconds, log):
    return Entry(label=name, method="baseline", llm=FakeEngine(name, steps, seconds, log),
                 clock=EngineClock())


def test_engines_take_turns_step_by_step_and_count_only_their_own_steps():
    log: list[str] = []
    fast, slow = entry("fast", 3, 0.002, log), entry("slow", 6, 0.004, log)
    took = step_round([fast, slow], ["p0", "p1"], sp=None)
    # one step each per turn, the order rotating every turn; the fast engine leaves early
    # (its second request takes one step more than its first)
    assert log[:8] == ["fast", "slow", "slow", "fast", "fast", "slow", "slow", "fast"]
    assert log[8:] == ["slow"] * 3
    # each engine's seconds are its own steps' (4 x 2 ms, 7 x 4 ms), not the round's wall time
    assert took["fast"][0] == pytest.approx(0.008) and took["slow"][0] == pytest.approx(0.028)
    # in prompt order, by the request ids the outputs carry
    assert [o.prompt for o in took["fast"][1]] == ["p0", "p1"]


def test_the_engine_clock_runs_only_while_its_engine_steps():
    clock = EngineClock()
    with clock.running():
        assert clock() == 0.0
        NOW[0] += 2.5
        assert clock() == 2.5  # read while running
    NOW[0] += 7.5
    assert clock() == 2.5  # stopped: other engines' turns are not counted
    with clock.running():
        NOW[0] += 1.0
    assert clock() == 3.5


def test_proposers_read_the_clock_they_are_given():
    """SWIFT's budget counts served time by the proposer's clock: an engine that waited for
    other engines' turns has not served that time."""
    ticks = iter([0.0, 0.5, 0.5])
    p = SwiftProposer.__new__(SwiftProposer)
    p.clock = lambda: next(ticks)  # type: ignore[method-assign]
    p._last_call, p.stats, p._step_s = None, {"served_seconds": 0.0, "opt_seconds": 0.0}, 0.0
    p.cfg = SimpleNamespace(optimization_budget=0.01)
    p._within_budget()
    p._within_budget()
    p._within_budget()
    # not a timing: the served seconds are the given clock's readings (0 -> 0.5 -> 0.5), so
    # the assertion checks which clock the budget reads, not how fast anything ran
    assert p.stats["served_seconds"] == 0.5


def test_the_baseline_time_is_the_mean_of_the_engine_started_first_and_its_twin():
    base = Entry(label="baseline", method="baseline", seconds=10.0, round_seconds=[4.0, 6.0],
                 outputs={"p": [1, 2]})
    twin = Entry(label="baseline (started last)", method="baseline", seconds=9.0,
                 round_seconds=[3.0, 6.0], outputs={"p": [1, 2]})
    merge_twin(base, twin)
    # not a timing: arithmetic on the seconds given above (the mean of the two engines)
    assert base.seconds == 9.5 and base.round_seconds == [3.5, 6.0]
    assert base.extra["baseline_twins"] == {"seconds_started_first": 10.0,
                                            "seconds_started_last": 9.0,
                                            "last_over_first": 0.9, "identical": True}


def test_auto_is_steps_with_vllms_drafters_too():
    # vLLM's ngram and suffix share the bench's process since P7 (patches.patch_kernel_rebind)
    assert interleave_mode("auto") == "steps"
    assert interleave_mode("prompts") == "prompts" and interleave_mode("steps") == "steps"


def test_a_report_names_the_cpu_model(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9B14\n")
    assert bench.cpu_model(str(info)) == "AMD EPYC 9B14"
    assert bench.cpu_model(str(tmp_path / "missing")) == platform.machine()


def test_a_profile_counts_only_its_own_engines_steps(tmp_path):
    """``--profile``: each engine's profiler runs only while that engine steps, so the
    other engines' turns are not in its profile; both files are written."""
    import cProfile
    import pstats

    log: list[str] = []
    fast, slow = entry("fast", 3, 0.002, log), entry("slow", 6, 0.004, log)
    for e in (fast, slow):
        e.clock.profile = cProfile.Profile()
    step_round([fast, slow], ["p0", "p1"], sp=None)
    steps = {}
    for e in (fast, slow):
        bench.write_profile(e.clock.profile, tmp_path, e.label)
        st = pstats.Stats(str(tmp_path / f"{e.label}.pstats")).stats  # type: ignore[attr-defined]
        calls = [v[1] for (path, _, fn), v in st.items() if fn == "step" and path == __file__]
        steps[e.label] = sum(calls)
        assert (tmp_path / f"{e.label}.txt").read_text().strip()
    assert steps == {"fast": log.count("fast"), "slow": log.count("slow")}
    # a later engine group's baseline of the same label gets its own files
    bench.write_profile(fast.clock.profile, tmp_path, "fast")
    assert (tmp_path / "fast-2.pstats").exists() and (tmp_path / "fast-2.txt").exists()
