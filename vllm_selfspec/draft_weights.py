"""The self-draft's low-bit weights inside vLLM (key ``draft_weights``; the formats and
kernels are ``proposers.low_bit``).

At start-up the drafter asks P8 (``patches.capture_weights``) for every linear layer's
float weight while vLLM loads the model, and quantizes it on the spot (vLLM on CPU then
packs the float weight and drops it). In ``load_model``, before vLLM sizes its KV cache
from the memory left (``cpu_worker.determine_available_memory``; on a GPU the loader's
memory profile wraps ``drafter.load_model``), each distinct weight shape is timed once
per machine in the target's own kernel and each allowed low-bit format
(``KernelTable``, cached), and every layer keeps only its fastest form; a layer whose
low-bit kernel is slower stays the target's own. The LM head (or a draft vocabulary's
rows of it) is chosen the same way.

During the draft walk, ``active()`` points each chosen layer's ``quant_method`` at its
low-bit copy (vLLM's ``LinearBase.forward`` calls ``self.quant_method.apply``,
linear.py:417/610/1778) and restores the target's after, so the target's own forward
never sees it. Attention still reads and writes the target's paged KV cache in the
target's dtype; the residual stream stays in it too, unless a chosen kernel takes
bfloat16 activations (``walk_dtype``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from vllm_selfspec.adapters import linear_bias, module_linear
from vllm_selfspec.proposers.low_bit import (
    ACT_DTYPE,
    KernelTable,
    LowBitLinear,
    allowed_kernels,
    low_bit_forms,
)


class DraftWeightsError(ValueError):
    """The model cannot draft through low-bit weights (refused at start-up)."""


@dataclass
class WeightCapture:
    """P8's hook: low-bit copies of every linear layer's weight for each wanted kernel
    (``low_bit.allowed_kernels``), made while vLLM loads the model (this rank's shard).
    With activation scales (key ``smoothing``: {vLLM layer prefix: absmax of its input},
    ``builders.activation_scales``) and ``alpha`` > 0, the copies for kernels that
    quantize activations are smoothed (SmoothQuant); a layer the scales do not name is not."""

    formats: tuple[str, ...]
    scales: dict[str, torch.Tensor] = field(default_factory=dict)
    alpha: float = 0.0
    copies: dict[int, tuple[Any, dict[str, LowBitLinear]]] = field(default_factory=dict)

    def __call__(self, layer: Any) -> None:
        w = getattr(layer, "weight", None)
        if not isinstance(w, torch.Tensor) or w.ndim != 2 or w.is_meta or w.numel() == 0:
            return
        absmax = self.scales.get(str(getattr(layer, "prefix", "")))
        self.copies[id(layer)] = (layer, low_bit_forms(w, self.formats, absmax, self.alpha))


class _LowBitMethod:
    """Stands in for a linear layer's ``quant_method`` during the draft walk."""

    def __init__(self, lin: LowBitLinear) -> None:
        self.lin = lin

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None = None
              ) -> torch.Tensor:
        return self.lin(x, bias)


