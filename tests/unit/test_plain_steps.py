"""P6 (vllm_selfspec.patches.patch_plain_steps): a step without drafts is prepared as plain
decoding, only for our drafter's engines and models without recurrent state. The engine
tests (selfspec, ngrammys, chimera, swift, layerskip: identical to plain decoding, greedy
and sampled) run with it applied."""

from types import SimpleNamespace

from vllm_selfspec import patches


class OurDrafter:
    def propose_with_runner(self, runner, ctx):  # the runner bridge's entry point
        return [], None


def runner(drafter, **model):
    flags = {"is_hybrid": False, "has_inner_state": False, "is_attention_free": False, **model}
    return SimpleNamespace(drafter=drafter, model_config=SimpleNamespace(**flags))


def test_applies_to_our_drafter_on_attention_models_only():
    assert patches.plain_steps_apply(runner(OurDrafter()))
    assert not patches.plain_steps_apply(runner(object()))  # vLLM's own drafters
    assert not patches.plain_steps_apply(runner(OurDrafter(), is_hybrid=True))
    assert not patches.plain_steps_apply(runner(OurDrafter(), has_inner_state=True))
    assert not patches.plain_steps_apply(runner(None))


def test_is_idempotent_and_marked_on_the_version_it_was_written_for():
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    applied = patches.patch_plain_steps()
    # P6 is written for vLLM 0.32 and a no-op elsewhere (vLLM 0.33's runner differs)
    assert applied == patches.version_supported(spec=patches.PLAIN_STEPS_VLLM)
    if not applied:
        return
    before = GPUModelRunner._prepare_inputs
    assert patches.patch_plain_steps() and GPUModelRunner._prepare_inputs is before
    assert patches._marked(before)
