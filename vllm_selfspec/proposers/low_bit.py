"""Low-bit draft weights: the self-draft reads fewer bytes per weight.

A layer-skip draft (Draft & Verify §3.2, SWIFT, LayerSkip's early exit) gets cheap only by
skipping sub-layers, which costs acceptance on small models. Decoding one token is bound
by reading the weights, so a weight-only quantized copy of the kept linear layers makes
the same walk cheap while it still picks the target's token most of the time. The target
verifies with its own weights, so greedy output stays identical; with sampling, q is the
low-bit pass's softmax and vLLM's rejection sampler keeps the target distribution.

Formats (key ``draft_weights``):

* ``full``: the target's own linear layers (no copy);
* ``int8``: one int8 per weight, one scale per output row (symmetric), activations in
  bfloat16 through ``torch._weight_int8pack_mm`` (W8A16);
* ``w8a8``: the same int8 weights with the activations quantized to int8 inside the
  kernel. Two kernels: vLLM's CPU kernel for W8A8 checkpoints (kernel ``w8a8``: VNNI-packed
  weights, bfloat16 activations quantized per token; ``torch.ops._C.
  int8_scaled_mm_with_quant``, vllm/model_executor/kernels/linear/scaled_mm/cpu.py; vLLM
  builds it for AVX-512 only), much faster than ``_weight_int8pack_mm`` for one token
  there (docs/results.md, the kernel table); and torch's FBGEMM dynamic quantized linear (kernel ``w8a8-fbgemm``: float32
  activations quantized per call to 7-bit unsigned ints, ``torch.ops.quantized.
  linear_dynamic``, the kernel of torch's dynamic quantization; AVX2 and AVX-512), which
  also runs on AVX2-only processors, where bfloat16 activations are emulated and
  ``_weight_int8pack_mm`` saves little;
* ``int4``: 4 bits per weight in groups of ``INT4_GROUP`` input columns (asymmetric:
  scale and zero per group), activations in bfloat16 through
  ``torch._weight_int4pack_mm_for_cpu`` (CPU) / ``torch._weight_int4pack_mm`` (CUDA).

Kernels that quantize activations (``ACT_QUANT_KERNELS``) lose most on the few input
channels whose activations are far larger than the rest; with activation scales measured
for the model (key ``smoothing``, ``builders.activation_scales``) their copies are
smoothed as in SmoothQuant (Xiao et al., 2023, §4): the weight's column j is multiplied by
s_j = max|x_j|^α / max|W_j|^(1-α) before quantizing and the activations are divided by
s_j before the kernel (``LowBitLinear.smooth``), which leaves the product unchanged.

A format is the lowest precision a linear layer may take: each layer takes the fastest
kernel of that format, or of a more precise one measured ``PRECISE_MARGIN`` faster, as
measured for its shape on the machine at hand (``KernelTable``); a layer whose low-bit
kernels are all slower than the target's own linear stays full.

torch's own weight-only kernels are used, not torchao's: torchao 0.18's int8
weight-only configuration dequantizes to the activation dtype and multiplies (slower
than ``_weight_int8pack_mm`` on this project's CPU: docs/keys.md), and its int4 CPU
layout did not import beside torch 2.13.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
import torch.nn.functional as F

from vllm_selfspec.log import logger

from .artifacts import cache_dir

DRAFT_WEIGHTS = ("full", "int8", "w8a8", "int4")  # most precise first
# kernel -> the format it computes (a format may have several kernels; the table picks)
KERNELS = {"full": "full", "int8": "int8", "w8a8": "w8a8", "w8a8-fbgemm": "w8a8",
           "int4": "int4"}
INT4_GROUP = 32  # input columns per int4 scale/zero (torch's kernels take 32..256)
ACT_DTYPE = torch.bfloat16  # the activation dtype of the kernels not in FLOAT32_KERNELS
FLOAT32_KERNELS = frozenset({"w8a8-fbgemm"})  # kernels that take float32 activations
ACT_QUANT_KERNELS = frozenset({"w8a8", "w8a8-fbgemm"})  # kernels that quantize activations
# /2: kernels timed in interleaved rounds (measure_shape); tables timed one kernel after
# another (/1) are measured again
KERNEL_TABLE_FORMAT = "vllm_selfspec.kernel_table/2"
# a kernel of a more precise format than the one asked for (``full`` included) is taken
# only when its measured time is this much below the asked format's fastest kernel: alone
# it runs in cache-warm isolation, in the walk it adds casts between activation dtypes
# (a W8A16 ``down_proj`` between W8A8 layers measured 41 µs alone, 85 µs in the walk,
# docs/results.md), and two timings on a shared core move by 10-20%
PRECISE_MARGIN = 0.15
_PRECISION = {fmt: i for i, fmt in enumerate(DRAFT_WEIGHTS)}  # format -> rank, most precise 0


def allowed_formats(draft_weights: str) -> tuple[str, ...]:
    """The formats a layer may take under key ``draft_weights``: it and every more
    precise one (``"w8a8"`` -> full, int8, w8a8)."""
    if draft_weights not in DRAFT_WEIGHTS:
        raise ValueError(f"draft_weights={draft_weights!r}: one of {', '.join(DRAFT_WEIGHTS)}")
    return DRAFT_WEIGHTS[: DRAFT_WEIGHTS.index(draft_weights) + 1]


def allowed_kernels(draft_weights: str) -> tuple[str, ...]:
    """The kernels of ``allowed_formats(draft_weights)``, in ``KERNELS`` order."""
    formats = allowed_formats(draft_weights)
    return tuple(k for k, f in KERNELS.items() if f in formats)


def act_dtype(kernel: str) -> torch.dtype:
    """The activation dtype a low-bit kernel takes."""
    return torch.float32 if kernel in FLOAT32_KERNELS else ACT_DTYPE


def kernels_available(fmt: str, device: torch.device) -> bool:
    """Whether torch has the kernel ``fmt`` (a ``KERNELS`` name) on ``device``."""
    if fmt == "full":
        return True
    if fmt == "int8":
        return hasattr(torch, "_weight_int8pack_mm") and device.type in ("cpu", "cuda")
    if fmt == "w8a8":  # vLLM's CPU build registers it (torch.ops._C)
        ops = getattr(torch.ops, "_C", None)
        return device.type == "cpu" and ops is not None and \
            hasattr(ops, "int8_scaled_mm_with_quant") and hasattr(ops, "convert_weight_packed")
    if fmt == "w8a8-fbgemm":  # torch's dynamic quantization kernel (x86 CPUs)
        ops = getattr(torch.ops, "quantized", None)
        return device.type == "cpu" and ops is not None and \
            hasattr(ops, "linear_dynamic") and hasattr(ops, "linear_prepack") and \
            "fbgemm" in torch.backends.quantized.supported_engines
    if fmt == "int4":
        if device.type == "cpu":
            return hasattr(torch, "_weight_int4pack_mm_for_cpu")
        return device.type == "cuda" and hasattr(torch, "_weight_int4pack_mm")
    return False


@dataclass
class LowBitLinear:
    """A weight-only quantized copy of one linear layer's weight [N, K] (this rank's
    shard). ``__call__(x, bias)`` is ``F.linear(x, W, bias)`` up to quantization, in the
    dtype of ``x``."""

    fmt: str  # the kernel (a ``KERNELS`` name)
    out_features: int
    in_features: int
    # int8: [N, K] int8; w8a8, int4: the kernel's packed layout; w8a8-fbgemm: FBGEMM's
    # packed weight (a torch ScriptObject, not a tensor)
    packed: Any
    scales: torch.Tensor  # int8: [N] bf16; w8a8(-fbgemm): [N] fp32; int4: [K/group, N, 2] bf16
    group: int = 0
    # SmoothQuant: 1/s [K] in the kernel's activation dtype, x * smooth before the kernel
    # (the weight was quantized as W·diag(s)); None: not smoothed
    smooth: torch.Tensor | None = None

    @property
    def act_dtype(self) -> torch.dtype:
        return act_dtype(self.fmt)

    @property
    def nbytes(self) -> int:
        extra = 0 if self.smooth is None else self.smooth.numel() * self.smooth.element_size()
        if self.fmt == "w8a8-fbgemm":  # int8 weights; a scale and a column offset per row
            return self.out_features * (self.in_features + 8) + extra
        return int(self.packed.numel() * self.packed.element_size()
                   + self.scales.numel() * self.scales.element_size()) + extra

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        shape = x.shape
        a = x.reshape(-1, shape[-1]).to(self.act_dtype)
        if self.smooth is not None:
            a = a * self.smooth
        if self.fmt == "int8":
            y = torch._weight_int8pack_mm(a, self.packed, self.scales)
        elif self.fmt == "w8a8":
            y = torch.ops._C.int8_scaled_mm_with_quant(a, self.packed, self.scales, None,
                                                       ACT_DTYPE, True)
        elif self.fmt == "w8a8-fbgemm":
            y = torch.ops.quantized.linear_dynamic(a.contiguous(), self.packed, True)
        elif a.device.type == "cpu":
            y = torch._weight_int4pack_mm_for_cpu(a, self.packed, self.group, self.scales)
        else:
            y = torch._weight_int4pack_mm(a, self.packed, self.group, self.scales)
        y = y.to(x.dtype)
        if bias is not None:
            y = y + bias.to(y.dtype)
        return y.reshape(*shape[:-1], self.out_features)


    def scaled_rows(self, start: int, factor: torch.Tensor) -> LowBitLinear | None:
        """This copy with output rows ``start..`` multiplied by ``factor`` [N - start]
        (through the per-row scales, the packed weight shared), or None where the format
        has no per-row scale (int4's group scales, FBGEMM's packed object)."""
        if self.fmt not in ("int8", "w8a8") or factor.numel() != self.out_features - start:
            return None
        scales = self.scales.clone()
        scales[start:] = (scales[start:].float() * factor.float()).to(scales.dtype)
        return LowBitLinear(self.fmt, self.out_features, self.in_features, self.packed,
                            scales.contiguous(), self.group, self.smooth)

    def bound(self, bias: torch.Tensor | None, dtype: torch.dtype, presmoothed: bool = False
              ) -> Callable[[torch.Tensor], torch.Tensor]:
        """``x -> self(x, bias)`` for x [n, K] already in ``dtype``, with the bias
        converted once and no reshaping: the draft walk calls it once per layer and token
        (each wrapper step costs microseconds there). ``presmoothed``: x comes multiplied
        by ``smooth`` already (folded into the norm or the rows before it), so the kernel
        does not multiply it again."""
        b = None if bias is None else bias.detach().to(dtype)
        packed, scales, group = self.packed, self.scales, self.group
        if self.fmt == "int8":
            def kernel(a: torch.Tensor) -> torch.Tensor:
                return torch._weight_int8pack_mm(a, packed, scales)
        elif self.fmt == "w8a8":
            op = torch.ops._C.int8_scaled_mm_with_quant

            def kernel(a: torch.Tensor) -> torch.Tensor:
                return op(a, packed, scales, None, ACT_DTYPE, True)
        elif self.fmt == "w8a8-fbgemm":
            op = torch.ops.quantized.linear_dynamic

            def kernel(a: torch.Tensor) -> torch.Tensor:
                return op(a, packed, True)  # reduce_range: 7-bit activations (AVX2 VPMADDUBSW)
        else:
            op = (torch._weight_int4pack_mm_for_cpu if packed.device.type == "cpu"
                  else torch._weight_int4pack_mm)

            def kernel(a: torch.Tensor) -> torch.Tensor:
                return op(a, packed, group, scales)
        act = self.act_dtype
        smooth = self.smooth
        if smooth is not None and not presmoothed:
            unsmoothed = kernel

            def kernel(a: torch.Tensor) -> torch.Tensor:
                return unsmoothed(a * smooth)
        if dtype == act:
            if b is None:
                return kernel
            return lambda x: kernel(x) + b
        if b is None:
            return lambda x: kernel(x.to(act)).to(dtype)
        return lambda x: kernel(x.to(act)).to(dtype) + b


def quantize_int8(weight: torch.Tensor) -> LowBitLinear:
    """Symmetric int8 with one scale per output row: W ≈ q · s, |q| <= 127."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
    n, k = w.shape
    return LowBitLinear("int8", n, k, q, scale.to(ACT_DTYPE).contiguous())


