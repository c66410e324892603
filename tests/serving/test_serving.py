"""Every method in serving, with tools/serve_check.py's own code: real `vllm serve` servers
on loopback under concurrent clients, next to a plain server's answers; aborted streams,
preemption from a small KV cache, draft failures injected by the drafter's test hook
(VLLM_SELFSPEC_FAULT_EVERY), bad requests and refused sampling parameters.

- ``test_short_serving`` (marker ``serving``, in ``make test``): plain and ``ngrammys``, one
  small-KV server each (preemption), 4 clients for 20 s, one aborted stream, one bad request,
  one refused sampling parameter, a draft failure every 10th step.
- ``test_method_in_serving`` (marker ``serving_full``, skipped by default: ``make
  test-serving``): every registered method, 8 clients for a minute on a small-KV server with
  faults injected (the README's "Serving under load").
"""

import pytest

from vllm_selfspec import methods
from vllm_selfspec.offline import serve_check as sc


def _explain(result, row):
    return "\n".join(row["problems"]) + "\n" + result["table"]


@pytest.mark.serving
@pytest.mark.serve
@pytest.mark.engine
def test_short_serving(tmp_path):
    # 4 clients' requests (50-230 prompt + 96 answer tokens) need more than the 16 usable
    # 32-token blocks of a 544-token KV cache, so vLLM preempts
    s = sc.Settings(methods=["ngrammys"], servers=("stress",), clients=4, stress_duration=20,
                    num_prompts=8, max_tokens=96, stress_kv_tokens=544, aborts=1, fault_every=10,
                    bad_requests=("malformed_json",), sampling_probes=("min_p",),
                    log_dir=str(tmp_path), progress=False)
    result = sc.run(s)
    plain, ngrammys = result["rows"]
    for row in (plain, ngrammys):
        assert not row["problems"], _explain(result, row)
        assert row["served"] > 0 and row["identical"] == row["compared"] == row["served"]
        assert row["aborts_survived"] == 1 and row["preemptions"] > 0
        assert row["bad_4xx"] == 1 and row["up_after"]
    assert plain["refused"] == [] and ngrammys["refused"] == ["min_p"]
    control = ngrammys["request_control"]  # drafting off, a JSON schema, a bad draft limit
    assert control["on"]["drafted"] > 0 and control["off"]["drafted"] == 0, control
    assert control["off"]["identical"] and control["json_schema"]["identical"], control
    assert control["malformed"]["status"] == 400 and "\n" not in control["malformed"]["message"]
    spec_on = control["on"]["per_request"]  # vLLM's metrics.speculative_decoding
    assert spec_on["num_draft_tokens"] > 0 and spec_on["num_spec_tokens"] > 0, control
    assert not (control["off"]["per_request"] or {}).get("num_draft_tokens"), control
    d = ngrammys["drafter"]  # the drafter's own figures on /metrics
    assert d["steps"] > 0 and sum(d["drafts"].values()) > 0 and d["draft_failures"] >= 1, d
    assert 0 < d["draft_time_share"] < 1, d
    f = ngrammys["faults"]
    assert ngrammys["faults_survived"] and f["logged"] == 1 and f["drafts_after_first_fault"] > 0


@pytest.fixture(scope="module")
def full_check(tmp_path_factory):
    out = tmp_path_factory.mktemp("serve-check")
    s = sc.Settings(methods=list(methods.METHODS), log_dir=str(out / "logs"), progress=False)
    return sc.run(s, log_path=out / "serve-check.log.jsonl")


@pytest.mark.serving
@pytest.mark.serving_full
@pytest.mark.parametrize("method", [sc.PLAIN, *methods.METHODS])
def test_method_in_serving(full_check, method):
    row = next(r for r in full_check["rows"] if r["method"] == method)
    assert not row["problems"], _explain(full_check, row)
    assert row["served"] > 0 and row["failed"] == 0 and row["identical"] == row["compared"]
    assert row["aborts"] > 0 and row["aborts_survived"] == row["aborts"]
    assert row["preemptions_survived"] and row["up_after"]
    assert row["bad_4xx"] == row["bad_total"] > 0
    if method != sc.PLAIN:
        assert row["faults_survived"]
        assert {"min_p", "logit_bias"} <= set(row["refused"])  # vLLM's own refusal
