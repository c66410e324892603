"""Coding requests for the target's own answers (``offline.corpus``): the documented public
functions of the running Python's standard library, each asked for as a chat user asks for
code (MT-bench's coding category, in this project's own words) or shown and asked about
(explain, review, test it).

A row is one function: its module, name, signature, the first paragraph of its docstring
and its source. Rows come from the library's own files (``ast``, nothing imported), in a
fixed order, so a Python version gives the same rows on every machine; the corpus stamp
names the version. Test folders, the IDLE and 2to3 packages, the interpreter's build folder
and private modules are skipped.
"""

from __future__ import annotations

import ast
import re
import sys
import sysconfig
import textwrap
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

Row = dict[str, Any]

SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages",
             "__pycache__", "turtledemo", "ensurepip"}
MIN_SUMMARY_WORDS = 5
MAX_SUMMARY_CHARS = 400
MAX_SOURCE_CHARS = 1200  # a shown function stays well inside the corpus's 512-token prompts


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def source_name() -> str:
    """How a corpus stamp names these rows."""
    v = sys.version_info
    return f"Python {v.major}.{v.minor}'s standard library"


def _summary(doc: str) -> str:
    first = re.split(r"\n\s*\n", doc.strip(), maxsplit=1)[0]
    return " ".join(first.split())


def _signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    args = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args) if a.arg not in ("self", "cls")]
    if fn.args.vararg:
        args.append("*" + fn.args.vararg.arg)
    args += [a.arg for a in fn.args.kwonlyargs]
    if fn.args.kwarg:
        args.append("**" + fn.args.kwarg.arg)
    return f"{fn.name}({', '.join(args)})"


def _functions(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Top-level functions and the methods of top-level classes, public only."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            yield from (n for n in node.body
                        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))


@lru_cache(maxsize=1)
def stdlib_functions() -> tuple[Row, ...]:
    """One row per documented public function whose docstring opens with a sentence (read
    once per process: parsing the library takes seconds)."""
    return tuple(iter_functions(stdlib_root()))


def iter_functions(root: Path) -> Iterator[Row]:
    """The rows of the ``.py`` files under ``root``, files in sorted order."""
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        folders = rel.parts[:-1]
        if (SKIP_DIRS & set(folders) or any(f.startswith("config-") for f in folders)
                or rel.name.startswith("_")):
            continue
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        module = ".".join(rel.with_suffix("").parts)
        lines = text.splitlines()
        for fn in _functions(tree):
            doc = ast.get_docstring(fn)
            if fn.name.startswith("_") or not doc or ">>>" in doc:
                continue
            summary = _summary(doc)
            if len(summary.split()) < MIN_SUMMARY_WORDS or len(summary) > MAX_SUMMARY_CHARS:
                continue
            yield {"module": module, "name": fn.name, "signature": _signature(fn),
                   "summary": summary,
                   "source": textwrap.dedent("\n".join(lines[fn.lineno - 1:fn.end_lineno]))}
