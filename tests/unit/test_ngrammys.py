"""N-Grammys without an engine: the context matcher, the mixed rows, kept rows, the
table file (format, stamp checks) and tools/build_bigram.py on a tiny model (small
vocabulary: the build forwards every token, so its cost grows with V squared)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vllm_selfspec.proposers.artifacts import ArtifactMismatchError, ModelStamp
from vllm_selfspec.proposers.base import DraftBatch, DraftRequest
from vllm_selfspec.proposers.ngram_tables import BigramTable, BigramTableError, repeated_extension
from vllm_selfspec.proposers.ngrammys import (
    NGrammysProposer,
    agreement_cut,
    context_rows,
    counted_context_rows,
    mixed_rows,
)
from vllm_selfspec.proposers.resolved import Artifacts

ROOT = Path(__file__).resolve().parents[2]


def toy_table(v: int = 10, k: int = 3, w: int = 3) -> BigramTable:
    ids = np.array([[(x + j + 1) % v for j in range(k)] for x in range(v)], dtype=np.int32)
    probs = np.tile(np.array([0.5, 0.3, 0.2][:k], dtype=np.float32), (v, 1))
    stamp = ModelStamp("LlamaForCausalLM", 2, 8, v, "abc")
    return BigramTable(ids, probs, np.arange(v, dtype=np.int32), repeated_extension(ids, k, w),
                       stamp)


def test_context_rows_count_then_recency():
    # query = last token 1; continuations after earlier 1s: (2,3) twice, (4,5) once (latest)
    h = np.array([1, 2, 3, 9, 1, 2, 3, 9, 1, 4, 5, 9, 1])
    assert context_rows(h, 1, 2, 5) == [[2, 3], [4, 5]]
    # ties go to the most recent occurrence
    h = np.array([1, 2, 3, 1, 4, 5, 1])
    assert context_rows(h, 1, 2, 5) == [[4, 5], [2, 3]]
    # a longer query, and a match needs w tokens after it
    h = np.array([7, 1, 2, 3, 8, 1, 6, 6, 7, 1])
    assert context_rows(h, 2, 2, 5) == [[2, 3]]
    assert context_rows(np.array([1, 2, 1]), 1, 2, 5) == [[2, 1]]  # may overlap the query
    assert context_rows(np.array([1, 5, 1]), 1, 3, 5) == []
    assert context_rows(h, 1, 2, 0) == []


def test_agreement_cut_drops_minority_tokens():
    # query = last token 1; earlier 1s continue (2,3), (2,4) and, latest, (7,8): every row
    # once, so the paper's order is by recency
    h = np.array([1, 2, 3, 9, 1, 2, 4, 9, 1, 7, 8, 9, 1])
    assert context_rows(h, 1, 2, 5) == [[7, 8], [2, 4], [2, 3]]
    # 7 follows one of the three occurrences: cut to nothing; 4 follows one of the two that
    # agree on 2: kept at 0.5, cut at 0.6 (then (2,3) cuts to the same [2], dropped)
    assert counted_context_rows(h, 1, 2, 5, min_agreement=0.5) == [([2, 4], 1), ([2, 3], 1)]
    assert context_rows_cut(h, 0.6) == [[2]]
    assert context_rows_cut(h, 0.6, limit=1) == [[2]]  # the limit counts rows that remain
    assert context_rows_cut(h, 1.0) == []
    assert agreement_cut(np.array([[2, 3], [2, 4]]), (2, 4), 0.5) == 2
    assert agreement_cut(np.array([[2, 3], [2, 4]]), (2, 4), 0.51) == 1


def context_rows_cut(h: np.ndarray, share: float, limit: int = 5) -> list[list[int]]:
    return [r for r, _ in counted_context_rows(h, 1, 2, limit, min_agreement=share)]


def test_proposer_drafts_the_cut_row():
    h = np.array([1, 2, 3, 9, 1, 2, 4, 9, 1, 7, 8, 9, 1])
    for share, want in ((0.0, [7, 8]), (0.5, [2, 4]), (0.6, [2])):
        p = NGrammysProposer(2, {"query_length": 1, "min_agreement": share}, Artifacts())
        req = DraftRequest(row=0, req_id="r", position=len(h) - 1, token=1, max_len=2)
        out = p.propose(DraftBatch(["r"], [req], h[None], np.asarray([len(h)])))
        assert out.drafts[0] == want, share


def test_repeated_extension_and_rows():
    t = toy_table()
    assert t.rows(4, 2, 3) == [[5, 6, 7], [6, 7, 8]]
    assert t.rows(4, 1, 5) == [[5, 6, 7, 8, 9]]  # wider than stored: repeat top-1
    assert t.rows(99, 2, 2) == []
    assert t.unigram_rows(2) == [[0], [1]]


def test_mixed_rows_context_first_then_bigram():
    t = toy_table()
    h = np.array([3, 1, 2, 3])  # query 3 -> (1, 2); bigram rows after 3: 4.., 5..
    rows = mixed_rows(h, t, 3, 2, max_query=1)
    assert rows == [[1, 2], [4, 5], [5, 6]]
    assert mixed_rows(h, None, 3, 2, 1) == [[1, 2]]


def _propose(p: NGrammysProposer, hist: list[int], rid: str = "a", max_len: int = 8) -> list[int]:
    req = DraftRequest(row=0, req_id=rid, position=len(hist) - 1, token=hist[-1], max_len=max_len)
    return p.propose(DraftBatch([rid], [req], np.asarray([hist]), np.asarray([len(hist)]))).drafts[0]


def test_kept_rows_continue_after_matching_tokens():
    t = toy_table()
    p = NGrammysProposer(3, {"num_rows": 3, "query_length": 1, "bigram_width": 3,
                             "keep_rows": True}, Artifacts(bigram_table=t))
    hist = [3, 1, 2, 9, 3]  # rows: context (1,2,9), bigram (4,5,6), (5,6,7)
    assert _propose(p, hist) == [1, 2, 9]
    # the target emitted 4, 5 (the second row's prefix): its rest comes first
    assert _propose(p, hist + [4, 5]) == [6]
    q = NGrammysProposer(3, {"num_rows": 3, "query_length": 1, "bigram_width": 3,
                             "keep_rows": False}, Artifacts(bigram_table=t))
    _propose(q, hist)
    assert _propose(q, hist + [4, 5]) == [6, 7, 8]  # plain bigram rows after 5
    p.finish({"a"})
    assert p.kept == {}


def test_likelihood_selection_prefers_probable_rows():
    t = toy_table()
    p = NGrammysProposer(2, {"num_rows": 3, "query_length": 1,
                             "selection": "likelihood", "keep_rows": False},
                         Artifacts(bigram_table=t))
    # context row (1, 2) after 3 is not in the bigram rows of 3 (prob 0) -> bigram row wins
    assert _propose(p, [3, 1, 2, 3]) == [4, 5]


def test_drafts_are_labelled_and_capped_by_evidence_class():
    """Each draft says what it came from, for the cost gate's per-class acceptance; the
    gate's limit for that class caps it (0: no draft)."""
    t = toy_table()
    p = NGrammysProposer(3, {"query_length": 2}, Artifacts(bigram_table=t))
    hist = [3, 1, 2, 9, 3, 1, 2, 9, 3, 1]  # (3, 1) seen twice, followed by (2, 9, 3) twice
    req = DraftRequest(row=0, req_id="a", position=len(hist) - 1, token=1, max_len=3)
    batch = DraftBatch(["a"], [req], np.asarray([hist]), np.asarray([len(hist)]))
    out = p.propose(batch)
    assert out.drafts == [[2, 9, 3]] and out.evidence == ["context:q2:x2+"]
    batch.limit = {"context:q2:x2+": 1}.get
    assert p.propose(batch).drafts == [[2]]
    lone = [5, 6, 7]  # no match: a bigram row of 7
    req = DraftRequest(row=0, req_id="b", position=2, token=7, max_len=3)
    batch = DraftBatch(["b"], [req], np.asarray([lone]), np.asarray([3]))
    assert p.propose(batch).evidence == ["bigram"]
    batch.limit = {"bigram": 0}.get
    out = p.propose(batch)
    assert out.drafts == [[]] and p.stats["from_bigram"] == 1  # the held-back row not counted


