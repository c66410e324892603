"""Every method in serving: a real ``vllm serve`` per method, under concurrent clients, next to
a plain server's answers, with aborted streams, preemption, injected draft failures and bad
requests.

    python tools/serve_check.py --json results/serving/serve-check.json

Servers run one at a time on loopback (embedded model, float32, --enforce-eager). Plain
decoding runs first: its greedy answers to a fixed prompt list (completions and chat) are the
reference. Then one server per method (``--servers``: either kind or both):

- ``stress`` (the default): N clients (``--clients``) send greedy completion and chat
  requests, streamed and not, for ``--stress-duration`` seconds while ``--aborts`` more
  streams hang up after their first chunks, on a KV cache so small that vLLM preempts
  requests (counted from its ``/metrics``), with the drafter's test hook
  ``VLLM_SELFSPEC_FAULT_EVERY`` making every ``--fault-every``-th draft step raise: the
  failure must be logged once and drafting go on (vLLM's spec-decode counters keep growing
  after it). Then the bad requests (malformed JSON, unknown model, negative max_tokens, ...:
  each must get a 4xx) and one request per OpenAI sampling parameter (``min_p``,
  ``logit_bias``, ...: served, or refused with a 4xx; never a 5xx), then per-request
  control: a request with drafting off (``vllm_xargs``) and a JSON-schema request must
  equal the plain server's answers, the first drafting nothing by vLLM's counters, and a
  malformed draft limit must get a 400; then the server must still answer, and answer right.
- ``load``: the same for ``--duration`` seconds on a KV cache that fits every client, without
  faults.

Every answer is compared with plain decoding's answer to the same prompt on the same
endpoint (token ids, streamed or not). Per method it reports requests served, failed,
identical to plain, aborted streams survived, preemptions survived, injected faults
survived, bad requests answered 4xx, and the sampling parameters refused. Each finished
server is appended to OUT.log.jsonl; ``--resume`` skips those. tests/serving/ runs the same
code (a short version in ``make test``, every method in ``make test-serving``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from vllm_selfspec.metrics import FAMILIES, METRICS_DIR_ENV, PREFIX
from vllm_selfspec.offline import process_group

PLAIN = "plain"
SERVER_KINDS = ("load", "stress")
HOST = "127.0.0.1"
FAULT_ENV = "VLLM_SELFSPEC_FAULT_EVERY"  # vllm_selfspec.drafter.FAULT_ENV (no vLLM import here)
FAULT_LOGGED = "a draft step failed"  # drafter.safe_propose's one log line
FAULT_HOOK_ON = f"test hook {FAULT_ENV}"
ENDPOINTS = ("completion", "chat")
PATHS = {"completion": "/v1/completions", "chat": "/v1/chat/completions"}


# Requests that must get a 4xx and leave the server up: name -> (endpoint, raw body or a
# function of (served model name) -> body)
def _bad_requests(model: str, max_model_len: int) -> dict[str, tuple[str, bytes]]:
    def js(body: dict[str, Any]) -> bytes:
        return json.dumps(body).encode()

    ok = {"model": model, "prompt": "Hello", "max_tokens": 4, "temperature": 0}
    return {
        "malformed_json": ("completion", b'{"model": "' + model.encode() + b'", "prompt": "Hi", '),
        "empty_body": ("completion", b""),
        "unknown_model": ("completion", js({**ok, "model": "no-such-model"})),
        "negative_max_tokens": ("completion", js({**ok, "max_tokens": -1})),
        "max_tokens_over_max_model_len": ("completion", js({**ok, "max_tokens": 10 * max_model_len})),
        "prompt_over_max_model_len": ("completion", js({**ok, "prompt": "hello " * (2 * max_model_len)})),
        "temperature_not_a_number": ("completion", js({**ok, "temperature": "hot"})),
        "missing_prompt": ("completion", js({k: v for k, v in ok.items() if k != "prompt"})),
        "chat_messages_not_a_list": ("chat", js({"model": model, "messages": "hi", "max_tokens": 4})),
    }


# One valid request per OpenAI (and vLLM) sampling parameter: served or refused with a 4xx
SAMPLING_PROBES: dict[str, dict[str, Any]] = {
    "min_p": {"min_p": 0.1, "temperature": 0.8, "seed": 1},
    "logit_bias": {"logit_bias": {"11": 5}},
    "temperature_seed": {"temperature": 0.8, "seed": 1},
    "top_p": {"top_p": 0.9, "temperature": 0.8, "seed": 1},
    "top_k": {"top_k": 5, "temperature": 0.8, "seed": 1},
    "presence_penalty": {"presence_penalty": 0.5},
    "frequency_penalty": {"frequency_penalty": 0.5},
    "repetition_penalty": {"repetition_penalty": 1.2},
    "logprobs": {"logprobs": 3},
    "prompt_logprobs": {"prompt_logprobs": 1},
    "n": {"n": 2, "temperature": 0.8, "seed": 1},
    "stop": {"stop": ["."]},
    "min_tokens": {"min_tokens": 4},
    "bad_words": {"bad_words": ["Paris"]},
    "allowed_token_ids": {"allowed_token_ids": [11, 12, 13, 314]},
    "response_format_json": {"response_format": {"type": "json_object"}},
}


# Per-request control and structured outputs (docs/per-request.md), probed after the load
# when nothing else runs: a request with drafting off and a JSON-schema request must equal
# the plain server's answer to the same request, the first must draft nothing (vLLM's own
# counters), and a malformed draft limit gets a 400.
CONTROL_PROMPT = "List three facts about the moon, one per line."
CONTROL_JSON_PROMPT = "Describe a person with a name and an age."
CONTROL_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                                   "age": {"type": "integer"}},
                  "required": ["name", "age"]}
DRAFT_LIMIT = "num_speculative_tokens"  # vllm_selfspec.bridge.REQUEST_KEY (no vLLM import here)


def control_requests(model: str) -> dict[str, dict[str, Any]]:
    """name -> chat request body: ``on`` (drafting as the server decides), ``off`` (the same
    request with drafting off), ``json_schema`` (a response_format schema) and ``malformed``
    (a draft limit of -1)."""
    def chat(text: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": text}]

    base = {"model": model, "messages": chat(CONTROL_PROMPT), "max_tokens": 48,
            "temperature": 0, "return_token_ids": True}
    return {"on": base,
            "off": {**base, "vllm_xargs": {DRAFT_LIMIT: 0}},
            "json_schema": {**base, "messages": chat(CONTROL_JSON_PROMPT), "response_format": {
                "type": "json_schema", "json_schema": {"name": "person",
                                                       "schema": CONTROL_SCHEMA}}},
            "malformed": {**base, "max_tokens": 4, "vllm_xargs": {DRAFT_LIMIT: -1}}}


@dataclass
class Settings:
    model: str = "smollm2-135m"
    methods: list[str] = field(default_factory=list)  # plugin methods (plain always runs first)
    method_configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    servers: tuple[str, ...] = ("stress",)
    clients: int = 8
    duration: float = 60.0  # load servers
    stress_duration: float = 60.0
    dataset: str = "mtbench"
    num_prompts: int = 16
    max_tokens: int = 64
    max_prompt_tokens: int = 320
    max_model_len: int = 512
    kv_cache_mib: int = 256
    stress_kv_tokens: int = 640  # 20 blocks of 32 tokens (one is vLLM's null block)
    stress_block_size: int = 32  # small blocks: requests outgrow them while decoding
    aborts: int = 6
    fault_every: int = 25
    bad_requests: tuple[str, ...] | None = None  # None: all
    sampling_probes: tuple[str, ...] | None = None  # None: all
    request_timeout: float = 300.0
    start_timeout: float = 900.0
    log_dir: str | None = None  # server logs (default: a temporary folder)
    progress: bool = True

    def key(self) -> dict[str, Any]:
        """What a resumed run must share with the log it continues."""
        d = asdict(self)
        for k in ("methods", "log_dir", "progress", "start_timeout", "request_timeout"):
            d.pop(k)
        d["servers"] = list(self.servers)
        return d


# ---- HTTP on loopback ---------------------------------------------------------------------

def _conn(port: int, timeout: float) -> http.client.HTTPConnection:
    return http.client.HTTPConnection(HOST, port, timeout=timeout)


def http_call(port: int, method: str, path: str, body: bytes | None = None,
              timeout: float = 30.0) -> tuple[int, bytes]:
    conn = _conn(port, timeout)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _samples(port: int) -> list[tuple[str, str, float]]:
    """(name, labels, value) of every sample on the server's ``/metrics`` ([] if unreachable)."""
    try:
        _, text = http_call(port, "GET", "/metrics", timeout=30)
    except OSError:
        return []
    out = []
    for line in text.decode(errors="replace").splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)", line)
        if m:
            try:
                out.append((m.group(1), m.group(2) or "", float(m.group(3))))
            except ValueError:
                pass
    return out


