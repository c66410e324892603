"""vllm_selfspec/offline/engines.py: a tool stopped by SIGTERM/SIGHUP/Ctrl-C shuts its engines down
first (leftover engine processes held ~5 GB each), then ends as the signal would."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vllm_selfspec.offline import engines

SCRIPT = textwrap.dedent("""
    import sys, time
    from vllm_selfspec.offline import engines

    class Core:
        def __init__(self, name): self.name = name
        def shutdown(self):
            with open(sys.argv[1], "a") as f: f.write(self.name + "\\n")

    class FakeLLM:
        def __init__(self, name):
            self.llm_engine = type("E", (), {"engine_core": Core(name)})()

    a, b, c = (engines.track(FakeLLM(n)) for n in "abc")
    engines.shutdown(b)  # shut down normally: not again on the signal
    print("ready", flush=True)
    time.sleep(60)
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_shuts_engines_down_then_ends_as_the_signal(tmp_path: Path, sig: int) -> None:
    log = tmp_path / "shutdowns.txt"
    p = subprocess.Popen([sys.executable, "-c", SCRIPT, str(log)], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    p.send_signal(sig)
    assert p.wait(timeout=30) == -sig
    assert log.read_text().split() == ["b", "c", "a"]  # b at its own shutdown; then newest first


def test_shutdown_never_raises() -> None:
    class Broken:
        @property
        def llm_engine(self) -> None:
            raise RuntimeError("half started")

    engines.shutdown(Broken())
    engines.shutdown(None)
