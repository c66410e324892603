"""tests/run.py (`make test`): which core each of its pytest runs gets."""

from tests import run

ROOT = run.ROOT


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
    assert {Path(d).name for d in run.ENGINE_DIRS + run.UNIT_DIRS + run.SERVING_DIRS} == dirs


def _pytest_options() -> dict:
    """pyproject's [tool.pytest.ini_options]."""
    from pathlib import Path

    import tomllib

    root = Path(run.__file__).resolve().parents[1]
    return tomllib.loads((root / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]


def test_every_test_that_starts_ray_runs_last():
    """A unit test that starts a local Ray cluster carries the marker tests/run.py runs last,
    and that marker is registered (an unregistered one would only warn)."""
    import ast

    assert any(m.startswith(f"{run.LAST}:") for m in _pytest_options()["markers"])
    needle = "ray" + ".init("  # split, so that this test does not find itself
    starting = []
    for path in (ROOT / "tests" / "unit").glob("test_*.py"):
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, ast.FunctionDef) and needle in ast.unparse(fn):
                marked = any(ast.unparse(d) == f"pytest.mark.{run.LAST}" for d in fn.decorator_list)
                starting.append((fn.name, marked))
    assert len(starting) >= 2 and all(marked for _, marked in starting), starting


def test_no_unit_test_carries_a_marker_addopts_leaves_out():
    """The unit run's own ``-m`` replaces the one in pyproject's addopts, so a unit test
    marked with one of the markers addopts leaves out would run in ``make test``."""
    addopts = _pytest_options()["addopts"]
    left_out = [w for w in addopts.replace('"', " ").split() if w not in ("-m", "not", "and")]
    assert left_out  # addopts still leaves something out, else this test checks nothing
    for path in (ROOT / "tests" / "unit").glob("test_*.py"):
        text = path.read_text()
        assert not any(f"mark.{m}" in text for m in left_out), (path.name, left_out)