def metrics(port: int) -> dict[str, float]:
    """vLLM's Prometheus counters we read, summed over their labels."""
    out: dict[str, float] = {}
    for name, labels, value in _samples(port):
        key = name
        if name == "vllm:request_success_total":
            r = re.search(r'finished_reason="(\w+)"', labels)
            key = f"vllm:request_success:{r.group(1) if r else '?'}_total"
        out[key] = out.get(key, 0.0) + value
    return out


def drafter_metrics(port: int) -> dict[str, Any]:
    """The drafter's own figures on ``/metrics`` (vllm_selfspec/metrics.py), summed over
    engines, with the drafts by source: {} when there are none."""
    out: dict[str, Any] = {}
    for full, labels, value in _samples(port):
        name = full[len(PREFIX):].removesuffix("_total") if full.startswith(PREFIX) else ""
        if name not in FAMILIES:
            continue
        if name == "drafts":
            src = re.search(r'source="([^"]*)"', labels)
            drafts = out.setdefault("drafts", {})
            key = src.group(1) if src else "?"
            drafts[key] = drafts.get(key, 0) + int(value)
        else:
            out[name] = out.get(name, 0) + value
    if out.get("step_seconds"):  # the share over all engines, not a sum of shares
        out["draft_time_share"] = out.get("draft_seconds", 0.0) / out["step_seconds"]
    return out


def _count(m: dict[str, float], name: str) -> int:
    return int(m.get(f"vllm:{name}_total", 0))


def request_body(settings_model: str, endpoint: str, text: str, max_tokens: int,
                 stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": settings_model, "max_tokens": max_tokens, "temperature": 0,
                            "return_token_ids": True, "stream": stream}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return body


