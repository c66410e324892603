"""One home for the offline tools' child processes: a command in its own session (process
group), so that stopping it stops everything it started (vLLM's engine core and workers)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import IO


def start(cmd: Sequence[str], log: IO[bytes] | IO[str], env: Mapping[str, str]) -> subprocess.Popen:
    """Start ``cmd`` in a new session, stdout and stderr to ``log``."""
    return subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=dict(env),
                            start_new_session=True)


def stop(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """Stop the process group: SIGTERM, then SIGKILL after ``grace`` seconds (``grace`` 0:
    SIGKILL at once); waits for the leader."""
    steps = ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)) if grace > 0 else \
        ((signal.SIGKILL, 10.0),)
    for sig, wait in steps:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.wait()
