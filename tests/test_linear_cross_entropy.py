"""``vlmcp.cp_linear_cross_entropy`` in one process: exact against the full logits, never N x V.

The distributed grid (P = 2, 3, ranks without a target) runs in ``tests/test_hf_loss.py``'s
spawned groups (``tests/loss_cases.py:op_grid``).
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import vlmcp
from tests import loss_cases
from vlmcp.debug.meters.allocations import AllocationMeter
from vlmcp.debug.meters.saved_tensors import SavedTensorMeter
from vlmcp.loss import chunk_transient_bytes


def _data(n=40, h=8, v=50, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, dtype=torch.float64)
    weight = torch.randn(v, h, generator=g, dtype=torch.float64) * 0.7
    bias = torch.randn(v, generator=g, dtype=torch.float64)
    labels = torch.randint(0, v, (n,), generator=g)
    labels[::3] = -100
    return hidden.to(dtype), weight.to(dtype), bias.to(dtype), labels


def _full(hidden, weight, bias, labels, softcap=None):
    z = F.linear(hidden, weight, bias)
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    return vlmcp.cp_cross_entropy(z, labels, None)


def _grads(fn, *tensors):
    leaves = [t.clone().requires_grad_() for t in tensors]
    res = fn(*leaves)
    res.loss.backward()
    return res, [t.grad for t in leaves]


def test_op_grid_one_process():
    """The spawned grid's op cases at P=1: loss, mean and gradients against the full logits."""
    for r in loss_cases.op_grid(None):
        assert r["loss_err"] < 1e-13 and r["mean_err"] < 1e-13, r
        assert r["hidden_err"] < 1e-13 and r["shared_err"] < 1e-13, r


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("softcap", [None, 1.5])
@pytest.mark.parametrize("chunk", [1, 7, 1000])
def test_exact_in_float64(bias, softcap, chunk):
    hidden, weight, b, labels = _data()
    args = (hidden, weight, b) if bias else (hidden, weight)
    ref, want = _grads(lambda h, w, *bb: _full(h, w, bb[0] if bb else None, labels, softcap), *args)
    res, got = _grads(lambda h, w, *bb: vlmcp.cp_linear_cross_entropy(
        h, w, labels, None, bias=bb[0] if bb else None, chunk_size=chunk, softcap=softcap), *args)
    assert abs(float(res.loss - ref.loss)) < 1e-13 and abs(float(res.mean - ref.mean)) < 1e-13
    assert res.loss.dtype == torch.float64
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(g, w, rtol=0, atol=1e-14), float((g - w).abs().max())
    assert not got[0][labels == -100].any()  # rows without a target: exactly zero


def test_tied_embedding_and_no_target():
    """The head's weight is the embedding's parameter: both gradients accumulate in it; a row
    without any target gives zero loss and zero gradient."""
    _, weight, _, labels = _data(v=50)
    ids = labels.clamp(min=0)
    for targets in (labels, torch.full_like(labels, -100)):
        grads = []
        for chunked in (False, True):
            emb = torch.nn.Embedding(50, 8, dtype=torch.float64)
            emb.weight.data.copy_(weight)
            h = torch.tanh(emb(ids))
            res = (vlmcp.cp_linear_cross_entropy(h, emb.weight, targets, None, chunk_size=4) if chunked
                   else _full(h, emb.weight, None, targets))
            res.loss.backward()
            grads.append((float(res.loss), emb.weight.grad))
        (l0, g0), (l1, g1) = grads
        assert abs(l0 - l1) < 1e-13 and torch.allclose(g0, g1, rtol=0, atol=1e-14)
        if not (targets != -100).any():
            assert l1 == 0 and not g1.any()


