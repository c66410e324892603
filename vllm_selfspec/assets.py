"""Model aliases: short names for real models that install from PyPI.

``resolve_model("smollm2-135m")`` returns the folder of the embedded model (and
``"qwen2.5-coder-0.5b"`` that of the second architecture), converted from its GGUF
file on first use (``vllm_selfspec.builders.models``). Anything that is
not an alias (a local folder, a hub name) passes through as is.
"""

from __future__ import annotations

ALIASES = {"smollm2": "smollm2-135m", "smollm2-135m-instruct": "smollm2-135m",
           "qwen2.5-coder-0.5b-instruct": "qwen2.5-coder-0.5b"}


def _key(name: str) -> str | None:
    from vllm_selfspec.builders.models import MODELS

    key = ALIASES.get(name.lower(), name.lower())
    return key if key in MODELS else None


def is_alias(name: str) -> bool:
    return _key(name) is not None


def resolve_model(name: str) -> str:
    """Return a path or hub name vLLM can load; converts an alias on first use."""
    key = _key(name)
    if key is None:
        return name
    from vllm_selfspec.builders.models import MODELS, prepare

    return str(prepare(MODELS[key]))