def test_draft_respects_max_len():
    p = NGrammysProposer(3, {"num_rows": 2, "query_length": 1},
                         Artifacts(bigram_table=toy_table()))
    assert _propose(p, [1, 2], max_len=1) == [3]


def test_table_roundtrip_and_refusals(tmp_path):
    t = toy_table()
    f = tmp_path / "t.safetensors"
    t.save(f)
    u = BigramTable.load(f, expect=t.stamp)
    assert u.rows(4, 2, 3) == t.rows(4, 2, 3)
    other = ModelStamp("LlamaForCausalLM", 2, 8, 10, "def")
    with pytest.raises(ArtifactMismatchError, match="bigram table .* another model"):
        BigramTable.load(f, expect=other)
    with pytest.raises(ArtifactMismatchError, match="vocabulary size"):
        BigramTable.load(f, expect=ModelStamp("LlamaForCausalLM", 2, 8, 12, None))
    with pytest.raises(BigramTableError, match="does not exist"):
        BigramTable.load(tmp_path / "missing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a table")
    with pytest.raises(BigramTableError, match="cannot read"):
        BigramTable.load(tmp_path / "junk.safetensors")


def test_build_bigram_tool_on_tiny_model(small_vocab_model_path, tmp_path):
    import torch

    from vllm_selfspec.builders.bigram import load_model
    from vllm_selfspec.model_info import stamp_from_model as model_stamp

    out = tmp_path / "tiny.safetensors"
    tiny_model_path = small_vocab_model_path
    cmd = [sys.executable, str(ROOT / "tools" / "build_bigram.py"), "--model", tiny_model_path,
           "--top-k", "4", "--width", "3", "--extension", "greedy", "--extend-k", "1",
           "--batch-size", "4096", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)
    model = load_model(tiny_model_path)
    table = BigramTable.load(out, expect=model_stamp(model))
    assert summary["vocab_size"] == table.vocab_size == model.config.vocab_size
    # row x of the table is the top-k of the model's single-token forward
    with torch.inference_mode():
        pre = list(table.meta["prefix"])
        assert pre  # the default prefix (a newline) puts x at position 1
        x = torch.tensor([pre + [5], pre + [123]])
        top = model(input_ids=x).logits[:, -1].topk(4, dim=-1).indices.numpy()
    assert (table.bigram_ids[[5, 123]] == top).all()
    # greedy extension of row 0: decode greedily from [prefix, x, bigram token]
    with torch.inference_mode():
        seq = torch.tensor([pre + [5, int(table.bigram_ids[5, 0])]])
        nxt = int(model(input_ids=seq).logits[0, -1].argmax())
    assert int(table.extended[5, 0, 0]) == nxt
    # rows beyond extend_k are repeated-bigram rows
    assert int(table.extended[5, 1, 0]) == int(table.bigram_ids[table.bigram_ids[5, 1], 0])


