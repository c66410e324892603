"""tools/swift_stream.py --shift-from: the re-entry stream is the prompts a fixed set
accepted most, then those it accepted least."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_selfspec.builders import datasets
from vllm_selfspec.offline import swift_stream
from vllm_selfspec.proposers.artifacts import append_jsonl


def _log(path: Path) -> None:
    rates = {"a-1": 0.5, "a-2": 0.1, "b-1": 0.3, "b-2": 0.6, "b-3": 0.2}
    for i, (pid, rate) in enumerate(rates.items()):
        task = pid.split("-")[0]
        for method, acc in (("selfspec", rate), ("swift", 1.0 - rate)):
            append_jsonl(path, {"method": method, "index": i, "task": task, "id": pid,
                                "draft_tokens": 100, "accepted": int(100 * acc)})
    append_jsonl(path, {"method": "selfspec", "summary": True, "seconds": 1.0})


def test_shift_stream_orders_high_then_low(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "s.log.jsonl"
    _log(log)
    asked = []

    def fake_load(name: str, tok: object, split: str, n: int, max_tokens: int) -> list:
        asked.append((name, n))
        return [datasets.Prompt(f"{name}-{i}", "", [i]) for i in range(1, n + 1)]

    monkeypatch.setattr(datasets, "load_prompts", fake_load)
    stream = swift_stream.shift_stream(log, "selfspec", 2, None, 64)
    assert [(t, p.id) for t, p in stream] == [("high", "b-2"), ("high", "a-1"),
                                              ("low", "b-3"), ("low", "a-2")]
    assert sorted(asked) == [("a", 2), ("b", 3)]  # each task reloaded as far as the log went
    with pytest.raises(SystemExit, match="need 6"):
        swift_stream.shift_stream(log, "selfspec", 3, None, 64)
