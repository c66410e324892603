"""tests/run.py (`make test`): which core each of the two pytest runs gets."""

from tests import run


def test_engine_run_on_the_first_core_unit_run_on_the_last(monkeypatch):
    for k in run.BIND:
        monkeypatch.delenv(k, raising=False)
    engine, unit, core = run.split_env([0, 1])
    assert engine["VLLM_CPU_OMP_THREADS_BIND"] == "0" and "VLLM_CPU_NUM_OF_RESERVED_CPU" not in engine
    assert core == 1 and unit["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert unit["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"


def test_a_binding_the_user_set_is_kept_for_the_engine_run(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "2-3")
    engine, unit, core = run.split_env([2, 3, 4])
    assert engine["VLLM_CPU_OMP_THREADS_BIND"] == "2-3"
    assert core == 4 and unit["VLLM_CPU_OMP_THREADS_BIND"] == "4"


def test_engine_and_unit_directories_cover_the_suite():
    from pathlib import Path

    tests = Path(run.__file__).parent
    dirs = {p.name for p in tests.iterdir() if p.is_dir() and any(p.glob("test_*.py"))}
    assert {Path(d).name for d in run.ENGINE_DIRS + run.UNIT_DIRS} == dirs
