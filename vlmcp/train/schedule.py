"""The learning-rate schedule: one pure function of the step, so a resumed run continues it exactly.

``step`` counts optimizer steps done before this one (0 for the first). Warm-up is linear and
reaches the peak at its last step, ``lr * (step + 1) / warmup``, so no step trains at 0; after
it the rate follows the scheduler over the remaining steps, ``progress = (step - warmup) /
(steps - warmup)`` in ``[0, 1)``, down to ``floor = min_lr_ratio``::

    cosine    floor + (1 - floor) * (1 + cos(pi * progress)) / 2
    linear    floor + (1 - floor) * (1 - progress)
    constant  1

times ``lr``. A model directory's defaults decay to 0 after no warm-up (``floor = 0``:
transformers' ``get_cosine_schedule_with_warmup`` and ``get_linear_schedule_with_warmup`` after
their warm-up); the reference VLM's are 5 warm-up steps and a cosine to 10%, the numbers its
runs always had.
"""

from __future__ import annotations

import math
from typing import Literal

__all__ = ["LR_SCHEDULERS", "LRScheduler", "lr_at", "scheduled_lr"]

LRScheduler = Literal["cosine", "linear", "constant"]
LR_SCHEDULERS: tuple[str, ...] = ("cosine", "linear", "constant")


def scheduled_lr(kind: str, lr: float, step: int, steps: int, warmup: int, floor: float = 0.0) -> float:
    """The learning rate of step ``step`` (0-based) of ``steps`` (see the module docstring)."""
    if kind not in LR_SCHEDULERS:
        raise ValueError(f"lr scheduler must be one of {LR_SCHEDULERS}, got {kind!r}")
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    if kind == "constant":
        return lr
    if kind == "linear":
        return lr * (floor + (1 - floor) * (1 - progress))
    return lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def lr_at(cfg, step: int) -> float:
    """The run's rate at ``step``: ``cfg.lr_scheduler`` after ``cfg.warmup`` steps, to ``cfg.min_lr_ratio``.

    ``cfg`` is a :class:`~vlmcp.train.config.TrainConfig` with its steps resolved.
    """
    return scheduled_lr(cfg.lr_scheduler, cfg.lr, step, cfg.steps, cfg.warmup, cfg.min_lr_ratio)