def quantize_w8a8(weight: torch.Tensor) -> LowBitLinear:
    """``quantize_int8``'s weights, packed for vLLM's VNNI kernel (fp32 row scales)."""
    lin = quantize_int8(weight)
    packed = torch.ops._C.convert_weight_packed(lin.packed)
    return LowBitLinear("w8a8", lin.out_features, lin.in_features, packed,
                        lin.scales.float().contiguous())


def quantize_int4(weight: torch.Tensor, group: int = INT4_GROUP) -> LowBitLinear:
    """Asymmetric int4 per group of ``group`` input columns: W ≈ (q - 8) · s + z,
    q in [0, 15] (the convention of torch's int4 weight-only kernels)."""
    w = weight.detach().float()
    n, k = w.shape
    if k % group:
        raise ValueError(f"int4 needs the input size ({k}) to be a multiple of {group}")
    wg = w.reshape(n, k // group, group)
    lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
    scale = ((hi - lo) / 15.0).clamp(min=1e-8)
    q = torch.round((wg - lo) / scale).clamp(0, 15).to(torch.int32).reshape(n, k)
    zero = lo + 8.0 * scale
    sz = torch.stack([scale.squeeze(-1), zero.squeeze(-1)], dim=-1)  # [N, K/g, 2]
    sz = sz.transpose(0, 1).contiguous().to(ACT_DTYPE)  # [K/g, N, 2]
    if w.device.type == "cpu":
        packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    else:  # CUDA: uint8 pairs, inner k tiles of 8
        pairs = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
        packed = torch._convert_weight_to_int4pack(pairs, 8)
    return LowBitLinear("int4", n, k, packed, sz, group)


def quantize_w8a8_fbgemm(weight: torch.Tensor) -> LowBitLinear:
    """``quantize_int8``'s weights and scales, packed for FBGEMM's dynamic quantized linear
    (a per-channel qint8 tensor through ``quantized.linear_prepack`` with the ``fbgemm``
    engine; the packed weight keeps its engine, so later calls need no global setting)."""
    lin = quantize_int8(weight)
    scales = lin.scales.float().contiguous()
    zeros = torch.zeros(lin.out_features, dtype=torch.long)
    engine = torch.backends.quantized.engine
    with warnings.catch_warnings():  # quantized tensors are deprecated, their kernels are not
        warnings.simplefilter("ignore")
        qweight = torch._make_per_channel_quantized_tensor(lin.packed, scales.double(), zeros, 0)
        try:
            torch.backends.quantized.engine = "fbgemm"
            packed = torch.ops.quantized.linear_prepack(qweight, None)
        finally:
            torch.backends.quantized.engine = engine
    return LowBitLinear("w8a8-fbgemm", lin.out_features, lin.in_features, packed, scales)


QUANTIZERS: dict[str, Callable[[torch.Tensor], LowBitLinear]] = {
    "int8": quantize_int8, "w8a8": quantize_w8a8, "w8a8-fbgemm": quantize_w8a8_fbgemm,
    "int4": quantize_int4}


def quantize(weight: torch.Tensor, fmt: str) -> LowBitLinear:
    return QUANTIZERS[fmt](weight)


# ---- which format each shape takes: measured ---------------------------------------------
def machine_key(device: torch.device, dtype: torch.dtype) -> str:
    """What a kernel timing depends on besides the shape: the processor, torch and the
    target's dtype (the ``full`` kernel's)."""
    if device.type == "cuda":
        proc = torch.cuda.get_device_name(device)
    else:
        proc = _cpu_name() or platform.machine()
    return f"{proc} | torch {torch.__version__} | {str(dtype).replace('torch.', '')}"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def shape_key(out_features: int, in_features: int) -> str:
    return f"{in_features}x{out_features}"


@dataclass
class KernelTable:
    """Microseconds per call of each format's kernel, per weight shape, at ``rows`` rows,
    on one machine (``machine``). One file format, written and read here."""

    machine: str
    rows: int = 1
    times: dict[str, dict[str, float]] = field(default_factory=dict)  # shape -> fmt -> µs

    def choose(self, out_features: int, in_features: int, allowed: Iterable[str]) -> str:
        """The kernel this shape takes: the fastest measured kernel of the least precise
        format in ``allowed`` (the format asked for), unless a kernel of a more precise
        format, or the target's own linear (``full``), was measured ``PRECISE_MARGIN``
        faster; ``full`` when no kernel of ``allowed`` was measured."""
        row = self.times.get(shape_key(out_features, in_features), {})
        kernels = [f for f in allowed if f in row and f in KERNELS]
        if not kernels:
            return "full"
        asked = max(_PRECISION[KERNELS[f]] for f in kernels)
        low = min((f for f in kernels if _PRECISION[KERNELS[f]] == asked), key=row.__getitem__)
        precise = [f for f in row
                   if f == "full" or (f in kernels and _PRECISION[KERNELS[f]] < asked)]
        if precise and low != "full":
            fast = min(precise, key=row.__getitem__)
            if row[fast] * (1.0 + PRECISE_MARGIN) < row[low]:
                return fast
        return low

    def has(self, out_features: int, in_features: int, fmts: Iterable[str]) -> bool:
        row = self.times.get(shape_key(out_features, in_features), {})
        return all(f in row for f in fmts)

    def time_missing(self, out_features: int, in_features: int,
                     full: Callable[[], Sequence[Callable[[torch.Tensor], torch.Tensor]]],
                     forms: Sequence[Mapping[str, LowBitLinear]], dtype: torch.dtype,
                     device: torch.device) -> bool:
        """Time one shape (``measure_shape``: the target's own linears, which ``full()``
        makes only then, and the kernels all of ``forms`` hold) unless this table has it
        already; whether it did."""
        if self.has(out_features, in_features, ["full", *forms[0]]):
            return False
        self.times[shape_key(out_features, in_features)] = measure_shape(
            full(), forms, in_features, dtype, device)
        return True

    def to_json(self) -> dict:
        return {"format": KERNEL_TABLE_FORMAT, "machine": self.machine, "rows": self.rows,
                "times_us": self.times}

    @classmethod
    def from_json(cls, data: dict) -> KernelTable:
        if data.get("format") != KERNEL_TABLE_FORMAT:
            raise ValueError(f"not a kernel table ({KERNEL_TABLE_FORMAT})")
        return cls(str(data["machine"]), int(data.get("rows", 1)),
                   {s: {f: float(t) for f, t in row.items()}
                    for s, row in data["times_us"].items()})

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1, sort_keys=True))
        tmp.replace(path)

    @classmethod
    def load(cls, path: str | Path) -> KernelTable:
        return cls.from_json(json.loads(Path(path).read_text()))

    @classmethod
    def cached(cls, device: torch.device, dtype: torch.dtype) -> KernelTable:
        """This machine's table from the cache (``kernel_table_path``), or an empty one."""
        key = machine_key(device, dtype)
        path = kernel_table_path(key)
        try:
            return cls.load(path) if path.exists() else cls(key)
        except (ValueError, KeyError, OSError):
            return cls(key)

    def save_cached(self) -> None:
        """Write this table where ``cached`` reads it (a warning if it cannot)."""
        path = kernel_table_path(self.machine)
        try:
            self.save(path)
        except OSError as e:
            logger.warning("vllm_selfspec: could not cache the kernel table at %s (%s)", path, e)


