"""The drafter's own figures on vLLM's ``/metrics`` (Prometheus).

vLLM counts drafted and accepted tokens itself (``vllm:spec_decode_*``). What only the
drafter knows (which source a draft came from, how many steps the cost gate kept plain,
how much of a step the draft took) lives in the worker process, while ``vllm serve``
answers ``/metrics`` from the API server process out of prometheus_client's global
registry (``vllm/entrypoints/serve/instrumentator/metrics.py``). The way across is a
folder, as prometheus_client's own multiprocess mode does it:

* ``install()`` (when a method of the plugin is configured, in the process that builds the
  engine's config: the API server, or the script that builds an ``LLM``) makes a temporary
  folder and names it in ``VLLM_SELFSPEC_METRICS_DIR``, which the engine processes it
  starts inherit, and registers ``DrafterCollector`` in its global registry;
* each engine's drafter (tensor-parallel rank 0 only) keeps a ``DrafterFigures`` and
  writes it to ``<folder>/<pid>-<n>.json`` at most once a second (``Publisher``);
* on a scrape, the collector reads the files of live processes and answers the families
  in ``FAMILIES``.

With ``--api-server-count`` > 1 vLLM answers ``/metrics`` from prometheus_client's
multiprocess registry instead, which does not hold this collector: there only vLLM's own
figures are exposed. Names and meanings: docs/metrics.md.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

METRICS_DIR_ENV = "VLLM_SELFSPEC_METRICS_DIR"
PUBLISH_INTERVAL_S = 1.0  # how stale a scrape may be
STEP_GAP_S = 2.0  # a longer wait between two engine steps is idle time, not a step
PREFIX = "vllm_selfspec:"

# name (without the prefix) -> (kind, help). The one home of the metric names.
FAMILIES: dict[str, tuple[str, str]] = {
    "steps": ("counter", "Engine steps the drafter was called in."),
    "gate_withheld_steps": ("counter", "Steps in which the cost gate let no request draft."),
    "drafts": ("counter", "Drafts (one request's chain in one step) by the source that made "
                          "them."),
    "draft_seconds": ("counter", "Seconds spent in the drafter: reading the verified tokens, "
                                 "drafting, its bookkeeping."),
    "step_seconds": ("counter", "Seconds between the drafter's calls while the engine steps "
                                f"(gaps over {STEP_GAP_S:g} s are idle time and not counted)."),
    "draft_time_share": ("gauge", "draft_seconds / step_seconds since the engine started."),
    "draft_failures": ("counter", "Draft steps that failed (and drafted nothing)."),
}


@dataclass
class DrafterFigures:
    """What one engine's drafter counts (the labels and the values of ``FAMILIES``)."""

    model_name: str
    method: str
    engine: str = "0"
    steps: int = 0
    gate_withheld_steps: int = 0
    drafts: dict[str, int] = field(default_factory=dict)
    draft_seconds: float = 0.0
    step_seconds: float = 0.0
    draft_failures: int = 0

    @property
    def draft_time_share(self) -> float:
        return self.draft_seconds / self.step_seconds if self.step_seconds > 0 else 0.0

    def take_sources(self, stats: dict[str, float]) -> None:
        """Drafts by source from a proposer's stats: its ``from_<source>`` counts where it
        labels its drafts (the ngrammys family), else all its drafts under the method."""
        sources = {k[len("from_"):]: int(v) for k, v in stats.items() if k.startswith("from_")}
        self.drafts = sources or {self.method: int(stats.get("drafts", 0))}
        self.draft_failures = int(stats.get("failures", 0))


_serial = itertools.count()  # engines of one process (tools/bench.py runs several)


class Publisher:
    """Keeps a drafter's ``DrafterFigures`` and writes them to the metrics folder, in
    ``<pid>-<n>.json``; the file goes when the drafter does."""

    def __init__(self, figures: DrafterFigures, folder: str | None) -> None:
        self.figures = figures
        self.path = Path(folder) / f"{os.getpid()}-{next(_serial)}.json" if folder else None
        self._last_call: float | None = None
        self._last_write = 0.0

    def step(self, now: float) -> None:
        """One engine step: the time since the previous call counts as step time."""
        if self._last_call is not None and 0 < now - self._last_call <= STEP_GAP_S:
            self.figures.step_seconds += now - self._last_call
        self._last_call = now
        self.figures.steps += 1

    def maybe_write(self, stats: dict[str, float], now: float, force: bool = False) -> None:
        if self.path is None or (not force and now - self._last_write < PUBLISH_INTERVAL_S):
            return
        self._last_write = now
        self.figures.take_sources(stats)
        try:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(asdict(self.figures)))
            os.replace(tmp, self.path)  # a scrape never reads half a file
        except OSError:
            self.path = None  # the folder went away: stop publishing, keep drafting

    def __del__(self) -> None:
        try:
            if self.path is not None:
                self.path.unlink(missing_ok=True)
        except Exception:  # noqa: BLE001 - at interpreter exit
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_figures(folder: str) -> list[DrafterFigures]:
    """The figures of the engines whose processes are alive (files ``<pid>-<n>.json``)."""
    out = []
    for path in sorted(Path(folder).glob("*-*.json")):
        pid = path.stem.split("-")[0]
        if not pid.isdigit() or not _alive(int(pid)):
            continue
        try:
            out.append(DrafterFigures(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return out


class DrafterCollector:
    """A prometheus_client collector over the metrics folder (``collect`` per scrape)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def describe(self) -> list[Any]:
        return []  # no names known before the first engine: prometheus_client then skips checks

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        figures = read_figures(self.folder)
        if not figures:
            return
        labels = ["model_name", "method", "engine"]
        for name, (kind, doc) in FAMILIES.items():
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            fam = cls(PREFIX + name, doc, labels=labels + (["source"] if name == "drafts" else []))
            for f in figures:
                base = [f.model_name, f.method, f.engine]
                if name == "drafts":
                    for source, n in sorted(f.drafts.items()):
                        fam.add_metric(base + [source], n)
                else:
                    fam.add_metric(base, getattr(f, name))
            yield fam


_installed: DrafterCollector | None = None
_folder: tempfile.TemporaryDirectory[str] | None = None


def install() -> str:
    """Name the metrics folder for this process and the engines it starts, and register
    the collector in prometheus_client's global registry; idempotent."""
    global _installed, _folder
    folder = os.environ.get(METRICS_DIR_ENV)
    if not folder:
        _folder = tempfile.TemporaryDirectory(prefix="vllm-selfspec-metrics-")
        folder = os.environ[METRICS_DIR_ENV] = _folder.name
    if _installed is None:
        from prometheus_client import REGISTRY

        _installed = DrafterCollector(folder)
        REGISTRY.register(_installed)  # type: ignore[arg-type]
    return folder


def publisher_for(vllm_config: Any, method: str) -> Publisher | None:
    """The drafter's publisher: on tensor-parallel rank 0 of each engine, where a folder
    is named (``install`` ran in the process that started the engine)."""
    folder = os.environ.get(METRICS_DIR_ENV)
    if not folder:
        return None
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        if get_tensor_model_parallel_rank() != 0:
            return None
    except Exception:  # noqa: BLE001 - no TP group (unit tests): one rank
        pass
    model = getattr(getattr(vllm_config, "model_config", None), "served_model_name", "") or ""
    if isinstance(model, (list, tuple)):
        model = model[0] if model else ""
    rank = getattr(getattr(vllm_config, "parallel_config", None), "data_parallel_rank", 0) or 0
    return Publisher(DrafterFigures(model_name=str(model), method=method, engine=str(rank)),
                     folder)
