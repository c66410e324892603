"""tools/serve_bench.py without an engine: its arguments, the configs it serves, the command
it hands vLLM's benchmark, and the rows, table and plot it makes of the results."""

import json
import math

import pytest

from vllm_selfspec.offline import serve_bench as sb


def test_arguments_and_refusals():
    _, s = sb.parse_args(["--methods", "ngram,selfspec", "--request-rates", "0.5,inf",
                          "--method-config", 'selfspec={"draft_weights": "full"}', "--json", "x"])
    assert s.request_rates == (0.5, math.inf) and s.methods == ["ngram", "selfspec"]
    assert sb.speculative_config("selfspec", s) == {"method": "selfspec", "draft_weights": "full"}
    assert sb.speculative_config("ngram", s)["prompt_lookup_max"] == 4
    assert sb.speculative_config(sb.PLAIN, s) is None
    for bad in (["--request-rates", "0,1"], ["--request-rates", "fast"],
                ["--method-config", 'swift={"a": 1}']):
        with pytest.raises(SystemExit):
            sb.parse_args(["--json", "x", "--methods", "ngram", *bad])
    with pytest.raises(SystemExit, match="unknown method 'nope'"):
        sb.check_methods(["nope"])


def test_bench_command_is_greedy_in_file_order():
    _, s = sb.parse_args(["--json", "x", "--num-prompts", "4", "--max-tokens", "32"])
    cmd = sb.bench_command(8001, "m", "/p", sb.Path("/tmp/p.jsonl"), s, math.inf, sb.Path("/o/r.json"))
    joined = " ".join(cmd)
    for part in ("bench serve", "--dataset-name custom", "--custom-output-len 32",
                 "--num-prompts 4", "--request-rate inf", "--temperature 0", "--disable-shuffle",
                 "--base-url http://127.0.0.1:8001", "--result-filename r.json"):
        assert part in joined


def record(method, rate, tok_s, tpot, texts):
    r = {"method": method, "rate": rate, "output_throughput": tok_s, "texts": texts,
         "spec_decode_acceptance_length": None if method == sb.PLAIN else 2.0}
    for m in sb.METRICS:
        for p in sb.PERCENTILES:
            r[f"p{p}_{m}_ms"] = tpot * (2 if p == 99 else 1)
    return r


def test_rows_table_and_plot(tmp_path):
    recs = [record(sb.PLAIN, 1.0, 100.0, 20.0, ["a", "b"]), record("suffix", 1.0, 150.0, 10.0, ["a", "c"]),
            record(sb.PLAIN, math.inf, 200.0, 40.0, ["a", "b"]), record("suffix", math.inf, 180.0, 50.0, ["a", "b"])]
    rows = sb.summarize(recs)
    by = {(r["method"], r["rate"]): r for r in rows}
    assert by[("suffix", 1.0)]["throughput_vs_plain"] == 1.5
    assert by[("suffix", 1.0)]["tpot_p50_vs_plain"] == 2.0
    assert (by[("suffix", 1.0)]["identical"], by[("suffix", 1.0)]["compared"]) == (1, 2)
    assert by[("suffix", math.inf)]["throughput_vs_plain"] == 0.9
    assert all("texts" not in r for r in rows)
    text = sb.table(rows)
    assert "| inf | `suffix` | 180.0 (0.90x) |" in text and "| 1 | `baseline` | 100.0 |" in text
    sb.plot(rows, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000
    json.dumps(rows)  # rows go to the JSON as they are


def test_each_rate_gets_prompts_of_its_own(monkeypatch, tmp_path):
    """Served again, a rate's prompts would be answered from the drafters' memory of the
    rate before (suffix, ngrammys-history)."""
    import transformers

    from vllm_selfspec.builders import datasets

    class P:
        def __init__(self, i):
            self.text = f"prompt {i}"

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: None)
    monkeypatch.setattr(datasets, "load_prompts", lambda name, tok, split, n, **k: [P(i) for i in range(n)])
    _, s = sb.parse_args(["--json", "x", "--num-prompts", "3", "--request-rates", "0.5,inf"])
    files = sb.write_prompts("/m", s, tmp_path)
    texts = {r: [json.loads(line)["prompt"] for line in f.read_text().splitlines()]
             for r, f in files.items()}
    assert texts == {0.5: ["prompt 0", "prompt 1", "prompt 2"],
                     math.inf: ["prompt 3", "prompt 4", "prompt 5"]}
    monkeypatch.setattr(datasets, "load_prompts", lambda *a, **k: [P(0)])
    with pytest.raises(SystemExit, match="only 1"):
        sb.write_prompts("/m", s, tmp_path)


def test_cells_are_logged_as_they_finish_and_resume_skips_them(monkeypatch, tmp_path):
    from vllm_selfspec import assets

    monkeypatch.setattr(assets, "resolve_model", lambda name: "/m")
    monkeypatch.setattr(sb, "write_prompts", lambda *a: {})
    calls = []

    def fake(method, s, model_path, prompts, work, todo, done):
        calls.append((method, list(todo)))
        for rate in todo:
            if method == "ngrammys" and rate == math.inf and fail:
                raise SystemExit("ngrammys at inf: exited with 1")
            done(rate, record(method, rate, 100.0, 20.0, ["a"]), 1.0)

    monkeypatch.setattr(sb, "run_method", fake)
    _, s = sb.parse_args(["--json", "x", "--methods", "ngrammys", "--request-rates", "1,inf"])
    out = tmp_path / "r.json"
    fail = True
    with pytest.raises(SystemExit, match="ngrammys at inf"):
        sb.run(s, out)
    logged = [json.loads(line) for line in out.with_suffix(".log.jsonl").read_text().splitlines()]
    assert [(r["method"], r["rate"]) for r in logged] == [
        ("baseline", "1.0"), ("baseline", "inf"), ("ngrammys", "1.0")]
    fail, calls[:] = False, []
    result = sb.run(s, out, resume=True)
    assert calls == [("ngrammys", [math.inf])]  # only the cell the log lacks
    assert len(result["rows"]) == 4 and out.exists()
    _, other = sb.parse_args(["--json", "x", "--methods", "ngrammys", "--max-tokens", "7"])
    with pytest.raises(SystemExit, match="other settings"):
        sb.run(other, out, resume=True)
