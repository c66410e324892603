"""The docs document exactly the keys the plugin accepts, with their defaults
(docs/keys.md), and what the README points at exists."""

import json
import re
from pathlib import Path

import pytest

from vllm_selfspec import methods

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
KEYS = ROOT / "docs" / "keys.md"


def _table(title: str) -> dict[str, str]:
    text = KEYS.read_text()
    section = text.split(f"## `{title}` keys", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_0-9]+)` \| (.+?) \|", section, flags=re.M)
    return {k: v.strip() for k, v in rows}


@pytest.mark.parametrize("method", list(methods.METHODS.values()), ids=lambda m: m.name)
def test_keys_documented_with_defaults(method):
    rows = _table(method.name)
    for key in method.keys:
        assert key.name in rows, f"{key.name} missing from docs/keys.md"
        doc = rows[key.name]
        if key.default is None:
            assert doc == "none"
        else:
            assert doc.strip("`") == json.dumps(key.default), (key.name, doc)
    plugin_keys = {k.name for k in method.keys}
    extra = set(rows) - plugin_keys - set(methods.CORE_KEYS)
    assert not extra, f"docs/keys.md documents keys the plugin does not accept: {extra}"
    if method.default_k is None:  # fixed at start-up (chimera: the checkpoint's heads)
        assert not rows["num_speculative_tokens"].strip("`").isdigit()
    else:
        assert rows["num_speculative_tokens"].strip("`") == str(method.default_k)


@pytest.mark.parametrize("doc", [README, *sorted((ROOT / "docs").glob("*.md"))],
                         ids=lambda p: p.name)
def test_links_and_tools_named_in_the_docs_exist(doc):
    """Every relative link and every ``tools/NAME.py`` a page names is in the tree."""
    text = doc.read_text()
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"
    for tool in set(re.findall(r"\btools/([a-z_0-9]+\.py)\b", text)):
        assert (ROOT / "tools" / tool).exists(), f"{doc.name} names missing tools/{tool}"


def test_every_method_is_introduced_in_the_readme():
    text = README.read_text()
    for name in methods.METHODS:
        assert f"**`{name}`**" in text, f"the README does not introduce {name}"


# the project's own issues and work sessions ("issue" or "stop" and a number); vLLM's are
# cited with their "#" ("vLLM issue #" and a number) and stay
SESSION_REFS = re.compile(r"\b(?:[Ii]ssues?|[Ss]tops?) \d+\b")


def _project_texts() -> list[Path]:
    skip = {".venv", ".git", "results", "build", "__pycache__"}
    out = []
    for p in ROOT.rglob("*"):
        if p.suffix in {".py", ".md", ".toml", ".cfg", ".sh"} or p.name == "Makefile":
            if not skip.intersection(p.relative_to(ROOT).parts) and p.is_file():
                out.append(p)
    return out


def test_no_issue_or_session_numbers():
    """Code and docs name the change, not the issue or work session that made it."""
    texts = _project_texts()
    assert ROOT / "README.md" in texts and ROOT / "vllm_selfspec" / "proposers" / "cost_gate.py" in texts
    hits = [f"{p.relative_to(ROOT)}:{i}: {m.group(0)}" for p in texts
            for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
            for m in SESSION_REFS.finditer(line)]
    assert not hits, "\n".join(hits)
