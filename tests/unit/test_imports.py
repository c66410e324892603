"""Every module under proposers/ imports with vLLM unavailable (the papers depend on
torch only), and every offline module imports without vLLM or Ray and starts nothing."""

import json
import subprocess
import sys

BLOCKER = """
import importlib, json, pkgutil, sys, threading

class Blocked:
    # a finder that refuses the named top-level packages and all their submodules
    def __init__(self, names):
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ImportError(f"{name} is blocked in this test")
        return None

sys.meta_path.insert(0, Blocked(set(sys.argv[2].split(","))))
pkg = importlib.import_module(sys.argv[1])
failed = {}
names = [m.name for m in pkgutil.iter_modules(pkg.__path__)]
for name in names:
    try:
        importlib.import_module(f"{pkg.__name__}.{name}")
    except Exception as e:
        failed[name] = f"{type(e).__name__}: {e}"
print(json.dumps({"modules": names, "failed": failed, "threads": threading.active_count(),
                  "loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("vllm", "ray"))}))
"""


def _import_all(package: str, blocked: str) -> dict:
    r = subprocess.run([sys.executable, "-c", BLOCKER, package, blocked], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_every_proposer_imports_without_vllm():
    res = _import_all("vllm_selfspec.proposers", "vllm")
    assert {"base", "artifacts", "layer_skip", "swift", "early_exit", "ngrammys"} <= set(
        res["modules"])
    assert res["failed"] == {}
    assert res["loaded"] == []


def test_every_offline_module_imports_without_starting_anything():
    res = _import_all("vllm_selfspec.offline", "vllm,ray")
    assert {"bench", "search", "objectives", "dev_set", "bigram_build", "models"} <= set(
        res["modules"])
    assert res["failed"] == {}
    assert res["loaded"] == [] and res["threads"] == 1  # no engine, no Ray, no workers
