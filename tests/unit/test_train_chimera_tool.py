"""tools/train_chimera.py: a tiny run writes a stamped checkpoint that loads, with its
report, Table 5 and loss curve; --resume continues from the trainer state."""

import json

from vllm_selfspec.model_info import stamp_from_path
from vllm_selfspec.offline import train_chimera
from vllm_selfspec.proposers.chimera import check_checkpoint, load_checkpoint


def test_tiny_run_writes_a_loadable_stamped_checkpoint(small_vocab_model_path, tmp_path):
    out = tmp_path / "c.safetensors"
    args = ["--model", small_vocab_model_path, "--tokens", "400", "--out", str(out),
            "--labels", "teacher-forced", "--heads", "2", "--draft-vocab", "256",
            "--epochs", "1", "--held-out", "4", "--held-out-tokens", "200", "--batch-tokens", "1024", "--max-seq", "256"]
    report = train_chimera.main(args)
    stamp = stamp_from_path(small_vocab_model_path)
    meta = check_checkpoint(out, stamp)
    assert meta["config"]["num_heads"] == 2 and meta["config"]["draft_vocab_size"] == 256
    tr = meta["training"]
    assert tr["answer_tokens"] >= 400 and tr["labels"] == "teacher-forced"
    assert len(tr["heldout"]["top_k"]) == 2 and len(tr["heldout"]["top_k"][0]) == 5
    model = load_checkpoint(out, stamp)
    assert model.cfg.num_heads == 2 and model.draft_ids.numel() == 256
    work = tmp_path / "c.safetensors.work"
    assert (work / "c.loss.png").exists() and (work / "c.report.json").exists()
    assert json.loads((work / "c.report.json").read_text())["checkpoint"] == report["checkpoint"]
    steps = report["training"]["steps"]
    # resuming a finished run trains nothing more and writes the same kind of checkpoint
    again = train_chimera.main([*args, "--resume"])
    assert again["training"]["steps"] == steps