@pytest.mark.ray
def test_build_bigram_ray_shards_match_single_process(small_vocab_model_path, tmp_path):
    pytest.importorskip("ray", reason="ray is installed with the [tools] extra")
    tiny_model_path = small_vocab_model_path
    single, sharded = tmp_path / "one.safetensors", tmp_path / "ray.safetensors"
    common = ["--model", tiny_model_path, "--top-k", "3", "--width", "2", "--batch-size", "8192"]
    code = f"""
import sys
from vllm_selfspec.offline import build_bigram
build_bigram.main({common!r} + ["--out", {str(single)!r}])
assert "ray" not in sys.modules  # without --ray nothing imports Ray
import ray
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
build_bigram.main({common!r} + ["--out", {str(sharded)!r}, "--ray", "--ray-workers", "2"])
ray.shutdown()
print("RAY-OK")
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert "RAY-OK" in res.stdout, res.stdout[-3000:] + res.stderr[-3000:]
    a, b = BigramTable.load(single), BigramTable.load(sharded)
    # batch shapes differ between the runs, so float near-ties may order differently
    assert (a.bigram_ids == b.bigram_ids).all(axis=1).mean() > 0.999
    assert a.stamp == b.stamp and a.vocab_size == b.vocab_size


def test_bigram_table_none_drafts_from_the_context_only(monkeypatch):
    """bigram_table "none": nothing is looked up or built at start-up (a 150k-token
    vocabulary takes tens of minutes to build on CPU) and drafts come from the context."""
    from types import SimpleNamespace

    import vllm_selfspec.builders.bigram as bb
    from vllm_selfspec.resolvers import resolve_bigram_table

    def no_build(*a):
        raise AssertionError("no table may be built")

    monkeypatch.setattr(bb, "table_for_model", no_build)
    opts = {"bigram_table": "none"}
    assert resolve_bigram_table(opts, SimpleNamespace(path="/nowhere", stamp=None), {}) == {}
    p = NGrammysProposer(3, opts)
    assert p.table is None
    toks = np.array([[5, 6, 7, 8, 5, 6, 0, 0]])
    batch = DraftBatch(["a", "b"], [DraftRequest(0, "a", 5, 6, 3)], token_ids=toks,
                       num_tokens=np.array([6]))
    assert p.propose(batch).drafts[0] == [7, 8, 5]  # after "5 6": the context's "7 8 5"
    toks = np.array([[1, 2, 3, 4, 0, 0, 0, 0]])  # no match in the context: no draft
    batch = DraftBatch(["a"], [DraftRequest(0, "a", 3, 4, 3)], token_ids=toks,
                       num_tokens=np.array([4]))
    assert p.propose(batch).drafts == [[]]


def test_replay_splits_classes_by_the_bigram_vote():
    """tools/ngrammys_calls.py --agreement: a context row whose first token is the bigram
    table's top-1 successor of the newest token gets the class suffix "b1", else "b0"; the
    per-source lengths give a class whose first token is never accepted no tokens."""
    from vllm_selfspec.offline.ngrammys_calls import bigram_agreement, lengths_by_source

    label = bigram_agreement(toy_table())
    h = np.array([4, 5])
    assert label("context:q1:x1", h, [6, 7]) == "context:q1:x1:b1"  # toy top-1 of 5 is 6
    assert label("history", h, [7]) == "history:b0"
    assert label("bigram", h, [9]) == "bigram"
    steps = [("good", 4, 4)] * 10 + [("bad", 4, 0)] * 10
    lengths = lengths_by_source(steps, 4, 0.031)
    assert lengths["good"]["best_length"] == 4 and lengths["bad"]["best_length"] == 0


def test_row_choice_oracles_bound_the_rules():
    """tools/ngrammys_calls.py --row-choice: an oracle that drafts whichever row the target
    accepts longest is never beaten by a rule over the same rows, and earlier requests help
    a request that repeats an earlier answer."""
    from vllm_selfspec.offline.ngrammys_calls import row_choice

    answer = [7, 3, 3, 8, 0, 6, 2, 2, 9, 4, 1, 5]
    data = [([1, 2], answer), ([5, 1, 2], answer)]
    rows = {r["rule"]: r["chain"]["tokens_per_call"] for r in row_choice(data, toy_table(), 4,
                                                                            64, 0.0)}
    best = rows["oracle: the best of all three"]
    assert all(best >= v for v in rows.values())
    assert rows["oracle: the better of context and history, else bigram"] >= rows[
        "ngrammys-history (context, else history, else bigram)"]
    assert rows["ngrammys-history (context, else history, else bigram)"] > rows[
        "ngrammys (context, else bigram)"]


def test_agreement_study_replays_each_cut():
    """tools/ngrammys_calls.py --agreement --min-agreements: one row per drafter, class set,
    cut and verify price, and the cut reaches the proposer: on a text whose repeated token is
    followed by a different token each time, cutting minority tokens drafts differently."""
    from vllm_selfspec.offline.ngrammys_calls import agreement

    answer = [7, 1, 2, 1, 3, 1, 4, 1, 5, 1, 6, 1, 2, 1, 8, 9]
    data = [([0], answer)]
    rows = agreement(data, data, toy_table(), 4, 0, [0.0], (0.0, 0.9))
    keys = {(r["drafter"], r["classes"], r["min_agreement"]) for r in rows}
    assert ("ngrammys", "evidence classes", 0.9) in keys
    assert ("ngrammys", "classes x bigram agreement", 0.9) not in keys  # cuts: plain classes
    drafted = {r["min_agreement"]: r["drafted_per_step"] for r in rows
               if (r["drafter"], r["classes"]) == ("ngrammys", "evidence classes")}
    assert drafted[0.9] != drafted[0.0]
