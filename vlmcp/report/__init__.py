"""Pictures for people: a run's loss curve and a CP plan's layout.

Main entry points:

* :func:`plot_loss_curve`: loss and per-part gradient norms from a metrics JSONL file.
* :func:`draw_plan`: a packed row's layout per rank and its attention mask split
  between ranks.

Both draw with matplotlib's Agg backend (no display needed).
"""

import importlib

__all__ = ["draw_plan", "plot_loss_curve"]

_LAZY = {"plot_loss_curve": "vlmcp.report.loss_curve", "draw_plan": "vlmcp.report.plan_picture"}
"""Imported on first use (PEP 562): matplotlib costs a second, and every trainer imports
:mod:`vlmcp.report.metrics` from this package."""


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'vlmcp.report' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
