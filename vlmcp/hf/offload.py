"""``vlmcp.hf.offload_activations()``: keep the tensors autograd saves for backward in CPU memory.

Under activation checkpointing the tensors saved between blocks are the checkpointed
blocks' inputs (torch's non-reentrant checkpoint saves them as an op of the outer
graph), so they go to the host too; without it, every activation does. Parameters
(and views of them: ``weight.t()``) stay where they are: they exist anyway. Copies are
exact, so gradients are bitwise those of a step without offloading. On CUDA the host
buffers are pinned; the copy to the host is synchronous (as ``torch.autograd.graph.save_on_cpu``),
the copy back in backward non-blocking from pinned memory.

On a CPU-only machine there is nothing to free: the saved tensors are copied once into
new host buffers and the originals freed, so the path runs (tests) at the cost of a copy.
:class:`~vlmcp.debug.meters.saved_tensors.SavedTensorMeter` counts what stays in place
(``SavedTensorMeter(params, hooks=offload_activations())``: ``kept_bytes``).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ActivationOffload", "offload_activations"]


class ActivationOffload(torch.autograd.graph.saved_tensors_hooks):
    """Saved-tensor hooks that move every saved tensor but parameters to (pinned) host memory.

    Attributes:
        offloaded_bytes: bytes copied to the host so far.
    """

    def __init__(self, pin_memory: bool | None = None):
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.offloaded_bytes = 0
        super().__init__(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor):
        base = t if t._base is None else t._base
        if isinstance(base, nn.Parameter) or t.layout != torch.strided or type(t) is not torch.Tensor:
            return t  # parameters exist anyway; sparse and subclass tensors (DTensor) stay as they are
        host = torch.empty(t.size(), dtype=t.dtype, pin_memory=self.pin_memory and t.is_cuda)
        host.copy_(t)
        self.offloaded_bytes += host.nbytes
        return t.device, host

    @staticmethod
    def _unpack(packed):
        if isinstance(packed, torch.Tensor):
            return packed
        device, host = packed
        return host.to(device, non_blocking=host.is_pinned())


def offload_activations(pin_memory: bool | None = None) -> ActivationOffload:
    """A context manager: the forward run inside it saves its activations on the host.

    ``with vlmcp.hf.offload_activations(): loss = vlmcp.hf.causal_lm_loss(...)``, then
    ``loss.backward()`` anywhere. Works for any module (nothing HF-specific).

    Args:
        pin_memory: pin the host buffers; default: when CUDA is available.
    """
    return ActivationOffload(pin_memory)
