"""The plugin's logger: a child of vLLM's "vllm" logger, so it inherits vLLM's
handlers, format and level (VLLM_LOGGING_LEVEL)."""

from __future__ import annotations

import logging

logger = logging.getLogger("vllm.vllm_selfspec")

_once: set[str] = set()


def log_once(level: int, key: str, msg: str, *args: object, exc_info: bool = False) -> bool:
    """Log ``msg`` the first time ``key`` is seen in this process; True if it logged."""
    if key in _once:
        return False
    _once.add(key)
    logger.log(level, msg, *args, exc_info=exc_info)
    return True
