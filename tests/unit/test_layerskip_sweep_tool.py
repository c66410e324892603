"""tools/layerskip_sweep.py on a tiny model: one row per exit layer, JSON + PNG,
--resume keeps the rows already in the log; exit at L is the model itself."""

import json


def run_tool(model, out, *extra):
    from vllm_selfspec.offline import layerskip_sweep

    layerskip_sweep.main(["--model", model, "--json", str(out), "--dataset", "mtbench",
                          "--num-prompts", "2", "--max-tokens", "12",
                          "--num-speculations", "1,3", *extra])


def test_sweep_rows_plot_and_resume(tiny_model_path, tmp_path):
    out = tmp_path / "sweep.json"
    run_tool(tiny_model_path, out, "--exit-layers", "1,4")
    log = out.with_suffix(".log.jsonl")
    first = log.read_text().splitlines()
    assert [json.loads(x)["exit_layer"] for x in first] == [1, 4]
    assert out.with_suffix(".png").exists()
    res = json.loads(out.read_text())
    full = res["rows"][1]
    assert full["agreement"] == 1.0  # E = L (4 layers): the draft is the model
    assert full["per_d"]["3"]["acceptance_rate"] == 1.0
    assert res["best"]["exit_layer"] == 1  # E = L is never proposed as the best exit
    run_tool(tiny_model_path, out, "--exit-layers", "1,2,4", "--resume")
    lines = log.read_text().splitlines()
    assert lines[:2] == first and json.loads(lines[2])["exit_layer"] == 2
    assert [r["exit_layer"] for r in json.loads(out.read_text())["rows"]] == [1, 2, 4]
