"""Activation scales for smoothing the W8A8 draft weights (key smoothing,
vllm_selfspec/builders/activation_scales.py): measured per linear layer under vLLM's names."""

import pytest
import torch

from vllm_selfspec.builders.activation_scales import (
    activation_absmax,
    load_scales,
    save_scales,
    vllm_name,
)
from vllm_selfspec.proposers.artifacts import ArtifactError, ArtifactMismatchError, ModelStamp


def test_names_follow_vllms_fused_layers():
    assert vllm_name("model.layers.3.self_attn.k_proj") == "model.layers.3.self_attn.qkv_proj"
    assert vllm_name("model.layers.0.mlp.up_proj") == "model.layers.0.mlp.gate_up_proj"
    assert vllm_name("model.layers.0.mlp.down_proj") == "model.layers.0.mlp.down_proj"
    assert vllm_name("lm_head") == "lm_head"


def test_absmax_of_every_linear_input(tiny_model_path):
    """One entry per vLLM layer (q/k/v and gate/up share theirs), one value per input
    channel, the largest |x| seen: a hook that recorded nothing, or recorded the output,
    would give another shape or smaller values."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    seen = {}

    def keep(mod, args, out):
        seen.setdefault("x", []).append(args[0].detach().reshape(-1, args[0].shape[-1]))

    h = model.model.layers[1].mlp.down_proj.register_forward_hook(keep)
    stats = activation_absmax(model, [[1, 2, 3, 4, 5], [6, 7, 8]])
    h.remove()
    cfg = model.config
    assert len(stats) == 4 * cfg.num_hidden_layers + 1
    assert stats["model.layers.0.self_attn.qkv_proj"].shape == (cfg.hidden_size,)
    assert stats["model.layers.2.mlp.down_proj"].shape == (cfg.intermediate_size,)
    assert stats["lm_head"].shape == (cfg.hidden_size,)
    want = torch.cat(seen["x"]).abs().amax(0)
    assert torch.allclose(stats["model.layers.1.mlp.down_proj"], want)


def test_file_round_trip_and_stamp(tmp_path):
    stamp = ModelStamp("LlamaForCausalLM", 2, 8, 100, "abc")
    other = ModelStamp("LlamaForCausalLM", 2, 8, 100, "def")
    scales = {"lm_head": torch.rand(8), "model.layers.0.mlp.down_proj": torch.rand(16)}
    path = tmp_path / "s.safetensors"
    save_scales(path, scales, stamp, {"tokens": 10})
    back = load_scales(path, stamp)
    assert set(back) == set(scales) and torch.equal(back["lm_head"], scales["lm_head"])
    with pytest.raises(ArtifactMismatchError, match="activation scales .* another model"):
        load_scales(path, other)
    with pytest.raises(ArtifactError, match="does not exist"):
        load_scales(tmp_path / "missing.safetensors")
