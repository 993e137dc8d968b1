"""Runs that survive faults (issue 19): each fault reproduced, and what must happen instead.

NaN inputs stay NaN in every attention backend; checkpoints are checksummed and fall back
to the previous good one; one run per directory; the final model is a checkpoint too;
stalled ranks end the job within ``--timeout``; ranks never outlive their launcher.
"""

import pytest
import torch

from tests import fault_cases
from vlmcp.attention import cp_attention, merge_, varlen_attention
from vlmcp.layout import plan_cp
from vlmcp.testing import run_on_ranks

pytestmark = pytest.mark.timeout(120)


# ---------------------------------------------------------------- NaN stays NaN


def test_merge_tells_a_row_without_keys_from_a_nan_row():
    out = torch.tensor([[[0.0, 0.0], [1.0, 2.0], [1.0, 2.0], [0.0, 0.0]]])
    lse = torch.tensor([[float("-inf"), 0.5, float("nan"), float("-inf")]])
    block_out = torch.tensor([[[0.0, 0.0], [float("nan")] * 2, [3.0, 4.0], [3.0, 4.0]]])
    block_lse = torch.tensor([[float("-inf"), float("nan"), 0.1, 0.2]])
    merge_(out, lse, block_out, block_lse)
    # no key on either side: still 0 and -inf; a NaN on either side: NaN; a new key: copied
    assert out[0, 0].tolist() == [0.0, 0.0] and bool(lse[0, 0].isneginf())
    assert bool(out[0, 1:3].isnan().all()) and bool(lse[0, 1:3].isnan().all())
    assert out[0, 3].tolist() == [3.0, 4.0] and float(lse[0, 3]) == pytest.approx(0.2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("kernel", ["flash_cpu", "math"])
def test_nan_stays_nan_in_one_process(dtype, kernel):
    """varlen_attention and cp_attention with P = 1 (ring and Ulysses) against the NaN rule."""
    for spot in fault_cases.NAN_SPOTS:
        is_image, cu, ids, q, k, v, affected = fault_cases.nan_inputs(spot, dtype)
        out, lse = varlen_attention(q, k, v, cu, kernel=kernel)
        everywhere = torch.arange(is_image.numel())
        fault_cases.check_nan_output(out, lse, everywhere, spot, is_image, cu, ids, q, k, v, affected)
        shard = plan_cp(is_image, 1, cu, image_ids=ids).for_rank(0)
        for backend in ("ring", "ulysses"):
            out, lse = cp_attention(shard.shard(q), shard.shard(k), shard.shard(v), shard, None, backend,
                                    return_lse=True, kernel=kernel)
            fault_cases.check_nan_output(out, lse, shard.positions, spot, is_image, cu, ids, q, k, v,
                                         affected)


def test_nan_stays_nan_in_every_cp_backend():
    checked = run_on_ranks(fault_cases.nan_grid, 4, ("float32", "bfloat16"), timeout=110)
    assert checked == [5 * 2 * len(fault_cases.NAN_SPOTS)] * 4


# ---------------------------------------------------------------- minor


def test_cp_cross_entropy_refuses_a_group_that_is_not_one():
    from vlmcp.loss import cp_cross_entropy

    with pytest.raises(TypeError, match="group must be a torch.distributed ProcessGroup.*got int 1"):
        cp_cross_entropy(torch.zeros(3, 5), torch.zeros(3, dtype=torch.long), 1)
