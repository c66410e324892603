"""tools/train_layerskip.py: LayerSkip §4.1's schedules follow the paper's formulas, layer
dropout passes dropped samples through unchanged, and a tiny run writes a stamped HF
folder that transformers loads, with its log, loss curve and before/after report."""

import json
import math

import pytest

from vllm_selfspec.offline import train_layerskip as ts


def test_layer_dropout_scale_rises_exponentially_from_0_to_1():
    L = 32
    d = [ts.dropout_layer_scale(ell, L) for ell in range(L)]
    assert d[0] == 0.0 and d[-1] == pytest.approx(1.0)
    assert all(a < b for a, b in zip(d, d[1:]))
    assert d[16] == pytest.approx(math.exp(16 * math.log(2) / 31) - 1)
    rates = ts.dropout_rates(5, 100, L, 0.1)  # S(t) = 1: the same at every step
    assert rates == ts.dropout_rates(90, 100, L, 0.1)
    assert rates[0] == 0.0 and rates[-1] == pytest.approx(0.1)


def test_dropout_time_curriculum():
    assert ts.dropout_time_scale(7, 50, "none") == 1.0
    assert ts.dropout_time_scale(0, 50, "exp") == 0.0
    assert ts.dropout_time_scale(49, 50, "exp") == pytest.approx(1.0)
    assert ts.dropout_time_scale(20, 50, "exp") == pytest.approx(math.exp(20 * math.log(2) / 49) - 1)
    assert ts.dropout_rates(0, 50, 8, 0.2, "exp") == [0.0] * 8


def test_exit_scales_and_their_normalisation():
    e = ts.exit_scales(4, 0.2)
    # e_scale * sum_{i<=l} i for l < L-1; L-1 + e_scale * sum_{i<=L-2} i at the last layer
    assert e == pytest.approx([0.0, 0.2, 0.6, 3 + 0.2 * 3])
    e32 = ts.exit_scales(32, 0.2)
    assert e32[7] == pytest.approx(0.2 * 28) and e32[31] == pytest.approx(31 + 0.2 * 465)
    on = [False, True, False, True]
    w = ts.exit_weights(on, e)
    assert sum(w) == pytest.approx(1.0) and w[0] == w[2] == 0.0
    assert w[1] == pytest.approx(0.2 / 3.8) and w[3] == pytest.approx(3.6 / 3.8)
    assert ts.exit_weights([True] * 4, ts.exit_scales(4, 0.0)) == [0, 0, 0, 1.0]  # LD only


def test_rotational_curriculum():
    L, R = 32, 8
    assert ts.default_rotation(32) == 8 and ts.default_rotation(30) == 8
    assert ts.default_rotation(40) == 10 and ts.default_rotation(4) == 1
    masks = [ts.rotational_curriculum(t, L, R) for t in range(3 * R)]
    assert all(m[L - 1] for m in masks)  # the model's own loss, always
    assert [i for i, on in enumerate(masks[0]) if on] == [0, 8, 16, 24, 31]
    assert [i for i, on in enumerate(masks[1]) if on] == [1, 9, 17, 25, 31]  # rotated by one
    for ell in range(L - 1):  # every early exit once every R iterations
        for t0 in range(2 * R):
            assert sum(masks[t][ell] for t in range(t0, t0 + R)) == 1
    assert all(sum(m) <= math.ceil(L / R) + 1 for m in masks)
    assert ts.curriculum("none", 3, 10, 6, 2) == [True] * 6


def test_gradual_curriculum():
    L, T = 8, 160  # one more layer every T / 2L = 10 iterations, from L-1 down to 0
    on = lambda t: [i for i, x in enumerate(ts.gradual_curriculum(t, T, L)) if x]  # noqa: E731
    assert on(0) == [7] and on(9) == [7]
    assert on(10) == [6, 7] and on(25) == [5, 6, 7]
    assert on(70) == list(range(L)) and on(T - 1) == list(range(L))


def test_dropped_samples_pass_the_residual_stream(small_vocab_model_path):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(small_vocab_model_path, dtype=torch.float32)
    x = torch.randint(0, 1000, (2, 9))
    with torch.no_grad():
        ref = model.model(input_ids=x).last_hidden_state
        taps = ts.LayerTaps(model)
        taps.set(None, set(), None)
        assert torch.equal(model.model(input_ids=x).last_hidden_state, ref)
        # sample 1 skips every layer: its state is its embedding (then the final norm)
        keep = [torch.tensor([True, False])] * 4
        taps.set(keep, {1}, torch.ones(2, 9, dtype=torch.bool))
        h = model.model(input_ids=x).last_hidden_state
        assert torch.allclose(h[0], ref[0])
        emb = model.model.embed_tokens(x[1])
        assert torch.allclose(h[1], model.model.norm(emb), atol=1e-6)
        assert torch.allclose(taps.outputs[1][9:], emb)  # layer 1's output, sample 1
        taps.remove()
        assert torch.equal(model.model(input_ids=x).last_hidden_state, ref)


