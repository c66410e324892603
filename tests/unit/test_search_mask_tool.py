"""tools/search_mask.py end to end on a tiny model: writes a loadable, stamped mask;
--resume continues the log; the Ray path runs on a local 2-CPU cluster."""

import json
import subprocess
import sys

import pytest

COMMON = ["--dataset", "mtbench", "--num-prompts", "2", "--max-tokens", "12", "--k", "4",
          "--objective", "proxy"]


def run_tool(model, out, *extra):
    from vllm_selfspec.offline import search_mask

    return search_mask.main(["--model", model, "--out", str(out), *COMMON, *extra])


def test_search_writes_loadable_stamped_mask_and_resumes(tiny_model_path, model_path, tmp_path):
    from vllm_selfspec.offline.hf_target import HFTarget
    from vllm_selfspec.proposers.artifacts import ArtifactMismatchError, ModelStamp
    from vllm_selfspec.proposers.skip_mask import parse_mask

    out = tmp_path / "tiny-mask.json"
    run_tool(tiny_model_path, out, "--iterations", "5")
    log = out.with_suffix(".trials.jsonl")
    first = log.read_text().splitlines()
    assert len(first) == 5
    assert out.with_suffix(".objective.png").exists() and out.with_suffix(".layout.png").exists()
    data = json.loads(out.read_text())
    meta = data["metadata"]
    assert meta["objective"] == "proxy" and meta["iterations"] == 5
    assert meta["dev_set"]["split"] == "dev" and meta["tool_version"]
    tiny = HFTarget(tiny_model_path).stamp()
    mask = parse_mask(str(out), 4, tiny)  # loads for the model it was made for
    assert mask.metadata["model"]["fingerprint"] == tiny.fingerprint

    with pytest.raises(SystemExit, match="--resume"):
        run_tool(tiny_model_path, out, "--iterations", "7")
    run_tool(tiny_model_path, out, "--iterations", "7", "--resume")
    lines = log.read_text().splitlines()
    assert len(lines) == 7 and lines[:5] == first

    smol = ModelStamp("LlamaForCausalLM", 30, 576, 49152, "x" * 16)
    with pytest.raises(ArtifactMismatchError, match="made for another model"):
        parse_mask(str(out), 30, smol)


def test_selfspec_refuses_the_tiny_models_mask(tiny_model_path, model_path, tmp_path):
    from vllm.engine.arg_utils import EngineArgs

    from vllm_selfspec.methods import SelfSpecConfigError

    out = tmp_path / "tiny-mask.json"
    run_tool(tiny_model_path, out, "--iterations", "2")
    args = EngineArgs(model=model_path, dtype="float32", max_model_len=512,
                      kv_cache_memory_bytes=1 << 28,
                      speculative_config={"method": "selfspec", "skip_mask": str(out)})
    with pytest.raises(SelfSpecConfigError, match="made for another model"):
        args.create_engine_config()


@pytest.mark.ray
def test_ray_path_on_a_local_cluster(tiny_model_path, tmp_path):
    pytest.importorskip("ray", reason="ray is installed with the [tools] extra")
    code = f"""
import ray
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
from vllm_selfspec.offline import search_mask
r = search_mask.main(["--model", {tiny_model_path!r}, "--out", {str(tmp_path / 'ray-mask.json')!r},
                      {', '.join(repr(a) for a in COMMON)}, "--iterations", "4", "--ray",
                      "--ray-workers", "2"])
assert r["trials"] == 4
ray.shutdown()
print("RAY-OK")
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert "RAY-OK" in res.stdout, res.stdout[-3000:] + res.stderr[-3000:]
    assert len((tmp_path / "ray-mask.trials.jsonl").read_text().splitlines()) == 4


def test_without_ray_nothing_imports_ray(tiny_model_path, tmp_path):
    code = f"""
import sys
from vllm_selfspec.offline import search_mask
search_mask.main(["--model", {tiny_model_path!r}, "--out", {str(tmp_path / 'm.json')!r},
                  {', '.join(repr(a) for a in COMMON)}, "--iterations", "2"])
print("RAY-IMPORTED" if "ray" in sys.modules else "NO-RAY")
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert "NO-RAY" in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]


def _trial(i, value, attention=(), mlp=()):
    return {"iteration": i, "value": value, "attention": list(attention), "mlp": list(mlp)}


def test_choose_mask_writes_the_best_non_empty_mask_and_says_when_none_pays():
    from vllm_selfspec.offline.search_mask import choose_mask, verdict_line

    trials = [_trial(0, 0.93), _trial(1, 0.81, [3], [4]), _trial(2, 0.88, [5]),
              _trial(3, 0.70, [1, 2], [2])]
    chosen, verdict = choose_mask(trials)
    assert chosen["iteration"] == 2  # the best mask that skips something, not the empty one
    assert verdict["expected_speedup"] == 0.88 and not verdict["beats_plain_decoding"]
    assert verdict["best_overall"] == 0.93 and verdict["best_overall_is_empty"]
    line = verdict_line(verdict, "proxy")
    assert "\n" not in line and "0.880x" in line and "plain decoding" in line

    chosen, verdict = choose_mask(trials + [_trial(4, 1.12, [7], [8])])
    assert chosen["iteration"] == 4 and verdict["beats_plain_decoding"]
    assert verdict_line(verdict, "proxy") is None
    assert choose_mask([_trial(0, 0.9)])[0] is None  # only the empty mask was tried


def test_with_low_bit_draft_weights_the_empty_mask_may_be_the_best():
    """Searched for a low-bit pass (--draft-weights), keeping every sub-layer is a draft
    that pays: it is written when it is the best trial."""
    from vllm_selfspec.offline.search_mask import choose_mask

    trials = [_trial(0, 1.55), _trial(1, 1.20, [3], [4])]
    chosen, verdict = choose_mask(trials, allow_empty=True)
    assert chosen["iteration"] == 0 and verdict["beats_plain_decoding"]
    assert choose_mask(trials)[0]["iteration"] == 1  # full weights: never the empty mask


class _LosingObjective:
    """Every mask is slower than plain decoding; the empty mask least so (SmolLM2 here)."""

    def __init__(self):
        self.seen = []

    def evaluate(self, mask):
        self.seen.append(mask)
        return {"value": 0.95 - 0.01 * mask.num_skipped, "acceptance_rate": 0.5}

    def describe(self):
        return {"objective": "fake"}


@pytest.mark.parametrize("iterations", [6, 1])
def test_search_that_finds_nothing_faster_says_so_and_writes_a_non_empty_mask(
        tiny_model_path, tmp_path, monkeypatch, capsys, iterations):
    from vllm_selfspec.offline import search_mask

    obj = _LosingObjective()
    monkeypatch.setattr(search_mask, "build_objective", lambda *a, **k: obj)
    out = tmp_path / "m.json"
    search_mask.main(["--model", tiny_model_path, "--out", str(out), *COMMON,
                      "--iterations", str(iterations)])
    printed = capsys.readouterr().out
    lines = [x for x in printed.splitlines() if x.startswith("no skip mask is expected")]
    assert len(lines) == 1
    data = json.loads(out.read_text())
    assert data["attention"] or data["mlp"]  # never the empty mask
    meta = data["metadata"]
    assert meta["expected_speedup"] == meta["value"] < 1.0
    assert f"{meta['expected_speedup']:.3f}x" in lines[0]
    assert meta["beats_plain_decoding"] is False
    assert meta["best_overall_is_empty"] and meta["best_overall_value"] == 0.95
