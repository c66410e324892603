"""The error a refused configuration raises (its message is the one line a user reads)."""

from __future__ import annotations


class SelfSpecConfigError(ValueError):
    """A speculative config the plugin cannot run; the message says what to do."""
