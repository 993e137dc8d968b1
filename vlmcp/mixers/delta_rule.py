"""The gated delta rule, chunked, in torch: packed segments, initial and final states, affine maps.

Note [vlmcp gated delta rule: a segment is an affine map of its incoming state]
------------------------------------------------------------------------------
Per value head, the state ``S`` is ``(K, V)`` and token t updates and reads it as
(transformers' ``torch_recurrent_gated_delta_rule``; ``q`` and ``k`` l2-normalised,
``q`` scaled by ``K ** -0.5``, ``g <= 0`` a log decay, ``beta`` in (0, 1))::

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T  =  A_t S_{t-1} + B_t
    o_t = S_t^T q_t

Each step is affine in the state, so a segment of n tokens is too::

    S_out = M S_in + U            M = A_n ... A_1  (K, K),   U = S_out from S_in = 0  (K, V)
    o_t   = O0_t + S_in^T R_t     O0_t = o_t from S_in = 0,  R_t = M_t^T q_t  (K,)

where ``M_t`` is the product up to token t. One pass of the chunked kernel gives all
four: run it with values ``[0 | v]`` (width K + V) from the initial state ``[I | 0]``;
the first K columns then evolve as ``X_t = A_t X_{t-1}`` from ``I`` (so the final state
is ``[M | U]`` and the outputs are ``[R | O0]``), the last V columns are the zero-state
run. A segment that starts a sample has ``S_in = 0``: it runs the plain kernel (width V)
and its ``M`` is never needed (zeros stand in for it).

The chunked kernel is transformers' ``torch_chunk_gated_delta_rule`` (the WY/UT
transform inside a chunk, a sequential scan over chunks) on a packed row of
independent segments, each padded to whole chunks with ``g = beta = k = 0`` (the
identity map). Decays stay in log space until a difference is exponentiated; the
state and every product accumulate in float32 at least (:func:`accumulator_dtype`),
as fla does.

Note [vlmcp gated delta rule: the kernel choice]
------------------------------------------------
:func:`chunk_gated_delta_rule` (and so :func:`segment_maps`, the CP op, the Ulysses
road and the HF layer) takes ``kernel``: ``"torch"`` is the chunked torch kernel above;
``"fla"`` is flash-linear-attention's Triton ``chunk_gated_delta_rule`` (``pip install
flash-linear-attention``; CUDA tensors, not float64) behind the same contract: a packed
row ``(1, T, H, K)`` with ``cu_seqlens`` (empty segments dropped before the call, their
final state is their initial state), ``g`` the log decay, ``beta``, ``scale``, the float32
``initial_state`` per segment, ``output_final_state=True``, ``use_qk_l2norm_in_kernel``;
its GVA maps value head ``j`` to key head ``j // (Hv / Hk)``, as here. fla tiles by its
own chunk size (``chunk_size`` only tiles the torch kernel; the result does not depend on
it). ``"auto"`` (the default) is fla when the tensors are on CUDA, not float64, and fla
imports; the torch kernel otherwise (:func:`select_kernel` says which).
"""

from __future__ import annotations

import functools
import inspect
from typing import NamedTuple

import torch
from torch.nn import functional as F

from vlmcp.attention.merge import accumulator_dtype  # float32, or float64 for float64 inputs
from vlmcp.mixers.chunks import chunk_layout, from_chunks, to_chunks

__all__ = ["KERNELS", "SegmentMaps", "accumulator_dtype", "chunk_gated_delta_rule", "segment_maps",
           "select_kernel"]

KERNELS = ("auto", "torch", "fla")
"""The values of ``kernel`` (Note [vlmcp gated delta rule: the kernel choice])."""


