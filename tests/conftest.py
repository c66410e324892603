"""Shared fixtures: the embedded model (converted once, cached) and engine helpers."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # control RPCs to local workers


@pytest.fixture(scope="session")
def model_path() -> str:
    from vllm_selfspec.assets import resolve_model

    return resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory, model_path) -> str:
    """A 4-layer random Llama with SmolLM2's tokenizer (fast offline-tool tests)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("tiny-llama")
    tok = AutoTokenizer.from_pretrained(model_path)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=2048, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return str(out)


@pytest.fixture(scope="session")
def small_vocab_model_path(tmp_path_factory, model_path) -> str:
    """A 4-layer random Llama over the first 1024 tokens of SmolLM2's tokenizer (its BPE
    trimmed to the merges that build them), for tools whose cost grows with the
    vocabulary (a bigram table forwards every token: V rows of V logits)."""
    import json
    import shutil
    from pathlib import Path

    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    vocab_size = 1024
    src, out = Path(model_path), tmp_path_factory.mktemp("small-vocab-llama")
    tj = json.loads((src / "tokenizer.json").read_text())
    bpe = tj["model"]
    keep = {t: i for t, i in bpe["vocab"].items() if i < vocab_size}

    def parts(merge: list[str] | str) -> list[str]:
        return merge if isinstance(merge, list) else merge.split(" ")

    # byte-level BPE: a merge stays when both parts and their concatenation are kept
    bpe["merges"] = [m for m in bpe["merges"]
                     if all(x in keep for x in parts(m)) and "".join(parts(m)) in keep]
    bpe["vocab"] = keep
    tj["added_tokens"] = [a for a in tj["added_tokens"] if a["id"] < vocab_size]
    (out / "tokenizer.json").write_text(json.dumps(tj))
    for f in ("tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (src / f).exists():
            shutil.copy(src / f, out / f)
    tok = AutoTokenizer.from_pretrained(str(out))
    assert len(tok) == vocab_size, len(tok)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=2048, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(str(out))
    return str(out)
