"""tools/train_chimera.py: a tiny run writes a stamped checkpoint that loads, with its
report, Table 5 and loss curve; --resume continues from the trainer state."""

import json

import pytest

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
    from vllm_selfspec.offline import chimera_eval

    cache = tmp_path / "eval-cache"
    ev = chimera_eval.main(["--checkpoint", str(out), "--model", small_vocab_model_path,
                            "--prompts", "humaneval", "--num-prompts", "2", "--max-tokens", "6",
                            "--cache", str(cache)])
    assert ev["chains"] > 0 and len(ev["table5"]["top_k"]) == 2 and ev["draft_vocab"] == 256
    assert 1.0 <= ev["sets"]["held_out"]["tokens_per_step_path"] <= 3.0
    assert {r["heads"] for r in ev["expected"]} == {1, 2}
    # the bench's prompts, answered by the target and measured like the held-out split
    he = ev["sets"]["humaneval"]
    assert 0 < he["positions"] <= 2 * 6 and len(he["top1"]) == 2 and he["answer_dtype"] == "float32"
    answers = list(cache.rglob("answers.jsonl"))
    assert len(answers) == 1 and len(answers[0].read_text().splitlines()) == 2
    # each prompt's own path, under the bench's prompt ids
    order = [json.loads(x)["id"] for x in answers[0].read_text().splitlines()]
    assert list(he["per_prompt"]) == order and all(i.startswith("HumanEval/") for i in order)
    assert all(r["steps"] >= 1 and r["tokens_per_step_path"] >= 1 for r in he["per_prompt"].values())
    assert he["tokens_per_step_path_by_heads"][-1] == he["tokens_per_step_path"]
    # deeper chains, the last head standing in for the heads the checkpoint lacks: the first
    # heads' figures are the checkpoint's own
    deep = chimera_eval.main(["--checkpoint", str(out), "--model", small_vocab_model_path,
                              "--prompts", "humaneval", "--num-prompts", "2", "--max-tokens", "6",
                              "--cache", str(cache), "--heads", "4"])
    assert deep["heads"] == 4 and ev["heads"] == 2
    dh = deep["sets"]["humaneval"]["tokens_per_step_path_by_heads"]
    assert len(dh) == 4 and dh[:2] == he["tokens_per_step_path_by_heads"]
    assert all(a <= b for a, b in zip(dh, dh[1:]))  # a longer chain never accepts less
    # without a corpus only the bench's prompt sets are measured; with neither, nothing is
    bare = chimera_eval.main(["--checkpoint", str(out), "--model", small_vocab_model_path,
                              "--corpus", str(tmp_path / "none"), "--prompts", "humaneval",
                              "--num-prompts", "2", "--max-tokens", "6", "--cache", str(cache)])
    assert list(bare["sets"]) == ["humaneval"] and "table5" not in bare
    assert bare["sets"]["humaneval"]["tokens_per_step_path"] == he["tokens_per_step_path"]
    with pytest.raises(SystemExit, match="no held-out states"):
        chimera_eval.main(["--checkpoint", str(out), "--model", small_vocab_model_path,
                           "--corpus", str(tmp_path / "none")])
    steps = report["training"]["steps"]
    # resuming a finished run trains nothing more and writes the same kind of checkpoint
    again = train_chimera.main([*args, "--resume"])
    assert again["training"]["steps"] == steps
    # a wider draft vocabulary counts the corpus's answers: none here (teacher-forced labels)
    from vllm_selfspec.offline.corpus import TRAIN_FILE

    wide_args = ["--checkpoint", str(out), "--model", small_vocab_model_path, "--draft-vocab", "300"]
    with pytest.raises(SystemExit, match="no training answers"):
        chimera_eval.main(wide_args)
    own = set(model.draft_ids.tolist())
    rare = [i for i in range(model.cfg.vocab_size) if i not in own][-3:]  # highest ids outside
    (work / TRAIN_FILE).write_text(json.dumps({"id": "a", "prompt": [1], "response": rare * 5}) + "\n")
    wide = chimera_eval.main(wide_args)
    assert wide["draft_vocab"] == 300  # the checkpoint's 256, the answers' tokens among the rest


