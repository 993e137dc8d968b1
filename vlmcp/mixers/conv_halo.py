"""Causal depthwise conv1d under CP: each segment gets its ``k-1`` predecessors (the halo).

Note [vlmcp causal conv1d halo]
-------------------------------
A causal convolution of kernel k gives token p the weighted sum of the *pre-convolution*
inputs at ``p-k+1 .. p`` of its own sample (zeros before the sample starts). Within a
local segment those rows are local; the first ``k-1`` tokens of a segment also need the
``k-1`` rows before it in global order. Those sit in the same sample's predecessor
segment(s): this rank's own or a replicated image run (local), another rank's text
chunk (remote), or nothing at a sample start (zeros)::

    global:   [ t0 t1 t2 | I I I | t3 t4 t5 t6 | t7 t8 ]      k = 3, halo = 2 rows
    owner:       rank 0    every    rank 1        rank 0
    rank 1's segment t3..t6 needs (I, I): local (replicated)
    rank 0's segment t7 t8 needs (t5, t6): remote, from rank 1
    rank 0's segment t0..t2 needs nothing: zeros (sample start)

One all-gather moves every remote halo row: each rank sends the rows of its own
tokens that some other rank needs (metadata identical on every rank decides which),
and picks out what it needs. Its dual, a reduce-scatter, returns the halo rows'
gradients to their owners. A segment shorter than ``k-1`` is handled by the same rule
(the halo is "the ``k-1`` positions before the segment", whoever holds them).

Then each local segment is laid out as ``[halo | segment]`` (``k-1 + n`` rows), one
unpadded conv1d runs over all of them back to back, and each token keeps the output
whose window ends at it; padding slots get zero. Bytes per layer:
``(k-1) x channels`` per segment boundary that crosses ranks, whatever L.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn import functional as F

from vlmcp.comm import all_gather
from vlmcp.layout.plan import RankShard
from vlmcp.mixers.segments import segment_layout

__all__ = ["HaloLayout", "causal_conv1d_cp", "halo_layout"]


@dataclass(frozen=True, eq=False)
class HaloLayout:
    """One rank's halo plan for a kernel size (cached per shard and kernel size).

    Attributes:
        kernel_size: k.
        export: ``LongTensor[e_r]``, local slots whose rows this rank sends.
        export_sizes: rows each rank sends (rank order).
        ext_index: ``LongTensor[E]``, rows of ``[x (N) | gathered (sum e) | zero row]`` laid
            out as ``[halo | segment]`` per local segment.
        out_rows: ``LongTensor[V]``, for each valid slot (``valid`` order), its row of the
            unpadded conv output over ``ext_index``.
        valid: ``LongTensor[V]``, local slots that hold a token.
    """

    kernel_size: int
    export: torch.Tensor
    export_sizes: tuple[int, ...]
    ext_index: torch.Tensor
    out_rows: torch.Tensor
    valid: torch.Tensor


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def halo_layout(shard: RankShard, kernel_size: int) -> HaloLayout:
    """Build (or fetch) this rank's :class:`HaloLayout` (metadata only, no communication)."""
    per_shard = _CACHE.setdefault(shard, {})
    if kernel_size in per_shard:
        return per_shard[kernel_size]
    if kernel_size < 1:
        raise ValueError(f"kernel_size must be >= 1, got {kernel_size}")
    seg = segment_layout(shard)
    row, P, r, w = seg.row, shard.cp_size, shard.rank, kernel_size - 1
    owner = shard.plan.owner
    cu = shard.plan.cu_seqlens.long()
    # every rank's remote halo positions (so that each owner knows what to send)
    needed: set[int] = set()
    mine_remote: list[int] = []
    halos = []  # per row segment: (zero rows, halo positions)
    for j in range(row.num_segments):
        start = int(row.starts[j])
        lo = max(int(cu[row.samples[j]]), start - w)
        pos = torch.arange(lo, start)
        halos.append((w - pos.numel(), pos))
        held_by = range(P) if int(row.owners[j]) < 0 else (int(row.owners[j]),)
        for rr in held_by:
            far = pos[(owner[pos] != rr) & (owner[pos] >= 0)].tolist()
            needed.update(far)
            if rr == r:
                mine_remote.extend(far)
    needed_t = torch.tensor(sorted(needed), dtype=torch.long)
    n_owner = owner[needed_t]
    sizes = tuple(int((n_owner == o).sum()) for o in range(P))
    gathered_at = {q: i for i, q in enumerate(torch.cat([needed_t[n_owner == o] for o in range(P)]).tolist())}
    inv = torch.full((shard.seq_len,), -1, dtype=torch.long)
    valid = seg.valid
    inv[shard.positions[valid]] = valid
    export = inv[needed_t[n_owner == r]]
    N, G = shard.num_tokens, len(gathered_at)
    zero = N + G
    ext, out_rows, base = [], [], 0
    for j in seg.local.tolist():
        zeros, pos = halos[j]
        local_pos = inv[pos]
        from_table = torch.tensor([gathered_at.get(q, -1) for q in pos.tolist()], dtype=torch.long) + N
        n = int(row.ends[j] - row.starts[j])
        ext += [torch.full((zeros,), zero, dtype=torch.long),
                torch.where(local_pos >= 0, local_pos, from_table),
                inv[torch.arange(int(row.starts[j]), int(row.ends[j]))]]
        out_rows.append(torch.arange(n) + base)  # conv output i is the window ending at ext row i + w
        base += w + n
    layout = HaloLayout(
        kernel_size=kernel_size, export=export, export_sizes=sizes,
        ext_index=torch.cat(ext) if ext else torch.zeros(0, dtype=torch.long),
        out_rows=torch.cat(out_rows) if out_rows else torch.zeros(0, dtype=torch.long), valid=valid)
    per_shard[kernel_size] = layout
    return layout


