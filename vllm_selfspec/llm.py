"""``vllm_selfspec.LLM``: vLLM's ``LLM`` plus the older keyword spelling.

vLLM up to 0.6 took ``LLM(model, speculative_model="[ngram]",
num_speculative_tokens=5, ngram_prompt_lookup_max=4)``; vLLM 0.32 removed those
keywords in favour of ``speculative_config={...}``. Users were promised
``LLM(model, speculative_model="[selfspec]")``, so this thin subclass maps the
old keywords onto ``speculative_config`` and otherwise is vLLM's ``LLM``. It also
resolves the embedded model aliases (``"smollm2-135m"``).
"""

from __future__ import annotations

import re
from typing import Any

from vllm import LLM as _VllmLLM

from vllm_selfspec.assets import resolve_model
from vllm_selfspec.methods import SelfSpecConfigError

LEGACY_KEYS = {
    "num_speculative_tokens": "num_speculative_tokens",
    "ngram_prompt_lookup_max": "prompt_lookup_max",
    "ngram_prompt_lookup_min": "prompt_lookup_min",
}


def translate_legacy_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Move ``speculative_model="[name]"`` & co. into ``speculative_config``."""
    if "speculative_model" not in kwargs:
        stray = [k for k in LEGACY_KEYS if k in kwargs]
        if stray:
            raise SelfSpecConfigError(f"vllm_selfspec: {stray[0]} needs speculative_model "
                                      "(or use speculative_config={...})")
        return kwargs
    kwargs = dict(kwargs)
    model = kwargs.pop("speculative_model")
    spec = dict(kwargs.pop("speculative_config", None) or {})
    if "method" in spec or "model" in spec:
        raise SelfSpecConfigError("vllm_selfspec: give the method either as speculative_model or "
                                  "in speculative_config, not both")
    m = re.fullmatch(r"\[\s*([A-Za-z0-9_\-]+)\s*\]", str(model).strip())
    if m:
        spec["method"] = m.group(1)
    else:
        spec["model"] = model  # a draft model path, as in old vLLM
    for old, new in LEGACY_KEYS.items():
        if old in kwargs:
            spec[new] = kwargs.pop(old)
    kwargs["speculative_config"] = spec
    return kwargs


class LLM(_VllmLLM):
    """vLLM's LLM; accepts ``speculative_model="[selfspec]"`` and model aliases."""

    def __init__(self, model: str, *args: Any, **kwargs: Any) -> None:
        kwargs = translate_legacy_kwargs(kwargs)
        super().__init__(resolve_model(model), *args, **kwargs)