def generate(port: int, endpoint: str, body: dict[str, Any], timeout: float,
             hang_up_after: int | None = None) -> dict[str, Any]:
    """One request; returns {"ok", "status", "text", "token_ids", "error"}. With
    ``hang_up_after`` the client closes the connection after that many streamed chunks."""
    conn = _conn(port, timeout)
    text, ids, chunks = [], [], 0
    try:
        conn.request("POST", PATHS[endpoint], body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return {"ok": False, "status": resp.status, "error": resp.read()[:300].decode(errors="replace")}
        if not body.get("stream"):
            r = json.loads(resp.read())
            c = r["choices"][0]
            t = c["message"]["content"] if endpoint == "chat" else c["text"]
            return {"ok": True, "status": 200, "text": t or "", "token_ids": c.get("token_ids"),
                    "finish_reason": c.get("finish_reason"),
                    "spec": (r.get("metrics") or {}).get("speculative_decoding")}
        done, finish = False, None
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                done = True
                break
            r = json.loads(data)
            if "error" in r:
                return {"ok": False, "status": 200, "error": json.dumps(r["error"])[:300]}
            for c in r.get("choices", []):
                delta = c.get("delta", {}).get("content") if endpoint == "chat" else c.get("text")
                text.append(delta or "")
                ids.extend(c.get("token_ids") or [])
                finish = c.get("finish_reason") or finish
            chunks += 1
            if hang_up_after is not None and chunks >= hang_up_after:
                return {"ok": True, "status": 200, "hung_up": True, "chunks": chunks}
        if not done:
            return {"ok": False, "status": 200, "error": "stream ended without [DONE]"}
        return {"ok": True, "status": 200, "text": "".join(text), "token_ids": ids,
                "finish_reason": finish}
    except (OSError, http.client.HTTPException, json.JSONDecodeError, KeyError, IndexError) as e:
        return {"ok": False, "status": None, "error": f"{type(e).__name__}: {e}"}
    finally:
        conn.close()


def same_answer(a: dict[str, Any], ref: dict[str, Any]) -> bool:
    if a.get("token_ids") and ref.get("token_ids"):
        return list(a["token_ids"]) == list(ref["token_ids"])
    return a.get("text") == ref.get("text")


# ---- servers ------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def kv_bytes_per_token(model_path: str, dtype_bytes: int = 4) -> int:
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return cfg["num_hidden_layers"] * 2 * cfg.get("num_key_value_heads", heads) * head_dim * dtype_bytes


class Server:
    """``vllm serve`` on loopback in its own process group (stopped as a group)."""

    def __init__(self, model_path: str, served_name: str, spec: dict[str, Any] | None,
                 kv_bytes: int, max_model_len: int, log: Path, env: dict[str, str],
                 block_size: int | None = None, extra: tuple[str, ...] = ()) -> None:
        vllm_bin = Path(sys.executable).parent / "vllm"
        self.port = free_port()
        self.log = log
        self.cmd = [str(vllm_bin) if vllm_bin.exists() else "vllm", "serve", model_path,
                    "--host", HOST, "--port", str(self.port), "--dtype", "float32",
                    "--max-model-len", str(max_model_len), "--enforce-eager", "--seed", "0",
                    "--kv-cache-memory-bytes", str(kv_bytes), "--served-model-name", served_name]
        if block_size:
            self.cmd += ["--block-size", str(block_size)]
        self.cmd += list(extra)
        if spec is not None:
            # vLLM's per-request figures: "metrics.speculative_decoding" in each answer
            self.cmd += ["--speculative-config", json.dumps(spec),
                         "--per-request-spec-decode-metrics", "summary"]
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
        # the server names its own /metrics folder (a folder this process named for its own
        # engines would show their figures on the server's /metrics)
        self.env.pop(METRICS_DIR_ENV, None)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float) -> str | None:
        """Start and wait until it answers; None, or why it did not come up."""
        self.launch()
        return self.wait(timeout)

    def launch(self) -> None:
        """Start the server's processes without waiting for them (``wait``), on a port free
        now (one picked when the server was built may have been taken since)."""
        if "--port" in self.cmd:
            self.port = free_port()
            self.cmd[self.cmd.index("--port") + 1] = str(self.port)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as f:
            self.proc = process_group.start(self.cmd, f, self.env)

    def wait(self, timeout: float) -> str | None:
        """Wait until the launched server answers; None, or why it did not come up (then
        it is stopped)."""
        assert self.proc is not None, "launch() first"
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                return f"server exited with {self.proc.returncode}:\n{self.log_tail()}"
            if self.up():
                return None
            time.sleep(1.0)
        self.stop()
        return f"server did not answer within {timeout:.0f} s:\n{self.log_tail()}"

    def up(self) -> bool:
        try:
            return http_call(self.port, "GET", "/health", timeout=5)[0] == 200
        except OSError:
            return False

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def log_tail(self, n: int = 3000) -> str:
        return self.log_text()[-n:]

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        process_group.stop(self.proc, grace=30.0)


# ---- one load phase -----------------------------------------------------------------------

@dataclass
class Job:
    prompt: int
    endpoint: str
    stream: bool

    @property
    def key(self) -> str:
        return f"{self.prompt}:{self.endpoint}"


def jobs_for(num_prompts: int) -> list[Job]:
    """Every (prompt, endpoint) once in the first pass (the reference fills early), streamed
    or not in turn, then again with streaming flipped."""
    return [Job(p, e, (p + j + flip) % 2 == 1) for flip in (0, 1) for p in range(num_prompts)
            for j, e in enumerate(ENDPOINTS)]


