"""tools/corpus.py: the target's own answers (transformers route, tiny model), stamped and
resumable, refused for another model or other limits, the source of a datastore and of
Chimera's training data."""

import json

import numpy as np
import pytest

from vllm_selfspec.offline import corpus


@pytest.fixture(scope="module")
def tiny_corpus(small_vocab_model_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    args = ["--model", small_vocab_model_path, "--out", str(folder), "--engine", "transformers",
            "--tokens", "300", "--held-out-tokens", "60", "--held-out", "4",
            "--max-tokens", "24", "--num-seqs", "8", "--states"]
    corpus.main(args)
    return folder, args


def test_answers_are_stamped_and_split(tiny_corpus, small_vocab_model_path):
    folder, _ = tiny_corpus
    stamp = json.loads((folder / corpus.STAMP_FILE).read_text())
    train = [json.loads(x) for x in (folder / corpus.TRAIN_FILE).read_text().splitlines()]
    held = [json.loads(x) for x in (folder / corpus.HELD_OUT_FILE).read_text().splitlines()]
    assert stamp["splits"]["train"]["answer_tokens"] == sum(len(r["response"]) for r in train)
    assert stamp["splits"]["train"]["answer_tokens"] >= 300
    assert stamp["splits"]["held_out"]["records"] == len(held) and len(held) <= 4
    assert not {r["id"] for r in train} & {r["id"] for r in held}
    assert all(0 < len(r["response"]) <= 24 for r in train)
    assert stamp["limits"] == {"max_prompt_tokens": 512, "max_tokens": 24, "held_out": 4,
                               "seed": 0, "dtype": "float32", "prompts": "sharegpt"}
    assert stamp["prompts"] == corpus.PROMPT_SOURCE
    assert stamp["answers"] == "greedy (temperature 0), float32"
    assert stamp["benchmark_filter"]["answers_left_out"] == {"held_out": 0, "train": 0}
    assert stamp["engine"] == "transformers" and stamp["generation"]["answer_tokens"] > 0
    from vllm_selfspec.model_info import stamp_from_path

    assert stamp["model"]["fingerprint"] == stamp_from_path(small_vocab_model_path).fingerprint
    # the states cover the records that hold the asked-for tokens
    index = json.loads((folder / corpus.TRAIN_STATES / "index.json").read_text())
    assert {i for s in index["shards"] for i in s["ids"]} == \
        {r["id"] for r in corpus.take(train, 300)}


def test_answers_are_greedy_continuations_of_the_model(tiny_corpus, small_vocab_model_path):
    import torch
    from transformers import AutoModelForCausalLM

    folder, _ = tiny_corpus
    rec = json.loads((folder / corpus.TRAIN_FILE).read_text().splitlines()[0])
    model = AutoModelForCausalLM.from_pretrained(small_vocab_model_path, dtype=torch.float32)
    ids = torch.tensor([rec["prompt"] + rec["response"]])
    with torch.inference_mode():
        top = model(ids).logits[0].argmax(-1).tolist()
    n = len(rec["prompt"])
    agree = np.mean([top[n - 1 + i] == t for i, t in enumerate(rec["response"])])
    assert agree >= 0.9  # left padding in a batch may flip a near-tie, rarely


def test_a_second_run_generates_nothing(tiny_corpus):
    folder, args = tiny_corpus
    before = json.loads((folder / corpus.STAMP_FILE).read_text())
    lines = (folder / corpus.TRAIN_FILE).read_text()
    corpus.main(args)
    after = json.loads((folder / corpus.STAMP_FILE).read_text())
    assert (folder / corpus.TRAIN_FILE).read_text() == lines
    assert after["generation"] == before["generation"]
    # a run that only read it names itself apart; the answering run's command stays
    assert "read_by" in after and "read_by" not in before
    assert after["command"] == before["command"] and after["date"] == before["date"]


def test_other_limits_or_model_are_refused(tiny_corpus, model_path):
    folder, args = tiny_corpus
    with pytest.raises(corpus.CorpusMismatch, match="max_tokens 24 != 32"):
        corpus.main([*args, "--max-tokens", "32"])
    with pytest.raises(corpus.CorpusMismatch, match="dtype float32 != bfloat16"):
        corpus.main([*args, "--dtype", "bfloat16"])
    with pytest.raises(corpus.CorpusMismatch, match="prompts sharegpt != sharegpt,truthfulqa"):
        corpus.main([*args, "--prompts", "sharegpt,truthfulqa"])
    with pytest.raises(corpus.CorpusMismatch, match="another model"):
        corpus.main([*args[:1], model_path, *args[2:]])
    with pytest.raises(SystemExit):  # argparse's one-line error
        corpus.main([*args, "--prompts", "sharegpt,xsum"])  # a bench prompt set


def test_a_stamp_from_before_prompt_sets_reads_as_sharegpt(tiny_corpus, tmp_path,
                                                           small_vocab_model_path):
    import shutil

    from vllm_selfspec.model_info import stamp_from_path

    folder, _ = tiny_corpus
    old = tmp_path / "old"
    shutil.copytree(folder, old)
    stamp = json.loads((old / corpus.STAMP_FILE).read_text())
    for key in ("prompts", "dtype"):
        del stamp["limits"][key]
    (old / corpus.STAMP_FILE).write_text(json.dumps(stamp))
    model = stamp_from_path(small_vocab_model_path)
    limits = corpus.Limits(max_tokens=24, held_out=4)
    corpus.check_stamp(old, model, limits)  # float32 ShareGPT, as it was made
    assert corpus.read_limits(old).prompts == "sharegpt"
    with pytest.raises(corpus.CorpusMismatch, match="prompts sharegpt != sharegpt,mmlu"):
        corpus.check_stamp(old, model, corpus.Limits(max_tokens=24, held_out=4,
                                                     prompts="sharegpt,mmlu"))


def test_prompt_sets_take_turns_and_keep_their_own_held_out_split():
    from vllm_selfspec.offline import chimera_data as cd

    train, held = corpus.prompts(corpus.Limits(prompts="sharegpt,logiqa,truthfulqa"))
    assert [c.id.split("-")[0] for c in train[1:3]] == ["logiqa", "truthfulqa"]
    assert [c.id.split("-")[0] for c in held[1:3]] == ["logiqa", "truthfulqa"]
    assert not {c.id for c in train} & {c.id for c in held}
    sharegpt_train, sharegpt_held = corpus.prompts(corpus.Limits())
    assert [c.id for c in held[::3]][:100] == [c.id for c in sharegpt_held][:100]
    assert [c.id for c in train if "-" not in c.id or not c.id.startswith(
        ("logiqa-", "truthfulqa-"))] == [c.id for c in sharegpt_train]
    # a task set keeps an eighth of itself out at most
    assert sum(c.id.startswith("truthfulqa-") for c in held) == 817 // 8
    # ShareGPT alone: the split and order of every corpus made before prompt sets
    a, b = cd.split(cd.sharegpt_prompts(), held_out=corpus.HELD_OUT_PROMPTS, seed=0)
    assert [c.id for c in sharegpt_train] == [c.id for c in a]
    assert [c.id for c in sharegpt_held] == [c.id for c in b]
    assert corpus.describe_prompts("sharegpt,logiqa").startswith(corpus.PROMPT_SOURCE + "; logiqa")
    with pytest.raises(ValueError, match="name each prompt set once"):
        corpus.prompt_sets("logiqa,logiqa")


def test_a_chunk_never_overshoots_a_small_budget_by_a_whole_chunk():
    from vllm_selfspec.offline.chimera_data import _chunk_size

    assert _chunk_size(1024, 256, None, 0, 0) == 1024  # no budget: whole chunks
    assert _chunk_size(1024, 256, 40_000, 0, 0) == 313  # 40,000 tokens at 128 a prompt
    assert _chunk_size(1024, 256, 40_000, 30_000, 100) == 256  # never under one batch
    assert _chunk_size(1024, 256, 10_000_000, 200, 1) == 1024  # never over a chunk


def test_datastore_of_the_models_own_text(tiny_corpus, small_vocab_model_path, tmp_path):
    from vllm_selfspec.offline import build_datastore
    from vllm_selfspec.proposers.datastore import Datastore
    from vllm_selfspec.proposers.past_requests import SEPARATOR

    folder, _ = tiny_corpus
    tokens, meta = corpus.datastore_tokens(folder, 10_000, small_vocab_model_path)
    train = [json.loads(x) for x in (folder / corpus.TRAIN_FILE).read_text().splitlines()]
    assert int((tokens == SEPARATOR).sum()) == len(train) == meta["documents"]
    # the training answers in file order, each closed by the separator; no held-out answer
    want = np.concatenate([np.asarray([*r["response"], SEPARATOR]) for r in train])
    assert np.array_equal(tokens, want)
    out = tmp_path / "own.safetensors"
    build_datastore.main(["--model", small_vocab_model_path, "--corpus", str(folder),
                          "--out", str(out)])
    store = Datastore.load(out)
    assert store.meta["source"].startswith("the model's own") and store.corpus_tokens == tokens.size


def test_an_answer_that_quotes_a_benchmark_text_is_left_out(small_vocab_model_path):
    from transformers import AutoTokenizer

    from vllm_selfspec.builders.benchmark_filter import benchmark_texts

    tok = AutoTokenizer.from_pretrained(small_vocab_model_path)
    quote = next(t for t in benchmark_texts() if len(t.split()) > 30)  # an MT-bench question
    recs = [{"id": "clean", "response": tok.encode("A plain answer about cooking rice.")},
            {"id": "quoting", "response": tok.encode("Sure. " + quote)}]
    assert [r["id"] for r in corpus.decontaminated(recs, tok)] == ["clean"]


def test_chimera_trains_from_the_corpus(tiny_corpus, small_vocab_model_path, tmp_path):
    from vllm_selfspec.offline import train_chimera

    folder, _ = tiny_corpus
    mtime = (folder / corpus.TRAIN_FILE).stat().st_mtime
    report = train_chimera.main([
        "--model", small_vocab_model_path, "--tokens", "200", "--out",
        str(tmp_path / "c.safetensors"), "--corpus", str(folder), "--heads", "2",
        "--draft-vocab", "256", "--epochs", "1", "--held-out", "4", "--held-out-tokens", "40",
        "--max-response-tokens", "24", "--batch-tokens", "1024", "--max-seq", "256",
        "--scaling-points", "50,100"])
    assert (folder / corpus.TRAIN_FILE).stat().st_mtime == mtime  # nothing generated
    assert 200 <= report["training"]["answer_tokens"] < 300
    assert report["training"]["labels"] == "self"
    # the scaling curve: one measured point (and a loadable snapshot) per token count
    scaling = report["training"]["scaling"]
    assert [p["tokens"] for p in scaling] == [50, 100]
    assert all(len(p["top1"]) == 2 and p["tokens_per_step"] >= 1.0 for p in scaling)
    from vllm_selfspec.model_info import stamp_from_path
    from vllm_selfspec.proposers.chimera import check_checkpoint

    meta = check_checkpoint(scaling[0]["checkpoint"], stamp_from_path(small_vocab_model_path))
    assert meta["training"]["answer_tokens"] == 50
    assert (tmp_path / "c.safetensors.work" / "c.scaling.png").exists()
