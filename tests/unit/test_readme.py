"""The README documents exactly the keys the plugin accepts, with their defaults."""

import json
import re
from pathlib import Path

import pytest

from vllm_selfspec import methods

README = Path(__file__).resolve().parents[2] / "README.md"


def _table(title: str) -> dict[str, str]:
    text = README.read_text()
    section = text.split(f"### `{title}` keys", 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| `([a-z_0-9]+)` \| (.+?) \|", section, flags=re.M)
    return {k: v.strip() for k, v in rows}


@pytest.mark.parametrize("method", list(methods.METHODS.values()), ids=lambda m: m.name)
def test_keys_documented_with_defaults(method):
    rows = _table(method.name)
    for key in method.keys:
        assert key.name in rows, f"{key.name} missing from the README"
        doc = rows[key.name]
        if key.default is None:
            assert doc == "none"
        else:
            assert doc.strip("`") == json.dumps(key.default), (key.name, doc)
    plugin_keys = {k.name for k in method.keys}
    extra = set(rows) - plugin_keys - set(methods.CORE_KEYS)
    assert not extra, f"README documents keys the plugin does not accept: {extra}"
    if method.default_k is None:  # fixed at start-up (chimera: the checkpoint's heads)
        assert not rows["num_speculative_tokens"].strip("`").isdigit()
    else:
        assert rows["num_speculative_tokens"].strip("`") == str(method.default_k)


def test_readme_stays_short_with_the_full_results_in_docs():
    assert README.stat().st_size < 25_000
    assert (README.parent / "docs" / "results.md").exists()
