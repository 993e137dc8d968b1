"""Autograd collectives: each forward collective paired with its dual in backward.

Note [vlmcp autograd collectives and their duals]
-------------------------------------------------
Every function here is a ``torch.autograd.Function`` whose backward is the adjoint
of its forward, so a gradient that crosses ranks is never dropped or counted twice::

    forward                                 backward (the dual)
    broadcast from src            (N, *)    reduce-sum to src              (N, *)
    all_gather on dim, uneven   (n_r, *) -> reduce-scatter: sum, own rows  (n_r, *)
    copy_to_group (identity)      (N, *)    all-reduce-sum                 (N, *)
    all_reduce_sum                (N, *)    identity                       (N, *)
    all_to_all (scatter d, gather e)        all_to_all (scatter e, gather d)
    all_to_all_uneven (rows, splits in/out)  the same, splits swapped        (rows back)

``copy_to_group`` and ``all_reduce_sum`` are Megatron's f/g pair: the first is the
entry to work that every rank does on the same tensor with a different loss (the
gradients are summed), the second the exit of work whose partial results are
summed (the gradient arriving at the sum is already the full one on every rank,
because what follows is replicated and counted once).

The backward of all-gather is a reduce-scatter and not a slice: every rank's copy
of the gathered tensor fed its own loss, so the gradient of rank r's rows is the
sum over all ranks of the gradient their copy received (PITFALLS: mbridge's
``AllGatherVisionEmbeddings``).

No collective runs in place on an autograd input: inputs and incoming gradients
are cloned (or padded into fresh buffers) first. Groups are always explicit, and
ranks (``src``) are ranks *within* ``group``. Every rank must call every function
(and run its backward) with tensors of the documented shapes; shapes are
metadata, so no rank ever waits for a peer that skipped.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

__all__ = ["all_gather", "all_reduce_sum", "all_to_all", "all_to_all_uneven", "broadcast", "copy_to_group"]


# torch 2.13 renamed the flat-buffer collectives; older releases (>= 2.5) only have the old
# names. Looked up at call time so a wrapper installed on torch.distributed sees the call.
def _all_gather_flat(out: torch.Tensor, x: torch.Tensor, group) -> None:
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, x, group=group)


def _reduce_scatter_flat(out: torch.Tensor, x: torch.Tensor, group) -> None:
    (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, x, group=group)


def _check_src(src: int, group: dist.ProcessGroup) -> None:
    world = dist.get_world_size(group)
    if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < world:
        raise ValueError(f"src must be a rank of the group, an int in [0, {world}), got {src!r}")


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, src, group):
        ctx.src, ctx.group = src, group
        out = x.detach().clone().contiguous()
        dist.broadcast(out, src=dist.get_global_rank(group, src), group=group)
        return out

    @staticmethod
    def backward(ctx, dout):
        grad = dout.detach().clone().contiguous()
        dist.reduce(grad, dst=dist.get_global_rank(ctx.group, ctx.src), group=ctx.group)
        # Off the source the input was a placeholder: its value never reached the output.
        dx = grad if dist.get_rank(ctx.group) == ctx.src else None
        return dx, None, None


def broadcast(x: torch.Tensor, src: int, group: dist.ProcessGroup) -> torch.Tensor:
    """Broadcast ``x`` from rank ``src`` of ``group``; backward reduce-sums to ``src``.

    Args:
        x: ``(N, *)`` on every rank. Only ``src``'s values are used; elsewhere it is a
            placeholder of the same shape and dtype. Off the source it must still
            require grad when the source's does, so that every rank joins the backward.
        src: rank within ``group``.
        group: the process group.

    Returns:
        ``(N, *)``, ``src``'s ``x`` on every rank. Backward: ``src`` receives the sum
        over ranks of the output gradients ``(N, *)``; other ranks receive none.
    """
    _check_src(src, group)
    return _Broadcast.apply(x, src, group)


def _pad_to(x: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """``x`` zero-padded to ``size`` along ``dim``; a contiguous read-only input when no pad is needed."""
    if x.shape[dim] == size:
        return x.contiguous()  # the collectives only read their input
    shape = list(x.shape)
    shape[dim] = size
    out = x.new_zeros(shape)
    out.narrow(dim, 0, x.shape[dim]).copy_(x)
    return out


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, sizes, group):
        ctx.dim, ctx.sizes, ctx.group = dim, sizes, group
        world, most = len(sizes), max(sizes)
        # Flat all-gathers (gloo and NCCL alike) take equal parts: pad each to the largest.
        padded = _pad_to(x.detach().movedim(dim, 0), 0, most)
        flat = padded.new_empty((world * most, *padded.shape[1:]))
        _all_gather_flat(flat, padded, group=group)
        parts = [flat[r * most: r * most + n] for r, n in enumerate(sizes)]
        return torch.cat(parts, 0).movedim(0, dim)

    @staticmethod
    def backward(ctx, dout):
        sizes, most = ctx.sizes, max(ctx.sizes)
        g = dout.detach().movedim(ctx.dim, 0)
        stacked = torch.cat([_pad_to(p, 0, most) for p in torch.split(g, sizes, 0)], 0)
        own = stacked.new_empty((most, *stacked.shape[1:]))
        _reduce_scatter_flat(own, stacked, group=ctx.group)
        rank = dist.get_rank(ctx.group)
        dx = own[: sizes[rank]].movedim(0, ctx.dim).contiguous()
        return dx, None, None, None


def all_gather(
    x: torch.Tensor, group: dist.ProcessGroup, dim: int = 0, sizes: Sequence[int] | None = None
) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` in rank order; backward reduce-scatters.

    Args:
        x: this rank's part, ``x.shape[dim] == sizes[rank]``; every other dimension
            equal on all ranks. A rank may hold zero rows.
        group: the process group.
        dim: the dimension to concatenate.
        sizes: every rank's ``x.shape[dim]``, known on every rank (metadata). None means
            equal sizes (``x.shape[dim]`` everywhere); it is never gathered implicitly.

    Returns:
        ``x`` with ``shape[dim] == sum(sizes)``, identical on every rank. Backward: rank r
        receives, in the shape of ``x``, the sum over ranks of the output gradient's
        slice ``[sum(sizes[:r]), sum(sizes[:r + 1]))`` along ``dim`` (a reduce-scatter,
        not a slice).
    """
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    d = dim % x.dim()
    sizes = [x.shape[d]] * world if sizes is None else [int(s) for s in sizes]
    if len(sizes) != world:
        raise ValueError(f"all_gather: sizes has {len(sizes)} entries, the group has {world} ranks")
    if x.shape[d] != sizes[rank]:
        raise ValueError(
            f"all_gather: rank {rank} holds {x.shape[d]} rows on dim {dim}, sizes says {sizes[rank]}")
    if max(sizes) == 0:  # nothing anywhere: every rank knows it from sizes, none communicates
        return x.view_as(x)
    return _AllGather.apply(x, d, tuple(sizes), group)


