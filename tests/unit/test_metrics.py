"""The drafter's figures on /metrics (vllm_selfspec/metrics.py): what a drafter writes, what a
scrape of prometheus_client's registry answers, files of dead engines left out, and the
folder named once for the processes an engine start spawns."""

import json
import os
import subprocess
import sys

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from vllm_selfspec import metrics
from vllm_selfspec.offline import serve_check


def _scrape(folder) -> str:
    reg = CollectorRegistry()
    reg.register(metrics.DrafterCollector(str(folder)))
    return generate_latest(reg).decode()


def test_a_drafter_publishes_and_a_scrape_reads(tmp_path):
    pub = metrics.Publisher(metrics.DrafterFigures("smol", "ngrammys-history", "0"), str(tmp_path))
    pub.step(10.0)
    pub.step(10.02)   # 20 ms of step time
    pub.step(15.0)    # after 4.98 s idle: not step time
    pub.figures.gate_withheld_steps += 2
    pub.figures.draft_seconds += 0.005
    pub.maybe_write({"drafts": 7, "from_context": 5, "from_datastore": 2, "failures": 1}, 15.0)
    text = _scrape(tmp_path)
    assert 'vllm_selfspec:steps_total{engine="0",method="ngrammys-history",model_name="smol"} 3.0' \
        in text
    assert 'vllm_selfspec:gate_withheld_steps_total{engine="0",method="ngrammys-history",' \
        'model_name="smol"} 2.0' in text
    assert 'source="context"} 5.0' in text and 'source="datastore"} 2.0' in text
    assert "vllm_selfspec:draft_failures_total" in text and "# TYPE vllm_selfspec:draft_time_share gauge" in text
    f = metrics.read_figures(str(tmp_path))[0]
    # bookkeeping of the clock values handed to step() above, not a measured time
    assert f.step_seconds == pytest.approx(0.02) and f.draft_time_share == pytest.approx(0.25)


def test_writes_are_throttled_but_not_lost(tmp_path):
    pub = metrics.Publisher(metrics.DrafterFigures("m", "selfspec"), str(tmp_path))
    pub.maybe_write({"drafts": 1}, 100.0)
    pub.maybe_write({"drafts": 2}, 100.5)  # within a second: not written
    assert metrics.read_figures(str(tmp_path))[0].drafts == {"selfspec": 1}
    pub.maybe_write({"drafts": 3}, 101.2)
    assert metrics.read_figures(str(tmp_path))[0].drafts == {"selfspec": 3}


def test_a_dead_engines_file_is_left_out(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    dead = metrics.DrafterFigures("m", "chimera", steps=5)
    (tmp_path / f"{p.pid}-0.json").write_text(json.dumps(dead.__dict__))
    (tmp_path / f"{os.getpid()}-0.json").write_text(json.dumps(
        metrics.DrafterFigures("m", "swift", steps=9).__dict__))
    (tmp_path / "notes.json").write_text("{}")
    assert [f.method for f in metrics.read_figures(str(tmp_path))] == ["swift"]
    assert _scrape(tmp_path).count("vllm_selfspec:steps_total{") == 1


def test_no_engine_no_families(tmp_path):
    assert "vllm_selfspec" not in _scrape(tmp_path)


def test_engines_of_one_process_keep_their_own_files_until_they_go(tmp_path):
    a = metrics.Publisher(metrics.DrafterFigures("m", "selfspec"), str(tmp_path))
    b = metrics.Publisher(metrics.DrafterFigures("m", "swift"), str(tmp_path))
    a.maybe_write({"drafts": 1}, 5.0)
    b.maybe_write({"drafts": 2}, 5.0)
    assert sorted(f.method for f in metrics.read_figures(str(tmp_path))) == ["selfspec", "swift"]
    del a
    assert [f.method for f in metrics.read_figures(str(tmp_path))] == ["swift"]


def test_install_names_one_folder_and_registers_once(monkeypatch, tmp_path):
    from prometheus_client import REGISTRY

    monkeypatch.delenv(metrics.METRICS_DIR_ENV, raising=False)
    monkeypatch.setattr(metrics, "_installed", None)
    folder = metrics.install()
    try:
        assert os.environ[metrics.METRICS_DIR_ENV] == folder and os.path.isdir(folder)
        assert metrics.install() == folder  # idempotent: the same folder, one collector
        pub = metrics.publisher_for(None, "selfspec")
        assert pub is not None and pub.path.parent == metrics.Path(folder)
        pub.step(1.0)
        pub.maybe_write({"drafts": 4}, 2.0)
        text = generate_latest(REGISTRY).decode()
        assert text.count("vllm_selfspec:steps_total{") == 1
        assert 'source="selfspec"} 4.0' in text
    finally:
        REGISTRY.unregister(metrics._installed)


def test_no_folder_no_publisher(monkeypatch):
    monkeypatch.delenv(metrics.METRICS_DIR_ENV, raising=False)
    assert metrics.publisher_for(None, "selfspec") is None


def test_serve_check_reads_the_families(monkeypatch, tmp_path):
    pub = metrics.Publisher(metrics.DrafterFigures("m", "ngrammys"), str(tmp_path))
    pub.step(1.0)
    pub.step(1.1)
    pub.figures.draft_seconds = 0.01
    pub.maybe_write({"from_context": 3, "from_bigram": 1}, 2.0)
    body = _scrape(tmp_path).encode() + b'vllm:spec_decode_num_drafts_total{engine="0"} 4.0\n'
    monkeypatch.setattr(serve_check, "http_call", lambda *a, **k: (200, body))
    got = serve_check.drafter_metrics(0)
    assert got["steps"] == 2 and got["drafts"] == {"bigram": 1, "context": 3}
    assert got["draft_time_share"] == pytest.approx(0.1)


def test_every_family_is_documented():
    doc = (metrics.Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    for name, (kind, _) in metrics.FAMILIES.items():
        assert f"`{metrics.PREFIX}{name}{'_total' if kind == 'counter' else ''}" in doc, name
