"""Draft token choice and the draft distribution q (lossless sampling needs exact q)."""

import torch

from vllm_selfspec.proposers.sampling import choose_tokens, draft_distribution


def test_greedy_rows_take_argmax_with_top1_confidence():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 0.0]])
    tok, conf, q = choose_tokens(logits, torch.tensor([False, False]), torch.zeros(2), None, None)
    assert tok.tolist() == [1, 0] and q is None
    assert torch.allclose(conf, torch.softmax(logits, 1).max(1).values)


def test_top_k_top_p_and_temperature():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    q = draft_distribution(logits, torch.tensor([1.0]), torch.tensor([2]), None)
    assert torch.allclose(q, torch.tensor([[0.625, 0.375, 0.0, 0.0]]), atol=1e-6)
    q = draft_distribution(logits, torch.tensor([1.0]), None, torch.tensor([0.7]))
    assert torch.allclose(q, torch.tensor([[0.625, 0.375, 0.0, 0.0]]), atol=1e-6)
    q = draft_distribution(logits, torch.tensor([1.0]), torch.tensor([0]), torch.tensor([1.0]))
    assert torch.allclose(q, torch.tensor([[0.5, 0.3, 0.15, 0.05]]), atol=1e-6)
    hot = draft_distribution(logits, torch.tensor([2.0]), None, None)
    assert hot[0, 3] > 0.05  # higher temperature flattens


def test_sampled_rows_follow_q():
    g = torch.Generator().manual_seed(0)
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.7]])).repeat(20000, 1)
    sampled = torch.ones(20000, dtype=torch.bool)
    tok, conf, q = choose_tokens(logits, sampled, torch.ones(20000), None, None, g)
    freq = torch.bincount(tok, minlength=3).float() / 20000
    assert torch.allclose(freq, torch.tensor([0.1, 0.2, 0.7]), atol=0.015)
    assert torch.allclose(q[0], torch.tensor([0.1, 0.2, 0.7]), atol=1e-6)
    assert torch.allclose(conf, torch.full((20000,), 0.7), atol=1e-6)


def test_mixed_batch_leaves_q_zero_for_greedy_rows():
    logits = torch.randn(3, 5)
    tok, conf, q = choose_tokens(logits, torch.tensor([False, True, False]),
                                 torch.tensor([0.0, 0.8, 0.0]), None, None)
    assert q is not None and q[0].sum() == 0 and q[2].sum() == 0
    assert abs(float(q[1].sum()) - 1.0) < 1e-5
    assert tok[0] == logits[0].argmax() and tok[2] == logits[2].argmax()