class Load:
    """``clients`` threads taking jobs in turn for ``duration`` seconds, ``aborts`` streams
    that hang up spread over that time, answers checked against ``reference`` (filled with
    the first answer of every key when it is the plain server's own)."""

    def __init__(self, port: int, s: Settings, prompts: list[str], reference: dict[str, Any],
                 fill_reference: bool, duration: float | None = None,
                 watch: Callable[[], None] | None = None) -> None:
        self.port, self.s, self.prompts = port, s, prompts
        self.duration = s.duration if duration is None else duration
        self.reference, self.fill = reference, fill_reference
        self.jobs = jobs_for(len(prompts))
        self.lock = threading.Lock()
        self.next_job = 0
        self.served = self.failed = self.tokens = 0
        self.answers: list[tuple[str, dict[str, Any]]] = []
        self.errors: list[str] = []
        self.aborts: list[dict[str, Any]] = []
        self.last_ok = 0.0
        self.watch = watch

    def body(self, job: Job, stream: bool | None = None, max_tokens: int | None = None) -> dict[str, Any]:
        return request_body(self.s.model, job.endpoint, self.prompts[job.prompt],
                            max_tokens or self.s.max_tokens, job.stream if stream is None else stream)

    def record(self, job: Job, r: dict[str, Any]) -> None:
        with self.lock:
            if not r["ok"]:
                self.failed += 1
                if len(self.errors) < 5:
                    self.errors.append(f"{job.key} stream={job.stream}: {r.get('status')} {r.get('error')}")
                return
            self.served += 1
            self.tokens += len(r.get("token_ids") or [])
            self.last_ok = time.time()
            if self.fill and job.key not in self.reference:
                self.reference[job.key] = {"text": r["text"], "token_ids": r["token_ids"]}
            self.answers.append((job.key, {"text": r["text"], "token_ids": r["token_ids"]}))

    def client(self, deadline: float) -> None:
        while time.time() < deadline:
            with self.lock:
                job = self.jobs[self.next_job % len(self.jobs)]
                self.next_job += 1
            r = generate(self.port, job.endpoint, self.body(job), self.s.request_timeout)
            self.record(job, r)
            if r["status"] is None:  # no connection: the server is gone or stuck
                time.sleep(1.0)

    def aborter(self, start: float) -> None:
        for i in range(self.s.aborts):
            at = start + self.duration * (i + 1) / (self.s.aborts + 1)
            time.sleep(max(0.0, at - time.time()))
            job = Job(i % len(self.prompts), ENDPOINTS[i % 2], True)
            r = generate(self.port, job.endpoint, self.body(job, True, 2 * self.s.max_tokens),
                         self.s.request_timeout, hang_up_after=2)
            self.aborts.append({"at": time.time(), "hung_up": bool(r.get("hung_up")),
                                "error": r.get("error")})

    def run(self, desc: str) -> float:
        from tqdm import tqdm

        start = time.time()
        deadline = start + self.duration
        threads = [threading.Thread(target=self.client, args=(deadline,), daemon=True)
                   for _ in range(self.s.clients)]
        threads.append(threading.Thread(target=self.aborter, args=(start,), daemon=True))
        for t in threads:
            t.start()
        with tqdm(total=int(self.duration), desc=desc, unit="s", disable=not self.s.progress,
                  leave=False) as bar:
            while any(t.is_alive() for t in threads):
                time.sleep(1.0)
                if self.watch is not None:
                    self.watch()
                bar.n = min(int(time.time() - start), int(self.duration))
                bar.set_postfix(served=self.served, failed=self.failed, refresh=False)
                bar.refresh()
        return time.time() - start

    def identical(self) -> tuple[int, int, list[str]]:
        same, compared, diffs = 0, 0, []
        for key, a in self.answers:
            ref = self.reference.get(key)
            if ref is None:
                continue
            compared += 1
            if same_answer(a, ref):
                same += 1
            elif len(diffs) < 5:
                diffs.append(f"{key}: {a['text'][:60]!r} vs plain {ref['text'][:60]!r}")
        return same, compared, diffs


# ---- one server: load, probes, checks -----------------------------------------------------

def spec_for(method: str, s: Settings, tmp: Path) -> dict[str, Any] | None:
    """The method's defaults, with the cost gate off (so the server drafts all the time:
    the check is about the drafter) and SWIFT optimizing within these short requests."""
    if method == PLAIN:
        return None
    from vllm_selfspec import methods

    m = methods.lookup(method)
    if m is None:
        raise SystemExit(f"unknown method '{method}'; choose from {', '.join(methods.METHODS)}")
    spec: dict[str, Any] = {"method": m.name}
    if m.key("cost_gate") is not None:
        spec["cost_gate"] = False
    if m.name == "swift":
        spec.update(context_window=8, mask_cache=str(tmp / "swift-mask.json"))
    spec.update(s.method_configs.get(method, {}))
    return spec


def probe_bad_requests(port: int, s: Settings) -> dict[str, int | None]:
    reqs = _bad_requests(s.model, s.max_model_len)
    names = s.bad_requests if s.bad_requests is not None else tuple(reqs)
    out: dict[str, int | None] = {}
    for name in names:
        endpoint, body = reqs[name]
        try:
            out[name] = http_call(port, "POST", PATHS[endpoint], body, timeout=s.request_timeout)[0]
        except OSError:
            out[name] = None
    return out


def probe_sampling(port: int, s: Settings) -> dict[str, dict[str, Any]]:
    names = s.sampling_probes if s.sampling_probes is not None else tuple(SAMPLING_PROBES)
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        body = {"model": s.model, "prompt": "The capital of France is", "max_tokens": 8,
                "temperature": 0, **SAMPLING_PROBES[name]}
        try:
            status, raw = http_call(port, "POST", PATHS["completion"], json.dumps(body).encode(),
                                    timeout=s.request_timeout)
        except OSError as e:
            out[name] = {"status": None, "message": str(e)}
            continue
        msg = ""
        if status != 200:
            try:
                err = json.loads(raw).get("error", {})
                msg = err.get("message", "") if isinstance(err, dict) else str(err)
            except (json.JSONDecodeError, AttributeError):
                msg = raw[:200].decode(errors="replace")
        out[name] = {"status": status, "message": msg[:200]}
    return out


def probe_request_control(port: int, s: Settings, reference: dict[str, Any],
                          plain: bool) -> dict[str, dict[str, Any]]:
    """The control requests one at a time: each answer, the draft tokens vLLM counted while
    it ran, and (``plain``) the plain server's answers kept in ``reference`` under
    ``control:NAME`` (to the request without its per-request value: plain decoding)."""
    out: dict[str, dict[str, Any]] = {}
    for name, body in control_requests(s.model).items():
        if plain:
            body = {k: v for k, v in body.items() if k != "vllm_xargs"}
            if name == "malformed":
                continue
        before = metrics(port)
        if name == "malformed":
            status, raw = http_call(port, "POST", PATHS["chat"], json.dumps(body).encode(),
                                    timeout=s.request_timeout)
            try:
                err = json.loads(raw).get("error", {})
                msg = err.get("message", "") if isinstance(err, dict) else str(err)
            except (json.JSONDecodeError, AttributeError):
                msg = raw[:300].decode(errors="replace")
            out[name] = {"status": status, "message": msg}
            continue
        r = generate(port, "chat", body, s.request_timeout)
        drafted = (_count(metrics(port), "spec_decode_num_draft_tokens")
                   - _count(before, "spec_decode_num_draft_tokens"))
        out[name] = {"ok": r["ok"], "status": r["status"], "text": r.get("text"),
                     "token_ids": r.get("token_ids"), "drafted": drafted,
                     "per_request": r.get("spec")}
        if plain and r["ok"]:
            reference[f"control:{name}"] = {"text": r["text"], "token_ids": r["token_ids"]}
        elif not plain:
            ref = reference.get(f"control:{name}")
            out[name]["identical"] = bool(r["ok"] and ref and same_answer(r, ref))
    return out


