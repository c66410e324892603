"""Building N-Grammys tables from a model's own weights (paper §4.1, Appendix B.1).

Used by ``tools/build_bigram.py`` and by method ``ngrammys`` when no table is
given and none is cached for the model (built once at start-up, then cached).
Everything runs through transformers, no vLLM: the bigram row of token x is the
top-K of p_M(. | x) from a single-token forward, batched over the vocabulary.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch

from vllm_selfspec.assets import cache_dir
from vllm_selfspec.log import logger
from vllm_selfspec.proposers.artifacts import ModelStamp, fingerprint_names, weights_fingerprint
from vllm_selfspec.proposers.ngram_tables import BigramTable, repeated_extension

EXTENSIONS = ("repeated", "greedy")
Progress = Callable[[Iterable[Any]], Iterable[Any]]


def load_model(model_path: str, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    return model.to(device).eval()


def model_stamp(model: Any, name: str = "") -> ModelStamp:
    """The same stamp the plugin computes at start-up (vllm_selfspec.model_info)."""
    cfg = model.config
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    n = int(cfg.num_hidden_layers)
    sd = dict(model.named_parameters())
    names = fingerprint_names(n)
    fp = weights_fingerprint([sd[k] for k in names]) if all(k in sd for k in names) else None
    arch = (getattr(model.config, "architectures", None) or [type(model).__name__])[0]
    return ModelStamp(arch, n, int(cfg.hidden_size), int(cfg.vocab_size), fp,
                      name=str(name).rstrip("/").split("/")[-1] or None)


def stamp_from_path(model_path: str) -> ModelStamp:
    """The stamp of a local model folder without loading it (config + safetensors)."""
    from transformers import AutoConfig

    from vllm_selfspec.model_info import read_fingerprint

    cfg = AutoConfig.from_pretrained(model_path)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    n = int(text.num_hidden_layers)
    arch = (getattr(cfg, "architectures", None) or [""])[0]
    return ModelStamp(arch, n, int(text.hidden_size), int(text.vocab_size),
                      read_fingerprint(model_path, n), name=Path(model_path.rstrip("/")).name)


@torch.inference_mode()
def bigram_topk(model: Any, top_k: int, start: int = 0, end: int | None = None,
                batch_size: int = 512, progress: Progress = lambda x: x,
                prefix: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Top-k of p_M(. | prefix, x) for x in [start, end): ids [n, k] int32, probs [n, k] float32.

    The paper forwards x alone. Many models treat the first position as an
    attention sink and predict nearly the same token after any x there (SmolLM2:
    one token is the top-1 for 99.9% of the vocabulary), so a short neutral
    ``prefix`` (default in tools/build_bigram.py: a newline) puts x at position 1."""
    pre = torch.tensor(list(prefix or []), dtype=torch.long)
    vocab = int(model.config.get_text_config().vocab_size
                if hasattr(model.config, "get_text_config") else model.config.vocab_size)
    end = vocab if end is None else end
    dev = next(model.parameters()).device
    ids_out = np.empty((end - start, top_k), dtype=np.int32)
    probs_out = np.empty((end - start, top_k), dtype=np.float32)
    for lo in progress(range(start, end, batch_size)):
        hi = min(end, lo + batch_size)
        x = torch.arange(lo, hi).unsqueeze(1)
        x = torch.cat([pre.expand(hi - lo, -1), x], dim=1).to(dev)
        logits = model(input_ids=x, attention_mask=torch.ones_like(x)).logits[:, -1].float()
        p, i = torch.softmax(logits, dim=-1).topk(top_k, dim=-1)
        ids_out[lo - start: hi - start] = i.cpu().numpy()
        probs_out[lo - start: hi - start] = p.cpu().numpy()
    return ids_out, probs_out


@torch.inference_mode()
def unigram_ranking(model: Any, n: int) -> np.ndarray:
    """Appendix B.1 ``unigram``: rank tokens by mu^T Cov(V) u_x, smallest first."""
    enc = model.get_input_embeddings().weight.detach().float()
    dec = model.get_output_embeddings().weight.detach().float()
    cov = enc.T @ enc / enc.shape[0]
    mu = dec.mean(dim=0, keepdim=True)
    dists = (mu @ cov @ dec.T).squeeze(0)
    return torch.topk(-dists, k=min(n, dists.numel())).indices.cpu().numpy().astype(np.int32)