@functools.lru_cache(maxsize=1)
def _fla_kernel():
    """fla's ``chunk_gated_delta_rule``, or None when flash-linear-attention is not importable."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_kernel
    except ImportError:
        return None
    return fla_kernel


def select_kernel(kernel: str, device: torch.device | str, dtype: torch.dtype) -> str:
    """The kernel ``kernel`` resolves to for tensors on ``device`` of ``dtype``: ``"torch"`` or ``"fla"``.

    ``"auto"``: fla on CUDA for float32/bfloat16/float16 when it imports, torch otherwise.
    ``"fla"`` raises when fla is missing (naming ``pip install flash-linear-attention``), the
    tensors are not on CUDA, or they are float64.
    """
    if kernel not in KERNELS:
        raise ValueError(f"gated delta rule kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel == "torch":
        return "torch"
    device = torch.device(device)
    if kernel == "fla":
        if _fla_kernel() is None:
            raise ImportError("kernel='fla' needs flash-linear-attention (fla.ops.gated_delta_rule): "
                              "pip install flash-linear-attention (or kernel='torch' / 'auto')")
        if device.type != "cuda":
            raise ValueError(f"kernel='fla' runs on CUDA tensors, got {device}: use kernel='torch' or 'auto'")
        if dtype == torch.float64:
            raise ValueError("kernel='fla' has no float64: use kernel='torch' or 'auto'")
        return "fla"
    if device.type == "cuda" and dtype != torch.float64 and _fla_kernel() is not None:
        return "fla"
    return "torch"


def _fla_chunk_gated_delta_rule(q, k, v, g, beta, cu, initial_state, scale, use_qk_l2norm):
    """:func:`chunk_gated_delta_rule` through fla (Note [vlmcp gated delta rule: the kernel choice])."""
    fla = _fla_kernel()
    T, Hk, K = k.shape
    Hv, V = v.shape[1:]
    S = cu.numel() - 1
    acc = accumulator_dtype(v.dtype)
    state0 = (torch.zeros(S, Hv, K, V, dtype=acc, device=v.device) if initial_state is None
              else initial_state.to(acc))
    lens = cu[1:] - cu[:-1]
    keep = torch.nonzero(lens > 0).flatten()
    if keep.numel() == 0:
        return v.new_zeros((T, Hv, V)), state0
    sub_cu = F.pad(torch.cumsum(lens[keep], 0), (1, 0))
    keep_dev = keep.to(v.device)
    extra = {"cu_seqlens_cpu": sub_cu} if "cu_seqlens_cpu" in inspect.signature(fla).parameters else {}
    q, k = q.to(v.dtype), k.to(v.dtype)
    o, final = fla(q[None], k[None], v[None], g[None].to(acc), beta[None].to(v.dtype), scale=scale,
                   initial_state=state0.index_select(0, keep_dev).contiguous(), output_final_state=True,
                   use_qk_l2norm_in_kernel=use_qk_l2norm, cu_seqlens=sub_cu.to(v.device), **extra)
    return o[0].to(v.dtype), state0.index_copy(0, keep_dev, final.to(acc))


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dimension (fla's and transformers' form)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def chunk_gated_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    cu_seqlens: torch.Tensor, initial_state: torch.Tensor | None = None, *, chunk_size: int = 64,
    scale: float | None = None, use_qk_l2norm: bool = False, kernel: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule on a packed row of independent segments (Note above).

    Args:
        q, k: ``(T, Hk, K)``.
        v: ``(T, Hv, V)``, ``Hv % Hk == 0`` (each q/k head serves ``Hv / Hk`` consecutive value heads).
        g: ``(T, Hv)``, log decays (``<= 0``).
        beta: ``(T, Hv)``.
        cu_seqlens: ``LongTensor[S+1]`` (CPU), segment boundaries; empty segments allowed.
        initial_state: ``(S, Hv, K, V)`` per segment, or None for zeros.
        chunk_size: tokens per chunk.
        scale: query scale, default ``K ** -0.5``.
        use_qk_l2norm: l2-normalise q and k first (Qwen3.5 does, inside the kernel).
        kernel: ``"auto"``, ``"torch"`` or ``"fla"`` (Note [vlmcp gated delta rule: the kernel choice]).

    Returns:
        ``(out (T, Hv, V)`` in ``v.dtype``, ``final_state (S, Hv, K, V)`` in
        :func:`accumulator_dtype`). Differentiable in every tensor input.
    """
    T, Hk, K = k.shape
    Hv, V = v.shape[1:]
    cu = cu_seqlens.to("cpu", torch.long)
    if select_kernel(kernel, v.device, v.dtype) == "fla":
        return _fla_chunk_gated_delta_rule(q, k, v, g, beta, cu, initial_state, scale, use_qk_l2norm)
    S = cu.numel() - 1
    out_dtype, acc = v.dtype, accumulator_dtype(v.dtype)
    if Hv != Hk:
        q, k = (x.repeat_interleave(Hv // Hk, dim=1) for x in (q, k))
    q, k, v, g, beta = (x.to(acc) for x in (q, k, v, g, beta))
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    q = q * (K ** -0.5 if scale is None else scale)
    state0 = (torch.zeros(S, Hv, K, V, dtype=acc, device=v.device) if initial_state is None
              else initial_state.to(acc))
    seg, first, last, rows = chunk_layout(cu, chunk_size)
    C = seg.numel()
    if C == 0:
        return v.new_zeros((T, Hv, V), dtype=out_dtype), state0
    # (T, Hv, *) -> (Hv, C, chunk, *), zero rows past each segment's end
    q, k, v, g, beta = (to_chunks(x, rows).movedim(2, 0) for x in (q, k, v, g, beta))
    upper = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=v.device).triu(1)
    gc = g.cumsum(-1)  # (Hv, C, chunk): log decay from the chunk start, inclusive
    decay = (gc[..., :, None] - gc[..., None, :]).masked_fill(upper, float("-inf")).exp()
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    system = (k_beta @ k.transpose(-1, -2)) * decay  # unit lower triangle: the diagonal is ignored
    new_values = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    k_cumdecay = torch.linalg.solve_triangular(system, k_beta * gc.exp()[..., None], upper=False,
                                               unitriangular=True)
    attn = (q @ k.transpose(-1, -2)) * decay
    q_decayed = q * gc.exp()[..., None]
    k_decayed = k * (gc[..., -1:] - gc).exp()[..., None]
    chunk_decay = gc[..., -1].exp()[..., None, None]  # (Hv, C, 1, 1)

    inits = state0.unbind(0)
    outs, finals = [], list(inits)
    state = None
    first_l, last_l, seg_l = first.tolist(), last.tolist(), seg.tolist()
    # per-chunk views by one unbind each: indexing chunk c in the loop would make backward write a
    # full-size zero gradient per chunk (quadratic in the number of chunks)
    tensors = (new_values, k_cumdecay, q_decayed, attn, k_decayed, chunk_decay)
    per_chunk = zip(*(x.unbind(1) for x in tensors), strict=True)
    for c, (nv, kc, qd, at, kd, cd) in enumerate(per_chunk):
        if first_l[c]:
            state = inits[seg_l[c]]
        v_new = nv - kc @ state
        outs.append(qd @ state + at @ v_new)
        state = state * cd + kd.transpose(-1, -2) @ v_new
        if last_l[c]:
            finals[seg_l[c]] = state
    out = from_chunks(torch.stack(outs, 1).movedim(0, 2), rows, T)
    return out.to(out_dtype), torch.stack(finals, 0)


class SegmentMaps(NamedTuple):
    """Each segment of a packed row run from a zero state, and its affine map (Note above).

    All in :func:`accumulator_dtype`.
    """

    out0: torch.Tensor
    """``(T, Hv, V)``: the outputs from ``S_in = 0``."""
    read: torch.Tensor
    """``(T, Hv, K)``: ``R_t``, how ``o_t`` reads ``S_in`` (``o_t = out0_t + S_in^T R_t``); zero in
    segments that start from zero."""
    maps: torch.Tensor
    """``(S, Hv, K, K + V)``: ``[M | U]`` of each segment (``M = 0`` where it starts from zero)."""


def segment_maps(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    cu_seqlens: torch.Tensor, fresh: torch.Tensor, *, chunk_size: int = 64, scale: float | None = None,
    use_qk_l2norm: bool = False, kernel: str = "auto",
) -> SegmentMaps:
    """Outputs from a zero state and the affine map of every segment (one kernel pass per kind).

    Args:
        q, k, v, g, beta, cu_seqlens, chunk_size, scale, use_qk_l2norm, kernel: as in
            :func:`chunk_gated_delta_rule`.
        fresh: ``BoolTensor[S]``: segments known to start from a zero state (a sample's
            first); they skip ``M`` and ``R`` (the plain kernel, width V).

    Returns:
        :class:`SegmentMaps`.
    """
    T, Hk, K = k.shape
    Hv, V = v.shape[1:]
    acc = accumulator_dtype(v.dtype)
    cu = cu_seqlens.to("cpu", torch.long)
    lens = cu[1:] - cu[:-1]
    fresh = fresh.to("cpu", torch.bool)
    token_fresh = torch.repeat_interleave(fresh, lens, output_size=T)
    out0 = v.new_zeros((T, Hv, V), dtype=acc)
    read = v.new_zeros((T, Hv, K), dtype=acc)
    maps = v.new_zeros((fresh.numel(), Hv, K, K + V), dtype=acc)
    # resolved on the inputs' dtype: the passes below run in the accumulator dtype
    kw = dict(chunk_size=chunk_size, scale=scale, use_qk_l2norm=use_qk_l2norm,
              kernel=select_kernel(kernel, v.device, v.dtype))
    for kind in (True, False):
        segs = torch.nonzero(fresh == kind).flatten()
        if segs.numel() == 0:
            continue
        tok = torch.nonzero(token_fresh == kind).flatten().to(v.device)
        sub_cu = F.pad(torch.cumsum(lens[segs], 0), (1, 0))
        args = [x.index_select(0, tok).to(acc) for x in (q, k, v, g, beta)]
        if kind:
            o, final = chunk_gated_delta_rule(*args, sub_cu, **kw)
            final = torch.cat([final.new_zeros(final.shape[:-1] + (K,)), final], -1)
        else:  # values [0 | v] from [I | 0]: the first K columns carry M and R
            args[2] = torch.cat([args[2].new_zeros(args[2].shape[:-1] + (K,)), args[2]], -1)
            init = torch.eye(K, K + V, dtype=acc, device=v.device).expand(segs.numel(), Hv, K, K + V)
            o, final = chunk_gated_delta_rule(*args, sub_cu, init, **kw)
            read = read.index_copy(0, tok, o[..., :K])
            o = o[..., K:]
        out0 = out0.index_copy(0, tok, o)
        maps = maps.index_copy(0, segs.to(v.device), final)
    return SegmentMaps(out0=out0, read=read, maps=maps)
