"""Autograd collectives, each alone, against a single-process computation in float64."""

import pytest

from tests import vision_cases
from vlmcp.testing import run_on_ranks


@pytest.mark.parametrize("P", [1, 3])
def test_every_collective_and_its_dual_match_one_process(P):
    # Forward values, input gradients and untouched inputs are asserted on every rank;
    # here we check that every case ran on every rank.
    checked = run_on_ranks(vision_cases.collectives_grid, P, timeout=90)
    assert all(c == checked[0] for c in checked)
    uneven = str([2, 0, 3, 1][:P])
    expected = (
        [f"broadcast src={s}" for s in range(P)]
        + [f"all_gather dim={d} sizes={s}" for d in (0, 1) for s in (uneven, str([0] * P), "None")]
        + ["copy_to_group", "all_reduce_sum", "all_to_all 0->1", "all_to_all 1->0", "all_to_all 2->2"]
    )
    assert checked[0] == expected