def test_unseen_held_out_prompts_share_no_run_with_training_ones():
    from vllm_selfspec.offline.chimera_eval import common_opening, unseen_ids, user_text

    opening = list(range(1, 11))  # a chat template's system turn
    closing = [2, 198, 1, 520, 9531, 198]  # ... and the assistant turn's header
    def chat(*user): return opening + list(user) + closing
    train = [{"id": "t0", "prompt": chat(*range(100, 120))},
             {"id": "t1", "prompt": chat(*range(300, 340))}]
    held = [{"id": "repeat", "prompt": chat(7, *range(105, 113), 9)},
            {"id": "short-overlap", "prompt": chat(*range(100, 107), 50, 51)},
            {"id": "cut", "prompt": list(range(330, 340)) + closing},  # cut to its last tokens
            {"id": "new", "prompt": chat(*range(200, 230))},
            {"id": "new-end", "prompt": chat(60, 61, 62, 338, 339)}]  # shares only the template
    prompts = [r["prompt"] for r in train + held]
    assert common_opening(prompts) == len(opening)
    assert common_opening([p[::-1] for p in prompts]) == len(closing)
    assert user_text(prompts)[held.index(held[2]) + len(train)] == list(range(330, 340))
    assert unseen_ids(held, train) == {"short-overlap", "new", "new-end"}


def test_expected_speedup_of_chains():
    import numpy as np

    from vllm_selfspec.offline.chimera_eval import expected

    correct = np.array([[1, 1, 0], [0, 1, 1], [1, 1, 1]], dtype=bool)
    conf = np.array([[0.9, 0.8, 0.1], [0.9, 0.9, 0.9], [0.9, 0.2, 0.9]])
    e = expected(correct, conf, threshold=0.5, heads=3, draft_cost=0.1, verify_cost=0.0)
    # drafted: 3, 3, 2; accepted: 2, 0, 2 -> tokens 1 + 4/3, drafts 8/3
    assert e["tokens_per_step"] == round(1 + 4 / 3, 4) and e["drafts_per_step"] == round(8 / 3, 4)
    assert abs(e["speedup"] - (1 + 4 / 3) / (1 + 0.8 / 3)) < 1e-3


def test_the_drafters_path_restarts_after_each_miss():
    import numpy as np

    from vllm_selfspec.offline.chimera_eval import along_the_path, expected

    # one sequence, chains at n = 0..5 with 2 heads; leads 2, 0, 1, 0, 0, 2
    correct = np.array([[1, 1], [0, 1], [1, 0], [0, 0], [0, 1], [1, 1]], dtype=bool)
    starts = np.array([[7, n] for n in range(6)])
    # path: n=0 accepts 2 -> n=3 accepts 0 -> n=4 accepts 0 -> n=5 accepts 2: 3, 1, 1, 3
    assert along_the_path(correct, starts) == 2.0
    every = expected(correct, np.ones_like(correct, dtype=float), 0.0, 2, 0.0, 0.0)
    assert every["tokens_per_step"] == round(1 + 5 / 6, 4)  # every start counted: not the path
    # a second sequence walks on its own from its own first chain
    two = along_the_path(np.concatenate([correct, correct[:2]]),
                         np.concatenate([starts, [[9, 4], [9, 5]]]))
    assert two == (3 + 1 + 1 + 3 + 3) / 5  # n=4 accepts 2 -> past its last chain


def test_autocast_steps_learn_and_say_so(small_vocab_model_path, tmp_path):
    out = tmp_path / "a.safetensors"
    report = train_chimera.main([
        "--model", small_vocab_model_path, "--tokens", "400", "--out", str(out),
        "--labels", "teacher-forced", "--heads", "2", "--draft-vocab", "256", "--epochs", "12",
        "--held-out", "4", "--held-out-tokens", "200", "--batch-tokens", "1024",
        "--max-seq", "256", "--lr", "3e-3", "--autocast"])
    assert report["training"]["autocast"] == "bfloat16"
    log = [json.loads(x) for x in (tmp_path / "a.safetensors.work" / "a.train.log.jsonl")
           .read_text().splitlines()]
    assert len(log) >= 8 and log[-1]["loss"] < 0.8 * log[0]["loss"], [r["loss"] for r in log]
    from vllm_selfspec.proposers.chimera import load_checkpoint

    assert load_checkpoint(out, stamp_from_path(small_vocab_model_path)).cfg.num_heads == 2


