"""The token exchange of expert parallelism: (token, slot) pairs to their experts' ranks and back.

Note [vlmcp expert parallel: dispatch and combine]
--------------------------------------------------
An EP group of ``E_ep`` ranks splits the ``E`` experts of every MoE layer into contiguous ranges:
rank j holds experts ``[j*El, (j+1)*El)``, ``El = E / E_ep``. The router runs unchanged on the rank
that holds the tokens and picks ``K`` experts per token; the ``S = T*K`` (token, slot) pairs are
what travels. Per layer and forward, on every rank of the group (zero pairs included)::

    pairs, sorted by global expert id (stable):  order = argsort(top_k_index.flatten())
        rank 0's view, E=4, E_ep=2, El=2:   [e0 e0 e1 | e2 e3 e3]     -> rank 0 | rank 1
    counts all-to-all: send (E_ep, El) pairs per (destination, local expert), receive
        recv[s, e] = pairs rank s sends to my local expert e          (int64, no gradient)
    data all-to-all (uneven: in_splits = send.sum(1), out_splits = recv.sum(1)):
        received rank-major         [s0: e0 e0 e1 | s1: e0 e1 e1]
    permute to expert-major         [e0: s0 s0 s1 | e1: s0 s1 s1]     (perm, a gather)
    local experts, top-1 with unit weight (grouped matmul or a loop: vlmcp.hf.moe.local)
    inverse permute, all-to-all back (splits swapped), un-sort:  (S, H) in pair order
    on the sender: y * weight per pair, the K slots added per token in ascending expert order

The last line is the eager HF kernel's own order (``index_add_`` expert by expert into zeros), so the
forward matches one process up to the matmul's row blocking; each (token, expert) pair is the same
function of the same weights wherever it runs. Every step is a gather or an autograd all-to-all
(:func:`vlmcp.comm.all_to_all_uneven`, whose dual is the same exchange with the splits swapped), so
backward returns each pair's input gradient to its token, and each expert's weight gradient on its
rank is the sum over the EP group's pairs: the gradient rule EXPERT (Note [vlmcp gradient rules]).

The split sizes are read on the host once per layer (``.tolist()``, as every dropless dispatcher
does). A rank that receives no pair still runs its experts on one zero row and keeps none of it,
so its weights and both all-to-alls stay in the graph and the backward exchange runs on every rank.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

from vlmcp.comm import all_to_all_uneven

__all__ = ["DispatchPlan", "combine", "dispatch", "plan_dispatch"]


class DispatchPlan(NamedTuple):
    """One layer's exchange on this rank (Note [vlmcp expert parallel: dispatch and combine])."""

    order: torch.Tensor
    """``LongTensor[S]``: the pairs sorted by global expert id (stable)."""
    counts: torch.Tensor
    """``LongTensor[E]``: this rank's pairs per global expert."""
    in_splits: tuple[int, ...]
    """Pairs sent to each EP rank."""
    out_splits: tuple[int, ...]
    """Pairs received from each EP rank."""
    perm: torch.Tensor
    """``LongTensor[R]``: received (rank-major) row of each expert-major row."""
    local_counts: tuple[int, ...]
    """Received pairs per local expert (expert-major groups), ``len == El``."""


def _exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    return x.cumsum(0) - x


def plan_dispatch(top_k_index: torch.Tensor, num_experts: int,
                  group: dist.ProcessGroup | None) -> DispatchPlan:
    """Sort this rank's pairs and exchange the counts (one int64 all-to-all; every rank must call it).

    Args:
        top_k_index: ``(T, K)`` global expert ids from the router.
        num_experts: E, the experts of the layer over the whole group.
        group: the EP group (None: one rank holds every expert, nothing is sent).

    Returns:
        The :class:`DispatchPlan`, the same split sizes on both ends of every exchange.
    """
    world = 1 if group is None else dist.get_world_size(group)
    local = num_experts // world
    ids = top_k_index.reshape(-1)
    order = torch.argsort(ids, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.long, device=ids.device)
    counts.scatter_add_(0, ids.clamp(0, num_experts - 1), torch.ones_like(ids))
    send = counts.view(world, local)
    recv = torch.empty_like(send)
    if group is None:
        recv.copy_(send)
    else:
        dist.all_to_all_single(recv, send, group=group)
    ids_range = torch.stack([ids.min(), ids.max()]) if ids.numel() else ids.new_zeros(2)
    host = torch.cat([send.sum(1), recv.reshape(-1), ids_range]).tolist()  # the one host sync
    if ids.numel() and (host[-2] < 0 or host[-1] >= num_experts):
        raise ValueError(f"router picked expert ids in [{host[-2]}, {host[-1]}], outside [0, {num_experts})")
    in_splits = tuple(host[:world])
    rc = recv.reshape(-1)
    # expert-major row i of local expert e from source s reads rank-major row start[s, e] + offset
    sizes_em = recv.t().reshape(-1)                      # block (e, s) sizes, expert-major
    starts_em = _exclusive_cumsum(rc).view(world, local).t().reshape(-1)
    total = int(sum(host[world:world + world * local]))
    block_start = torch.repeat_interleave(starts_em, sizes_em, output_size=total)
    within = torch.arange(total, device=ids.device) - torch.repeat_interleave(
        _exclusive_cumsum(sizes_em), sizes_em, output_size=total)
    recv_host = host[world:world + world * local]
    out_splits = tuple(sum(recv_host[s * local:(s + 1) * local]) for s in range(world))
    local_counts = tuple(sum(recv_host[s * local + e] for s in range(world)) for e in range(local))
    return DispatchPlan(order=order, counts=counts, in_splits=in_splits, out_splits=out_splits,
                        perm=block_start + within, local_counts=local_counts)


def dispatch(rows: torch.Tensor, plan: DispatchPlan, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Pair rows ``(S, H)``, expert-sorted -> the rows of this rank's experts, expert-major ``(R, H)``."""
    got = rows if group is None else all_to_all_uneven(rows, group, plan.out_splits, plan.in_splits)
    return got.index_select(0, plan.perm)


def combine(y: torch.Tensor, plan: DispatchPlan, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Expert outputs ``(R, H)``, expert-major -> each pair's output on its sender, pair order ``(S, H)``."""
    inverse = torch.empty_like(plan.perm)
    inverse[plan.perm] = torch.arange(plan.perm.numel(), device=plan.perm.device)
    back = y.index_select(0, inverse)
    back = back if group is None else all_to_all_uneven(back, group, plan.in_splits, plan.out_splits)
    unsort = torch.empty_like(plan.order)
    unsort[plan.order] = torch.arange(plan.order.numel(), device=plan.order.device)
    return back.index_select(0, unsort)
