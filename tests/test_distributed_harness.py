"""The multi-process harness itself, and the layout's collective inverse."""

import re
import time

import pytest

from tests import dist_cases
from vlmcp.testing import DistributedTestError, run_on_ranks


def test_runs_every_rank_with_an_explicit_group():
    assert run_on_ranks(dist_cases.report_rank, 3) == [(0, 3, 3), (1, 3, 3), (2, 3, 3)]


def test_failing_rank_traceback_is_reported_and_peers_are_stopped():
    start = time.monotonic()
    with pytest.raises(DistributedTestError, match="(?s)rank 1 of 2.*ValueError: boom on purpose"):
        run_on_ranks(dist_cases.raise_on_rank_one, 2, timeout=60)
    assert time.monotonic() - start < 30  # did not wait for the deadline


def test_hang_fails_at_the_deadline_naming_the_ranks():
    with pytest.raises(DistributedTestError, match=r"ranks \[0, 1\] of 2 still running"):
        run_on_ranks(dist_cases.hang_forever, 2, timeout=8)


def test_rank_that_dies_silently_is_reported():
    with pytest.raises(DistributedTestError, match="rank 0 died with exit code 3"):
        run_on_ranks(dist_cases.die_on_rank_zero, 2, timeout=60)


def test_a_killed_rank_is_one_line_and_each_peer_that_lost_it_one_line():
    with pytest.raises(DistributedTestError) as failed:
        run_on_ranks(dist_cases.kill_rank_two, 3, timeout=60)
    lines = failed.value.lines
    assert str(failed.value) == "\n".join(lines) and "Traceback" not in str(failed.value)
    assert lines[0] == "rank 2 was killed by SIGKILL (signal 9) without a report", lines
    # the others were waiting for it (rank 1 perhaps for rank 0, which stopped first): one line each
    assert [line.split(":")[0] for line in lines[1:]] == ["rank 0", "rank 1"], lines
    # all_reduce, or the barrier before it when rank 2 left first (a collective that lost rank 2)
    want = (r"rank [01]: outside the step loop: (all_reduce|barrier) over ranks \[0, 1, 2\] lost a peer "
            r"\((Connection reset by peer|Connection closed by peer|Broken pipe|Socket closed)\)")
    assert all(re.fullmatch(want, line) for line in lines[1:]), lines
    assert "Connection" in failed.value.detail or "pipe" in failed.value.detail  # the tracebacks are kept


@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_shard_then_unshard_is_identity(P):
    cases = [
        ([(0, 16 * P)], "replicate"),
        ([(5, 7), (0, 3), (9, 1)], "replicate"),
        ([(5, 7), (0, 3), (9, 1)], "shard"),
        ([(4, 0), (2, 2 * P + 1)], "replicate"),
        ([(1, 1)], "shard"),
    ]
    assert run_on_ranks(dist_cases.unshard_round_trip, P, cases) == [2 * len(cases)] * P
