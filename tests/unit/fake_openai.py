"""A fake OpenAI server for tools/serve_check.py's unit tests (no engine): greedy answers
that depend on the prompt only, vLLM's /metrics counters, and the drafter's fault-hook log
lines when VLLM_SELFSPEC_FAULT_EVERY is set. ``python fake_openai.py PORT`` serves it."""

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
COUNTS = {"served": 0, "aborted": 0, "draft_tokens": 0}


class Fake(BaseHTTPRequestHandler):
    wrong = ""  # a prompt this "method" answers differently
    model = "m"

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
            n = COUNTS["served"]
            self._send(200, (
                f"# HELP x\nvllm:num_preemptions_total{{engine=\"0\"}} {n // 3}.0\n"
                f"vllm:request_success_total{{finished_reason=\"abort\"}} {COUNTS['aborted']}.0\n"
                f"vllm:request_success_total{{finished_reason=\"length\"}} {n}.0\n"
                f"vllm:spec_decode_num_drafts_total {4 * n}.0\n"
                f"vllm:spec_decode_num_draft_tokens_total {COUNTS['draft_tokens']}.0\n"
                + self._drafter(n)).encode(), "text/plain")

    @staticmethod
    def _drafter(n):
        """The drafter's own families (vllm_selfspec/metrics.py)."""
        lab = 'engine="0",method="x",model_name="m"'
        fails = 1 if os.environ.get("VLLM_SELFSPEC_FAULT_EVERY") and n >= 5 else 0
        return (f"vllm_selfspec:steps_total{{{lab}}} {8 * n}.0\n"
                f"vllm_selfspec:gate_withheld_steps_total{{{lab}}} 0.0\n"
                f'vllm_selfspec:drafts_total{{{lab},source="context"}} {4 * n}.0\n'
                f"vllm_selfspec:draft_seconds_total{{{lab}}} {0.01 * n}\n"
                f"vllm_selfspec:step_seconds_total{{{lab}}} {0.1 * n}\n"
                f"vllm_selfspec:draft_time_share{{{lab}}} 0.1\n"
                f"vllm_selfspec:draft_failures_total{{{lab}}} {fails}.0\n")

    def do_POST(self):
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        except json.JSONDecodeError:
            return self._send(400, {"error": {"message": "bad json"}})
        if body.get("model") != Fake.model:
            return self._send(404, {"error": {"message": "no model"}})
        if not isinstance(body.get("max_tokens", 1), int) or body.get("max_tokens", 1) < 0 \
                or body.get("min_p") or not (body.get("prompt") or body.get("messages")):
            return self._send(400, {"error": {"message": "min_p is not supported"}})
        limit = (body.get("vllm_xargs") or {}).get("num_speculative_tokens", 3)
        if not isinstance(limit, int) or limit < 0:
            return self._send(400, {"error": {"message": "num_speculative_tokens must be an "
                                              "integer in [0, 128]"}})
        msgs = body.get("messages")
        text = body.get("prompt") or (msgs[0].get("content") if isinstance(msgs, list) else None)
        if not isinstance(text, str):
            return self._send(400, {"error": {"message": "messages must be a list"}})
        ids = [ord(c) for c in text[: body["max_tokens"]]]
        if text == Fake.wrong:
            ids = ids[::-1]
        with LOCK:
            COUNTS["served"] += 1
            COUNTS["draft_tokens"] += limit
            if COUNTS["served"] == 5 and os.environ.get("VLLM_SELFSPEC_FAULT_EVERY"):
                print("ERROR vllm_selfspec: a draft step failed (InjectedFault: injected)",
                      flush=True)
        chat = "messages" in body
        if not body.get("stream"):
            choice = {"token_ids": ids, "finish_reason": "length"}
            choice.update({"message": {"content": text}} if chat else {"text": text})
            spec = {"num_draft_tokens": limit, "num_accepted_draft_tokens": limit // 2}
            return self._send(200, {"choices": [choice],
                                    "metrics": {"speculative_decoding": spec}})
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
            with LOCK:
                COUNTS["aborted"] += 1


def serve(port: int = 0) -> ThreadingHTTPServer:
    srv = ThreadingHTTPServer(("127.0.0.1", port), Fake)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


if __name__ == "__main__":
    if os.environ.get("VLLM_SELFSPEC_FAULT_EVERY"):
        print("WARNING vllm_selfspec: test hook VLLM_SELFSPEC_FAULT_EVERY=3", flush=True)
    Fake.model = sys.argv[2]
    Fake.wrong = sys.argv[3] if len(sys.argv) > 3 else ""
    srv = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Fake)
    srv.serve_forever()
