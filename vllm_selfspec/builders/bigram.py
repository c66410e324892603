"""Building N-Grammys tables from a model's own weights (paper §4.1, Appendix B.1).

Used by ``tools/build_bigram.py`` (``offline.build_bigram``) and by method ``ngrammys`` when no table is
given and none is cached for the model (built once at start-up, then cached).
Everything runs through transformers, no vLLM: the bigram row of token x is the
top-K of p_M(. | x) from a single-token forward, batched over the vocabulary.
A build is ``shard_rows`` over slices of the vocabulary (one slice in-process,
many on Ray workers) followed by ``assemble``.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch

from vllm_selfspec.log import logger
from vllm_selfspec.model_info import stamp_from_model
from vllm_selfspec.proposers.artifacts import ModelStamp, build_path
from vllm_selfspec.proposers.ngram_tables import BigramTable, repeated_extension

EXTENSIONS = ("repeated", "greedy")
Progress = Callable[[Iterable[Any]], Iterable[Any]]
Shard = tuple[np.ndarray, np.ndarray, "np.ndarray | None"]  # ids, probs, greedy extension


@dataclass
class TableSpec:
    """What to build (the file's metadata records it)."""

    top_k: int = 32
    width: int = 4
    extension: str = "repeated"
    extend_k: int | None = None  # greedy extension for the first rows only
    prefix: list[int] = field(default_factory=list)  # context before x
    unigram_size: int = 1024
    batch_size: int = 512

    def __post_init__(self) -> None:
        if self.extension not in EXTENSIONS:
            raise ValueError(f"extension must be one of {EXTENSIONS}, got {self.extension!r}")

    @property
    def greedy_rows(self) -> int:
        if self.extension != "greedy" or self.width <= 1:
            return 0
        return min(self.top_k, self.extend_k or self.top_k)


def load_model(model_path: str, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    return model.to(device).eval()


def vocab_size(model: Any) -> int:
    cfg = model.config
    return int((cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg).vocab_size)


@torch.inference_mode()
def bigram_topk(model: Any, top_k: int, start: int = 0, end: int | None = None,
                batch_size: int = 512, progress: Progress = lambda x: x,
                prefix: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Top-k of p_M(. | prefix, x) for x in [start, end): ids [n, k] int32, probs [n, k] float32.

    The paper forwards x alone. Many models treat the first position as an
    attention sink and predict nearly the same token after any x there (SmolLM2:
    one token is the top-1 for 99.9% of the vocabulary), so a short neutral
    ``prefix`` (default in tools/build_bigram.py: a newline) puts x at position 1.
    The prefix is the same for every x: it is forwarded once and its KV cache shared by
    every batch, so each batch forwards x alone (about half the work with a one-token
    prefix), and only x's logits are computed."""
    end = vocab_size(model) if end is None else end
    dev = next(model.parameters()).device
    past = _prefix_cache(model, prefix, dev)
    context = len(prefix or []) + 1  # the prefix and x
    ids_out = np.empty((end - start, top_k), dtype=np.int32)
    probs_out = np.empty((end - start, top_k), dtype=np.float32)
    for lo in progress(range(start, end, batch_size)):
        hi = min(end, lo + batch_size)
        x = torch.arange(lo, hi, device=dev).unsqueeze(1)
        mask = torch.ones(hi - lo, context, dtype=torch.long, device=dev)
        logits = model(input_ids=x, attention_mask=mask, past_key_values=_repeated(past, hi - lo),
                       use_cache=False, logits_to_keep=1).logits[:, -1].float()
        p, i = torch.softmax(logits, dim=-1).topk(top_k, dim=-1)
        ids_out[lo - start: hi - start] = i.cpu().numpy()
        probs_out[lo - start: hi - start] = p.cpu().numpy()
    return ids_out, probs_out


def _prefix_cache(model: Any, prefix: list[int] | None, dev: torch.device) -> Any:
    """The KV cache of ``prefix`` alone (batch 1), or None without one."""
    if not prefix:
        return None
    pre = torch.tensor([list(prefix)], dtype=torch.long, device=dev)
    return model(input_ids=pre, use_cache=True, logits_to_keep=1).past_key_values


def _repeated(past: Any, n: int) -> Any:
    """A copy of the batch-1 cache ``past`` for a batch of ``n`` (the forward extends it)."""
    if past is None:
        return None
    out = copy.deepcopy(past)
    out.batch_repeat_interleave(n)
    return out


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
def greedy_extension(model: Any, ids: np.ndarray, start: int, k: int, width: int,
                     batch_size: int = 256, progress: Progress = lambda x: x,
                     prefix: list[int] | None = None) -> np.ndarray:
    """Rows extended by greedy decoding from [prefix, x, bigram token] (§4.1 "Extensions"),
    for the tokens x = start + i of the bigram rows ``ids`` [n, >=k]: [n, k, width-1].

    Costs k * (width - 1) short forwards per token x: fine on a GPU, slow on a
    CPU for large vocabularies (use ``repeated`` there)."""
    n = ids.shape[0]
    dev = next(model.parameters()).device
    out = np.empty((n, k, max(0, width - 1)), dtype=np.int32)
    rel = np.repeat(np.arange(n), k)
    js = np.tile(np.arange(k), n)
    seqs = np.stack([rel + start, ids[rel, js]], axis=1)  # [n*k, 2]
    if prefix:
        seqs = np.concatenate([np.tile(np.asarray(prefix), (len(seqs), 1)), seqs], axis=1)
    for lo in progress(range(0, len(seqs), batch_size)):
        rows = np.arange(lo, min(lo + batch_size, len(seqs)))
        inp = torch.from_numpy(seqs[rows]).long().to(dev)
        past = None
        for i in range(width - 1):
            o = model(input_ids=inp, past_key_values=past, use_cache=True)
            past = o.past_key_values
            inp = o.logits[:, -1].argmax(-1, keepdim=True)
            out[rows // k, rows % k, i] = inp.squeeze(1).cpu().numpy()
    return out


def shard_rows(model: Any, spec: TableSpec, start: int, end: int,
               progress: Progress = lambda x: x) -> Shard:
    """Bigram rows (and greedy extension) of the tokens [start, end)."""
    ids, probs = bigram_topk(model, spec.top_k, start, end, spec.batch_size, progress, spec.prefix)
    ext = None
    if spec.greedy_rows:
        ext = greedy_extension(model, ids, start, spec.greedy_rows, spec.width, spec.batch_size,
                               progress, spec.prefix)
    return ids, probs, ext


def assemble(model: Any, spec: TableSpec, shards: list[Shard], name: str, t0: float,
             **meta: Any) -> BigramTable:
    """The table from vocabulary shards in token order (repeated extension, unigram, stamp)."""
    ids = np.concatenate([s[0] for s in shards])
    probs = np.concatenate([s[1] for s in shards])
    ext = repeated_extension(ids, spec.top_k, spec.width)
    if spec.greedy_rows:
        ext[:, : spec.greedy_rows] = np.concatenate([s[2] for s in shards])
    uni = unigram_ranking(model, spec.unigram_size)
    info = {k: v for k, v in asdict(spec).items() if k not in ("batch_size", "unigram_size")}
    info.update(build_seconds=round(time.perf_counter() - t0, 1),
                dtype=str(next(model.parameters()).dtype), **meta)
    return BigramTable(ids, probs, uni, ext, stamp_from_model(model, name), info)


def build_table(model: Any, spec: TableSpec, name: str = "",
                progress: Progress = lambda x: x) -> BigramTable:
    """Build the whole table in this process (``tools/build_bigram.py --ray`` shards it)."""
    t0 = time.perf_counter()
    shard = shard_rows(model, spec, 0, vocab_size(model), progress)
    return assemble(model, spec, [shard], name, t0,
                    device=str(next(model.parameters()).device))


def default_prefix(model_path: str) -> list[int]:
    """A newline, as the tokenizer encodes it (the context of a line start)."""
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(model_path).encode("\n", add_special_tokens=False)
    return [int(i) for i in ids[-1:]]


class _LoggedProgress:
    """Progress of a start-up build in the log (no terminal to draw a bar on in a server):
    an estimate after the first batches, then every ~10%."""

    def __init__(self, total: int, every: float = 0.1) -> None:
        self.total, self.every = total, every

    def __call__(self, batches: Iterable[Any]) -> Iterable[Any]:
        t0 = time.perf_counter()
        batches = list(batches)
        step = max(1, int(len(batches) * self.every))
        for i, b in enumerate(batches):
            yield b
            done = i + 1
            if done == min(2, len(batches)) or done % step == 0:
                dt = time.perf_counter() - t0
                left = dt / done * (len(batches) - done)
                logger.warning("vllm_selfspec: bigram table %d%% built (%.0f s so far, about %.0f s "
                               "left)", 100 * done // len(batches), dt, left)


def table_for_model(model_path: str, stamp: ModelStamp) -> Path:
    """The cached table of this model (``artifact_path("bigram", stamp)``: built on first
    use, or put there by ``tools/build_bigram.py --install``), built now (default
    TableSpec) if missing."""
    path = build_path("bigram", stamp, model_path)
    if path.exists():
        logger.info("vllm_selfspec: no bigram_table given; using the table cached for this "
                    "model: %s", path)
        return path
    logger.warning("vllm_selfspec: no bigram_table given and none cached for this model; "
                   "building one now from the model's weights (one single-token forward per "
                   "vocabulary entry: %d tokens) before the engine starts. It is cached at %s "
                   "and reused next time. To build it ahead (on a GPU or a Ray cluster): "
                   "python tools/build_bigram.py --model %s --install [--device cuda | --ray]",
                   stamp.vocab_size, path, model_path)
    model = load_model(model_path)
    table = build_table(model, TableSpec(prefix=default_prefix(model_path)), name=model_path,
                        progress=_LoggedProgress(stamp.vocab_size))
    table.save(path)
    logger.info("vllm_selfspec: built the bigram table in %.1f s", table.meta["build_seconds"])
    return path
