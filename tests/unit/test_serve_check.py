"""tools/serve_check.py's client side against a fake OpenAI server (no engine): concurrent
clients, streams that hang up, the comparison with plain answers, the probes, the table."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from vllm_selfspec.offline import serve_check as sc


class Fake(BaseHTTPRequestHandler):
    """Greedy answers that depend on the prompt only, unless ``wrong`` names the prompt."""

    wrong = ""
    aborted = 0

    def log_message(self, *a):
        pass

    def _send(self, status, body, ctype="application/json"):
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):
        if self.path == "/health":
            self._send(200, b"")
        elif self.path == "/metrics":
            self._send(200, (
                "# HELP x\nvllm:num_preemptions_total{engine=\"0\"} 3.0\n"
                f"vllm:request_success_total{{finished_reason=\"abort\"}} {Fake.aborted}.0\n"
                "vllm:request_success_total{finished_reason=\"length\"} 9.0\n"
                "vllm:spec_decode_num_drafts_total 12.0\n").encode(), "text/plain")

    def do_POST(self):
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        except json.JSONDecodeError:
            return self._send(400, {"error": {"message": "bad json"}})
        if body.get("model") != "m":
            return self._send(404, {"error": {"message": "no model"}})
        if body.get("max_tokens", 1) < 0 or body.get("min_p"):
            return self._send(400, {"error": {"message": "min_p is not supported"}})
        text = body.get("prompt") or body["messages"][0]["content"]
        ids = [ord(c) for c in text[: body["max_tokens"]]]
        if text == Fake.wrong:
            ids = ids[::-1]
        chat = "messages" in body
        if not body.get("stream"):
            choice = {"token_ids": ids, "finish_reason": "length"}
            choice.update({"message": {"content": text}} if chat else {"text": text})
            return self._send(200, {"choices": [choice]})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for t in ids:
                c = {"token_ids": [t]}
                c.update({"delta": {"content": chr(t)}} if chat else {"text": chr(t)})
                self.wfile.write(f"data: {json.dumps({'choices': [c]})}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            Fake.aborted += 1


@pytest.fixture
def fake():
    srv = ThreadingHTTPServer((sc.HOST, 0), Fake)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    Fake.wrong = ""
    yield srv.server_address[1]
    srv.shutdown()


PROMPTS = ["abcdefgh" * 8, "the quick brown fox " * 4, "0123456789" * 5]


def _load(port, reference, fill, **kw):
    s = sc.Settings(model="m", clients=3, duration=1.5, max_tokens=16, aborts=2,
                    progress=False, **kw)
    load = sc.Load(port, s, PROMPTS, reference, fill_reference=fill)
    load.run("test")
    return load


def test_plain_fills_the_reference_and_a_method_is_compared_with_it(fake):
    ref = {}
    plain = _load(fake, ref, True)
    assert plain.failed == 0 and plain.served > 2 * len(PROMPTS)
    assert set(ref) == {f"{p}:{e}" for p in range(len(PROMPTS)) for e in sc.ENDPOINTS}
    same, compared, _ = plain.identical()
    assert same == compared == plain.served
    assert len(plain.aborts) == 2 and all(a["hung_up"] for a in plain.aborts)
    assert all(a["at"] < plain.last_ok for a in plain.aborts)

    Fake.wrong = PROMPTS[1]  # this "method" answers one prompt differently
    method = _load(fake, ref, False)
    same, compared, diffs = method.identical()
    assert compared == method.served and 0 < same < compared
    assert diffs and all(d.startswith("1:") for d in diffs)


def test_streamed_and_unstreamed_answers_agree(fake):
    job = sc.Job(0, "chat", False)
    body = sc.request_body("m", "chat", PROMPTS[0], 16, False)
    a = sc.generate(fake, job.endpoint, body, 10)
    b = sc.generate(fake, job.endpoint, {**body, "stream": True}, 10)
    assert a["ok"] and b["ok"] and sc.same_answer(a, b) and a["text"][:16] == b["text"]
    bad = sc.generate(fake, "completion", {**body, "model": "x"}, 10)
    assert not bad["ok"] and bad["status"] == 404


def test_metrics_and_probes(fake):
    m = sc.metrics(fake)
    assert sc._count(m, "num_preemptions") == 3 and sc._count(m, "spec_decode_num_drafts") == 12
    assert sc._count(m, "request_success:length") == 9
    s = sc.Settings(model="m", sampling_probes=("min_p", "stop"))
    bad = sc.probe_bad_requests(fake, s)
    assert bad["malformed_json"] == 400 and bad["unknown_model"] == 404
    samp = sc.probe_sampling(fake, s)
    assert samp["min_p"]["status"] == 400 and "min_p" in samp["min_p"]["message"]
    assert samp["stop"]["status"] == 200


def _rec(server, **kw):
    base = dict(method="x", server=server, served=10, failed=0, identical=10, compared=10,
                aborts=2, aborts_survived=2, preemptions=0, up_after=True)
    return {**base, **kw}


def test_rows_say_what_went_wrong():
    s = sc.Settings(model="m")
    faults = {"hook_on": True, "logged": 1, "injected_in_log": True, "failed_steps": 4,
              "drafts_after_first_fault": 30}
    good = sc.summarize("ngrammys", [
        _rec("load", bad_requests={"a": 400, "b": 404},
             sampling={"min_p": {"status": 400}, "stop": {"status": 200}}),
        _rec("stress", preemptions=5, faults=faults)], s)
    assert good["problems"] == [] and good["refused"] == ["min_p"] and good["served"] == 20
    assert "| `ngrammys` | 20 | 0 | 20/20 | 4/4 | yes (5) | yes (4 steps) | 2/2 | `min_p` |" in \
        sc.table([good])
    bad = sc.summarize("swift", [
        _rec("load", identical=9, bad_requests={"a": 500}, sampling={"n": {"status": 500}}),
        _rec("stress", preemptions=0, faults={**faults, "logged": 2})], s)
    text = " | ".join(bad["problems"])
    for what in ("differ from plain", "without a 4xx", "5xx", "no preemption", "faults not survived"):
        assert what in text
    down = sc.summarize("chimera", [{"method": "chimera", "server": "load", "error": "exited\nlog"}], s)
    assert any("exited" in p for p in down["problems"]) and not down["up_after"]


def test_prompts_fit_and_kv_sizing(model_path):
    assert sc.kv_bytes_per_token(model_path) == 30 * 2 * 3 * 64 * 4  # SmolLM2-135M, fp32
    jobs = sc.jobs_for(3)
    assert [j.stream for j in jobs[:6]] == [False] * 6 and len({j.key for j in jobs}) == 6