def kernel_table_path(key: str) -> Path:
    """The cached kernel table of machine key ``key`` (``machine_key``)."""
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    return cache_dir() / "kernels" / f"{digest}.json"


def smoothing_factors(act_absmax: torch.Tensor, weight: torch.Tensor, alpha: float
                      ) -> torch.Tensor:
    """SmoothQuant's s_j = max|x_j|^α / max|W_j|^(1-α) (eq. 4) for ``weight`` [N, K] and the
    activation absmax [K] of its input, float32 [K] (channels never seen active: 1)."""
    a = act_absmax.float().to(weight.device)
    w = weight.detach().float().abs().amax(0)
    s = a.clamp(min=1e-5).pow(alpha) / w.clamp(min=1e-5).pow(1.0 - alpha)
    return torch.where((a > 0) & (w > 0), s, torch.ones_like(s))


def low_bit_forms(weight: torch.Tensor, fmts: Iterable[str],
                  act_absmax: torch.Tensor | None = None, alpha: float = 0.0
                  ) -> dict[str, LowBitLinear]:
    """Copies of ``weight`` [N, K] for each low-bit kernel of ``fmts`` (``KERNELS`` names)
    that runs on its device and suits its shape (int4 needs K in groups of ``INT4_GROUP``).
    With the absmax of the layer's input activations and ``alpha`` > 0 the copies for
    kernels that quantize activations are smoothed (``smoothing_factors``)."""
    out: dict[str, LowBitLinear] = {}
    s = None
    if act_absmax is not None and alpha > 0 and act_absmax.numel() == weight.shape[1]:
        s = smoothing_factors(act_absmax, weight, alpha)
    for fmt in fmts:
        if fmt == "full" or not kernels_available(fmt, weight.device):
            continue
        try:
            if s is not None and fmt in ACT_QUANT_KERNELS:
                lin = quantize(weight.detach().float() * s[None, :], fmt)
                lin.smooth = (1.0 / s).to(act_dtype(fmt)).contiguous()
                out[fmt] = lin
            else:
                out[fmt] = quantize(weight, fmt)
        except ValueError:
            continue
    return out


