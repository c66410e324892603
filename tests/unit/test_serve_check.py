"""tools/serve_check.py's client side against a fake OpenAI server (no engine): concurrent
clients, streams that hang up, the comparison with plain answers, the probes, the table."""

import json
import sys
from pathlib import Path

import pytest
from fake_openai import Fake, serve

from vllm_selfspec.offline import serve_check as sc


@pytest.fixture
def fake():
    srv = serve()
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
    n = sc._count(m, "request_success:length")
    assert sc._count(m, "num_preemptions") == n // 3 and sc._count(m, "spec_decode_num_drafts") == 4 * n
    s = sc.Settings(model="m", sampling_probes=("min_p", "stop"))
    bad = sc.probe_bad_requests(fake, s)
    assert bad["malformed_json"] == 400 and bad["unknown_model"] == 404
    samp = sc.probe_sampling(fake, s)
    assert samp["min_p"]["status"] == 400 and "min_p" in samp["min_p"]["message"]
    assert samp["stop"]["status"] == 200


def test_request_control_probe(fake):
    s = sc.Settings(model="m")
    ref = {}
    plain = sc.probe_request_control(fake, s, ref, plain=True)
    assert set(ref) == {"control:on", "control:off", "control:json_schema"}
    assert "malformed" not in plain
    Fake.wrong = sc.control_requests("m")["json_schema"]["messages"][0]["content"]
    method = sc.probe_request_control(fake, s, ref, plain=False)
    assert method["on"]["drafted"] == 3 and method["off"]["drafted"] == 0
    assert method["on"]["identical"] and method["off"]["identical"]
    assert not method["json_schema"]["identical"]  # this "method" answers it differently
    assert method["malformed"] == {"status": 400, "message": "num_speculative_tokens must be "
                                                             "an integer in [0, 128]"}
    row = sc.summarize("ngrammys", [_rec("stress", preemptions=1, request_control=method)], s)
    assert any("json_schema request differs" in p for p in row["problems"])
    assert "schema NO, malformed 400" in sc.table([row])


def _rec(server, **kw):
    base = dict(method="x", server=server, served=10, failed=0, identical=10, compared=10,
                aborts=2, aborts_survived=2, preemptions=0, up_after=True)
    return {**base, **kw}


def test_rows_say_what_went_wrong():
    s = sc.Settings(model="m")
    faults = {"hook_on": True, "logged": 1, "injected_in_log": True, "failed_steps": 4,
              "drafts_after_first_fault": 30}
    drafter = {"steps": 50.0, "drafts": {"context": 20, "bigram": 3}, "draft_failures": 4.0,
               "draft_time_share": 0.12}
    good = sc.summarize("ngrammys", [
        _rec("load", bad_requests={"a": 400, "b": 404}, drafter=drafter,
             sampling={"min_p": {"status": 400}, "stop": {"status": 200}}),
        _rec("stress", preemptions=5, faults=faults, drafter=drafter)], s)
    assert good["problems"] == [] and good["refused"] == ["min_p"] and good["served"] == 20
    assert "| `ngrammys` | 20 | 0 | 20/20 | 4/4 | yes (5) | yes (4 failed steps) | 2/2 | `min_p` " \
        "| — | yes |" in sc.table([good])
    bad = sc.summarize("swift", [
        _rec("load", identical=9, bad_requests={"a": 500}, sampling={"n": {"status": 500}},
             up_after=False),
        _rec("stress", preemptions=0, faults={**faults, "logged": 2})], s)
    text = " | ".join(bad["problems"])
    for what in ("differ from plain", "without a 4xx", "5xx", "no preemption", "faults not survived",
                 "not answering", "figures are not on /metrics"):
        assert what in text
    assert sc.table([bad]).endswith("| NO (`n` got 500) |")
    down = sc.summarize("chimera", [{"method": "chimera", "server": "load", "error": "exited\nlog"}], s)
    assert any("exited" in p for p in down["problems"]) and not down["up_after"]


def test_prompts_fit_and_kv_sizing(model_path):
    assert sc.kv_bytes_per_token(model_path) == 30 * 2 * 3 * 64 * 4  # SmolLM2-135M, fp32
    jobs = sc.jobs_for(3)
    assert len({j.key for j in jobs[:6]}) == 6 and {j.stream for j in jobs[:2]} == {False, True}
    assert {(j.key, j.stream) for j in jobs} == {(k, st) for k in {j.key for j in jobs}
                                                  for st in (False, True)}


class FakeServer(sc.Server):
    """tests/unit/fake_openai.py in place of `vllm serve`; the `swift` one answers the second
    prompt differently."""

    def __init__(self, model_path, served_name, spec, *args):
        super().__init__(model_path, served_name, spec, *args)
        wrong = PROMPTS[1] if spec and spec["method"] == "swift" else ""
        self.cmd = [sys.executable, str(Path(__file__).with_name("fake_openai.py")),
                    str(self.port), served_name, wrong]


def test_the_whole_check_resumes_and_reports(tmp_path, monkeypatch):
    import vllm_selfspec.assets

    monkeypatch.setattr(sc, "Server", FakeServer)
    monkeypatch.setattr(sc, "load_prompt_texts", lambda model_path, s: PROMPTS)
    monkeypatch.setattr(sc, "kv_bytes_per_token", lambda model_path: 1)
    monkeypatch.setattr(vllm_selfspec.assets, "resolve_model", lambda name: name)
    out = tmp_path / "check.json"
    argv = ["--model", "m", "--methods", "ngrammys,swift", "--duration", "1", "--stress-duration",
            "2.5", "--clients", "2", "--aborts", "1", "--no-progress", "--json", str(out),
            "--log-dir", str(tmp_path / "logs"), "--sampling-probes", "min_p,stop",
            "--bad-requests", "malformed_json,unknown_model,negative_max_tokens"]
    with pytest.raises(SystemExit):  # swift differs from plain
        sc.main(argv)
    result = json.loads(out.read_text())
    rows = {r["method"]: r for r in result["rows"]}
    assert list(rows) == ["plain", "ngrammys", "swift"]
    for m in ("plain", "ngrammys"):
        assert rows[m]["problems"] == [], rows[m]["problems"]
    assert rows["ngrammys"]["faults_survived"] and rows["ngrammys"]["refused"] == ["min_p"]
    assert rows["ngrammys"]["bad_4xx"] == rows["ngrammys"]["bad_total"] == 3
    assert [p for p in rows["swift"]["problems"] if "differ from plain" in p]
    assert result["command"].startswith("python tools/serve_check.py --model m")
    assert "| `min_p` | **400** | **400** | **400** |" in result["sampling_table"]
    assert rows["ngrammys"]["drafter"]["drafts"]["context"] > 0
    assert "| `ngrammys` |" in result["drafter_table"] and "context" in result["drafter_table"]
    on = rows["ngrammys"]["request_control"]["on"]
    assert on["per_request"]["num_draft_tokens"] == on["drafted"] > 0

    def no_server(*a, **kw):
        raise AssertionError("a resumed run restarted a finished server")

    monkeypatch.setattr(FakeServer, "start", no_server)
    with pytest.raises(SystemExit):
        sc.main(argv + ["--resume"])
    assert json.loads(out.read_text())["table"] == result["table"]
