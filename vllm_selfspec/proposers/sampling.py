"""Draft token choice: argmax for greedy requests, a sample from q otherwise.

Lossless sampling (Leviathan et al.; Draft & Verify Appendix K, Algorithm 4):
a draft sampled from q is accepted with probability min(1, p/q) and replaced
from norm(max(p - q, 0)) on rejection, so q must be exactly the distribution the
draft was drawn from. We build q like vLLM builds p (temperature, then top-k,
then top-p; ``vllm/v1/sample/rejection_sampler.py: apply_sampling_constraints``)
so that q is close to p and acceptance stays high.
"""

from __future__ import annotations

import torch


def draft_distribution(logits: torch.Tensor, temperature: torch.Tensor,
                       top_k: torch.Tensor | None = None,
                       top_p: torch.Tensor | None = None) -> torch.Tensor:
    """q = softmax(top_p(top_k(logits / T))) row by row; float32 [n, V]."""
    x = logits.float() / temperature.float().clamp_min(1e-5).unsqueeze(1)
    vocab = x.shape[1]
    if top_k is not None:
        k = top_k.clone()
        k[(k <= 0) | (k >= vocab)] = vocab
        if bool((k < vocab).any()):
            kmax = int(k.max())
            top = torch.topk(x, kmax, dim=1).values
            kth = top.gather(1, (k - 1).clamp(max=kmax - 1).long().unsqueeze(1))
            x = x.masked_fill(x < kth, float("-inf"))
    if top_p is not None and bool((top_p < 1.0).any()):
        sorted_x, idx = torch.sort(x, dim=1, descending=True)
        cum = torch.softmax(sorted_x, dim=1).cumsum(dim=1)
        # drop a token when the mass before it already exceeds top_p
        drop_sorted = (cum - torch.softmax(sorted_x, dim=1)) > top_p.float().unsqueeze(1)
        drop = torch.zeros_like(drop_sorted).scatter(1, idx, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.softmax(x, dim=1)


def choose_tokens(logits: torch.Tensor, sampled: torch.Tensor, temperature: torch.Tensor,
                  top_k: torch.Tensor | None, top_p: torch.Tensor | None,
                  generator: torch.Generator | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Pick one draft token per row.

    Returns (tokens [n], confidence [n], q [n, V] or None). Rows with
    ``sampled`` False take the argmax and their confidence is the top-1 softmax
    probability (D&V §3.4); sampled rows draw from q, confidence = max q.
    q rows of argmax rows are left zero (vLLM ignores them for greedy requests).
    """
    probs = torch.softmax(logits.float(), dim=1)
    conf, tokens = probs.max(dim=1)
    q = None
    if bool(sampled.any()):
        idx = sampled.nonzero().squeeze(1)
        q_rows = draft_distribution(logits[idx], temperature[idx],
                                    None if top_k is None else top_k[idx],
                                    None if top_p is None else top_p[idx])
        drawn = torch.multinomial(q_rows, 1, generator=generator).squeeze(1)
        tokens = tokens.clone()
        conf = conf.clone()
        tokens[idx] = drawn
        conf[idx] = q_rows.max(dim=1).values
        q = torch.zeros_like(probs)
        q[idx] = q_rows
    return tokens, conf, q
