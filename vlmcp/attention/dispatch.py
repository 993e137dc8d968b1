"""``cp_attention``: the entry point, and every input check (all before any communication)."""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.distributed as dist

from vlmcp.attention.kernels import select_kernel
from vlmcp.attention.ring import ring_attention
from vlmcp.attention.ulysses import ulysses_attention
from vlmcp.attention.usp import usp_attention
from vlmcp.attention.usp_groups import UspGroups, cached_usp_groups, check_ulysses_size, usp_groups
from vlmcp.layout.plan import RankShard
from vlmcp.layout.work import ImageAttention

__all__ = ["cp_attention"]

Backend = Literal["ring", "ulysses", "usp"]
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check(q, k, v, shard, group, backend, image_attention, softmax_scale, ulysses_size) -> float:
    if backend not in ("ring", "ulysses", "usp"):
        raise ValueError(f"backend must be 'ring', 'ulysses' or 'usp', got {backend!r}")
    if ulysses_size is not None and backend != "usp":
        raise ValueError(f"ulysses_size is for backend='usp' only, got backend={backend!r}")
    if image_attention not in ("causal", "bidirectional"):
        raise ValueError(f"image_attention must be 'causal' or 'bidirectional', got {image_attention!r}")
    if not isinstance(shard, RankShard):
        raise TypeError(f"shard must be a RankShard (plan.for_rank(rank)), got {type(shard).__name__}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise ValueError(f"{name} must be a 3-D tensor (tokens, heads, head_dim), got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        if x.shape[0] != shard.num_tokens:
            raise ValueError(f"{name} has {x.shape[0]} tokens but rank {shard.rank}'s shard has "
                             f"{shard.num_tokens} slots (len(shard.positions)); use shard.shard(x)")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in _DTYPES:
        raise TypeError(f"q, k, v must be a float dtype in {_DTYPES}, got {q.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape[:2] != v.shape[:2]:
        raise ValueError(f"k and v must have the same tokens and heads, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)} (only the head dim may differ: MLA)")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q and k must have the same head_dim, got {q.shape[2]} and {k.shape[2]}")
    heads, kv_heads = q.shape[1], k.shape[1]
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads}) (GQA)")
    if group is None:  # a single process: no communication at all
        if shard.cp_size != 1:
            raise ValueError(f"group=None means a single process, but the shard was planned for "
                             f"cp_size={shard.cp_size}")
        world = 1
    else:
        world = dist.get_world_size(group)
        if world != shard.cp_size:
            raise ValueError(f"shard was planned for cp_size={shard.cp_size}, but the group has "
                             f"{world} ranks")
        if dist.get_rank(group) != shard.rank:
            raise ValueError(f"shard is rank {shard.rank}'s, but this is rank "
                             f"{dist.get_rank(group)} of group")
    if backend == "ulysses" and heads % world:
        raise ValueError(f"ulysses needs heads divisible by the CP size: heads={heads}, P={world} "
                         f"(kv_heads={kv_heads} not divisible is fine: K/V heads are replicated)")
    if backend == "usp":
        if ulysses_size is None:
            raise ValueError("backend='usp' needs ulysses_size (a divisor of the CP size; 1 = ring, "
                             "P = Ulysses)")
        check_ulysses_size(ulysses_size, world)
        if heads % ulysses_size:
            raise ValueError(f"usp needs heads divisible by ulysses_size: heads={heads}, "
                             f"ulysses_size={ulysses_size} (P={world} need not divide them)")
    if softmax_scale is None:
        return q.shape[2] ** -0.5
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)) \
            or not math.isfinite(softmax_scale) or softmax_scale <= 0:
        raise ValueError(f"softmax_scale must be a positive finite number or None, got {softmax_scale!r}")
    return float(softmax_scale)


def _check_window(sliding_window, backend) -> int:
    """The sliding window as an int (0: none), checked before any communication."""
    if sliding_window is None:
        return 0
    if isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 1:
        raise ValueError(f"sliding_window must be a positive int or None, got {sliding_window!r}")
    if backend == "usp":
        raise ValueError("sliding_window is supported by backend='ring' and 'ulysses', not 'usp'")
    return sliding_window


def _usp_groups(group, ulysses_size: int) -> UspGroups:
    if group is None:
        return UspGroups(ulysses_size=1, ulysses=None, ring=None, ulysses_rank=0, ring_rank=0)
    groups = cached_usp_groups(group, ulysses_size)
    if groups is not None:
        return groups
    if dist.get_world_size(group) != dist.get_world_size():
        # creating them now would wait for the processes of the other CP groups
        raise ValueError(f"backend='usp' on a CP group smaller than the job: call "
                         f"vlmcp.attention.usp_groups(cp_group, {ulysses_size}) on every process first")
    return usp_groups(group, ulysses_size)


