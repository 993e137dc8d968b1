"""Exact saved-for-backward byte counts (a counter, not a timer: repeatable anywhere).

Autograd keeps some tensors of the forward pass alive until backward; their total is
the activation memory a training step needs. :class:`SavedTensorMeter` records every
tensor autograd saves while it is active and sums the bytes of the distinct storages,
leaving out the storages of given tensors (the parameters, which exist anyway).

Saved-tensor hooks do not nest (the innermost pair alone sees the tensors), so a policy
that moves saved tensors elsewhere (:func:`vlmcp.hf.offload_activations`) is given to the
meter, which runs it: ``kept_bytes`` then counts the storages the policy left where they
were made (on the accelerator, for a model on one).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterable

import torch

__all__ = ["SavedTensorMeter"]


class SavedTensorMeter:
    """Context manager: ``with SavedTensorMeter(model.parameters()) as m: loss = f()``; ``m.bytes``.

    Args:
        exclude: tensors whose storages are not counted (e.g. parameters).
        hooks: a ``torch.autograd.graph.saved_tensors_hooks`` policy to run under the meter
            (e.g. :func:`vlmcp.hf.offload_activations`'s), instead of keeping every tensor.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = (), hooks: torch.autograd.graph.saved_tensors_hooks
                 | None = None):
        self._skip = {t.untyped_storage().data_ptr() for t in exclude}
        self._seen: dict[int, int] = {}  # storage id -> bytes
        self._kept: dict[int, int] = {}
        self._alive: dict[int, tuple[weakref.ref, int]] = {}  # address -> (its storage, storage id)
        self._ids = itertools.count()
        self._policy = hooks
        unpack = (lambda t: t) if hooks is None else hooks.unpack_hook
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, unpack)

    def _storage_id(self, storage: torch.UntypedStorage) -> int:
        """One id per storage, whatever its address: a policy that copies frees the original, and the
        allocator may give its address to the next one (storage objects are unique per storage)."""
        address = storage.data_ptr()
        seen = self._alive.get(address)
        if seen is not None and seen[0]() is storage:
            return seen[1]
        sid = next(self._ids)
        self._alive[address] = (weakref.ref(storage), sid)
        return sid

    def _pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        counted = storage.data_ptr() not in self._skip
        sid = self._storage_id(storage) if counted else -1
        if counted:
            self._seen[sid] = storage.nbytes()
        packed = t if self._policy is None else self._policy.pack_hook(t)
        same = isinstance(packed, torch.Tensor) and packed.untyped_storage().data_ptr() == storage.data_ptr()
        if counted and same:
            self._kept[sid] = storage.nbytes()
        return packed

    @property
    def bytes(self) -> int:
        """Bytes of the distinct storages saved so far."""
        return sum(self._seen.values())

    @property
    def kept_bytes(self) -> int:
        """Of :attr:`bytes`, those the ``hooks`` policy kept in place (all of them without one)."""
        return sum(self._kept.values())

    def __enter__(self) -> SavedTensorMeter:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