def test_tiny_run_writes_a_stamped_folder_transformers_loads(small_vocab_model_path, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    out = tmp_path / "ls"
    args = ["--model", small_vocab_model_path, "--tokens", "400", "--out", str(out),
            "--data-source", "sharegpt", "--eval-tokens", "120", "--max-response-tokens", "48",
            "--batch-tokens", "256", "--max-seq", "128", "--rotation", "2", "--p-max", "0.5",
            "--lr", "1e-3"]
    report = ts.main(args)
    cfg = json.loads((out / "config.json").read_text())
    stamp = cfg[ts.STAMP_KEY]
    assert stamp["data_source"] == "sharegpt" and stamp["answer_tokens"] >= 400
    hp = stamp["hyper_parameters"]
    assert hp["rotation"] == 2 and hp["p_max"] == 0.5 and hp["e_scale"] == 0.2
    assert stamp["steps"] >= 3
    assert stamp["command"].startswith("python tools/train_layerskip.py --model")
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    orig = AutoModelForCausalLM.from_pretrained(small_vocab_model_path, dtype=torch.float32)
    assert not torch.equal(model.model.layers[0].mlp.up_proj.weight,
                           orig.model.layers[0].mlp.up_proj.weight)  # it trained
    log = [json.loads(x) for x in (out / "train.log.jsonl").read_text().splitlines()]
    assert len(log) == stamp["steps"] and all("3" in r["ce"] for r in log)
    # rotation R = 2 over layers 0..2: exits {0, 2} then {1}; layer 0's scale is 0
    assert set(log[0]["ce"]) == {"2", "3"} and set(log[1]["ce"]) == {"1", "3"}
    assert sum(log[1]["weights"].values()) == pytest.approx(1.0, abs=1e-3)
    assert (out / "loss.png").exists()
    rep = json.loads((out / ts.REPORT).read_text())
    h = rep["heldout"]
    assert h["exit_layers"] == [1, 2, 3, 4] and h["positions"] >= 120
    assert h["original"]["early_exit_agreement"][-1] == 1.0
    assert len(h["trained"]["early_exit_agreement"]) == 4
    assert h["trained"]["early_exit_agreement_own"][-1] == 1.0
    assert h["trained"]["last_layer_agreement"] == h["trained"]["early_exit_agreement"][-1]
    assert report["heldout"] == h
    # resuming a finished run trains nothing more
    again = ts.main([*args, "--resume"])
    assert again["training"]["steps"] == stamp["steps"]
    assert len((out / "train.log.jsonl").read_text().splitlines()) == stamp["steps"]


def test_train_step_gradients_are_those_of_the_early_exit_loss(small_vocab_model_path):
    """The chunked LM head (detached states, gradients pushed through the body after) gives
    the gradients of J = sum_l e~(l) CE(lm_head(norm(x_{l+1})), Y) computed directly."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(small_vocab_model_path, dtype=torch.float32)
    recs = [{"id": "a", "prompt": [1, 5, 9, 20], "response": [33, 7, 400, 12, 2]},
            {"id": "b", "prompt": [1, 8], "response": [44, 45, 46]}]
    batch = ts.batch_tensors(recs, 64, "cpu")
    x, att, lab, pos = batch
    assert int(pos.sum()) == 8 and lab[1, 1].item() == 44
    w = ts.exit_weights([False, True, True, True], ts.exit_scales(4, 0.5))
    taps = ts.LayerTaps(model)
    res = ts.train_step(model, taps, batch, [0.0] * 4, w, torch.Generator().manual_seed(0), 3)
    got = {k: p.grad.clone() for k, p in model.named_parameters()}
    taps.remove()
    model.zero_grad()
    out = model.model(input_ids=x, attention_mask=att, output_hidden_states=True)
    hs = out.hidden_states  # embeddings, then after each layer (the last one normed)
    J = 0.0
    for ell in range(4):
        h = out.last_hidden_state if ell == 3 else model.model.norm(hs[ell + 1])
        ce = F.cross_entropy(model.lm_head(h[pos]), lab[pos])
        if ell > 0:
            assert res["ce"][ell] == pytest.approx(float(ce.detach()), rel=1e-5)
        J = J + w[ell] * ce
    J.backward()
    assert res["loss"] == pytest.approx(float(J.detach()), rel=1e-5)
    for k, p in model.named_parameters():
        assert torch.allclose(got[k], p.grad, atol=1e-6, rtol=1e-4), k
