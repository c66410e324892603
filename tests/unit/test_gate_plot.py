"""tools/gate_plot.py draws the cost gate's decisions of a bench report."""

import json

from vllm_selfspec.offline import gate_plot


def report(gated: bool) -> dict:
    rows = [{"method": "baseline", "speedup": 1.0}]
    gate = {"decisions": [[i, 2 if i % 32 else 0, 1.1] for i in range(1, 200)], "plain_probes": 6}
    rows.append({"method": "chimera", "speedup": 1.02, "drafter": {"cost_gate": gate} if gated else {}})
    return {"config": {"dataset": "humaneval", "num_prompts": 8, "concurrency": 1}, "results": rows}


def test_draws_one_panel_per_gated_method(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report(True)))
    assert [m for m, _, _ in gate_plot.gated(report(True))] == ["chimera"]
    assert gate_plot.main([str(path)]) == [str(tmp_path / "r.gate.png")]
    assert (tmp_path / "r.gate.png").stat().st_size > 1000


def test_nothing_to_draw_without_a_gate(tmp_path):
    assert not gate_plot.draw(report(False), tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()
