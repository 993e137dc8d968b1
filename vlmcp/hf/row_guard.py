"""Every rank of a CP group must hold the same global row: one small all-gather checks it.

Note [vlmcp row guard: one row per CP group]
--------------------------------------------
CP ranks cut *one* row between them; handed different rows, ring attention mixes their
keys and values and trains without an error (measured inside transformers' ``Trainer``,
whose sampler gives the two CP ranks rows [0, 3] and [1, 2]: a worst gradient error of
2.3). So :func:`vlmcp.hf.shard_inputs` checks, after its local checks and before any
other collective, that the group agrees on the row::

    rank r: digest_r = sha256(every key's name, dtype and shape;              (16 of its bytes)
                                   the content of input_ids, labels, cu_seqlens, every
                                   per-token and integer key (image/video grids, sizes);
                                   a strided sample of <= 64 values of each float key)
            mine = [L, samples, digest_r as two int64]                       (4 x int64)
    all_gather(mine) over the CP group -> (P, 4), the same on every rank
    all rows equal -> go on; else every rank raises, naming which ranks hold which row

Cost per call: hashing the row's integer tensors on the host (sha256, hardware-accelerated
on current x86 and ARM CPUs; 16 bytes per token for ``input_ids`` + ``labels``, ~1.5 ms for
32k tokens measured on this loaded 2-core machine; the ids are copied to the host for the
plan anyway) and one all-gather of 32 bytes per rank (latency-bound: tens of microseconds on
NCCL, well under a millisecond on gloo). Pixels are sampled, not hashed whole: a pass over every
pixel each step would cost more than the check is worth, and two rows with the same
tokens, grids and pixel shapes but different pixels need a loader that augments per
rank. Skip the check once a loader is trusted: ``shard_inputs(..., check_same_row=False)``
per call, or ``parallelize(..., check_same_row=False)`` for the model.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["check_same_row", "row_digest"]

_FLOAT_SAMPLE = 64  # values of a floating tensor (pixels) that enter the digest


def _tensor_bytes(x: torch.Tensor) -> bytes:
    """What of ``x`` enters the digest: all of an integer or bool tensor, a strided sample of a float one."""
    flat = x.detach().reshape(-1)
    if flat.is_floating_point() or flat.is_complex():
        step = max(1, flat.numel() // _FLOAT_SAMPLE)
        flat = flat[::step][:_FLOAT_SAMPLE]
    return flat.cpu().contiguous().view(torch.uint8).numpy().tobytes()


def row_digest(tensors: dict[str, Any]) -> bytes:
    """A 16-byte digest of one row's inputs (see Note [vlmcp row guard: one row per CP group]).

    Args:
        tensors: name -> tensor (or a small Python value: its ``repr`` enters); ``None`` skipped.
    """
    h = hashlib.sha256()
    for name in sorted(tensors):
        value = tensors[name]
        if value is None:
            continue
        h.update(name.encode() + b"\0")
        if isinstance(value, torch.Tensor):
            h.update(f"{value.dtype}{tuple(value.shape)}".encode())
            h.update(_tensor_bytes(value))
        else:
            h.update(repr(value).encode())
    return h.digest()[:16]


def _collective_device(group: dist.ProcessGroup) -> torch.device:
    """Where a small tensor of ``group``'s collectives lives: the current CUDA device under NCCL."""
    if "nccl" in str(dist.get_backend(group)):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def check_same_row(tensors: dict[str, Any], length: int, samples: int, group: dist.ProcessGroup) -> None:
    """Raise on every rank of ``group`` unless every rank passed the same row (one all-gather).

    Args:
        tensors: the row's inputs, as :func:`row_digest` takes them.
        length: tokens in the row (named in the error).
        samples: samples packed in it (named in the error).
        group: the CP group.

    Raises:
        ValueError: the ranks hold different rows; the message names which ranks hold which
            (CP ranks and their global ranks, the tokens and samples of each row).
    """
    digest = row_digest(tensors)
    mine = torch.tensor([length, samples, int.from_bytes(digest[:8], "big", signed=True),
                         int.from_bytes(digest[8:], "big", signed=True)], dtype=torch.int64)
    device = _collective_device(group)
    world = dist.get_world_size(group)
    gathered = [torch.empty(4, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(gathered, mine.to(device), group=group)
    rows = [tuple(int(v) for v in g.cpu()) for g in gathered]
    if len(set(rows)) == 1:
        return
    holders: dict[tuple, list[int]] = {}
    for rank, row in enumerate(rows):
        holders.setdefault(row, []).append(rank)
    parts = []
    for row, ranks in holders.items():
        glob = [dist.get_global_rank(group, r) for r in ranks]
        plural = "s" if len(ranks) > 1 else ""
        parts.append(f"CP rank{plural} {', '.join(map(str, ranks))} (global {', '.join(map(str, glob))}): "
                     f"{row[0]} tokens, {row[1]} sample(s), digest {(row[2] & (2**64 - 1)):016x}")
    raise ValueError(
        "shard_inputs: the ranks of the CP group hold different rows, which CP would mix in attention and "
        "train on silently: " + "; ".join(parts) + ". Every rank of a CP group must get the same row: shard "
        "the data over data-parallel replicas only (vlmcp.integrations.transformers.CPTrainer does this for "
        "transformers' Trainer); check_same_row=False skips this check once a loader is trusted")