def measure_shape(full: Sequence[Callable[[torch.Tensor], torch.Tensor]],
                  forms: Sequence[Mapping[str, LowBitLinear]], in_features: int,
                  dtype: torch.dtype, device: torch.device, rows: int = 1,
                  min_seconds: float = 0.02, rounds: int = 5) -> dict[str, float]:
    """µs per call, at ``rows`` rows of ``dtype`` activations, of the target's own linear
    layers of one shape (``full``: x [rows, K] -> [rows, N]) and of each low-bit kernel
    all of ``forms`` (their copies) hold, conversions to and from its activation dtype
    included. Each is timed over every layer of the shape in
    turn, as the draft walk reads them: once per token, from memory rather than cache (one
    weight timed in a loop stays in cache and reads much faster than in the walk). The
    kernels take turns, ``rounds`` rounds in a rotating order, and each keeps its median
    round, so a swing of the machine (the other core busy) hits every kernel alike, as
    the bench's engines take turns (offline/bench.py)."""
    x = torch.randn(rows, in_features, device=device, dtype=dtype)
    runs: dict[str, list[Callable[[torch.Tensor], torch.Tensor]]] = {"full": list(full)}
    for fmt in (forms[0] if forms else {}):
        if all(fmt in f for f in forms):
            runs[fmt] = [f[fmt] for f in forms]

    def every_layer(fns: list[Callable[[torch.Tensor], torch.Tensor]]) -> Callable[[], None]:
        def call() -> None:
            for f in fns:
                f(x)
        return call

    times = time_interleaved({fmt: every_layer(fns) for fmt, fns in runs.items()},
                             min_seconds, rounds)
    return {fmt: us / len(runs[fmt]) for fmt, us in times.items()}