def test_init_starts_from_a_checkpoint_and_says_so(small_vocab_model_path, model_path, tmp_path):
    import torch
    from safetensors.torch import load_file

    common = ["--labels", "teacher-forced", "--epochs", "1", "--held-out", "4",
              "--held-out-tokens", "200", "--batch-tokens", "1024", "--max-seq", "256"]
    first = tmp_path / "first.safetensors"
    train_chimera.main(["--model", small_vocab_model_path, "--tokens", "300", "--out",
                        str(first), "--heads", "2", "--draft-vocab", "256", *common])
    # lr 0: the weights it starts from are the ones it ends with; its own --heads gives way
    # to the checkpoint's, and so does the default draft vocabulary
    again = tmp_path / "again.safetensors"
    report = train_chimera.main(["--model", small_vocab_model_path, "--tokens", "300", "--out",
                                 str(again), "--init", str(first), "--heads", "3",
                                 "--lr", "0", *common])
    a, b = load_file(str(first)), load_file(str(again))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # a larger --draft-vocab widens it: the checkpoint's tokens first, then others, the
    # weights as they were; a smaller one is refused
    wide = tmp_path / "wide.safetensors"
    train_chimera.main(["--model", small_vocab_model_path, "--tokens", "300", "--out",
                        str(wide), "--init", str(first), "--draft-vocab", "384", "--lr", "0",
                        *common])
    w = load_file(str(wide))
    assert w["draft_ids"].shape == (384,) and torch.equal(w["draft_ids"][:256], a["draft_ids"])
    assert len(set(w["draft_ids"].tolist())) == 384
    assert all(torch.equal(a[k], w[k]) for k in a if k != "draft_ids")
    with pytest.raises(SystemExit, match="only be widened"):
        train_chimera.main(["--model", small_vocab_model_path, "--tokens", "300", "--out",
                            str(tmp_path / "narrow.safetensors"), "--init", str(first),
                            "--draft-vocab", "128", *common])
    assert report["training"]["init"]["checkpoint"] == str(first)
    assert report["training"]["init"]["training"]["answer_tokens"] >= 300
    # with a learning rate it moves away from them
    moved = tmp_path / "moved.safetensors"
    train_chimera.main(["--model", small_vocab_model_path, "--tokens", "300", "--out",
                        str(moved), "--init", str(first), "--lr", "3e-3", *common])
    c = load_file(str(moved))
    assert torch.equal(a["draft_ids"], c["draft_ids"])
    assert not torch.equal(a["heads.0.weight"], c["heads.0.weight"])
    # a checkpoint made for another model is refused before anything is made for it
    with pytest.raises(ValueError, match="made for|another model"):
        train_chimera.main(["--model", model_path, "--tokens", "300", "--out",
                            str(tmp_path / "x.safetensors"), "--init", str(first), *common])
    assert not (tmp_path / "x.safetensors.work" / "responses.jsonl").exists()


