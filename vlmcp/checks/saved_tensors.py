"""Exact saved-for-backward byte counts (a counter, not a timer: repeatable anywhere).

Autograd keeps some tensors of the forward pass alive until backward; their total is
the activation memory a training step needs. :class:`SavedTensorMeter` records every
tensor autograd saves while it is active and sums the bytes of the distinct storages,
leaving out the storages of given tensors (the parameters, which exist anyway).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["SavedTensorMeter"]


class SavedTensorMeter:
    """Context manager: ``with SavedTensorMeter(model.parameters()) as m: loss = f()``; ``m.bytes``.

    Args:
        exclude: tensors whose storages are not counted (e.g. parameters).
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        self._skip = {t.untyped_storage().data_ptr() for t in exclude}
        self._seen: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in self._skip:
            self._seen[storage.data_ptr()] = storage.nbytes()
        return t

    @property
    def bytes(self) -> int:
        """Bytes of the distinct storages saved so far."""
        return sum(self._seen.values())

    def __enter__(self) -> SavedTensorMeter:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
