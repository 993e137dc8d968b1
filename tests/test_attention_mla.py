"""MLA (DeepSeek-V3, Kimi-K2.5): V's head dim differs from Q/K's.

``cp_attention`` against single-process attention on the whole row (out, lse, dq, dk,
dv) in float64 and float32, on ring, Ulysses and USP, both CPU kernels (the flash
kernel zero-pads the narrower side, the math kernel takes any ``Dv``), ``Dv`` below and
above ``D``, at P = 2, 3 and 4 (USP with real Ulysses groups); and the two CPU kernels
on one block each, ``Dv != D``, against each other.
"""

import pytest
import torch

from tests import attention_cases
from vlmcp.attention.kernels import KERNELS
from vlmcp.attention.masks import Block, MaskKind
from vlmcp.testing import run_on_ranks

PACKED = ["t3 i5 t4 i2 i3 t6", "t7", "t2 i6"]
NAMES = ("out", "lse", "dq", "dk", "dv")


def _grid(P):
    cases = []
    usp = {2: (1, 2), 3: (1, 3), 4: (2,)}[P]
    backends = [("ring", None), ("ulysses", None)] + [("usp", u) for u in usp]
    for i, (backend, u) in enumerate(backends):
        for j, (strategy, ia) in enumerate((("replicate", "bidirectional"), ("shard", "causal"))):
            cases.append(dict(samples=PACKED, strategy=strategy, backend=backend, image_attention=ia,
                              kv_heads=(4, 3)[(i + j) % 2], dtype_name="float64", head_dim=12,
                              v_head_dim=(8, 16)[(i + j) % 2], ulysses_size=u,
                              kernel=(None, "math")[j]))
    cases.append(dict(samples=[(4, 9), (0, 5)], strategy="replicate", backend="ring",
                      image_attention="causal",
                      kv_heads=4, dtype_name="float32", head_dim=16, v_head_dim=8, seed=1))
    return cases


@pytest.fixture(scope="module")
def results():
    out = {}
    for P in (2, 3, 4):
        per_rank = run_on_ranks(attention_cases.parity_grid_kw, P, _grid(P), timeout=120)
        out[P] = [item for rank in per_rank for item in rank]
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("P", [2, 3, 4])
def test_mla_value_head_dim_matches_one_process(results, P):
    rows = results[P]
    assert {c["backend"] for c, _ in rows} == {"ring", "ulysses", "usp"}
    for case, errs in rows:
        tol = 1e-10 if case["dtype_name"] == "float64" else 2e-5
        bad = {n: errs[n] for n in NAMES if not errs[n] <= tol}
        assert not bad, (case, bad)


@pytest.mark.parametrize("dv", [4, 12])
@pytest.mark.parametrize("kind", [MaskKind.FULL, MaskKind.CAUSAL, MaskKind.MASKED])
def test_cpu_flash_kernel_pads_the_value_head_dim_exactly(kind, dv):
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(4, 6, 8, generator=g, dtype=torch.float64), torch.randn(2, 7, 8, generator=g,
                                                                               dtype=torch.float64)
    v, dout = torch.randn(2, 7, dv, generator=g, dtype=torch.float64), torch.randn(4, 6, dv, generator=g,
                                                                                   dtype=torch.float64)
    block = Block(0, 6, 0, 7, kind, 3, 0, 2, 5) if kind is MaskKind.MASKED else Block(0, 6, 0, 7, kind)
    flash, ref = KERNELS["flash_cpu"](), KERNELS["math"]()
    out, lse = flash.forward(q, k, v, block, 0.3)
    out_r, lse_r = ref.forward(q, k, v, block, 0.3)
    assert out.shape == (4, 6, dv)
    torch.testing.assert_close(out, out_r, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, lse_r, rtol=0, atol=1e-12)
    grads = flash.backward(dout, q, k, v, out_r, lse_r, block, 0.3)
    grads_r = ref.backward(dout, q, k, v, out_r, lse_r, block, 0.3)
    for a, b, x in zip(grads, grads_r, (q, k, v), strict=True):
        assert a.shape == x.shape
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
