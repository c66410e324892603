"""vllm_selfspec: self-speculative decoding methods for vLLM, as a plugin.

Importing this package does not import vLLM. ``vllm_selfspec.LLM`` is vLLM's
``LLM`` that also accepts the older ``speculative_model="[selfspec]"`` spelling
and the embedded model aliases (``"smollm2-135m"``).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["LLM", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from vllm_selfspec.llm import LLM

        return LLM
    raise AttributeError(name)