def causal_conv1d_cp(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, shard: RankShard,
                     group: dist.ProcessGroup | None) -> torch.Tensor:
    """Depthwise causal conv1d of this rank's tokens over the whole row (Note above).

    Args:
        x: ``(N, C)``, pre-convolution inputs of this rank's slots (``len(shard.positions)``).
        weight: ``(C, 1, k)`` or ``(C, k)``, ``nn.Conv1d(C, C, k, groups=C)``'s weight.
        bias: ``(C,)`` or None.
        shard: this rank's :class:`~vlmcp.RankShard`.
        group: the CP group (None: one process).

    Returns:
        ``(N, C)`` in ``x.dtype``, before any activation; zero at padding slots. Backward
        returns each halo row's gradient to its owner (all-gather <-> reduce-scatter);
        a replicated row's gradient is this rank's share.
    """
    w2 = weight.reshape(weight.shape[0], -1)
    k = w2.shape[1]
    if x.dim() != 2 or x.shape[0] != shard.num_tokens or x.shape[1] != w2.shape[0]:
        raise ValueError(f"causal_conv1d_cp: x must be (N={shard.num_tokens}, C={w2.shape[0]}), "
                         f"got {tuple(x.shape)}")
    halo = halo_layout(shard, k)
    sent = x.index_select(0, halo.export.to(x.device))
    if group is not None and max(halo.export_sizes) > 0:
        gathered = all_gather(sent, group, dim=0, sizes=halo.export_sizes)
    else:
        gathered = sent
    table = torch.cat([x, gathered, x.new_zeros((1, x.shape[1]))])
    ext = table.index_select(0, halo.ext_index.to(x.device)).to(w2.dtype)
    y = F.conv1d(ext.t().unsqueeze(0), w2.unsqueeze(1), bias, groups=w2.shape[0])[0].t()
    y = y.index_select(0, halo.out_rows.to(x.device)).to(x.dtype)
    return x.new_zeros(x.shape).index_copy(0, halo.valid.to(x.device), y)
