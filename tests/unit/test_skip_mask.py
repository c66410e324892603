"""Skip-mask parsing and validation (Draft & Verify / SWIFT file formats)."""

import json

import pytest

from vllm_selfspec.proposers.artifacts import ArtifactMismatchError, ModelStamp
from vllm_selfspec.proposers.skip_mask import SkipMask, SkipMaskError, parse_mask, uniform_mask

STAMP = ModelStamp("LlamaForCausalLM", 30, 576, 49152, "abcd1234abcd1234", "SmolLM2")

# The shape of dilab-zju/self-speculative-decoding's skip_layers.json (keyed by model name).
DV_FILE = {
    "llama-2-13b": {"attention": [3, 5, 6, 8, 10, 11, 14, 15, 18, 19, 21, 23, 24, 25, 26, 27, 28,
                                  29, 31, 32, 34, 35, 36, 37],
                    "mlp": [6, 9, 10, 11, 15, 24, 25, 27, 28, 35]},
    "codellama-13b": {"attention": [5, 6, 7], "mlp": [2, 4]},
}


def test_inline_mask():
    m = parse_mask({"attention": [1, 3], "mlp": [2]}, 30)
    assert m.attention == {1, 3} and m.mlp == {2}
    assert m.num_skipped == 3
    assert m.kept_fraction(30) == pytest.approx(57 / 60)


def test_missing_list_means_nothing_skipped():
    m = parse_mask({"attention": [4]}, 30)
    assert m.mlp == frozenset()


def test_file_from_draft_and_verify_repo_loads_as_is(tmp_path):
    f = tmp_path / "skip_layers.json"
    f.write_text(json.dumps(DV_FILE))
    m = parse_mask(str(f), 40, key="llama-2-13b")
    assert len(m.attention) == 24 and len(m.mlp) == 10
    # matched by model folder name when no key is given
    m2 = parse_mask(str(f), 40, model_name="/models/CodeLlama-13B")
    assert m2.attention == {5, 6, 7}


def test_keyed_file_needs_a_choice(tmp_path):
    f = tmp_path / "m.json"
    f.write_text(json.dumps(DV_FILE))
    with pytest.raises(SkipMaskError, match="several models.*skip_mask_key"):
        parse_mask(str(f), 40)
    with pytest.raises(SkipMaskError, match="no entry 'llama-2-70b'"):
        parse_mask(str(f), 40, key="llama-2-70b")


def test_swift_style_task_key(tmp_path):
    f = tmp_path / "m.json"
    f.write_text(json.dumps({"llama-2-13b_cnndm": {"attention": [1], "mlp": [2]}}))
    m = parse_mask(str(f), 40)  # a single entry is taken
    assert m.source.endswith("[llama-2-13b_cnndm]")


def test_out_of_range_layer_is_refused():
    with pytest.raises(SkipMaskError, match="attention layer 30 is out of range; this model has 30 layers"):
        parse_mask({"attention": [0, 30], "mlp": []}, 30)
    with pytest.raises(SkipMaskError, match="mlp layer -1 is out of range"):
        parse_mask({"attention": [], "mlp": [-1]}, 30)


@pytest.mark.parametrize("bad", [{"attention": "1,2"}, {"attention": [1.5]}, {"attention": [True]},
                                 {"layers": [1]}, {"attention": [1], "foo": 1}])
def test_malformed_masks(bad):
    with pytest.raises(SkipMaskError):
        parse_mask(bad, 30)


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(SkipMaskError, match="does not exist"):
        parse_mask(str(tmp_path / "nope.json"), 30)
    f = tmp_path / "bad.json"
    f.write_text("{not json")
    with pytest.raises(SkipMaskError, match="not valid JSON"):
        parse_mask(str(f), 30)


def test_mask_stamped_for_another_model_is_refused():
    other = ModelStamp("Qwen2ForCausalLM", 24, 896, 151936, "ffff0000ffff0000", "Qwen2.5-0.5B")
    mask = {"attention": [1], "mlp": [], "metadata": {"model": other.to_json()}}
    with pytest.raises(ArtifactMismatchError, match="made for another model.*Qwen2.5-0.5B.*architecture"):
        parse_mask(mask, 30, STAMP)
    # same shape, other weights (a fine-tune): the fingerprint tells them apart
    twin = ModelStamp("LlamaForCausalLM", 30, 576, 49152, "0000000000000000")
    with pytest.raises(ArtifactMismatchError, match="weights fingerprint"):
        parse_mask({"attention": [1], "metadata": {"model": twin.to_json()}}, 30, STAMP)
    # made for this model: fine
    ok = parse_mask({"attention": [1], "metadata": {"model": STAMP.to_json()}}, 30, STAMP)
    assert ok.attention == {1}


def test_uniform_mask_matches_swift_start():
    # skip_ratio 0.5: every other inner layer for both blocks (SWIFT's arange(1, L-1, 2))
    m = uniform_mask(40, 0.5)
    assert sorted(m.attention) == list(range(1, 39, 2))
    assert m.attention == m.mlp
    assert uniform_mask(30, 0.0).num_skipped == 0
    m15 = uniform_mask(30, 0.15)
    assert m15.num_skipped == round(2 * 28 * 0.15)
    assert 0 not in m15.attention | m15.mlp and 29 not in m15.attention | m15.mlp
    with pytest.raises(SkipMaskError):
        uniform_mask(30, 1.0)


def test_vector_round_trip():
    m = SkipMask(frozenset({0, 5}), frozenset({7}))
    z = m.to_vector(10)
    assert len(z) == 20 and z[0] == 1 and z[5] == 1 and z[17] == 1
    back = SkipMask.from_vector([v * 0.9 for v in z], 10)  # thresholded at 0.5
    assert back == m