def run_server(method: str, kind: str, s: Settings, model_path: str, prompts: list[str],
               reference: dict[str, Any], log_dir: Path, probes: bool) -> dict[str, Any]:
    """Start one server, load it, probe it, stop it; the record of what happened."""
    tmp = log_dir / f"{method}-{kind}"
    tmp.mkdir(parents=True, exist_ok=True)
    per_token = kv_bytes_per_token(model_path)
    stress = kind == "stress"
    kv = s.stress_kv_tokens * per_token if stress else s.kv_cache_mib << 20
    faults = stress and method != PLAIN and s.fault_every > 0
    env = {FAULT_ENV: str(s.fault_every)} if faults else {FAULT_ENV: ""}
    spec = spec_for(method, s, tmp)
    server = Server(model_path, s.model, spec, kv, s.max_model_len, tmp / "server.log", env,
                    s.stress_block_size if stress else None)
    rec: dict[str, Any] = {"method": method, "server": kind, "spec": spec,
                           "kv_cache_tokens": kv // per_token, "fault_every": s.fault_every if faults else None,
                           "log": str(server.log), "command": shlex.join(server.cmd)}
    t0 = time.time()
    err = server.start(s.start_timeout)
    rec["start_s"] = round(time.time() - t0, 1)
    if err is not None:
        rec["error"] = err
        return rec
    try:
        fault_seen: dict[str, Any] = {}

        def watch() -> None:
            if faults and not fault_seen and FAULT_LOGGED in server.log_text():
                fault_seen["at"] = time.time()
                fault_seen["drafts"] = _count(metrics(server.port), "spec_decode_num_drafts")

        before = metrics(server.port)
        load = Load(server.port, s, prompts, reference, fill_reference=method == PLAIN,
                    duration=s.stress_duration if stress else s.duration, watch=watch)
        rec["load_s"] = round(load.run(f"{method}/{kind}"), 1)
        if method == PLAIN:  # every key gets its reference, also those the load did not reach
            for job in load.jobs:
                if job.key not in reference:
                    load.record(job, generate(server.port, job.endpoint, load.body(job, False),
                                              s.request_timeout))
        after = metrics(server.port)
        same, compared, diffs = load.identical()
        aborts_hung_up = [a for a in load.aborts if a["hung_up"]]
        rec.update(served=load.served, failed=load.failed, identical=same, compared=compared,
                   tokens=load.tokens, errors=load.errors, mismatches=diffs,
                   aborts=len(load.aborts), aborts_hung_up=len(aborts_hung_up),
                   aborts_survived=sum(a["at"] < load.last_ok for a in aborts_hung_up),
                   abort_errors=[a["error"] for a in load.aborts if not a["hung_up"]],
                   server_aborted=_count(after, "request_success:abort")
                   - _count(before, "request_success:abort"),
                   preemptions=_count(after, "num_preemptions") - _count(before, "num_preemptions"),
                   spec_drafts=_count(after, "spec_decode_num_drafts"),
                   spec_draft_tokens=_count(after, "spec_decode_num_draft_tokens"),
                   spec_accepted=_count(after, "spec_decode_num_accepted_tokens"))
        if method != PLAIN:
            rec["drafter"] = drafter_metrics(server.port)
        if probes:
            rec["bad_requests"] = probe_bad_requests(server.port, s)
            rec["sampling"] = probe_sampling(server.port, s)
            rec["request_control"] = probe_request_control(server.port, s, reference,
                                                           plain=method == PLAIN)
        # still up, and still right, after all of it
        job = load.jobs[0]
        final = generate(server.port, job.endpoint, load.body(job, False), s.request_timeout)
        rec["up_after"] = server.up() and final["ok"] and (
            job.key not in reference or same_answer(final, reference[job.key]))
        log = server.log_text()
        rec["log_errors"] = [ln[:300] for ln in log.splitlines()
                             if re.search(r"(^|\) )ERROR ", ln) and FAULT_LOGGED not in ln][:10]
        if faults:
            failed_steps = [int(x) for x in re.findall(r"failed steps (\d+)", log)]
            end_drafts = rec["spec_drafts"]  # at the end of the load (before the probes)
            rec["faults"] = {
                "hook_on": FAULT_HOOK_ON in log,
                "logged": log.count(FAULT_LOGGED),
                "injected_in_log": "InjectedFault" in log,
                "failed_steps": max(failed_steps) if failed_steps else None,
                "drafts_at_first_fault": fault_seen.get("drafts"),
                "drafts_after_first_fault": (end_drafts - fault_seen["drafts"]) if fault_seen else None,
            }
    finally:
        server.stop()
    return rec


# ---- the rows and the table ---------------------------------------------------------------

def _faults_ok(f: dict[str, Any] | None) -> bool:
    return bool(f and f["hook_on"] and f["logged"] == 1 and f["injected_in_log"]
                and (f["drafts_after_first_fault"] or 0) > 0)


