"""tools/step_cost.py times the model's own linear-layer shapes by rows and reports each
size against one row, from config.json alone (no weights)."""

import json

from vllm_selfspec.offline.step_cost import layer_shapes, main


def test_layer_shapes_follow_the_config():
    cfg = {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
           "intermediate_size": 1536}
    assert layer_shapes(cfg) == [(960, 576), (576, 576), (3072, 576), (576, 1536)]


def test_a_tiny_model_is_timed_and_drawn(tmp_path):
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 100}))
    out = tmp_path / "cost.json"
    report = main(["--model", str(model), "--max-tokens", "3", "--repeats", "2",
                   "--json", str(out)])
    rows = report["rows"]
    assert [r["tokens"] for r in rows] == [1, 2, 3]
    assert all(r["decoder_s"] > 0 and r["lm_head_s"] > 0 for r in rows)
    for r in rows:  # each size against one row, from the timings reported
        assert r["decoder_vs_1"] == round(r["decoder_s"] / rows[0]["decoder_s"], 3)
    assert json.loads(out.read_text())["config"]["layers"] == 2
    assert out.with_suffix(".png").stat().st_size > 0