def _low_precision_errors(dtype, device):
    hidden, weight, b, labels = _data(n=256, h=32, v=300)
    ref, want = _grads(lambda h, w, bb: _full(h, w, bb, labels), hidden, weight, b)
    low = [t.to(device=device, dtype=dtype) for t in (hidden, weight, b)]
    labels = labels.to(device)
    full, g_full = _grads(lambda h, w, bb: _full(h, w, bb, labels), *low)
    mine, g_mine = _grads(lambda h, w, bb: vlmcp.cp_linear_cross_entropy(h, w, labels, None, bias=bb,
                                                                          chunk_size=16), *low)

    def err(x, y):
        return float((x.double().cpu() - y).norm() / y.norm())

    assert abs(float(mine.loss) - float(ref.loss)) <= 2 * abs(float(full.loss) - float(ref.loss)) + 1e-7
    for gm, gf, w in zip(g_mine, g_full, want, strict=True):
        assert gm.dtype == dtype
        assert err(gm, w) <= 2 * err(gf, w), (err(gm, w), err(gf, w))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_low_precision_error_within_twice_the_full_paths(dtype):
    """Against a float64 reference, the chunked path's loss and gradient errors are at most 2x the
    full-logits path's in the same dtype (both round the logits where the head computes them)."""
    _low_precision_errors(dtype, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_cuda_error_within_twice_the_full_paths(dtype):
    """The same on CUDA (cuBLAS matmuls, TF32 off by default for float32)."""
    _low_precision_errors(dtype, "cuda")


def test_autocast_runs_the_head_in_the_autocast_dtype():
    hidden, weight, _, labels = _data()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        res, got = _grads(lambda h, w: vlmcp.cp_linear_cross_entropy(h, w, labels, None, chunk_size=5),
                          hidden.float(), weight.float())
    low, want = _grads(lambda h, w: vlmcp.cp_linear_cross_entropy(
        h.bfloat16(), w.bfloat16(), labels, None, chunk_size=5), hidden.float(), weight.float())
    assert float(res.loss) == float(low.loss)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.float32 and torch.equal(g, w)


def test_no_tensor_of_n_by_v_elements_at_n_much_larger_than_the_chunk():
    """N = 2048 >> chunk 32: no op output of N x V elements, forward or backward (an allocation hook on
    every op), and the saved-for-backward bytes are O(N) besides the inputs (the saved-tensor counter);
    the full-logits path is the control (the meters do see its N x V tensors)."""
    n, h, v, chunk = 2048, 16, 512, 32
    hidden, weight, _, labels = _data(n=n, h=h, v=v, dtype=torch.float32)
    for chunked in (True, False):
        hd, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with AllocationMeter() as alloc, SavedTensorMeter([hd, w]) as saved:
            res = (vlmcp.cp_linear_cross_entropy(hd, w, labels, None, chunk_size=chunk) if chunked
                   else _full(hd, w, None, labels))
            res.loss.backward()
        if chunked:
            assert alloc.max_numel <= max(chunk * v, n * h, v * h), alloc.max_shape
            assert saved.bytes <= 3 * n * 8, saved.bytes  # rows (int64), targets (int64), lse (fp32)
        else:
            assert alloc.max_numel >= n * v and saved.bytes >= n * v * 4


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("softcap", [None, 2.0])
def test_chunk_transient_bytes_is_what_a_chunk_allocates(dtype, softcap):
    """The peak bytes alive at once grow with the chunk exactly as :func:`chunk_transient_bytes` says."""
    n, h, v = 512, 8, 1000
    hidden, weight, _, labels = _data(n=n, h=h, v=v, dtype=dtype)
    peaks = {}
    for chunk in (32, 96):
        hd, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with AllocationMeter() as m:
            vlmcp.cp_linear_cross_entropy(hd, w, labels.clamp(min=0), None, chunk_size=chunk,
                                          softcap=softcap).loss.backward()
        peaks[chunk] = m.peak_live_bytes
    want = (chunk_transient_bytes(96, v, dtype, softcap=softcap is not None, hidden_size=h)
            - chunk_transient_bytes(32, v, dtype, softcap=softcap is not None, hidden_size=h))
    assert abs((peaks[96] - peaks[32]) - want) <= 0.01 * want, (peaks, want)


def test_errors_before_any_communication():
    hidden, weight, b, labels = _data()
    cases = [
        (dict(hidden=hidden[None]), ValueError, "(N, H)"),
        (dict(labels=labels[:-1]), ValueError, "labels must be (N,)"),
        (dict(bias=b[:-1]), ValueError, "bias must be (V,)"),
        (dict(weight=weight.float()), TypeError, "one float dtype"),
        (dict(chunk_size=0), ValueError, "chunk_size"),
        (dict(softcap=0.0), ValueError, "softcap"),
        (dict(labels=labels.masked_fill(labels == 3, 50)), ValueError, "labels must be in [0, 50)"),
        (dict(group="world"), TypeError, "ProcessGroup"),
    ]
    for change, error, words in cases:
        kw = dict(hidden=hidden, weight=weight, labels=labels, group=None, bias=None, chunk_size=4)
        kw.update(change)
        with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            vlmcp.cp_linear_cross_entropy(kw.pop("hidden"), kw.pop("weight"), kw.pop("labels"),
                                          kw.pop("group"), **kw)
