"""Rank functions for the end-to-end VLM tests (module level: they are pickled by name)."""

from vlmcp.verify import ParityCase, parity_case


def parity_grid(group, cases):
    return [parity_case(group, ParityCase(**case)) for case in cases]