class LowBitDraft:
    """The draft walk's linear layers and LM head in the formats the kernel table chose."""

    def __init__(self, adapter: Any, draft_weights: str, capture: WeightCapture,
                 vocab_size: int) -> None:
        self.draft_weights = draft_weights
        allowed = allowed_kernels(draft_weights)
        head_module = getattr(adapter.lm, "lm_head", None)
        head_weight = adapter.lm_head_weight
        self.device = head_weight.device
        self.dtype = head_weight.dtype
        self.vocab_size = vocab_size
        linears = [(m, forms) for m, forms in capture.copies.values()]
        if not linears:
            raise DraftWeightsError(
                f"draft_weights={draft_weights}: no unquantized linear layer was loaded (the "
                "model's weights are quantized already, or the drafter was set up after "
                "loading); use draft_weights \"full\"")
        table = KernelTable.cached(self.device, self.dtype)
        measured = False
        by_shape: dict[tuple[int, int], list[tuple[Any, dict[str, LowBitLinear]]]] = {}
        for m, forms in linears:
            by_shape.setdefault(_out_in(m, forms), []).append((m, forms))
        for (n, k), group in by_shape.items():
            measured |= table.time_missing(n, k, lambda g=group: [module_linear(m) for m, _ in g],
                                           [f for _, f in group], self.dtype, self.device)
        # the LM head over the full vocabulary (a draft vocabulary's rows: at first use)
        head_rows = head_weight[:vocab_size]
        hn, hk = head_rows.shape
        self.head_absmax = capture.scales.get("lm_head")
        self.alpha = capture.alpha
        head_forms = low_bit_forms(head_rows, allowed, self.head_absmax, self.alpha)
        measured |= table.time_missing(
            hn, hk, lambda: [module_linear(head_module) if head_module is not None
                             else (lambda x: x @ head_rows.t())], [head_forms], self.dtype,
            self.device)
        if measured:
            table.save_cached()
        self.table = table
        self.allowed = allowed
        self.swaps: list[tuple[Any, _LowBitMethod]] = []
        self.forms: dict[int, LowBitLinear] = {}  # id(module) -> its chosen low-bit copy
        self.counts: dict[str, int] = {}
        self.smoothed = 0  # layers whose chosen copy is smoothed (the head included)
        for m, forms in linears:
            n, k = _out_in(m, forms)
            fmt = table.choose(n, k, [f for f in allowed if f in forms])
            self.counts[fmt] = self.counts.get(fmt, 0) + 1
            if fmt != "full":
                self.swaps.append((m, _LowBitMethod(forms[fmt])))
                self.forms[id(m)] = forms[fmt]
                self.smoothed += forms[fmt].smooth is not None
        capture.copies.clear()  # the copies not chosen go
        self.native = [(m, m.quant_method) for m, _ in self.swaps]
        self.head_format = table.choose(hn, hk, head_forms)
        self.head = head_forms.get(self.head_format)
        self.smoothed += self.head is not None and self.head.smooth is not None
        self._subsets: dict[tuple[int, tuple[int, ...]], LowBitLinear | None] = {}
        self._head_processor = getattr(adapter.lm, "logits_processor", None)

    @property
    def nbytes(self) -> int:
        """Bytes of the low-bit copies kept (the draft's memory beyond the target's)."""
        return sum(s.lin.nbytes for _, s in self.swaps) + (self.head.nbytes if self.head else 0)

    def describe(self) -> str:
        layers = ", ".join(f"{n} {f}" for f, n in sorted(self.counts.items()))
        smooth = (f"; {self.smoothed} smoothed, migration strength {self.alpha:.2f}"
                  if self.smoothed else "")
        return (f"draft weights {self.draft_weights} (linear layers: {layers}; LM head "
                f"{self.head_format}; {self.nbytes / 2**20:.1f} MiB{smooth})")

    def report(self) -> dict[str, Any]:
        return {"draft_weights": self.draft_weights, "linear_formats": dict(self.counts),
                "head_format": self.head_format, "draft_weights_bytes": self.nbytes,
                "smoothed_layers": self.smoothed}

    @property
    def walk_dtype(self) -> torch.dtype:
        """The direct walk's residual dtype: bfloat16 when every low-bit layer runs a
        kernel that takes bfloat16 activations (no conversion around any of them), else
        the model's, which the kernel table timed each kernel from (conversions included):
        a walk that mixes in FBGEMM's float32 kernel, or keeps some layers full, stays in
        the model's dtype."""
        if self.swaps and all(s.lin.act_dtype == ACT_DTYPE for _, s in self.swaps) \
                and len(self.swaps) == sum(self.counts.values()):
            return ACT_DTYPE
        return self.dtype

    def linear(self, module: Any, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
        """How the direct walk (adapters.DirectWalk) runs ``module`` on x in ``dtype``: its
        low-bit copy (bias in ``dtype``, bound once), or the target's own linear."""
        lin = self.forms.get(id(module))
        if lin is None:
            return module_linear(module, dtype)
        return lin.bound(linear_bias(module), dtype)

    def smooth(self, module: Any) -> torch.Tensor | None:
        """The multiplier [K] (SmoothQuant's 1/s) ``module``'s low-bit copy applies to its
        input, or None (not smoothed, or the layer stays the target's own)."""
        lin = self.forms.get(id(module))
        return None if lin is None else lin.smooth

    def folded_linear(self, module: Any, dtype: torch.dtype,
                      rows: tuple[int, torch.Tensor] | None = None
                      ) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """``linear`` for an input the walk multiplies by ``smooth(module)`` already (folded
        into the RMSNorm weight before it, or into the rows that make it), and with
        ``rows`` = (start, factor) its output rows from ``start`` on multiplied by
        ``factor`` (the next layer's smoothing, folded into this one's row scales). None
        where it cannot: no low-bit copy, a bias, or a format without per-row scales."""
        lin = self.forms.get(id(module))
        if lin is None:
            return None
        bias = linear_bias(module)
        if rows is not None:
            if bias is not None:
                return None
            lin = lin.scaled_rows(*rows)
            if lin is None:
                return None
        return lin.bound(bias, dtype, presmoothed=True)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        # through the instance dict: nn.Module.__setattr__'s checks cost ~3 µs a swap, and
        # the walk swaps every linear layer for every draft token
        try:
            for m, method in self.swaps:
                m.__dict__["quant_method"] = method
            yield
        finally:
            for m, method in self.native:
                m.__dict__["quant_method"] = method

    def logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Logits [n, V] through the low-bit head, or None when the head stays full."""
        if self.head is None:
            return None
        return self._process(self.head(hidden).float())

    def prepare_subset(self, rows: torch.Tensor) -> None:
        """Quantize and time a draft vocabulary's head rows [N, H] (at start-up or when the
        vocabulary changes, not inside a timed draft step)."""
        key = (rows.data_ptr(), tuple(rows.shape))
        if key in self._subsets:
            return
        n, k = rows.shape
        forms = low_bit_forms(rows, self.allowed, self.head_absmax, self.alpha)
        self.table.time_missing(n, k, lambda: [lambda x: x @ rows.t()], [forms], self.dtype,
                                self.device)
        self._subsets[key] = forms.get(self.table.choose(n, k, forms))

    def subset_logits(self, hidden: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
        """Logits over a draft vocabulary's head rows [N, H] through their low-bit copy,
        or None when those rows stay full."""
        self.prepare_subset(rows)
        lin = self._subsets[(rows.data_ptr(), tuple(rows.shape))]
        return None if lin is None else self._process(lin(hidden).float())

    def _process(self, logits: torch.Tensor) -> torch.Tensor:
        """Scale and soft cap as vLLM's LogitsProcessor does (adapters.subset_logits)."""
        proc = self._head_processor
        cap = getattr(proc, "soft_cap", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        scale = getattr(proc, "scale", 1.0)
        return logits * scale if scale != 1.0 else logits


def _out_in(module: Any, forms: dict[str, LowBitLinear]) -> tuple[int, int]:
    if forms:
        lin = next(iter(forms.values()))
        return lin.out_features, lin.in_features
    return int(module.output_size_per_partition), int(module.input_size_per_partition)