class _CopyToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dout):
        grad = dout.detach().clone().contiguous()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad, None


def copy_to_group(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Identity forward; backward all-reduce-sums the gradient over ``group``.

    Use it where every rank holds the same ``x`` and feeds it to a different part of
    the loss: the true gradient is the sum of the ranks' gradients.

    Args:
        x: ``(*)``, equal on every rank.
        group: the process group.

    Returns:
        ``x`` ``(*)``. Backward: the sum over ranks of the output gradient, ``(*)``.
    """
    return _CopyToGroup.apply(x, group)


class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        out = x.detach().clone().contiguous()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx, dout):
        return dout, None


def all_reduce_sum(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Sum ``x`` over ``group``; backward is the identity.

    The identity is the dual when what follows the sum is replicated and counted once
    (the gradient reaching the sum is the full one on every rank). Where each rank
    instead takes a different share of the loss, follow it with :func:`copy_to_group`.

    Args:
        x: ``(*)``, this rank's partial value.
        group: the process group.

    Returns:
        ``(*)``, the sum over ranks. Backward: the output gradient, unchanged ``(*)``.
    """
    return _AllReduceSum.apply(x, group)


def _all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group) -> torch.Tensor:
    world = dist.get_world_size(group)
    # Chunk j of scatter_dim goes to rank j; received chunks are stacked in rank order.
    send = torch.stack(torch.chunk(x, world, dim=scatter_dim), 0).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return torch.cat(recv.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, group):
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _all_to_all(x.detach(), scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, dout):
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(dout.detach(), gather_dim, scatter_dim, ctx.group), None, None, None


