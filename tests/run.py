"""`make test`: the engine tests and the unit tests side by side, one core each.

Every engine test binds its vLLM worker to one core (vLLM's CPU worker keeps the others for
its scheduler, which in the test process is mostly idle), so on a two-core machine the unit
tests, which start no engine of their own in this process, run on the other core at the same
time, at the lowest priority so that whatever of the engine run lands on that core goes first:
the suite takes little longer than the engine tests alone (docs/layout.md). The engine tests keep one
process and their order: spread over pytest-xdist workers, every engine test took twice as
long on two busy cores and one module's shared engine broke.

When the unit tests are done, the serving tests (tests/serving: `vllm serve` processes under
load) run on that core at normal priority while the engine tests go on: their servers are
processes of their own, and the engine run no longer waits for them.

The unit tests that start a local Ray cluster (marker ``ray``) run last, alone, with every
core free: Ray gives its node 30 s to register (not configurable in Ray 2.60), which a
low-priority run beside the engine tests did not always get.

With fewer than two cores (or ``--serial``) it runs one ``pytest tests``. Extra
arguments go to every pytest run. The unit run's output goes to ``out/unit-tests.log`` and is
printed after the engine run's; the exit status is non-zero when any run failed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from pytest import ExitCode

ROOT = Path(__file__).resolve().parents[1]
ENGINE_DIRS = ["tests/engine"]
UNIT_DIRS = ["tests/unit"]
SERVING_DIRS = ["tests/serving"]  # after the unit tests, on their core
# the marker of the tests run after the other two, alone; its ``-m`` replaces the one in
# pyproject's addopts, whose markers no unit test carries
LAST = "ray"
BIND = ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU")


def pytest(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", *args]


def split_env(cores: list[int]) -> tuple[dict[str, str], dict[str, str], int]:
    """(the engine run's environment, the unit run's, the unit run's core): the engine
    workers on the first core, the unit run on the last. A binding the user set is kept for
    the engine run."""
    engine, unit = dict(os.environ), dict(os.environ)
    if not any(k in os.environ for k in BIND):
        engine["VLLM_CPU_OMP_THREADS_BIND"] = str(cores[0])
    # anything in the unit run that starts a vLLM worker (the corpus tool's tests) stays on
    # its core instead of vLLM's auto-binding, which wants a core for its scheduler
    unit["VLLM_CPU_OMP_THREADS_BIND"] = str(cores[-1])
    unit["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    return engine, unit, cores[-1]


def _pin_low(core: int) -> None:
    """The unit run on ``core`` at the lowest priority: a thread of the engine run that
    lands on that core (its test process, a ``vllm serve`` child) takes it first."""
    os.sched_setaffinity(0, {core})
    os.nice(19)


def _pin(core: int) -> None:
    """The serving run on ``core`` at normal priority: its servers start and answer there."""
    os.sched_setaffinity(0, {core})


def _second_lane(args: list[str], env: dict[str, str], core: int, unit_log: Path,
                 serving_log: Path, rcs: dict[str, int]) -> None:
    """The unit tests (lowest priority), then the serving tests (normal), on ``core``."""
    with unit_log.open("w") as f:
        rcs["unit"] = subprocess.call(pytest([*args, "-m", f"not {LAST}", *UNIT_DIRS]),
                                      cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                                      preexec_fn=lambda: _pin_low(core))
    with serving_log.open("w") as f:
        rc = subprocess.call(pytest([*args, *SERVING_DIRS]), cwd=ROOT, env=env, stdout=f,
                             stderr=subprocess.STDOUT, preexec_fn=lambda: _pin(core))
    rcs["serving"] = 0 if rc == ExitCode.NO_TESTS_COLLECTED else rc


def main(argv: list[str]) -> int:
    serial = "--serial" in argv
    args = [a for a in argv if a != "--serial"]
    cores = sorted(os.sched_getaffinity(0))
    if serial or len(cores) < 2:
        return subprocess.call(pytest([*args, "tests"]), cwd=ROOT)
    engine_env, unit_env, unit_core = split_env(cores)
    log, serving_log = ROOT / "out" / "unit-tests.log", ROOT / "out" / "serving-tests.log"
    log.parent.mkdir(exist_ok=True)
    t0 = time.time()
    rcs: dict[str, int] = {}
    lane = threading.Thread(target=_second_lane,
                            args=(args, unit_env, unit_core, log, serving_log, rcs))
    lane.start()
    engine_rc = subprocess.call(pytest([*args, *ENGINE_DIRS]), cwd=ROOT, env=engine_env)
    lane.join()
    unit_rc, serving_rc = rcs.get("unit", 1), rcs.get("serving", 1)
    print(f"\n==== unit tests (core {unit_core}, {log.relative_to(ROOT)}) ====")
    print(log.read_text(), end="")
    print(f"\n==== serving tests (core {unit_core}, {serving_log.relative_to(ROOT)}) ====")
    print(serving_log.read_text(), end="")
    print(f"\n==== unit tests marked {LAST!r}, every core free ====", flush=True)
    last_rc = subprocess.call(pytest([*args, "-m", LAST, *UNIT_DIRS]), cwd=ROOT)
    last_rc = 0 if last_rc == ExitCode.NO_TESTS_COLLECTED else last_rc
    print(f"==== engine tests exit {engine_rc}, unit tests exit {unit_rc}, serving tests exit "
          f"{serving_rc}, {LAST!r} tests exit {last_rc}, {time.time() - t0:.0f} s in all ====")
    return engine_rc or unit_rc or serving_rc or last_rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
