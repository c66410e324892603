"""Low-bit draft weights (key draft_weights): quantized copies, their kernels and the
per-shape kernel table (vllm_selfspec/proposers/low_bit.py)."""

import pytest
import torch
import torch.nn.functional as F

from vllm_selfspec import methods
from vllm_selfspec.proposers.low_bit import (
    DRAFT_WEIGHTS,
    PRECISE_MARGIN,
    KernelTable,
    allowed_formats,
    allowed_kernels,
    choose_forms,
    kernels_available,
    low_bit_forms,
    measure_shape,
    quantize,
    quantize_int8,
    shape_key,
    smoothing_factors,
)

CPU = torch.device("cpu")


def _weight(n=96, k=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * 0.05


def _rel_err(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_int8_is_symmetric_per_row():
    w = _weight()
    lin = quantize_int8(w)
    assert lin.packed.dtype == torch.int8 and lin.packed.shape == w.shape
    assert int(lin.packed.abs().max()) == 127  # each row's largest weight maps to ±127
    back = lin.packed.float() * lin.scales.float()[:, None]
    assert _rel_err(back, w) < 0.01
    assert lin.nbytes == w.numel() + 2 * w.shape[0]  # a quarter of float32, plus bf16 scales


def _vllm_cpu_ops() -> bool:
    """vLLM's CPU kernels (w8a8) register with ``vllm._custom_ops``; a GPU build has none."""
    try:
        import vllm._custom_ops  # noqa: F401
    except ImportError:
        return False
    return kernels_available("w8a8", CPU)


@pytest.mark.parametrize("fmt,bound", [("int8", 0.02), ("w8a8", 0.03), ("w8a8-fbgemm", 0.03),
                                       ("int4", 0.15)])
def test_low_bit_linear_computes_the_layer(fmt, bound):
    if fmt == "w8a8" and not _vllm_cpu_ops():
        pytest.skip("w8a8 runs vLLM's CPU kernel: not in this vLLM build")
    if not kernels_available(fmt, CPU):
        pytest.skip(f"no {fmt} kernel in this torch build")
    w, x, b = _weight(), torch.randn(3, 64), torch.randn(96)
    lin = quantize(w, fmt)
    y = lin(x, b)
    assert y.dtype == x.dtype and y.shape == (3, 96)
    ref = F.linear(x, w, b)
    assert _rel_err(y, ref) < bound
    # a wrong weight is far off: the check can fail
    assert _rel_err(quantize(_weight(seed=1), fmt)(x, b), ref) > 0.3


def test_low_bit_linear_keeps_leading_dims_and_dtype():
    lin = quantize_int8(_weight())
    x = torch.randn(2, 5, 64, dtype=torch.bfloat16)
    assert lin(x).shape == (2, 5, 96) and lin(x).dtype == torch.bfloat16


def test_fbgemm_w8a8_takes_float32_activations():
    """FBGEMM's kernel runs where vLLM's W8A8 kernel is not built (AVX2): float32 in and
    out, so a float32 walk converts nothing; bfloat16 callers get bfloat16 back; a bound
    kernel with a bias adds it once."""
    if not kernels_available("w8a8-fbgemm", CPU):
        pytest.skip("no FBGEMM in this torch build")
    w, b = _weight(), torch.randn(96)
    lin = quantize(w, "w8a8-fbgemm")
    assert lin.act_dtype == torch.float32 and lin.nbytes == 96 * (64 + 8)
    x = torch.randn(4, 64)
    f = lin.bound(b, torch.float32)
    assert f(x).dtype == torch.float32 and _rel_err(f(x), F.linear(x, w, b)) < 0.03
    xb = x.to(torch.bfloat16)
    yb = lin.bound(b, torch.bfloat16)(xb)
    assert yb.dtype == torch.bfloat16 and _rel_err(yb, F.linear(x, w, b)) < 0.03


def test_int4_needs_whole_groups():
    if not kernels_available("int4", CPU):
        pytest.skip("no int4 kernel")
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize(_weight(k=48), "int4")
    assert "int4" not in low_bit_forms(_weight(k=48), ["int8", "int4"])
    assert "int8" in low_bit_forms(_weight(k=48), ["int8", "int4"])


def test_allowed_formats_cascade():
    assert allowed_formats("full") == ("full",)
    assert allowed_formats("int8") == ("full", "int8")
    assert allowed_formats("w8a8") == ("full", "int8", "w8a8")
    assert allowed_formats("int4") == DRAFT_WEIGHTS
    with pytest.raises(ValueError, match="one of"):
        allowed_formats("int2")
    # a format's kernels: both W8A8 kernels under "w8a8", none of them under "int8"
    assert allowed_kernels("int8") == ("full", "int8")
    assert allowed_kernels("w8a8") == ("full", "int8", "w8a8", "w8a8-fbgemm")


def test_kernel_table_chooses_the_fastest_measured_format(tmp_path):
    t = KernelTable("cpu | torch x | float32")
    t.times["576x1536"] = {"full": 100.0, "int8": 40.0, "w8a8": 20.0}
    t.times["1536x576"] = {"full": 30.0, "int8": 50.0}
    assert t.choose(1536, 576, ["int8", "w8a8"]) == "w8a8"
    assert t.choose(1536, 576, ["int8"]) == "int8"
    assert t.choose(576, 1536, ["int8"]) == "full"  # slower than the target's own: stays full
    assert t.choose(7, 7, ["int8"]) == "full"  # never measured: full
    # a more precise kernel must win by PRECISE_MARGIN: a few µs of a swing do not flip it
    t.times["576x960"] = {"full": 66.0, "int8": 41.5, "w8a8": 45.3, "w8a8-fbgemm": 49.8}
    assert t.choose(960, 576, ["int8", "w8a8", "w8a8-fbgemm"]) == "w8a8"
    t.times["576x960"]["int8"] = 45.3 / (1.0 + PRECISE_MARGIN) - 1.0
    assert t.choose(960, 576, ["int8", "w8a8", "w8a8-fbgemm"]) == "int8"
    # the asked format's own kernels: the fastest, with no margin between them
    t.times["576x960"] = {"full": 66.0, "w8a8": 45.3, "w8a8-fbgemm": 44.0}
    assert t.choose(960, 576, ["full", "int8", "w8a8", "w8a8-fbgemm"]) == "w8a8-fbgemm"
    t.save(tmp_path / "k.json")
    back = KernelTable.load(tmp_path / "k.json")
    assert back.times == t.times and back.machine == t.machine
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="not a kernel table"):
        KernelTable.load(tmp_path / "bad.json")


def test_measure_shape_times_every_form():
    w = _weight()
    forms = low_bit_forms(w, ["int8"])
    w2 = _weight(seed=2)
    out = measure_shape([lambda x: F.linear(x, w), lambda x: F.linear(x, w2)],
                        [forms, low_bit_forms(w2, ["int8"])], 64, torch.float32, CPU,
                        min_seconds=0.001)
    assert set(out) == {"full", "int8"} and all(v > 0 for v in out.values())
    # a format only some layers of the shape have is not timed
    out = measure_shape([lambda x: F.linear(x, w)] * 2, [forms, {}], 64, torch.float32, CPU,
                        min_seconds=0.001)
    assert set(out) == {"full"}


@pytest.mark.parametrize("method", ["selfspec", "swift", "layerskip", "chimera",
                                    "ngrammys-chimera"])
def test_key_is_validated(method):
    _, _, opts = methods.split_config({"method": method, "draft_weights": "int8"})
    assert opts["draft_weights"] == "int8"
    with pytest.raises(methods.SelfSpecConfigError, match="draft_weights"):
        methods.split_config({"method": method, "draft_weights": "int3"})


def test_key_is_refused_where_nothing_drafts_through_layers():
    with pytest.raises(methods.SelfSpecConfigError, match="unknown key 'draft_weights'"):
        methods.split_config({"method": "ngrammys", "draft_weights": "int8"})


def test_choose_forms_takes_the_cached_choice_and_times_new_shapes(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_SELFSPEC_CACHE", str(tmp_path))
    table = KernelTable.cached(CPU, torch.float32)
    table.times[shape_key(96, 64)] = {"full": 100.0, "int8": 20.0}
    table.times[shape_key(32, 64)] = {"full": 10.0, "int8": 50.0}
    table.save_cached()
    a, b, c = _weight(96, 64), _weight(32, 64, seed=1), _weight(48, 64, seed=2)
    out = choose_forms({"a": a, "b": b}, "int8", torch.float32)
    assert set(out) == {"a"} and out["a"].fmt == "int8"  # b: the table's full is faster
    assert choose_forms({"a": a}, "full", torch.float32) == {}
    choose_forms({"c": c}, "int8", torch.float32)  # a shape never timed: timed and cached
    again = KernelTable.cached(CPU, torch.float32)
    assert set(again.times[shape_key(48, 64)]) == {"full", "int8"}
    assert again.times[shape_key(96, 64)] == {"full": 100.0, "int8": 20.0}


def _outlier_input(rows=8, k=64, seed=3):
    """Activations whose first 4 channels run 20x larger than the rest (as after an RMSNorm
    with a few large gains): the case activation quantization loses most on."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g)
    x[:, :4] *= 20.0
    return x


def test_smoothing_factors_follow_smoothquant():
    w = _weight()
    a = torch.rand(64) + 0.1
    s = smoothing_factors(a, w, 0.5)
    assert s.shape == (64,)
    assert torch.allclose(s, a.sqrt() / w.abs().amax(0).sqrt())
    # a channel never seen active keeps its scale
    a[5] = 0.0
    assert smoothing_factors(a, w, 0.5)[5] == 1.0


@pytest.mark.parametrize("fmt", ["w8a8", "w8a8-fbgemm"])
def test_smoothing_moves_activation_outliers_into_the_weights(fmt):
    """SmoothQuant: with the input's absmax, the copy of a kernel that quantizes
    activations computes the layer closer to the float product; the weight-only kernel's
    copy is left as it is (its activations are not quantized)."""
    if fmt == "w8a8" and not _vllm_cpu_ops():
        pytest.skip("w8a8 runs vLLM's CPU kernel: not in this vLLM build")
    if not kernels_available(fmt, CPU):
        pytest.skip(f"no {fmt} kernel in this torch build")
    w, x = _weight(), _outlier_input()
    ref = F.linear(x, w)
    plain = low_bit_forms(w, [fmt, "int8"])
    smoothed = low_bit_forms(w, [fmt, "int8"], act_absmax=x.abs().amax(0), alpha=0.5)
    assert plain[fmt].smooth is None and smoothed[fmt].smooth is not None
    assert smoothed["int8"].smooth is None
    err_plain, err_smooth = _rel_err(plain[fmt](x), ref), _rel_err(smoothed[fmt](x), ref)
    assert err_smooth < 0.7 * err_plain, (err_plain, err_smooth)
    bound = smoothed[fmt].bound(None, torch.float32)
    assert _rel_err(bound(x), ref) == pytest.approx(err_smooth, rel=0.05)
    # absmax of another width (a row-parallel shard under tensor parallelism): not smoothed
    assert low_bit_forms(w, [fmt], act_absmax=torch.ones(32), alpha=0.5)[fmt].smooth is None


@pytest.mark.parametrize("fmt", ["int8", "w8a8"])
def test_scaled_rows_scale_only_the_rows_named(fmt):
    if fmt == "w8a8" and not _vllm_cpu_ops():
        pytest.skip("w8a8 runs vLLM's CPU kernel: not in this vLLM build")
    if not kernels_available(fmt, CPU):
        pytest.skip(f"no {fmt} kernel in this torch build")
    w, x = _weight(), torch.randn(3, 64)
    lin = quantize(w, fmt)
    factor = torch.rand(48) + 0.5
    scaled = lin.scaled_rows(48, factor)
    y, ys = lin(x), scaled(x)
    assert torch.equal(scaled.packed, lin.packed)  # the packed weight is shared
    assert _rel_err(ys[:, :48], y[:, :48]) < 1e-6
    assert _rel_err(ys[:, 48:], y[:, 48:] * factor) < 0.01
    assert _rel_err(ys[:, 48:], y[:, 48:]) > 0.1
    assert lin.scaled_rows(48, torch.ones(47)) is None  # the wrong width


def test_scaled_rows_need_row_scales():
    # skipped only where torch has no int4 kernel (no int4 copy exists to refuse then)
    if not kernels_available("int4", CPU):
        pytest.skip("no int4 kernel in this torch build")
    assert quantize(_weight(), "int4").scaled_rows(48, torch.ones(48)) is None


def _fold_case():
    """A layer's MLP (RMSNorm, gate_up, SiLU-and-mul, down), both linears W8A8 and
    smoothed from inputs with outlier channels, as ``LowBitDraft`` holds them."""
    import types

    from vllm_selfspec.draft_weights import LowBitDraft

    k, inter = 64, 64
    gu_w, down_w = _weight(2 * inter, k, seed=2), _weight(k, inter, seed=3)
    x = _outlier_input()
    norm_w = torch.rand(k) + 0.5

    def rms(h, w):
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    act_in = rms(x, norm_w)
    g, u = F.linear(act_in, gu_w).chunk(2, dim=-1)
    act_mid = F.silu(g) * u
    gu = low_bit_forms(gu_w, ["w8a8"], act_absmax=act_in.abs().amax(0), alpha=0.5)["w8a8"]
    down = low_bit_forms(down_w, ["w8a8"], act_absmax=act_mid.abs().amax(0) * 8, alpha=0.5)["w8a8"]
    mlp = types.SimpleNamespace(gate_up_proj=types.SimpleNamespace(output_size_per_partition=2 * inter),
                                down_proj=types.SimpleNamespace())
    layer = types.SimpleNamespace(self_attn=types.SimpleNamespace(qkv_proj=object()), mlp=mlp)
    fold = LowBitDraft.__new__(LowBitDraft)
    fold.forms = {id(mlp.gate_up_proj): gu, id(mlp.down_proj): down}
    L = dict(in_norm=(torch.ones(k), 1e-6), post_norm=(norm_w, 1e-6),
             gate_up=gu.bound(None, torch.float32), down=down.bound(None, torch.float32))

    def run(L):
        a, b = L["gate_up"](rms(x, L["post_norm"][0])).chunk(2, dim=-1)
        return L["down"](F.silu(a) * b)

    return fold, layer, L, run, F.linear(act_mid, down_w)


def test_smoothing_folds_into_the_norm_and_the_rows_before():
    """The draft walk folds ``gate_up``'s smoothing into the RMSNorm weight and
    ``down``'s into ``gate_up``'s up rows (adapters._fold_smoothing): the same MLP up to
    rounding, two multiplies fewer; a kernel told its input is smoothed when it is not
    computes something else, so the comparison can fail."""
    # skipped only where the kernel itself is missing (a GPU build of vLLM): the fold is
    # made only for w8a8 copies, so there is nothing to check there
    if not _vllm_cpu_ops():
        pytest.skip("w8a8 runs vLLM's CPU kernel: not in this vLLM build")
    from vllm_selfspec.adapters import _fold_smoothing

    fold, layer, L, run, ref = _fold_case()
    unfolded = run(L)
    before = L["post_norm"][0].clone()
    folded_L = dict(L)
    assert _fold_smoothing(fold, layer, torch.float32, folded_L) == 2  # no qkv copy here
    assert folded_L["post_norm"][0] is not L["post_norm"][0]
    assert torch.equal(L["post_norm"][0], before)  # the target's norm weight is not touched
    folded = run(folded_L)
    assert _rel_err(folded, unfolded) < 0.02
    assert _rel_err(folded, ref) < 0.05
    wrong = dict(folded_L, post_norm=L["post_norm"])  # a presmoothed kernel, unsmoothed input
    assert _rel_err(run(wrong), unfolded) > 0.1
