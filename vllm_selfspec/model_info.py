"""What the plugin knows about the target model before the engine starts.

Start-up checks (skip mask in range and made for this model, architecture has an
adapter) run in the front-end process, where vLLM builds its config
(``EngineArgs.create_speculative_config``), so a bad input fails before any
engine process starts. The weights fingerprint is read from the model folder's
safetensors files; for hub names not on disk it is checked again in the worker.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_selfspec.log import logger
from vllm_selfspec.proposers.artifacts import ModelStamp, fingerprint_names, weights_fingerprint


@dataclass
class ModelInfo:
    stamp: ModelStamp
    path: str  # what the user passed (folder or hub name)

    @property
    def num_layers(self) -> int:
        return self.stamp.num_layers


def _text_config(hf_config: Any) -> Any:
    get = getattr(hf_config, "get_text_config", None)
    return get() if callable(get) else hf_config


def read_fingerprint(model_dir: str, num_layers: int) -> str | None:
    """Weights fingerprint from safetensors files in a local folder (None if unavailable)."""
    d = Path(model_dir)
    if not d.is_dir():
        return None
    files = sorted(d.glob("*.safetensors"))
    if not files:
        return None
    try:
        from safetensors import safe_open

        names = fingerprint_names(num_layers)
        found: dict[str, Any] = {}
        index = d / "model.safetensors.index.json"
        if index.exists():
            weight_map = json.loads(index.read_text()).get("weight_map", {})
            files = sorted({d / weight_map[n] for n in names if n in weight_map}) or files
        for f in files:
            with safe_open(str(f), framework="pt") as sf:
                keys = set(sf.keys())
                for n in names:
                    if n in keys and n not in found:
                        found[n] = sf.get_tensor(n)
        if len(found) != len(names):
            return None
        return weights_fingerprint([found[n] for n in names])
    except Exception as e:  # unreadable weights: structural checks still apply
        logger.debug("vllm_selfspec: could not read a weights fingerprint from %s: %s", model_dir, e)
        return None


def stamp_from_config(hf_config: Any, path: str) -> ModelStamp:
    """The stamp of a model from its HF config, fingerprint read from ``path``'s files."""
    hf = _text_config(hf_config)
    archs = list(getattr(hf_config, "architectures", None) or [])
    num_layers = int(hf.num_hidden_layers)
    return ModelStamp(
        architecture=archs[0] if archs else "",
        num_layers=num_layers,
        hidden_size=int(hf.hidden_size),
        vocab_size=int(hf.vocab_size),
        fingerprint=read_fingerprint(path, num_layers),
        name=os.path.basename(path.rstrip("/")),
    )


def stamp_from_path(model_path: str) -> ModelStamp:
    """The stamp of a local model folder without loading its weights (offline tools)."""
    from transformers import AutoConfig

    return stamp_from_config(AutoConfig.from_pretrained(model_path), model_path)


def stamp_from_model(model: Any, name: str = "") -> ModelStamp:
    """The stamp of a loaded transformers model (fingerprint from its parameters)."""
    hf = _text_config(model.config)
    n = int(hf.num_hidden_layers)
    params = dict(model.named_parameters())
    names = fingerprint_names(n)
    fp = weights_fingerprint([params[k] for k in names]) if all(k in params for k in names) else None
    arch = (getattr(model.config, "architectures", None) or [type(model).__name__])[0]
    return ModelStamp(arch, n, int(hf.hidden_size), int(hf.vocab_size), fp,
                      name=str(name).rstrip("/").split("/")[-1] or None)


def model_info(model_config: Any) -> ModelInfo:
    """Build ModelInfo from vLLM's ModelConfig (front-end process)."""
    path = str(model_config.model)
    return ModelInfo(stamp=stamp_from_config(model_config.hf_config, path), path=path)
