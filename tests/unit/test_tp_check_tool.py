"""tools/tp_check.py without an engine: verdicts, refusal lines, rank counters, the shim."""

import subprocess
import sys
from pathlib import Path

from vllm_selfspec.methods import SelfSpecConfigError
from vllm_selfspec.offline import tp_check as tc

ROOT = Path(__file__).resolve().parents[2]


def test_verdicts():
    ref = [[1, 2, 3], [4, 5]]
    assert tc.verdict({"status": "ran", "token_ids": [[1, 2, 3], [4, 5]]}, ref) == {
        "result": "identical"}
    v = tc.verdict({"status": "ran", "token_ids": [[1, 2, 3], [4, 6]]}, ref)
    assert v == {"result": "differs", "first_difference": {"prompt": 1, "position": 1}}
    v = tc.verdict({"status": "ran", "token_ids": [[1, 2], [4, 5]]}, ref)
    assert v["first_difference"] == {"prompt": 0, "position": 2}
    v = tc.verdict({"status": "refused", "message": "vllm_selfspec: no."}, ref)
    assert v == {"result": "refused", "message": "vllm_selfspec: no."}
    assert tc.verdict({"status": "timeout", "message": "no result after 9 s"}, ref)["result"] \
        == "timeout"


def test_refusal_line_is_found_inside_wrapped_errors():
    e = ValueError("1 validation error for VllmConfig\n  Value error, vllm_selfspec: method "
                   "'chimera' does not support tensor parallelism. Use tp 1. [type=value_error]")
    assert tc.refusal(e).startswith("vllm_selfspec: method 'chimera' does not support")
    assert tc.refusal(SelfSpecConfigError("vllm_selfspec: x")) == "vllm_selfspec: x"
    assert tc.refusal(RuntimeError("CUDA out of memory")) is None


def test_ranks_agree():
    same = {"draft_forwards": 7, "score_forwards": 2, "plans_from_rank_0": 40}
    assert tc.ranks_agree({"ranks": [{"rank": 0, **same}, {"rank": 1, **same}]})
    other = {**same, "draft_forwards": 6}
    assert not tc.ranks_agree({"ranks": [{"rank": 0, **same}, {"rank": 1, **other}]})
    assert tc.ranks_agree({}) is None


def test_defaults_and_ngrammys_without_a_table():
    a = tc.parse_args([])
    assert a.tp == 2 and a.executors == ["mp", "ray"] and a.methods == ["all"]
    assert a.model == "qwen2.5-coder-0.5b" and a.out == "results/tp/tp2.json"
    assert tc.METHOD_OPTIONS["ngrammys"] == {"bigram_table": "none"}


def test_method_entries_with_extra_keys():
    assert tc.method_spec("selfspec:cost_gate=false,num_speculative_tokens=4") == {
        "method": "selfspec", "cost_gate": False, "num_speculative_tokens": 4}
    assert tc.method_spec("ngrammys") == {"method": "ngrammys", "bigram_table": "none"}


def test_cpu_binding_splits_the_cores(monkeypatch):
    monkeypatch.setattr(tc.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert tc.cpu_binding(2) == "0,1|2,3" and tc.cpu_binding(4) == "0|1|2|3"


def test_shim_help():
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "tp_check.py"), "--help"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "tensor_parallel_size" in r.stdout