def time_interleaved(forms: Mapping[str, Callable[[], Any]], min_seconds: float,
                     rounds: int = 5) -> dict[str, float]:
    """µs per call of each of ``forms``: after a warm-up call, as many calls per round as
    one timed call says fill ``min_seconds``; ``rounds`` rounds in a rotating order, each
    form keeping its median round, so a swing of the machine (the other core busy) hits
    every form alike."""
    calls: dict[str, int] = {}
    for name, f in forms.items():
        f()
        t0 = time.perf_counter()
        f()
        calls[name] = max(2, int(min_seconds / max(time.perf_counter() - t0, 1e-7)))
    samples: dict[str, list[float]] = {name: [] for name in forms}
    names = list(forms)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            f = forms[name]
            t0 = time.perf_counter()
            for _ in range(calls[name]):
                f()
            samples[name].append((time.perf_counter() - t0) / calls[name])
    return {name: sorted(v)[len(v) // 2] * 1e6 for name, v in samples.items()}


def choose_forms(weights: Mapping[str, torch.Tensor], draft_weights: str,
                 dtype: torch.dtype) -> dict[str, LowBitLinear]:
    """Low-bit copies of named weights [N, K] (no bias, no smoothing) under key
    ``draft_weights``: each distinct shape is timed once per machine in ``F.linear`` and
    in every allowed kernel (``measure_shape``, the cached ``KernelTable`` the self-draft's
    layers use), and each weight keeps the copy of the kernel ``KernelTable.choose``
    picks; a weight that stays full is left out."""
    allowed = allowed_kernels(draft_weights)
    if not weights or allowed == ("full",):
        return {}
    device = next(iter(weights.values())).device
    table = KernelTable.cached(device, dtype)
    forms = {name: low_bit_forms(w, allowed) for name, w in weights.items()}
    by_shape: dict[tuple[int, int], list[str]] = {}
    for name, w in weights.items():
        by_shape.setdefault((int(w.shape[0]), int(w.shape[1])), []).append(name)
    measured = False
    for (n, k), names in by_shape.items():
        if forms[names[0]]:
            full = lambda names=names: [  # noqa: E731
                functools.partial(F.linear, weight=weights[x].detach().to(dtype)) for x in names]
            measured |= table.time_missing(n, k, full, [forms[x] for x in names], dtype,
                                           device)
    if measured:
        table.save_cached()
    out: dict[str, LowBitLinear] = {}
    for name, w in weights.items():
        fmt = table.choose(int(w.shape[0]), int(w.shape[1]),
                           [f for f in allowed if f in forms[name]])
        if fmt != "full":
            out[name] = forms[name][fmt]
    return out
