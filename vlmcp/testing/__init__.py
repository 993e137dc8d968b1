"""Helpers for testing distributed vlmcp code on one machine (gloo on the CPU)."""

from vlmcp.testing.distributed import DistributedTestError, run_on_ranks

__all__ = ["DistributedTestError", "run_on_ranks"]