def cp_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    shard: RankShard,
    group: dist.ProcessGroup | None,
    backend: Backend = "ring",
    image_attention: ImageAttention = "causal",
    softmax_scale: float | None = None,
    *,
    return_lse: bool = False,
    kernel: str | None = None,
    ulysses_size: int | None = None,
    sliding_window: int | None = None,
):
    """Exact attention of this rank's tokens over the whole (packed) row.

    Causal within each sample, nothing across samples; with
    ``image_attention="bidirectional"`` the image tokens of a sample also see each
    other both ways (prefix-LM). The result equals single-process attention on the
    whole row at ``shard.positions``; padding slots get zero output and zero gradient.
    Gradients of replicated image tokens carry share semantics: their sum over the
    CP group is the single-process gradient (Note [vlmcp gradient rules] in :mod:`vlmcp.grads`).

    Args:
        q: ``(N, H, D)`` with ``N = len(shard.positions)``, this rank's local order.
        k: ``(N, Hk, D)``, ``H % Hk == 0`` (GQA); v: ``(N, Hk, Dv)``, where ``Dv`` may differ
            from ``D`` (MLA: DeepSeek-V3, Kimi-K2.5).
        shard: this rank's :class:`~vlmcp.layout.RankShard`.
        group: the CP process group the plan was made for (explicit, never global), or
            None for a single process (``shard.cp_size == 1``; nothing is communicated).
        backend: ``"ring"`` (P2P ring of K/V, see Note [vlmcp ring attention schedule]),
            ``"ulysses"`` (all-to-all over heads; needs ``H % P == 0``) or ``"usp"``
            (Ulysses inside groups of ``ulysses_size`` ranks, ring across them; needs
            ``H % ulysses_size == 0``; Note [vlmcp USP: Ulysses groups are the virtual
            ranks of a ring] in :mod:`vlmcp.attention.usp`).
        image_attention: ``"causal"`` (LLaVA, Qwen2-VL) or ``"bidirectional"`` (prefix-LM).
        softmax_scale: default ``D ** -0.5``.
        return_lse: also return the log-sum-exp ``(N, H)`` (float32; float64 for float64
            inputs; ``-inf`` at padding). Not differentiable.
        kernel: force a local kernel by name (``"math"``, ``"flash_cpu"``, ``"sdpa"``,
            ``"flash_attn"``); default picks from the device.
        ulysses_size: ``"usp"`` only: U, a divisor of P. Its subgroups come from
            :func:`~vlmcp.attention.usp_groups.usp_groups`, which every process of the
            job must call first, unless the CP group is the whole job (then the first
            call creates them on every rank).
        sliding_window: ``W``: a query also needs the key within ``W`` positions before it
            in its sample (``x - y < W``), ANDed with causal-or-same-image: Gemma 3's
            sliding layers (transformers' ``sliding_window_overlay``). ``"ring"`` and
            ``"ulysses"``; ring blocks wholly outside the window are skipped. None: none.

    Under ``torch.autocast`` q, k and v are cast to the autocast dtype on entry (HF's rotary
    embedding leaves q and k in float32 while v comes from a bf16 projection) and the attention
    runs without autocast inside: merges stay in float32, the output is in the autocast dtype.

    Returns:
        ``out (N, H, Dv)`` in q's dtype, or ``(out, lse)`` with ``return_lse``.

    Raises:
        ValueError, TypeError: bad input, raised before any communication.
    """
    device = q.device.type if isinstance(q, torch.Tensor) else None
    if device is not None and torch.is_autocast_enabled(device):
        low = torch.get_autocast_dtype(device)
        q, k, v = (x.to(low) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                   for x in (q, k, v))
        with torch.autocast(device, enabled=False):
            return cp_attention(q, k, v, shard, group, backend, image_attention, softmax_scale,
                                return_lse=return_lse, kernel=kernel, ulysses_size=ulysses_size,
                                sliding_window=sliding_window)
    scale = _check(q, k, v, shard, group, backend, image_attention, softmax_scale, ulysses_size)
    window = _check_window(sliding_window, backend)
    groups = _usp_groups(group, ulysses_size) if backend == "usp" else None
    kern = select_kernel(q.device, q.dtype, kernel)
    if backend == "usp":
        out, lse = usp_attention(q, k, v, shard, groups, image_attention, scale, kern, need_lse=return_lse)
    elif backend == "ring":
        out, lse = ring_attention(q, k, v, shard, group, image_attention, scale, kern, window)
    else:
        out, lse = ulysses_attention(q, k, v, shard, group, image_attention, scale, kern,
                                     need_lse=return_lse, window=window)
    return (out, lse) if return_lse else out
