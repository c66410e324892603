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