@torch.inference_mode()
def greedy_extension(model: Any, bigram_ids: np.ndarray, k: int, width: int,
                     start: int = 0, end: int | None = None, batch_size: int = 256,
                     progress: Progress = lambda x: x, prefix: list[int] | None = None
                     ) -> np.ndarray:
    """Rows extended by greedy decoding from [x, bigram token] (§4.1 "Extensions").

    Costs k * (width - 1) short forwards per token x: fine on a GPU, slow on a
    CPU for large vocabularies (use ``repeated`` there)."""
    end = bigram_ids.shape[0] if end is None else end
    dev = next(model.parameters()).device
    out = np.empty((end - start, k, max(0, width - 1)), dtype=np.int32)
    xs = np.repeat(np.arange(start, end), k)
    js = np.tile(np.arange(k), end - start)
    seqs = np.stack([xs, bigram_ids[xs, js]], axis=1)  # [(end-start)*k, 2]
    if prefix:
        seqs = np.concatenate([np.tile(np.asarray(prefix), (len(seqs), 1)), seqs], axis=1)
    for lo in progress(range(0, len(seqs), batch_size)):
        cur = torch.from_numpy(seqs[lo: lo + batch_size]).long().to(dev)
        past = None
        inp = cur
        for i in range(width - 1):
            o = model(input_ids=inp, past_key_values=past, use_cache=True)
            past = o.past_key_values
            nxt = o.logits[:, -1].argmax(-1, keepdim=True)
            rows = np.arange(lo, lo + cur.shape[0])
            out[rows // k, rows % k, i] = nxt.squeeze(1).cpu().numpy()
            inp = nxt
    return out


def build_table(model: Any, top_k: int = 32, width: int = 4, extension: str = "repeated",
                unigram_size: int = 1024, batch_size: int = 512, name: str = "",
                progress: Progress = lambda x: x, extend_k: int | None = None,
                prefix: list[int] | None = None) -> BigramTable:
    """Build the whole table in this process (``tools/build_bigram.py`` shards it over Ray)."""
    if extension not in EXTENSIONS:
        raise ValueError(f"extension must be one of {EXTENSIONS}, got {extension!r}")
    t0 = time.perf_counter()
    ids, probs = bigram_topk(model, top_k, batch_size=batch_size, progress=progress, prefix=prefix)
    t_bigram = time.perf_counter() - t0
    ext = repeated_extension(ids, top_k, width)
    if extension == "greedy" and width > 1:
        ke = min(top_k, extend_k or top_k)
        ext[:, :ke] = greedy_extension(model, ids, ke, width, batch_size=batch_size,
                                       progress=progress, prefix=prefix)
    uni = unigram_ranking(model, unigram_size)
    meta = {"top_k": top_k, "width": width, "extension": extension,
            "extend_k": extend_k if extension == "greedy" else None, "prefix": list(prefix or []),
            "build_seconds": round(time.perf_counter() - t0, 1),
            "bigram_seconds": round(t_bigram, 1),
            "device": str(next(model.parameters()).device),
            "dtype": str(next(model.parameters()).dtype)}
    return BigramTable(ids, probs, uni, ext, model_stamp(model, name), meta)


def default_prefix(model_path: str) -> list[int]:
    """A newline, as the tokenizer encodes it (the context of a line start)."""
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(model_path).encode("\n", add_special_tokens=False)
    return [int(i) for i in ids[-1:]]


def cached_table_path(stamp: ModelStamp) -> Path | None:
    """Where the default table of these exact weights is cached (needs a fingerprint):
    built on first use, or put there by ``tools/build_bigram.py --install``."""
    if not stamp.fingerprint:
        return None
    return (cache_dir() / "bigram"
            / f"{stamp.architecture}-{stamp.vocab_size}-{stamp.fingerprint}.safetensors")


def table_for_model(model_path: str, stamp: ModelStamp, top_k: int, width: int) -> Path:
    """The cached table of this model, built now if missing (logged: it takes a while)."""
    path = cached_table_path(stamp)
    if path is not None and path.exists():
        logger.info("vllm_selfspec: no bigram_table given; using the table cached for this "
                    "model: %s", path)
        return path
    if path is None:
        path = cache_dir() / "bigram" / (Path(model_path.rstrip("/")).name
                                         + f"-k{top_k}-w{width}.safetensors")
    logger.info("vllm_selfspec: no bigram_table given and none cached for this model; building "
                "one now from the model's weights (one single-token forward per vocabulary "
                "entry; %d tokens). It is cached at %s and reused next time.",
                stamp.vocab_size, path)
    model = load_model(model_path)
    table = build_table(model, top_k, width, name=model_path, prefix=default_prefix(model_path))
    table.save(path)
    logger.info("vllm_selfspec: built the bigram table in %.1f s", table.meta["build_seconds"])
    return path
