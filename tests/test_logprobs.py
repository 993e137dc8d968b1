"""cp_token_logprobs and per_sample_sum on one process (the CP grid and DPO run in tests/test_trainer.py)."""

from __future__ import annotations

import pytest
import torch

import vlmcp

pytestmark = pytest.mark.timeout(60)


def _dense(hidden, weight, bias, labels, temperature, softcap=None):
    logits = hidden @ weight.t() + (0 if bias is None else bias)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    logits = logits / temperature
    picked = torch.log_softmax(logits, -1).gather(1, labels.clamp(min=0)[:, None]).squeeze(1)
    return torch.where(labels != -100, picked, torch.zeros_like(picked))


@pytest.mark.parametrize("chunk_size", [1, 3, 64])
@pytest.mark.parametrize("with_bias,softcap", [(False, None), (True, None), (True, 2.5)])
def test_chunked_from_hidden_states_is_exact(chunk_size, with_bias, softcap):
    g = torch.Generator().manual_seed(0)
    n, h, v = 11, 6, 17
    hidden = torch.randn(n, h, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(v, h, dtype=torch.float64, generator=g, requires_grad=True)
    bias = torch.randn(v, dtype=torch.float64, generator=g, requires_grad=True) if with_bias else None
    labels = torch.randint(0, v, (n,), generator=g)
    labels[[0, 4, 9]] = -100
    weights = torch.randn(n, dtype=torch.float64, generator=g)  # a loss that weighs each token's log-prob
    params = [hidden, weight] + ([bias] if with_bias else [])

    ref = _dense(hidden, weight, bias, labels, 0.7, softcap)
    ref_grads = torch.autograd.grad((ref * weights).sum(), params)
    out = vlmcp.cp_token_logprobs(hidden, labels, None, weight=weight, bias=bias, chunk_size=chunk_size,
                                  temperature=0.7, softcap=softcap)
    grads = torch.autograd.grad((out * weights).sum(), params)
    assert torch.allclose(out, ref, rtol=0, atol=1e-13) and bool((out[[0, 4, 9]] == 0).all())
    for got, want in zip(grads, ref_grads, strict=True):
        assert torch.allclose(got, want, rtol=0, atol=1e-12)
    assert bool((grads[0][[0, 4, 9]] == 0).all())  # rows without a target: no gradient

    logits = hidden @ weight.t() + (0 if bias is None else bias)
    logits = (logits if softcap is None else softcap * torch.tanh(logits / softcap)).detach()
    from_logits = vlmcp.cp_token_logprobs(logits, labels, None, temperature=0.7)
    assert torch.allclose(from_logits, ref, rtol=0, atol=1e-13)


def test_logprobs_refuse_bad_inputs():
    hidden, weight = torch.zeros(4, 3), torch.zeros(5, 3)
    with pytest.raises(ValueError, match="labels must be in"):
        vlmcp.cp_token_logprobs(hidden, torch.tensor([0, 5, -100, 1]), None, weight=weight)
    with pytest.raises(ValueError, match="weight must be"):
        vlmcp.cp_token_logprobs(hidden, torch.zeros(4, dtype=torch.long), None, weight=torch.zeros(5, 4))
    with pytest.raises(TypeError, match="share one float dtype"):
        vlmcp.cp_token_logprobs(hidden, torch.zeros(4, dtype=torch.long), None, weight=weight.double())
    with pytest.raises(ValueError, match="temperature"):
        vlmcp.cp_token_logprobs(hidden, torch.zeros(4, dtype=torch.long), None, weight=weight, temperature=0)
    with pytest.raises(TypeError, match="ProcessGroup"):
        vlmcp.cp_token_logprobs(hidden, torch.zeros(4, dtype=torch.long), "world", weight=weight)


def test_per_sample_sum_one_process_sums_each_sample_and_checks_the_shard():
    plan = vlmcp.plan_cp(torch.tensor([False, True, True, False, False, False, False]), 1,
                         cu_seqlens=torch.tensor([0, 4, 7]))
    shard = plan.for_rank(0)
    values = torch.arange(1.0, shard.num_tokens + 1, dtype=torch.float64, requires_grad=True)
    sums = vlmcp.per_sample_sum(values, shard, None)
    assert sums.tolist() == [1 + 2 + 3 + 4, 5 + 6 + 7]
    sums.sum().backward()
    assert values.grad.tolist() == [1.0] * 7
    with pytest.raises(ValueError, match="one per local slot"):
        vlmcp.per_sample_sum(values[:3], shard, None)
    with pytest.raises(ValueError, match="planned for P=2"):
        other = vlmcp.plan_cp(torch.zeros(8, dtype=torch.bool), 2).for_rank(0)
        vlmcp.per_sample_sum(torch.zeros(other.num_tokens), other, None)