def all_to_all(x: torch.Tensor, group: dist.ProcessGroup, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Split ``x`` into P chunks on ``scatter_dim``, send chunk j to rank j, concat on ``gather_dim``.

    Ulysses uses it to trade a sequence shard for a head shard and back. Backward is
    the inverse all-to-all (``scatter_dim`` and ``gather_dim`` swapped).

    Args:
        x: ``(*)`` with ``x.shape[scatter_dim]`` divisible by P; equal shapes on all ranks.
        group: the process group.
        scatter_dim: dimension split across ranks.
        gather_dim: dimension along which received chunks are concatenated, rank order.

    Returns:
        ``x.shape`` with ``scatter_dim`` divided by P and ``gather_dim`` multiplied by P
        (when they differ). Backward maps a gradient of that shape back to ``x.shape``.
    """
    world = dist.get_world_size(group)
    sd, gd = scatter_dim % x.dim(), gather_dim % x.dim()
    if x.shape[sd] % world:
        raise ValueError(
            f"all_to_all: dim {scatter_dim} of shape {tuple(x.shape)} is not divisible by P={world}")
    return _AllToAll.apply(x, sd, gd, group)


def _all_to_all_rows(x: torch.Tensor, out_splits: tuple[int, ...], in_splits: tuple[int, ...],
                     group) -> torch.Tensor:
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=list(out_splits),
                           input_split_sizes=list(in_splits), group=group)
    return out


class _AllToAllUneven(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        return _all_to_all_rows(x.detach(), out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, dout):
        out_splits, in_splits = ctx.splits
        # the dual: every row's gradient goes back to the rank that sent the row, splits swapped
        return _all_to_all_rows(dout.detach(), in_splits, out_splits, ctx.group), None, None, None


def all_to_all_uneven(x: torch.Tensor, group: dist.ProcessGroup, out_splits: Sequence[int],
                      in_splits: Sequence[int]) -> torch.Tensor:
    """Send rows ``[sum(in_splits[:d]), sum(in_splits[:d + 1]))`` of ``x`` to rank d; stack what arrives.

    Expert parallelism's token exchange (Note [vlmcp expert parallel: dispatch and combine]). The
    split sizes are metadata every rank must agree on: rank s's ``in_splits[d]`` is rank d's
    ``out_splits[s]`` (exchange the counts first). Any split may be zero, the whole ``x`` too: the
    rank still takes part, forward and backward.

    Args:
        x: ``(sum(in_splits), *)``, rows grouped by destination rank in rank order.
        group: the process group.
        out_splits: rows arriving from each rank, ``len == world``.
        in_splits: rows sent to each rank, ``len == world``.

    Returns:
        ``(sum(out_splits), *)``, the rows from rank 0, then rank 1, ... Backward: the gradient
        ``(sum(out_splits), *)`` goes back the same way with the splits swapped and arrives as
        ``(sum(in_splits), *)``, each row's gradient at the rank and place the row came from.
    """
    world = dist.get_world_size(group)
    out_splits, in_splits = tuple(int(s) for s in out_splits), tuple(int(s) for s in in_splits)
    if len(out_splits) != world or len(in_splits) != world:
        raise ValueError(f"all_to_all_uneven: {len(out_splits)} out and {len(in_splits)} in splits for a "
                         f"group of {world} ranks")
    if min(out_splits + in_splits) < 0 or x.shape[0] != sum(in_splits):
        raise ValueError(f"all_to_all_uneven: x has {x.shape[0]} rows, in_splits {in_splits} "
                         f"(out_splits {out_splits})")
    return _AllToAllUneven.apply(x, out_splits, in_splits, group)
