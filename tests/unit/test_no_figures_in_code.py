"""Measured figures live in docs, not in docstrings or comments: a speedup ("1.5x") or a
time ("12 ms") in the plugin's or the tools' code goes stale the day the machine or the
code changes, and nothing checks it there."""

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIGURE = re.compile(r"\b\d+(?:\.\d+)?x\b|\b\d+(?:\.\d+)? ?ms\b")


def prose(src: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring in ``src``."""
    out = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(src).readline)
           if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append((getattr(node, "lineno", 1), doc))
    return out


def test_prose_finds_comments_and_docstrings():
    src = '"""Module 1.5x."""\n\ndef f():\n    """Takes 12 ms."""\n    return "3x"  # 2.0x here\n'
    hits = [m.group(0) for _, t in prose(src) for m in FIGURE.finditer(t)]
    assert sorted(hits) == ["1.5x", "12 ms", "2.0x"]  # the string literal "3x" is code


def test_no_measured_figures_in_docstrings_or_comments():
    files = sorted([*(ROOT / "vllm_selfspec").rglob("*.py"), *(ROOT / "tools").glob("*.py")])
    assert ROOT / "vllm_selfspec" / "proposers" / "cost_gate.py" in files
    hits = [f"{p.relative_to(ROOT)}:{line}: {m.group(0)}" for p in files
            for line, text in prose(p.read_text()) for m in FIGURE.finditer(text)]
    assert not hits, "measured figures belong in docs/results.md: " + "; ".join(hits)
