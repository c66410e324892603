"""Artifacts: the files made for one model (skip masks, bigram tables, trained heads).

One module owns where they live, how they are written and how they are checked:

* ``ModelStamp``: every file carries what it was made for (architecture, layer
  count, hidden size, vocabulary size and a weights fingerprint); ``check_stamp``
  refuses it for another model with a message that says which model it was made
  for and what to do;
* ``cache_dir`` / ``artifact_path``: where the default artifact of a model is
  cached (``$VLLM_SELFSPEC_CACHE``, else ``~/.cache/vllm_selfspec``);
* ``atomic_path``: every writer writes a temporary file and renames it into place,
  so a reader (another engine, a Ray worker) never sees half a file;
* ``save_stamped`` / ``open_stamped``: safetensors files with a format name, a
  stamp and build metadata in their header (bigram tables, checkpoints);
* ``read_jsonl`` / ``append_jsonl``: the resumable logs of the offline tools.

Torch only; nothing here imports vLLM.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch

# Small replicated tensors (never sharded by tensor parallelism), read the same
# way from a safetensors file or from the live vLLM model.
FINGERPRINT_TENSORS = (
    "model.norm.weight",
    "model.layers.0.input_layernorm.weight",
    "model.layers.{last}.post_attention_layernorm.weight",
)


class ArtifactMismatchError(ValueError):
    """An artifact was made for another model."""


class ArtifactError(ValueError):
    """An artifact file that cannot be used: missing, of another format, or unreadable."""


def fingerprint_names(num_layers: int) -> list[str]:
    return [n.format(last=num_layers - 1) for n in FINGERPRINT_TENSORS]


def weights_fingerprint(tensors: list[torch.Tensor]) -> str:
    """sha256 over the bf16 bytes of the fingerprint tensors (dtype-robust:
    the same weights loaded in fp32 or bf16 give the same value)."""
    h = hashlib.sha256()
    for t in tensors:
        b = t.detach().to("cpu", torch.bfloat16).contiguous().view(torch.int16)
        h.update(b.numpy().tobytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class ModelStamp:
    architecture: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    fingerprint: str | None = None  # None when the weights could not be read
    name: str | None = None  # informational only (never compared)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ModelStamp:
        return cls(
            architecture=str(obj.get("architecture", "")),
            num_layers=int(obj.get("num_layers", -1)),
            hidden_size=int(obj.get("hidden_size", -1)),
            vocab_size=int(obj.get("vocab_size", -1)),
            fingerprint=obj.get("fingerprint"),
            name=obj.get("name"),
        )

    def describe(self) -> str:
        fp = f", weights {self.fingerprint}" if self.fingerprint else ""
        nm = f"{self.name}: " if self.name else ""
        return (
            f"{nm}{self.architecture}, {self.num_layers} layers, hidden {self.hidden_size}, "
            f"vocab {self.vocab_size}{fp}"
        )

    def mismatch(self, other: ModelStamp) -> str | None:
        """Why an artifact stamped ``other`` does not fit this model, or None."""
        fields = [
            ("architecture", self.architecture, other.architecture),
            ("number of layers", self.num_layers, other.num_layers),
            ("hidden size", self.hidden_size, other.hidden_size),
            ("vocabulary size", self.vocab_size, other.vocab_size),
        ]
        for what, mine, theirs in fields:
            if theirs not in ("", -1) and mine != theirs:
                return f"{what} {theirs} != {mine}"
        if self.fingerprint and other.fingerprint and self.fingerprint != other.fingerprint:
            return f"weights fingerprint {other.fingerprint} != {self.fingerprint}"
        return None


def check_stamp(what: str, source: str, stamped: ModelStamp | None, model: ModelStamp,
                remedy: str) -> None:
    """Raise ArtifactMismatchError if ``stamped`` was made for another model."""
    if stamped is None:
        return
    why = model.mismatch(stamped)
    if why is not None:
        raise ArtifactMismatchError(
            f"{what} {source} was made for another model ({stamped.describe()}; {why}); "
            f"this model is {model.describe()}. {remedy}"
        )


# ---- where artifacts live -------------------------------------------------------------------
# The default artifact of each kind for one model's weights:
# <cache>/<kind>/<name><suffix>, the name formatted from the model's stamp.
CACHED_ARTIFACTS: dict[str, tuple[str, str]] = {
    "masks": ("{architecture}-{num_layers}L-{fingerprint}", ".json"),  # searched skip masks
    "swift": ("{architecture}-{num_layers}L-{fingerprint}", ".json"),  # SWIFT's saved layer sets
    "bigram": ("{architecture}-{vocab_size}-{fingerprint}", ".safetensors"),  # N-Grammys tables
    "datastore": ("{architecture}-{vocab_size}-{fingerprint}", ".safetensors"),  # REST corpora
    "chimera": ("{architecture}-{num_layers}L-{fingerprint}", ".safetensors"),  # Chimera models
    # activation absmax per linear input (builders/activation_scales.py: SmoothQuant's scales)
    "activation_scales": ("{architecture}-{num_layers}L-{fingerprint}", ".safetensors"),
}


def cache_dir() -> Path:
    """Where converted models and artifacts are cached (``$VLLM_SELFSPEC_CACHE``)."""
    root = os.environ.get("VLLM_SELFSPEC_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "vllm_selfspec"


def artifact_path(kind: str, stamp: ModelStamp, suffix: str | None = None) -> Path | None:
    """Where the default ``kind`` artifact of these exact weights is cached; None without
    a weights fingerprint (a name alone does not say which weights)."""
    if kind not in CACHED_ARTIFACTS:
        raise ValueError(f"unknown artifact kind {kind!r}; known: {', '.join(CACHED_ARTIFACTS)}")
    if not stamp.fingerprint:
        return None
    pattern, default_suffix = CACHED_ARTIFACTS[kind]
    name = pattern.format(**asdict(stamp))
    return cache_dir() / kind / f"{name}{default_suffix if suffix is None else suffix}"


def build_path(kind: str, stamp: ModelStamp, model_path: str) -> Path:
    """Where a ``kind`` artifact built for a model at start-up is cached: its
    ``artifact_path``, or, without a weights fingerprint, one named after the model's folder."""
    path = artifact_path(kind, stamp)
    if path is not None:
        return path
    return cache_dir() / kind / (Path(model_path.rstrip("/")).name + CACHED_ARTIFACTS[kind][1])


