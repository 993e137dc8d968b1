"""Point-to-point ring transfers for ring attention, with guards against misuse.

Every rank sends to ``rank + 1`` and receives from ``rank - 1`` (ranks of ``group``).
Operations are queued with :meth:`RingComm.send_recv`, posted together with
``dist.batch_isend_irecv`` by :meth:`RingComm.commit` and completed by
:meth:`RingComm.wait`. Every rank posts the same sequence of batches in the same
order, which is what keeps NCCL from deadlocking (PyTorch #109401) and is not
something gloo would catch on its own.

Empty tensors are not transferred (both ends know every size from the plan), so a
rank with nothing to send or receive at a step posts no batch at all. The
``batch_isend_irecv`` docstring (torch 2.x) says that if it "is the first collective
call in the group ... all ranks of the group must participate ... otherwise, the
behavior is undefined" (NCCL). So the first commit on a group warms it up with one
all-reduce of one element, once per process and group, on CUDA tensors (gloo on
the CPU does not need it; ``warm_up=True`` forces it). Posting a batch anyway is not
an option: ``batch_isend_irecv`` rejects an empty list, and zero-byte messages would
change the message pattern.

Waits are bounded by the group's timeout (``dist.new_group(..., timeout=)``; gloo's
``Work.wait()`` without an argument uses it, NCCL's watchdog too). A wait that runs out
raises a ``RuntimeError`` naming the ring transfer and both peers, with the attributes
``collective`` and ``peers`` (global ranks) for whoever reports it
(:func:`vlmcp.train.faults.stall_guard`).
"""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist

__all__ = ["RingComm"]

_WARM: weakref.WeakSet = weakref.WeakSet()  # groups this process has warmed up


class RingComm:
    """A ring of one process group. Not thread-safe; one in-flight batch at a time.

    Args:
        group: the CP process group.
        warm_up: run one all-reduce on the group before its first batch (once per
            process and group). None (default): only for CUDA tensors (NCCL).
    """

    def __init__(self, group: dist.ProcessGroup, warm_up: bool | None = None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.send_rank = dist.get_global_rank(group, (self.rank + 1) % self.world_size)
        self.recv_rank = dist.get_global_rank(group, (self.rank - 1) % self.world_size)
        self.warm_up = warm_up
        self._ops: list[dist.P2POp] = []
        self._queued = False
        self._device: torch.device | None = None
        self._reqs: list | None = None
        self._in_flight: list[torch.Tensor] = []

    def send_recv(self, to_send: torch.Tensor, recv_buffer: torch.Tensor) -> torch.Tensor:
        """Queue sending ``to_send`` to the next rank and receiving into ``recv_buffer``.

        Both tensors must stay untouched until :meth:`wait` returns. The receive
        buffer must have the exact shape and dtype of what the previous rank sends.
        An empty tensor is not transferred: both ends know every size from the plan,
        so the peer skips the matching operation too.

        Returns:
            ``recv_buffer`` (valid after :meth:`wait`).
        """
        if self._reqs is not None:
            raise RuntimeError("RingComm.send_recv while a batch is in flight; call wait() first")
        if self.world_size == 1:
            raise RuntimeError("RingComm with one rank: there is no one to send to")
        if not (to_send.is_contiguous() and recv_buffer.is_contiguous()):
            raise ValueError("RingComm needs contiguous send and receive tensors")
        self._queued = True
        self._device = to_send.device
        if to_send.numel():
            self._ops.append(dist.P2POp(dist.isend, to_send, self.send_rank, self.group))
        if recv_buffer.numel():
            self._ops.append(dist.P2POp(dist.irecv, recv_buffer, self.recv_rank, self.group))
        return recv_buffer

    def _warm_up(self) -> None:
        """Every rank commits at the same ring steps, so every rank of the group gets here
        before its first batch: the all-reduce is matched (see the module docstring)."""
        warm = self._device.type == "cuda" if self.warm_up is None else self.warm_up
        if warm and self.group not in _WARM:
            dist.all_reduce(torch.zeros(1, device=self._device), group=self.group)
            _WARM.add(self.group)

    def commit(self) -> None:
        """Post every queued operation as one batch (none when nothing is queued)."""
        if self._reqs is not None:
            raise RuntimeError("RingComm.commit twice without wait()")
        if not self._queued:
            raise RuntimeError("RingComm.commit with nothing queued; call send_recv() first")
        self._warm_up()
        self._in_flight = [op.tensor for op in self._ops]
        self._reqs = dist.batch_isend_irecv(self._ops) if self._ops else []
        self._ops, self._queued = [], False

    def wait(self) -> None:
        """Block until the committed batch has completed."""
        if self._reqs is None:
            raise RuntimeError("RingComm.wait without commit()")
        try:
            for req in self._reqs:
                req.wait()
        except RuntimeError as err:
            first = (str(err).strip().splitlines() or [""])[0]
            failure = RuntimeError(f"ring attention send/recv timed out or failed (global rank "
                                   f"{dist.get_global_rank(self.group, self.rank)} sends to {self.send_rank} "
                                   f"and receives from {self.recv_rank}): {first}")
            failure.collective = "ring attention send/recv"
            failure.peers = sorted({self.send_rank, self.recv_rank})
            raise failure from err
        self._reqs, self._in_flight = None, []
