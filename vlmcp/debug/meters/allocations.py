"""Exact counts of the tensors a computation allocates (a counter, not a timer: repeatable anywhere).

:class:`AllocationMeter` watches every op dispatched while it is active (a
``TorchDispatchMode``): the largest single output (elements and bytes) and the peak of the
bytes of outputs still alive at once. It complements
:class:`~vlmcp.debug.meters.saved_tensors.SavedTensorMeter`, which counts what autograd keeps for
backward: this one also sees the transients freed within a step (a chunk's logits).

Liveness follows the outputs' storages: a storage counts from the op that created it until
the last tensor object produced on it is garbage (CPython frees it then). Tensors that
autograd keeps only in C++ (saved for backward, never seen again in Python) look free once
Python drops them, so ``peak_live_bytes`` is a lower bound where autograd saves op outputs;
it is exact for code that runs without a graph, such as a custom autograd Function's
forward and backward.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["AllocationMeter"]


class AllocationMeter(TorchDispatchMode):
    """``with AllocationMeter() as m: f()``; then ``m.max_numel``, ``m.max_bytes``, ``m.peak_live_bytes``.

    Attributes:
        max_numel: elements of the largest tensor any op returned.
        max_shape: its shape.
        max_bytes: bytes of the largest storage any op created.
        peak_live_bytes: the most bytes of storages created under the meter alive at once.
        ops: how many ops ran.
    """

    def __init__(self) -> None:
        super().__init__()
        self.max_numel = 0
        self.max_shape: tuple[int, ...] = ()
        self.max_bytes = 0
        self.peak_live_bytes = 0
        self.ops = 0
        self._live: dict[int, list[int]] = {}  # storage pointer -> [bytes, tensor objects alive on it]
        self._live_bytes = 0
        self._inputs: set[int] = set()

    def _drop(self, key: int) -> None:
        entry = self._live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self._live[key]
            self._live_bytes -= entry[0]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        before = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor) and t.device.type != "meta"}
        out = func(*args, **kwargs)
        self.ops += 1
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            if t.numel() > self.max_numel:
                self.max_numel, self.max_shape = t.numel(), tuple(t.shape)
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key in before and key not in self._live:
                continue  # a view or an in-place result on a storage made elsewhere
            entry = self._live.get(key)
            if entry is None:
                entry = self._live[key] = [storage.nbytes(), 0]
                self._live_bytes += entry[0]
                self.max_bytes = max(self.max_bytes, entry[0])
                self.peak_live_bytes = max(self.peak_live_bytes, self._live_bytes)
            entry[1] += 1
            weakref.finalize(t, self._drop, key)
        return out
