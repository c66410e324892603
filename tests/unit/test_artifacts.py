"""The artifact module: cache paths, atomic writes, stamped safetensors, JSONL logs."""

import json

import pytest
import torch

from vllm_selfspec.proposers.artifacts import (
    ArtifactError,
    ArtifactMismatchError,
    ModelStamp,
    append_jsonl,
    artifact_path,
    atomic_path,
    open_stamped,
    read_jsonl,
    save_stamped,
)

STAMP = ModelStamp("LlamaForCausalLM", 30, 576, 49152, "0123456789abcdef")


def test_artifact_paths_per_kind(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_SELFSPEC_CACHE", str(tmp_path))
    assert artifact_path("masks", STAMP) == tmp_path / "masks/LlamaForCausalLM-30L-0123456789abcdef.json"
    assert artifact_path("swift", STAMP).parent == tmp_path / "swift"
    assert artifact_path("bigram", STAMP) == (
        tmp_path / "bigram/LlamaForCausalLM-49152-0123456789abcdef.safetensors")
    assert artifact_path("masks", STAMP, ".bak").suffix == ".bak"
    no_weights = ModelStamp("LlamaForCausalLM", 30, 576, 49152, None)
    assert artifact_path("masks", no_weights) is None  # a name alone does not say which weights
    with pytest.raises(ValueError, match="unknown artifact kind"):
        artifact_path("heads", STAMP)


def test_atomic_path_replaces_in_one_step(tmp_path):
    out = tmp_path / "sub" / "a.json"
    with atomic_path(out) as tmp:
        assert tmp.parent == out.parent and not out.exists()
        tmp.write_text("1")
    assert out.read_text() == "1"
    with pytest.raises(RuntimeError):
        with atomic_path(out) as tmp:
            tmp.write_text("half")
            raise RuntimeError
    assert out.read_text() == "1"  # the old file stays, the temporary is gone
    assert sorted(p.name for p in out.parent.iterdir()) == ["a.json"]
    folder = tmp_path / "model"
    with atomic_path(folder) as tmp:
        tmp.mkdir()
        (tmp / "config.json").write_text("{}")
    assert (folder / "config.json").exists()


def test_stamped_safetensors_roundtrip_and_refusals(tmp_path):
    f = tmp_path / "x.safetensors"
    save_stamped(f, {"w": torch.arange(6).reshape(2, 3)}, "test/1", STAMP, {"k": 4})
    header, tensors = open_stamped(f, "test/1", "test file", "Rebuild it.", expect=STAMP)
    assert header == {"format": "test/1", "stamp": STAMP, "meta": {"k": 4}}
    assert tensors["w"].tolist() == [[0, 1, 2], [3, 4, 5]]
    _, shapes = open_stamped(f, "test/1", "test file", "Rebuild it.", arrays=False)
    assert list(shapes["w"]) == [2, 3]
    with pytest.raises(ArtifactError, match=r"is not a test file of this plugin .*Rebuild it\.$"):
        open_stamped(f, "other/1", "test file", "Rebuild it.")
    other = ModelStamp("LlamaForCausalLM", 30, 576, 49152, "fedcba9876543210")
    with pytest.raises(ArtifactMismatchError, match="test file .* another model"):
        open_stamped(f, "test/1", "test file", "Rebuild it.", expect=other)
    with pytest.raises(ArtifactError, match="does not exist"):
        open_stamped(tmp_path / "missing.safetensors", "test/1", "test file", "")
    (tmp_path / "junk.safetensors").write_bytes(b"\n\n not safetensors")
    with pytest.raises(ArtifactError, match="cannot read test file") as e:
        open_stamped(tmp_path / "junk.safetensors", "test/1", "test file", "")
    assert "\n" not in str(e.value)
    save_stamped(f, {"w": torch.zeros(1)}, "test/1", None, {})
    assert open_stamped(f, "test/1", "test file", "", expect=STAMP)[0]["stamp"] is None


def test_jsonl_log_appends_and_tolerates_a_torn_line(tmp_path):
    log = tmp_path / "log.jsonl"
    assert read_jsonl(log) == []
    append_jsonl(log, {"a": 1})
    append_jsonl(log, {"b": [1, 2]})
    with open(log, "a") as f:
        f.write('{"c": ')
    assert read_jsonl(log) == [{"a": 1}, {"b": [1, 2]}]
    assert json.loads(log.read_text().splitlines()[0]) == {"a": 1}
