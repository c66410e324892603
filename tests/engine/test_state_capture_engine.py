"""The corpus tool's states from the engine (patch P10) on the embedded model: the states
vLLM computes while it answers are the model's final-norm last-layer states at every
position but the last (the same as a transformers forward over prompt + answer), and
the labels are the answer's own tokens."""

from __future__ import annotations

import numpy as np
import pytest
from vllm import SamplingParams

from tests.engine.helpers import make_llm, shutdown, token_ids
from vllm_selfspec import control

pytestmark = pytest.mark.engine


def test_engine_states_are_the_models_states(model_path, eval_prompts, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    prompts = eval_prompts[:3]
    # a prompt in several chunks too (long_prefill_token_threshold)
    llm = make_llm(model_path, enable_prefix_caching=False, max_num_batched_tokens=64,
                   long_prefill_token_threshold=32)
    try:
        llm.collective_rpc(control.capture_states)
        outs = llm.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0),
                            use_tqdm=False)
        recs = [(o.request_id, f"r{i}", list(p["prompt_token_ids"]), r)
                for i, (o, p, r) in enumerate(zip(outs, prompts, token_ids(outs)))]
        shard = llm.collective_rpc(control.write_states,
                                   args=(str(tmp_path / "s.npz"), recs))[0]
    finally:
        shutdown(llm)
    assert shard["ids"] == ["r0", "r1", "r2"] and not shard["missing"]
    z = np.load(tmp_path / shard["file"])
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    for i, (_, _, prompt, resp) in enumerate(recs):
        a, b = int(z["offsets"][i]), int(z["offsets"][i + 1])
        seq = prompt + resp
        assert list(z["tokens"][a:b]) == seq
        with torch.inference_mode():
            want = model.model(input_ids=torch.tensor([seq])).last_hidden_state[0].numpy()
        got = z["hidden"][a:b].astype(np.float32)
        # float16 storage; every position but the last, which is never fed to the model
        np.testing.assert_allclose(got[:-1], want[:-1], atol=0.05, rtol=0.01)
        assert not got[-1].any()
        n = len(prompt)
        assert list(z["labels"][a + n - 1: b - 1]) == resp
