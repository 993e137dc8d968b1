"""Pictures for people: a run's loss curve and a CP plan's layout.

Main entry points:

* :func:`plot_loss_curve`: loss and per-part gradient norms from a metrics JSONL file.
* :func:`draw_plan`: a packed row's layout per rank and its attention mask split
  between ranks.

Both draw with matplotlib's Agg backend (no display needed).
"""

from vlmcp.report.loss_curve import plot_loss_curve
from vlmcp.report.plan_picture import draw_plan

__all__ = ["draw_plan", "plot_loss_curve"]
