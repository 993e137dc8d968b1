"""The random-number state a checkpoint carries, so that a resumed run draws what the
uninterrupted one would have drawn."""

from __future__ import annotations

import random
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["capture_rng_state", "restore_rng_state"]


def capture_rng_state() -> dict[str, Any]:
    """RNG states of python ``random``, numpy's global generator, torch CPU and CUDA.

    Returns:
        A dict of tensors, ints and tuples (loadable with ``weights_only=True``).
        ``vlmcp train`` saves rank 0's state and restores it on every rank: it draws no
        random numbers after initialization. A model with dropout, which differs per
        rank, would need every rank's state gathered instead.
    """
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss),
                  float(cached)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`capture_rng_state` captured.

    A CUDA state is restored only when this process sees the same number of GPUs;
    otherwise it is skipped with a warning (the CPU streams are still exact).
    """
    random.setstate(_as_tuples(state["python"]))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.int64).astype(np.uint32), int(pos),
                         int(has_gauss), float(cached)))
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        if torch.cuda.is_available() and torch.cuda.device_count() == len(state["cuda"]):
            torch.cuda.set_rng_state_all(state["cuda"])
        else:
            warnings.warn("checkpoint holds CUDA RNG states for a different set of GPUs; "
                          "not restoring them", stacklevel=2)


def _as_tuples(value):
    # random.setstate needs tuples; a state that went through JSON or a list-only
    # serializer comes back as lists.
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value