def test_deeper_heads_repeat_the_last_one_and_the_timed_path_weighs_steps():
    import torch

    from vllm_selfspec.offline.bench import NUM_PROMPTS, WARMUP_PROMPTS
    from vllm_selfspec.offline.chimera_eval import timed_path
    from vllm_selfspec.proposers.chimera import ChimeraConfig, ChimeraDraftModel

    torch.manual_seed(0)
    cfg = ChimeraConfig(hidden_size=16, intermediate_size=32, num_attention_heads=2,
                        num_key_value_heads=1, head_dim=8, rms_norm_eps=1e-5, rope_theta=1e4,
                        vocab_size=40, num_heads=2)
    m = ChimeraDraftModel(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    assert m.with_heads(2) is m and m.with_heads(1) is m
    d = m.with_heads(4)
    assert d.cfg.num_heads == 4 and m.cfg.num_heads == 2
    assert torch.equal(d.heads[0].weight, m.heads[0].weight)
    assert torch.equal(d.heads[2].weight, m.heads[1].weight)
    assert torch.equal(d.heads[3].weight, m.heads[1].weight)
    emb = torch.randn(40, 16)
    for x in (m, d):
        x.bind_target(emb, emb)
    tok, hid = torch.randint(0, 40, (1, 9)), torch.randn(1, 9, 16)
    with torch.no_grad():
        own, deep = m.teacher_forced(tok, hid), d.teacher_forced(tok, hid)
    assert len(deep) == 4
    for (w0, _, l0), (w1, _, l1) in zip(own, deep[:2]):
        assert torch.equal(w0, w1) and torch.allclose(l0, l1)
    # the bench's timed prompts: total tokens over total steps, warm-up left out
    rows = [{"steps_by_heads": [100], "tokens_per_step_path_by_heads": [9.0]}]  # warm-up
    rows += [{"steps_by_heads": [10 * (i + 1)], "tokens_per_step_path_by_heads": [1.0 + i % 2]}
             for i in range(NUM_PROMPTS + 3)]
    timed = rows[WARMUP_PROMPTS: WARMUP_PROMPTS + NUM_PROMPTS]
    want = sum(r["steps_by_heads"][0] * r["tokens_per_step_path_by_heads"][0] for r in timed) \
        / sum(r["steps_by_heads"][0] for r in timed)
    assert timed_path(rows) == [round(want, 4)] and timed_path([]) == []


def test_a_corpus_keeps_its_own_split(tmp_path):
    import argparse
    import json

    from vllm_selfspec.offline import corpus

    args = argparse.Namespace(seed=3, max_response_tokens=256, held_out=256)
    # a new folder: --seed's split, float32 ShareGPT answers
    new = train_chimera.corpus_limits(tmp_path, args)
    assert (new.seed, new.dtype, new.prompts) == (3, "float32", corpus.SHAREGPT)
    # a corpus made with another seed keeps its split, dtype and prompt sets
    made = corpus.Limits(seed=1, dtype="bfloat16", prompts="sharegpt,logiqa")
    (tmp_path / corpus.STAMP_FILE).write_text(json.dumps({"limits": made.to_json()}))
    assert train_chimera.corpus_limits(tmp_path, args) == made


def test_skip_tokens_trains_on_the_later_records_only(small_vocab_model_path, tmp_path):
    from transformers import AutoTokenizer

    from vllm_selfspec.offline import chimera_data as cd
    from vllm_selfspec.offline import corpus

    common = ["--model", small_vocab_model_path, "--labels", "teacher-forced", "--heads", "2",
              "--draft-vocab", "256", "--epochs", "1", "--held-out", "4",
              "--held-out-tokens", "200", "--batch-tokens", "1024", "--max-seq", "256"]
    full = train_chimera.main([*common, "--tokens", "600", "--out",
                               str(tmp_path / "full.safetensors")])["training"]
    later = train_chimera.main([*common, "--tokens", "600", "--skip-tokens", "300", "--out",
                                str(tmp_path / "later.safetensors")])["training"]
    # the records the trainer reads, in its order: the later run has the first ones' tokens less
    tok = AutoTokenizer.from_pretrained(small_vocab_model_path)
    convs, _ = cd.split(cd.sharegpt_prompts(), held_out=4, seed=0)
    recs = corpus.take(cd.teacher_forced_records(tok, convs, 600, max_tokens=256), 600)
    first = corpus.take(recs, 300)
    assert 0 < len(first) < len(recs)
    assert later["skipped_tokens"] == 300 and "skipped_tokens" not in full
    assert later["sequences"] == full["sequences"] - len(first)
    assert later["answer_tokens"] == full["answer_tokens"] - sum(len(r["response"]) for r in first)
    with pytest.raises(SystemExit, match="leaves none"):
        train_chimera.main([*common, "--tokens", "300", "--skip-tokens", "100000", "--out",
                            str(tmp_path / "none.safetensors")])
