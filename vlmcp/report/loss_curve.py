"""The loss curve of a training run, drawn from its metrics JSONL file."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on CI machines or cluster nodes
import matplotlib.pyplot as plt  # noqa: E402

from vlmcp.report.metrics import read_metrics  # noqa: E402

__all__ = ["plot_loss_curve"]

_GRAD_KEYS = (("grad_norm_vision", "vision tower"), ("grad_norm_projector", "projector"),
              ("grad_norm_llm", "LLM"))


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    pairs = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return [p[0] for p in pairs], [float(p[1]) for p in pairs]


def plot_loss_curve(metrics_jsonl: str | os.PathLike, out_png: str | os.PathLike,
                    title: str | None = None) -> Path:
    """Draw loss per step (top, with the eval loss where the file has one) and the gradient norms of
    each part (bottom).

    The bottom panel is the seed's point made visible: the vision tower's gradient
    norm stays above zero, i.e. the text loss reaches the ViT through CP.

    Args:
        metrics_jsonl: a file written by :class:`vlmcp.report.metrics.MetricsWriter`.
        out_png: the PNG to write (its directory is created).
        title: figure title (default: the metrics file name).

    Returns:
        ``Path(out_png)``.

    Raises:
        ValueError: if the file holds no record with a loss.
    """
    records = read_metrics(metrics_jsonl)
    steps, loss = _series(records, "loss")
    if not steps:
        raise ValueError(f"{metrics_jsonl} holds no step with a loss; nothing to plot")
    fig, (ax_loss, ax_grad) = plt.subplots(2, 1, figsize=(7, 6), sharex=True,
                                           gridspec_kw={"height_ratios": [3, 2]})
    try:
        ax_loss.plot(steps, loss, color="tab:blue", linewidth=1, alpha=0.5, label="loss")
        if len(loss) >= 10:  # a running mean reads better than noisy single steps
            k = max(2, len(loss) // 20)
            smooth = [sum(loss[max(0, i - k + 1):i + 1]) / len(loss[max(0, i - k + 1):i + 1])
                      for i in range(len(loss))]
            ax_loss.plot(steps, smooth, color="tab:blue", linewidth=2, label=f"mean of {k} steps")
        eval_steps, eval_loss = _series(records, "eval_loss")
        if eval_steps:  # vlmcp train --model --eval-data
            ax_loss.plot(eval_steps, eval_loss, color="tab:orange", marker="o", linewidth=1.5,
                         label="eval loss")
        ax_loss.set_ylabel("loss")
        ax_loss.grid(alpha=0.3)
        ax_loss.legend(loc="upper right")
        ax_loss.set_title(title or Path(metrics_jsonl).name)
        for key, label in _GRAD_KEYS:
            xs, ys = _series(records, key)
            if xs:
                ax_grad.plot(xs, ys, linewidth=1.5, label=label)
        # Norms span decades between parts; a log axis needs every value > 0.
        if ax_grad.lines and all(min(line.get_ydata()) > 0 for line in ax_grad.lines):
            ax_grad.set_yscale("log")
        ax_grad.set_xlabel("step")
        ax_grad.set_ylabel("gradient norm")
        ax_grad.grid(alpha=0.3)
        if ax_grad.lines:
            ax_grad.legend(loc="upper right")
        out = Path(out_png)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.tight_layout()
        fig.savefig(out, dpi=100)
    finally:
        plt.close(fig)
    return out
