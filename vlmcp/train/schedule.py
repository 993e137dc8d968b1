"""The learning-rate schedules of both trainers: pure functions of the step, so a resumed run
continues them exactly.

``step`` counts optimizer steps done before this one (0 for the first). Warm-up is linear and
reaches the peak at its last step, ``lr * (step + 1) / warmup``, so no step trains at 0; after
it the rate follows the scheduler over the remaining steps, ``progress = (step - warmup) /
(steps - warmup)`` in ``[0, 1)``::

    cosine    floor + (1 - floor) * (1 + cos(pi * progress)) / 2
    linear    floor + (1 - floor) * (1 - progress)
    constant  1

times ``lr``. ``vlmcp train --model`` decays to 0 (``floor = 0``, transformers'
``get_cosine_schedule_with_warmup`` and ``get_linear_schedule_with_warmup`` after their warm-up);
the reference trainer keeps 5 warm-up steps and a cosine to 10%.
"""

from __future__ import annotations

import math
from typing import Literal

__all__ = ["LR_SCHEDULERS", "WARMUP_STEPS", "LRScheduler", "hf_lr_at", "lr_at", "scheduled_lr"]

WARMUP_STEPS = 5
"""The reference trainer's warm-up."""

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
    """The reference trainer's rate: 5 warm-up steps, then cosine decay to 10%.

    ``cfg`` has ``lr`` and ``steps`` (a :class:`~vlmcp.train.reference.config.TrainConfig`).
    """
    return scheduled_lr("cosine", cfg.lr, step, cfg.steps, WARMUP_STEPS, floor=0.1)


def hf_lr_at(cfg, step: int) -> float:
    """``vlmcp train --model``'s rate: ``cfg.lr_scheduler`` after ``cfg.warmup`` steps, to 0.

    ``cfg`` is an :class:`~vlmcp.train.hf.config.HFTrainConfig` with its steps resolved.
    """
    return scheduled_lr(cfg.lr_scheduler, cfg.lr, step, cfg.steps, cfg.warmup)
