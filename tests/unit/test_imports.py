"""The direction of every import arrow: the papers (vllm_selfspec/proposers/) import neither vLLM nor the
rest of the plugin; what an engine builds at start-up (vllm_selfspec/builders/) imports neither
vLLM nor the offline tools; the vLLM glue never imports the offline tools, so an engine starts
without them; every offline module imports without vLLM or Ray and starts nothing."""

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

BLOCKER = """
import importlib, json, pkgutil, sys, threading

class Blocked:
    # a finder that refuses the named packages and all their submodules
    def __init__(self, names):
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if any(name == n or name.startswith(n + ".") for n in self.names):
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
    assert {"base", "artifacts", "draft_verify", "swift", "layerskip", "ngrammys"} <= set(
        res["modules"])
    assert res["failed"] == {}
    assert res["loaded"] == []


def test_every_offline_module_imports_without_starting_anything():
    res = _import_all("vllm_selfspec.offline", "vllm,ray")
    assert {"bench", "search", "objectives", "dev_set", "build_bigram", "chimera_data"} <= set(
        res["modules"])
    assert res["failed"] == {}
    assert res["loaded"] == [] and res["threads"] == 1  # no engine, no Ray, no workers


def test_every_builder_imports_without_vllm_or_the_tools():
    res = _import_all("vllm_selfspec.builders", "vllm,ray,vllm_selfspec.offline")
    assert {"models", "bigram", "datastore", "sharegpt", "benchmark_filter", "datasets"} <= set(
        res["modules"])
    assert res["failed"] == {}
    assert res["loaded"] == []


def _imports(path: Path, package: str) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function (relative imports
    resolved against ``package``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


FOLDERS = {  # folder -> (its package, imports it must never make)
    "vllm_selfspec/proposers": ("vllm_selfspec.proposers", ("vllm", "vllm_selfspec.offline",
                                              "vllm_selfspec.builders", "vllm_selfspec.plugin")),
    "vllm_selfspec/builders": ("vllm_selfspec.builders", ("vllm", "vllm_selfspec.offline")),
    "vllm_selfspec": ("vllm_selfspec", ("vllm_selfspec.offline",)),
}


def test_arrows_point_one_way():
    """Static: lazy imports inside functions count too, so a start-up path that would reach
    an offline module on some branch is caught without running that branch."""
    seen, wrong = 0, []
    for folder, (package, never) in FOLDERS.items():
        for path in sorted((ROOT / folder).glob("*.py")):
            seen += 1
            for name in _imports(path, package):
                if _under(name, never):
                    wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert seen > 40 and not wrong, "\n".join(wrong)


def test_the_arrow_test_sees_a_wrong_arrow(tmp_path):
    bad = tmp_path / "plugin.py"
    bad.write_text("def f():\n    from vllm_selfspec.offline.bench import main\n"
                   "from .offline import engines\n")
    assert {"vllm_selfspec.offline.bench", "vllm_selfspec.offline.engines"} <= _imports(
        bad, "vllm_selfspec")


def test_an_engine_starts_up_without_the_offline_tools():
    """The glue's start-up path with every offline module refused: the plugin registers,
    the embedded model resolves from its converted copy, and the bigram table and the
    datastore the ngrammys methods build when none is given load from the cache."""
    code = BLOCKER.split("pkg = importlib")[0] + """
from types import SimpleNamespace
from vllm_selfspec import assets, plugin, resolvers
from vllm_selfspec.model_info import stamp_from_path
plugin.register()
path = assets.resolve_model("smollm2-135m")
opts = {"datastore": "sharegpt"}
refs = resolvers.resolve_ngrammys_artifacts(opts, SimpleNamespace(path=path, stamp=stamp_from_path(path)), {})
assert refs["bigram_table"] and refs["datastore"], refs
print(json.dumps({"offline": sorted(m for m in sys.modules
                                    if m.startswith("vllm_selfspec.offline"))}))
"""
    r = subprocess.run([sys.executable, "-c", code, "-", "vllm_selfspec.offline"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"offline": []}