# ---- writing ------------------------------------------------------------------------------
_tmp_ids = itertools.count()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A fresh temporary path next to ``path`` to write a file (or a folder) to; when the
    block ends without an error it replaces ``path`` in one step (``os.replace``), so
    readers see the old file or the new one, never half of one. On an error the
    temporary is removed and ``path`` is left as it was.

        with atomic_path(out) as tmp:
            tmp.write_text(text)
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp{os.getpid()}-{next(_tmp_ids)}")
    _remove(tmp)
    try:
        yield tmp
        os.replace(tmp, p)
    finally:
        _remove(tmp)


# ---- stamped safetensors -------------------------------------------------------------------
def save_stamped(path: str | Path, tensors: dict[str, torch.Tensor], fmt: str,
                 stamp: ModelStamp | None, meta: dict[str, Any]) -> None:
    """Write ``tensors`` as safetensors whose header names the format ``fmt``, the model
    ``stamp`` and the build metadata ``meta`` (JSON), atomically."""
    from safetensors.torch import save_file

    header = {"format": fmt, "stamp": json.dumps(stamp.to_json() if stamp else {}),
              "meta": json.dumps(meta, default=str)}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=header)


def open_stamped(path: str | Path, fmt: str, what: str, remedy: str, arrays: bool = True,
                 expect: ModelStamp | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read a file of ``save_stamped``: ({"format", "stamp": ModelStamp | None, "meta":
    dict}, {name: tensor}), or only the tensors' shapes when ``arrays`` is False (the
    header is read, not the data).

    Raises ArtifactError with a one-line message (``what`` names the artifact,
    ``remedy`` says what to do) for a missing file, another format or an unreadable
    file, and, given ``expect``, ArtifactMismatchError (``check_stamp``) for a file
    stamped for another model.
    """
    from safetensors import safe_open

    p = Path(path)
    if not p.is_file():
        raise ArtifactError(f"{what} {p} does not exist. {remedy}")
    try:
        with safe_open(str(p), framework="pt") as f:
            header = f.metadata() or {}
            if header.get("format") != fmt:
                raise ArtifactError(f"{p} is not a {what} of this plugin (format "
                                    f"{header.get('format')!r}, expected {fmt!r}). {remedy}")
            tensors = {k: f.get_tensor(k) if arrays else f.get_slice(k).get_shape()
                       for k in f.keys()}
        stamp_json = json.loads(header.get("stamp") or "{}")
        meta = json.loads(header.get("meta") or "{}")
    except ArtifactError:
        raise
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same advice
        why = " ".join(str(e).split()) or type(e).__name__
        raise ArtifactError(f"cannot read {what} {p} ({why}). {remedy}") from None
    stamp = ModelStamp.from_json(stamp_json) if stamp_json else None
    if expect is not None:
        check_stamp(what, str(p), stamp, expect, remedy)
    return {"format": fmt, "stamp": stamp, "meta": meta}, tensors


# ---- resumable logs -------------------------------------------------------------------------
def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The records of a JSONL log, up to a torn last line from an interrupted run."""
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return out


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """Append one record and make it durable (a resumed run trusts every full line)."""
    with open(path, "a") as f:
        f.write(json.dumps(record, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())
