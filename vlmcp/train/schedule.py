"""The learning-rate schedule of both trainers: a pure function of the step, so a resumed run
continues it exactly."""

from __future__ import annotations

import math

__all__ = ["WARMUP_STEPS", "lr_at"]

WARMUP_STEPS = 5


def lr_at(cfg, step: int) -> float:
    """Linear warm-up, then cosine decay to 10% (a pure function of the step: resumable).

    ``cfg`` has ``lr`` and ``steps`` (a :class:`~vlmcp.train.reference.config.TrainConfig` or an
    :class:`~vlmcp.train.hf.config.HFTrainConfig`).
    """
    if step < WARMUP_STEPS:
        return cfg.lr * (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / max(1, cfg.steps - WARMUP_STEPS)
    return cfg.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress))))