def _drafts_after_fault(rec: dict[str, Any]) -> None:
    """Drafts vLLM counted between the first fault and the end of the load."""
    f = rec.get("faults")
    if f and f.get("drafts_at_first_fault") is not None:
        f["drafts_after_first_fault"] = rec["spec_drafts"] - f["drafts_at_first_fault"]


def summarize(method: str, recs: list[dict[str, Any]], s: Settings) -> dict[str, Any]:
    """One table row from a method's server records, with the list of what went wrong."""
    row: dict[str, Any] = {"method": method, "servers": recs, "problems": []}
    probs = row["problems"]
    for r in recs:
        if "error" in r:
            probs.append(f"{r['server']} server: {r['error'].splitlines()[0]}")
    ok = [r for r in recs if "error" not in r]
    for r in ok:
        _drafts_after_fault(r)

    def tot(k: str) -> int:
        return sum(r.get(k, 0) for r in ok)

    row.update(served=tot("served"), failed=tot("failed"), identical=tot("identical"),
               compared=tot("compared"), aborts=tot("aborts"), aborts_survived=tot("aborts_survived"),
               up_after=all(r.get("up_after") for r in ok) and bool(ok))
    if row["failed"]:
        probs.append(f"{row['failed']} failed requests")
    if row["identical"] != row["compared"]:
        probs.append(f"{row['compared'] - row['identical']} answers differ from plain")
    if row["aborts_survived"] != row["aborts"]:
        probs.append(f"{row['aborts'] - row['aborts_survived']} aborted streams not survived")
    if not row["up_after"]:
        probs.append("server not answering (right) after the probes")
    stress = next((r for r in ok if r["server"] == "stress"), None)
    row["preemptions"] = stress["preemptions"] if stress else None
    row["preemptions_survived"] = bool(stress and stress["preemptions"] > 0 and not stress["failed"]
                                       and stress["identical"] == stress["compared"])
    if stress and not stress["preemptions"]:
        probs.append("no preemption happened on the small KV cache")
    row["faults"] = stress.get("faults") if stress else None
    row["faults_survived"] = _faults_ok(row["faults"]) and not stress["failed"] if stress else False
    if stress and method != PLAIN and s.fault_every > 0 and not row["faults_survived"]:
        probs.append(f"injected faults not survived: {row['faults']}")
    drafter = next((r["drafter"] for r in ok if "drafter" in r), None)
    row["drafter"] = drafter
    if ok and method != PLAIN and not (drafter and drafter.get("steps")):
        probs.append(f"the drafter's figures are not on /metrics: {drafter}")
    elif stress and drafter and row["faults"] and not drafter.get("draft_failures"):
        probs.append("injected faults are not counted in vllm_selfspec:draft_failures_total")
    bad = next((r["bad_requests"] for r in ok if "bad_requests" in r), None)
    row["bad_requests"] = bad
    row["bad_4xx"] = sum(1 for v in (bad or {}).values() if v is not None and 400 <= v < 500)
    row["bad_total"] = len(bad or {})
    if bad and row["bad_4xx"] != row["bad_total"]:
        probs.append("bad requests without a 4xx: " + ", ".join(
            f"{k} -> {v}" for k, v in bad.items() if v is None or not 400 <= v < 500))
    control = next((r["request_control"] for r in ok if "request_control" in r), None)
    row["request_control"] = control
    if control and method != PLAIN:
        for name in ("on", "off", "json_schema"):
            if not control[name].get("identical"):
                probs.append(f"request control: the {name} request differs from plain "
                             f"({control[name].get('status')})")
        if control["off"].get("drafted"):
            probs.append(f"request control: the request with drafting off drafted "
                         f"{control['off']['drafted']} tokens")
        spec_on, spec_off = (control[n].get("per_request") or {} for n in ("on", "off"))
        if not spec_on.get("num_draft_tokens") or spec_off.get("num_draft_tokens"):
            probs.append(f"request control: vLLM's per-request figures (metrics."
                         f"speculative_decoding) say {spec_on.get('num_draft_tokens')} draft "
                         f"tokens with drafting on and {spec_off.get('num_draft_tokens')} off")
        if control["malformed"]["status"] != 400:
            probs.append(f"request control: a malformed draft limit got "
                         f"{control['malformed']['status']}, not 400")
    sampling = next((r["sampling"] for r in ok if "sampling" in r), None)
    row["sampling"] = sampling
    row["refused"] = sorted(k for k, v in (sampling or {}).items()
                            if v["status"] is not None and 400 <= v["status"] < 500)
    broken = sorted(k for k, v in (sampling or {}).items()
                    if v["status"] is None or v["status"] >= 500)
    if broken:
        probs.append("sampling parameters answered 5xx or no answer: " + ", ".join(broken))
    return row


def _control_cell(row: dict[str, Any]) -> str:
    """off identical and drafting nothing / schema identical / malformed status."""
    c = row.get("request_control")
    if not c or row["method"] == PLAIN:
        return "—"
    off = "yes" if c["off"].get("identical") and not c["off"].get("drafted") else "NO"
    schema = "yes" if c["json_schema"].get("identical") else "NO"
    return (f"off {off} ({c['off'].get('drafted')} drafted, {c['on'].get('drafted')} with it on)"
            f", schema {schema}, malformed {c['malformed']['status']}")


