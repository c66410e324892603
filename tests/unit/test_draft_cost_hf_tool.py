"""tools/draft_cost_hf.py: the draft pass timed through transformers (the draft pass on a GPU),
run here on CPU with a tiny random model."""

from __future__ import annotations

import json

import pytest
import torch


def test_the_timed_walk_with_nothing_skipped_is_the_model(tiny_model_path):
    from vllm_selfspec.offline.draft_cost_hf import _head, _walk
    from vllm_selfspec.offline.hf_target import HFTarget
    from vllm_selfspec.proposers.skip_mask import SkipMask

    target = HFTarget(tiny_model_path, random_weights=True)
    ids = list(range(100, 140))
    with torch.inference_mode():
        prep = target.prepare(ids[:-1], ids[-1:])
        pos = torch.tensor([len(ids) - 1])
        drafted = _head(_walk(target, prep, SkipMask(), pos), target.model.lm_head.weight)
        full = target.model(torch.tensor([ids])).logits[0, -1].argmax()
        skipped = _head(_walk(target, prep, SkipMask(frozenset({1, 2}), frozenset({1, 2})), pos),
                        target.model.lm_head.weight)
    assert int(drafted) == int(full)
    assert skipped.shape == drafted.shape


@pytest.mark.parametrize("passes,kind_masks", [("eager", True), ("eager,compiled", False)])
def test_report_rows_fits_and_plot(tiny_model_path, tmp_path, passes, kind_masks):
    from vllm_selfspec.offline import draft_cost_hf

    out = tmp_path / "cost.json"
    report = draft_cost_hf.main([
        "--model", tiny_model_path, "--random-weights", "--device", "cpu", "--dtype", "float32",
        "--fractions", "1,0.5", "--context", "16", "--verify", "2", "--draft-vocab", "0,16",
        "--passes", passes, "--repeats", "1", "--rounds", "1", "--json", str(out),
        "--kind-masks" if kind_masks else "--no-kind-masks"])
    names = passes.split(",")
    assert report["reference_pass"] == names[-1]
    assert not report["errors"]
    # kept 1, kept 0.5 (and no inner attention, no inner MLP); two heads; every pass
    assert len(report["rows"]) == (4 if kind_masks else 2) * 2 * len(names)
    assert all(r["draft_token_s"] > 0 for r in report["rows"])
    assert set(report["by_variant"]) == {f"{p}, {h}" for p in names
                                        for h in ("full head", "draft vocabulary 16")}
    for d in report["by_variant"].values():  # the split per kind needs the kind masks
        assert (set(d["cost_model"]) == {"draft_fixed", "draft_attention", "draft_mlp",
                                         "verify_per_token"}) if kind_masks else d["cost_model"] is None
    assert json.loads(out.read_text())["architecture"] == "LlamaForCausalLM"
    assert out.with_suffix(".png").stat().st_size > 0
    plot = tmp_path / "again.png"
    draft_cost_hf.main(["--replot", str(out), "--plot", str(plot)])
    assert plot.stat().st_size > 0


def test_low_bit_copies_run_the_walk_close_to_the_model(tiny_model_path):
    """Key draft_weights through transformers: the walk's linear layers and head run their
    int8 copies inside ``draft_weights`` (the hidden states move, a little) and their own
    weights after it (exactly the same again)."""
    from vllm_selfspec.offline.draft_cost_hf import _walk
    from vllm_selfspec.offline.hf_target import HFTarget
    from vllm_selfspec.proposers.skip_mask import SkipMask

    target = HFTarget(tiny_model_path, random_weights=True)
    ids = list(range(100, 140))
    copies = target.low_bit_copies("int8")
    assert len(copies) == 4 * 7 + 1  # q, k, v, o, gate, up, down per layer, and the head
    with torch.inference_mode():
        prep = target.prepare(ids[:-1], ids[-1:])
        pos = torch.tensor([len(ids) - 1])
        full = _walk(target, prep, SkipMask(), pos)
        with target.draft_weights(copies):
            low = _walk(target, prep, SkipMask(), pos)
        again = _walk(target, prep, SkipMask(), pos)
    err = float((low - full).norm() / full.norm())
    assert 0 < err < 0.05
    assert torch.equal(again, full)


def test_report_has_a_variant_per_draft_weights(tiny_model_path, tmp_path):
    from vllm_selfspec.offline import draft_cost_hf

    report = draft_cost_hf.main([
        "--model", tiny_model_path, "--random-weights", "--device", "cpu", "--dtype", "float32",
        "--fractions", "1,0.5", "--context", "16", "--verify", "2", "--draft-vocab", "0",
        "--passes", "eager", "--repeats", "1", "--rounds", "1", "--no-kind-masks",
        "--draft-weights", "full,int8"])
    assert not report["errors"]
    assert {r["draft_weights"] for r in report["rows"]} == {"full", "int8"}
    assert set(report["by_variant"]) == {"eager, full head", "eager, int8 weights, full head"}


def test_graph_passes_need_cuda(tiny_model_path):
    from vllm_selfspec.offline import draft_cost_hf

    with pytest.raises(SystemExit, match="graph passes need CUDA"):
        draft_cost_hf.main(["--model", tiny_model_path, "--random-weights", "--device", "cpu",
                            "--passes", "graph"])
