"""No benchmark text in a datastore or training corpus (vllm_selfspec/builders/benchmark_filter.py)."""

from vllm_selfspec.builders import sharegpt
from vllm_selfspec.builders.benchmark_filter import BenchmarkFilter, benchmark_filter
from vllm_selfspec.builders.datasets import load_items

PROMPT = ("Compose an engaging travel blog post about a recent trip to Hawaii, highlighting "
          "cultural experiences and must-see attractions.")


def test_a_shared_run_of_13_words_is_caught_anywhere_in_a_document():
    f = BenchmarkFilter([PROMPT])
    inside = "Sure! Here is my take. " + PROMPT.upper() + " Thanks for reading."
    assert f.contaminated(inside)  # case and surrounding text do not hide it
    assert not f.contaminated("A travel blog post about Hawaii with cultural experiences.")
    twelve = " ".join(PROMPT.split()[:12])  # one word short of a shared run
    assert not f.contaminated(twelve + " and then something else entirely different here")
    assert f.contaminated(" ".join(PROMPT.split()[1:14]) + " at the end")


def test_code_matches_through_its_identifiers():
    solution = ("    for idx, elem in enumerate(numbers):\n        for idx2, elem2 in "
                "enumerate(numbers):\n            if idx != idx2:\n                distance = "
                "abs(elem - elem2)\n")
    f = BenchmarkFilter([solution])
    assert f.contaminated("Here is code:\n```python\n" + solution.replace("    ", "\t") + "```")
    assert not f.contaminated("def add(a, b):\n    return a + b\n")


def test_every_benchmark_prompt_the_bench_uses_is_caught():
    """The filter is built from the real prompt sets: each test prompt of MT-bench and
    HumanEval, pasted into a document, marks it (a filter missing a set would not)."""
    f = benchmark_filter()
    for name in ("mtbench", "humaneval"):
        items = load_items(name, "test")
        assert items
        for _, text in items:
            assert f.contaminated("As asked: " + text + " -- end"), (name, text[:80])


def test_sharegpt_corpus_leaves_contaminated_conversations_out(monkeypatch):
    convs = [
        {"id": "clean", "conversations": [
            {"from": "human", "value": "What is the capital of France, please?"},
            {"from": "gpt", "value": "Paris is the capital of France."}]},
        {"id": "prompt-copied", "conversations": [
            {"from": "human", "value": PROMPT}, {"from": "gpt", "value": "Aloha! ..."}]},
        {"id": "answer-copied", "conversations": [
            {"from": "human", "value": "Write me something about islands."},
            {"from": "gpt", "value": "Here goes: " + PROMPT}]},
    ]
    monkeypatch.setattr(sharegpt, "sharegpt_conversations", lambda: convs)
    kept = [c.id for c in sharegpt.sharegpt_prompts()]
    assert kept == ["clean"]
    assert [c.id for c in sharegpt.sharegpt_prompts(decontaminate=False)] == \
        ["clean", "prompt-copied", "answer-copied"]


def test_the_first_conversations_are_read_without_the_rest(monkeypatch):
    """A caller that needs the first few (the activation scales, a datastore cut at its
    size) stops reading there; what the filter left out before it is counted."""
    from itertools import islice

    read = []

    def conversations():
        for i, (q, a) in enumerate([("Tell me about islands, please.", PROMPT),
                                    ("What is the capital of France?", "Paris."),
                                    ("And the capital of Spain?", "Madrid.")]):
            read.append(i)
            yield {"id": f"c{i}", "conversations": [{"from": "human", "value": q},
                                                   {"from": "gpt", "value": a}]}

    monkeypatch.setattr(sharegpt, "sharegpt_conversations", conversations)
    dropped: list[str] = []
    first = list(islice(sharegpt.iter_sharegpt_prompts(dropped=dropped), 1))
    assert [c.id for c in first] == ["c1"] and dropped == ["c0"] and read == [0, 1]