def table(rows: list[dict[str, Any]]) -> str:
    def yes(flag: bool, n: Any) -> str:
        return f"{'yes' if flag else 'NO'} ({n})"

    lines = ["| method | served | failed | identical to plain | aborts survived | preemptions "
             "survived | injected faults survived | bad requests 4xx | sampling params refused "
             "(4xx) | per-request control | up after the probes |",
             "| --- | ---: | ---: | ---: | ---: | --- | --- | ---: | --- | --- | --- |"]
    for r in rows:
        pre = "—" if r["preemptions"] is None else yes(r["preemptions_survived"], r["preemptions"])
        if r["method"] == PLAIN or r["faults"] is None:
            flt = "—"
        else:
            n = r["faults"].get("failed_steps")
            flt = yes(r["faults_survived"], f"{n} failed step{'s' * (n > 1)}" if n else "logged once")
        bad = f"{r['bad_4xx']}/{r['bad_total']}" if r["bad_total"] else "—"
        refused = ", ".join(f"`{k}`" for k in r["refused"]) or ("none" if r["sampling"] else "—")
        first_5xx = next((f"`{k}` got {v['status']}" for k, v in (r["sampling"] or {}).items()
                          if v["status"] is None or v["status"] >= 500), "")
        up = "yes" if r["up_after"] else "NO" + (f" ({first_5xx})" if first_5xx else "")
        lines.append(f"| `{r['method']}` | {r['served']} | {r['failed']} | "
                     f"{r['identical']}/{r['compared']} | {r['aborts_survived']}/{r['aborts']} | "
                     f"{pre} | {flt} | {bad} | {refused} | {_control_cell(r)} | {up} |")
    return "\n".join(lines)


def drafter_table(rows: list[dict[str, Any]]) -> str:
    """The drafter's own figures from ``/metrics`` per method (first server's)."""
    rows = [r for r in rows if r.get("drafter")]
    if not rows:
        return ""
    lines = ["| method | steps | gate withheld | drafts by source | draft time share | "
             "failed draft steps |", "| --- | ---: | ---: | --- | ---: | ---: |"]
    for r in rows:
        d = r["drafter"]
        mix = ", ".join(f"{k} {v}" for k, v in sorted(d.get("drafts", {}).items()))
        lines.append(f"| `{r['method']}` | {int(d.get('steps', 0))} | "
                     f"{int(d.get('gate_withheld_steps', 0))} | {mix} | "
                     f"{d.get('draft_time_share', 0):.3f} | {int(d.get('draft_failures', 0))} |")
    return "\n".join(lines)


def sampling_table(rows: list[dict[str, Any]]) -> str:
    """Sampling parameter x method: the HTTP status each request got."""
    rows = [r for r in rows if r["sampling"]]
    if not rows:
        return ""
    names = list(rows[0]["sampling"])
    lines = ["| parameter | " + " | ".join(f"`{r['method']}`" for r in rows) + " |",
             "| --- |" + " --- |" * len(rows)]
    for n in names:
        cells = []
        for r in rows:
            st = r["sampling"].get(n, {}).get("status")
            cells.append("served" if st == 200 else f"**{st}**")
        lines.append(f"| `{n}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---- the whole check ----------------------------------------------------------------------

def load_prompt_texts(model_path: str, s: Settings) -> list[str]:
    from transformers import AutoTokenizer

    from vllm_selfspec.builders.datasets import load_prompts

    limit = min(s.max_prompt_tokens, s.max_model_len - 2 * s.max_tokens - 16)  # aborts: twice
    tok = AutoTokenizer.from_pretrained(model_path)
    ps = load_prompts(s.dataset, tok, "test", s.num_prompts, max_prompt_tokens=limit)
    if len(ps) < s.num_prompts:
        raise SystemExit(f"only {len(ps)} {s.dataset} prompts fit in {limit} tokens")
    return [p.text for p in ps]


def run(s: Settings, log_path: Path | None = None, resume: bool = False) -> dict[str, Any]:
    """Plain decoding, then every method of ``s.methods``, one server at a time; returns
    {"rows": [...], "table": markdown, "ok": bool}. With ``log_path`` every finished server
    is appended there, and ``resume`` skips the servers that log already holds."""
    from vllm_selfspec.assets import resolve_model
    from vllm_selfspec.proposers.artifacts import append_jsonl, read_jsonl

    for kind in s.servers:
        if kind not in SERVER_KINDS:
            raise SystemExit(f"unknown server kind '{kind}'; choose from {', '.join(SERVER_KINDS)}")
    model_path = resolve_model(s.model)
    prompts = load_prompt_texts(model_path, s)
    log_dir = Path(s.log_dir or tempfile.mkdtemp(prefix="serve-check-"))
    done: dict[tuple[str, str], dict[str, Any]] = {}
    reference: dict[str, Any] = {}
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        if resume:
            for r in read_jsonl(log_path):
                if r.get("settings") != s.key():
                    raise SystemExit(f"{log_path} was written with other settings; run without "
                                     "--resume to start afresh")
                if r.get("reference") is not None:
                    reference = r["reference"]
                elif "error" not in r["record"]:
                    done[(r["record"]["method"], r["record"]["server"])] = r["record"]
        elif log_path.exists():
            log_path.unlink()
    methods = [PLAIN] + [m for m in s.methods if m != PLAIN]
    rows = []
    for method in methods:
        recs = []
        for i, kind in enumerate(s.servers):
            if (method, kind) in done and (method != PLAIN or reference):
                recs.append(done[(method, kind)])
                continue
            if method != PLAIN and not reference:
                raise SystemExit("the plain server gave no reference answers")
            fill = method == PLAIN and not reference
            rec = run_server(method, kind, s, model_path, prompts, reference, log_dir, probes=i == 0)
            if fill and reference and log_path is not None:
                append_jsonl(log_path, {"settings": s.key(), "reference": reference})
            if log_path is not None:
                append_jsonl(log_path, {"settings": s.key(), "record": rec})
            recs.append(rec)
            status = rec.get("error", "").splitlines()[0] if "error" in rec else (
                f"{rec['served']} served, {rec['failed']} failed, {rec['identical']}/"
                f"{rec['compared']} identical, {rec['preemptions']} preemptions")
            print(f"{method}/{kind}: {status} (start {rec['start_s']} s)", file=sys.stderr, flush=True)
        rows.append(summarize(method, recs, s))
    text = table(rows)
    return {"rows": rows, "table": text, "sampling_table": sampling_table(rows),
            "drafter_table": drafter_table(rows),
            "ok": not any(r["problems"] for r in rows),
            "settings": s.key(), "prompts": prompts, "log_dir": str(log_dir)}


def method_configs(items: list[str], fail: Callable[[str], Any]) -> dict[str, dict[str, Any]]:
    """``--method-config METHOD=JSON`` items as {method: config}; ``fail(message)`` on bad JSON."""
    configs: dict[str, dict[str, Any]] = {}
    for c in items:
        name, _, js = c.partition("=")
        try:
            configs[name] = json.loads(js)
        except json.JSONDecodeError as e:
            fail(f"--method-config {name}: invalid JSON ({e})")
    return configs


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Settings]:
    d = Settings()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=d.model, help="alias, local folder or hub name")
    p.add_argument("--methods", default="all", help="comma list of plugin methods, or 'all'")
    p.add_argument("--method-config", action="append", default=[], metavar="METHOD=JSON",
                   help="extra speculative-config keys for a method (repeatable)")
    p.add_argument("--servers", default=",".join(d.servers),
                   help="server kinds per method: load (fitting KV cache), stress (small KV "
                        "cache that preempts, and injected draft failures)")
    p.add_argument("--clients", type=int, default=d.clients)
    p.add_argument("--duration", type=float, default=d.duration, help="seconds of load, load servers")
    p.add_argument("--stress-duration", type=float, default=d.stress_duration,
                   help="seconds of load, stress servers")
    p.add_argument("--dataset", default=d.dataset)
    p.add_argument("--num-prompts", type=int, default=d.num_prompts)
    p.add_argument("--max-tokens", type=int, default=d.max_tokens)
    p.add_argument("--max-prompt-tokens", type=int, default=d.max_prompt_tokens)
    p.add_argument("--max-model-len", type=int, default=d.max_model_len)
    p.add_argument("--kv-cache-mib", type=int, default=d.kv_cache_mib, help="load servers' KV cache")
    p.add_argument("--stress-kv-tokens", type=int, default=d.stress_kv_tokens,
                   help="stress servers' KV cache, in tokens")
    p.add_argument("--stress-block-size", type=int, default=d.stress_block_size,
                   help="stress servers' KV-cache block size")
    p.add_argument("--aborts", type=int, default=d.aborts, help="streams that hang up, per server")
    p.add_argument("--fault-every", type=int, default=d.fault_every,
                   help=f"stress servers: every N-th draft step raises ({FAULT_ENV}; 0: none)")
    p.add_argument("--bad-requests", default="all", help="comma list, or 'all': "
                   + ", ".join(_bad_requests("m", 1)))
    p.add_argument("--sampling-probes", default="all", help="comma list, 'all' or 'none': "
                   + ", ".join(SAMPLING_PROBES))
    p.add_argument("--log-dir", default=None, help="server logs (default: a temporary folder)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--resume", action="store_true", help="skip the servers OUT.log.jsonl holds")
    p.add_argument("--json", dest="json_out", default=None, help="write results here")
    a = p.parse_args(argv)
    from vllm_selfspec import methods

    names = list(methods.METHODS) if a.methods == "all" else [
        m.strip() for m in a.methods.split(",") if m.strip()]
    for m in names:
        if methods.lookup(m) is None and m != PLAIN:
            p.error(f"unknown method '{m}'; choose from {', '.join(methods.METHODS)}")
    configs = method_configs(a.method_config, p.error)

    def names_of(v: str, known: Any) -> tuple[str, ...] | None:
        if v == "all":
            return None
        got = tuple(x.strip() for x in v.split(",") if x.strip() and x.strip() != "none")
        for x in got:
            if x not in known:
                p.error(f"unknown name '{x}'; choose from {', '.join(known)}")
        return got

    s = Settings(model=a.model, methods=names, method_configs=configs,
                 servers=tuple(x.strip() for x in a.servers.split(",") if x.strip()),
                 clients=a.clients, duration=a.duration, stress_duration=a.stress_duration,
                 dataset=a.dataset,
                 num_prompts=a.num_prompts, max_tokens=a.max_tokens,
                 max_prompt_tokens=a.max_prompt_tokens, max_model_len=a.max_model_len,
                 kv_cache_mib=a.kv_cache_mib, stress_kv_tokens=a.stress_kv_tokens,
                 stress_block_size=a.stress_block_size,
                 aborts=a.aborts, fault_every=a.fault_every,
                 bad_requests=names_of(a.bad_requests, _bad_requests("m", 1)),
                 sampling_probes=names_of(a.sampling_probes, SAMPLING_PROBES),
                 log_dir=a.log_dir, progress=not a.no_progress)
    return a, s


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a, s = parse_args(argv)
    if a.resume and not a.json_out:
        raise SystemExit("--resume continues OUT.log.jsonl: give --json OUT")
    out = Path(a.json_out) if a.json_out else None
    t0 = time.time()
    result = run(s, out.with_suffix(".log.jsonl") if out else None, resume=a.resume)
    result["command"] = "python tools/serve_check.py " + shlex.join(
        argv if argv is not None else sys.argv[1:])
    result["seconds"] = round(time.time() - t0, 1)
    if out is not None:
        from vllm_selfspec.proposers.artifacts import atomic_path

        with atomic_path(out) as tmp:
            tmp.write_text(json.dumps(result, indent=1) + "\n")
    print(result["table"])
    if result["drafter_table"]:
        print("\nthe drafter's figures on /metrics:\n" + result["drafter_table"])
    if result["sampling_table"]:
        print("\nsampling parameters (HTTP status):\n" + result["sampling_table"])
    for r in result["rows"]:
        for prob in r["problems"]:
            print(f"PROBLEM {r['method']}: {prob}")
    print(f"server logs: {result['log_dir']}" + (f"; wrote {out}" if out else ""))
    if not result["ok"]:
        raise SystemExit(1)
    return result


if __name__ == "__main__":
    main()
