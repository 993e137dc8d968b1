"""The LM head and cross-entropy in one op, a chunk of tokens at a time: never the N x V logits.

Note [vlmcp chunked linear cross-entropy]
-----------------------------------------
``cp_cross_entropy(hidden @ weight.T, labels)`` holds the whole ``(N, V)`` logits, their
fp32 copy and the fp32 log-probabilities autograd saves: at V = 152k and N = 32k tokens per
rank that is ~40 GB, most of a rank's activations (issue 23). :func:`cp_linear_cross_entropy`
computes the same loss and the same gradients holding one chunk of logits at a time::

    forward (no graph)                              saved for backward
    ------------------                              ------------------
    rows  = the M tokens with a target              hidden (N, H), weight (V, H), bias (V,),
    for each chunk c of <= chunk_size rows:         labels (N,), rows (M,) and
      z_c = hidden[c] @ weight.T + bias  (C, V)     lse (M,) in the accumulation dtype:
      z_c = cap * tanh(z_c / cap)   (softcap)       O(N) besides what exists anyway
      lse_c = logsumexp(z_c)  (fp32, fp64 in fp64)
      loss += sum(lse_c - z_c[target])

    backward, g = d(loss sum), per chunk c (z_c recomputed from hidden and weight):
      dz_c = g * (softmax(z_c) - onehot(target))    = g * (exp(z_c - lse_c) - onehot)
      dz_c *= 1 - tanh(z_c / cap)**2                 (softcap: d cap*tanh(u/cap) / du)
      d_hidden[c] = dz_c @ weight       (C, H)       rows without a target: exactly 0
      d_weight   += dz_c.T @ hidden[c]  (V, H)       fp32 accumulator for a 16-bit weight
      d_bias     += dz_c.sum(0)         (V,)

Only rows with a target enter a chunk (image tokens, prompts, padding and sample ends are
skipped at no cost), so the op is exact however the targets are spread, and a rank with no
target computes nothing but still joins the group's one all-reduce. The logits of a chunk
are computed in the inputs' dtype and upcast, as ``cp_cross_entropy(logits.float())``
does, so a 16-bit run rounds exactly where the full-logits path rounds.

The op itself communicates nothing: it returns this rank's summed token loss, and
:func:`~vlmcp.loss.cross_entropy.normalize_over_group` divides it by the CP group's target
count (one all-reduce of ``[count, loss sum]``, the same as :func:`vlmcp.cp_cross_entropy`;
that all-reduce carries no gradient, so there is no dual to document). Each rank's loss
is its share (Note [vlmcp gradient rules]): ``d_weight`` is this rank's share of the head's
gradient, reduced with the other parameters'.

Peak transient memory of one chunk: :func:`chunk_transient_bytes`.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from vlmcp.loss.cross_entropy import CPLoss, check_group, normalize_over_group

__all__ = ["chunk_transient_bytes", "cp_linear_cross_entropy"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _chunk_logits(hidden, weight, bias, rows, softcap, keep_tanh=False):
    """The chunk's logits ``(C, V)`` in the accumulation dtype, capped; with ``keep_tanh`` also
    ``tanh(raw / cap)`` (the backward's chain rule; None without softcap). Every step but the
    matmul and the upcast is in place, so at most two ``C x V`` tensors exist at once."""
    h = hidden.index_select(0, rows)
    z = h @ weight.t() if bias is None else torch.addmm(bias, h, weight.t())
    z = z.to(_accumulation_dtype(hidden.dtype))  # a fresh tensor either way: in place below is safe
    if softcap is None:
        return z, None
    t = z.div_(softcap).tanh_()
    if keep_tanh:
        return t * softcap, t
    return t.mul_(softcap), None


def check_head_options(hidden, weight, bias, chunk_size, softcap) -> None:
    """The checks both chunked heads (this loss and :func:`vlmcp.cp_token_logprobs`) run on the head's
    dtypes and their options.

    Raises:
        TypeError: ``hidden``, ``weight`` and ``bias`` not of one float dtype.
        ValueError: a ``chunk_size`` that is not a positive int, a ``softcap`` not > 0.
    """
    dtypes = {hidden.dtype, weight.dtype} | ({bias.dtype} if bias is not None else set())
    if len(dtypes) != 1 or hidden.dtype not in _FLOATS:
        raise TypeError(f"hidden, weight and bias must share one float dtype, got {sorted(map(str, dtypes))}")
    if not (isinstance(chunk_size, int) and not isinstance(chunk_size, bool) and chunk_size >= 1):
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if softcap is not None and not float(softcap) > 0:
        raise ValueError(f"softcap must be > 0 or None, got {softcap!r}")


def backward_in_forward_dtypes(backward):
    """An autograd ``backward(ctx, grad)`` run with autocast off, so that it computes in the dtypes its
    forward saved, even when called inside an autocast region (both chunked heads' backwards)."""

    @functools.wraps(backward)
    def run(ctx, grad):
        with torch.autocast(grad.device.type, enabled=False):
            return backward(ctx, grad)

    return staticmethod(run)


class _LinearCrossEntropy(torch.autograd.Function):
    """Sum over target rows of ``logsumexp(z) - z[target]``, ``z = cap(hidden @ weight.T + bias)``."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, rows, chunk_size, softcap):
        acc = _accumulation_dtype(hidden.dtype)
        targets = labels.index_select(0, rows)
        lse = torch.empty(rows.numel(), dtype=acc, device=hidden.device)
        total = torch.zeros((), dtype=acc, device=hidden.device)
        for a in range(0, rows.numel(), chunk_size):
            z, _ = _chunk_logits(hidden, weight, bias, rows[a:a + chunk_size], softcap)
            c = z.shape[0]
            target_logit = z.gather(1, targets[a:a + c, None]).squeeze(1)
            top = z.amax(dim=1, keepdim=True)
            lse_c = z.sub_(top).exp_().sum(dim=1).log_().add_(top.squeeze(1))  # logsumexp, in place
            lse[a:a + c] = lse_c
            total += (lse_c - target_logit).sum()
            del z
        ctx.save_for_backward(hidden, weight, bias, rows, targets, lse)
        ctx.chunk_size, ctx.softcap = chunk_size, softcap
        return total

    @backward_in_forward_dtypes
    def backward(ctx, grad):
        hidden, weight, bias, rows, targets, lse = ctx.saved_tensors
        row_grad = grad.to(lse.dtype).expand(rows.numel())  # d loss / d CE_i = g for every target row
        grads = chunked_head_backward(hidden, weight, bias, rows, targets, lse, row_grad,
                                      ctx.needs_input_grad[:3], ctx.chunk_size, ctx.softcap)
        return (*grads, None, None, None, None)


def chunked_head_backward(hidden, weight, bias, rows, targets, lse, row_grad, needs, chunk, softcap,
                          temperature=1.0):
    """``(d_hidden, d_weight, d_bias)`` of ``sum_i row_grad_i * CE_i`` over the target ``rows``, the
    logits of each chunk recomputed (Note [vlmcp chunked linear cross-entropy]).

    ``CE_i = lse_i - z_i[target]``, ``z = cap(hidden @ weight.T + bias) / temperature``, so
    ``dz = row_grad_i * (softmax(z_i) - onehot(target)) / temperature`` (times ``1 - tanh^2``
    under a softcap). The log-probs of :func:`vlmcp.cp_token_logprobs` are ``-CE_i``: their
    backward is this one with ``row_grad = -grad``. ``needs``: which of the three to compute.
    """
    need_h, need_w, need_b = needs
    acc = lse.dtype
    d_hidden = torch.zeros_like(hidden) if need_h else None
    d_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
    d_bias = torch.zeros(bias.shape, dtype=acc, device=bias.device) if need_b else None
    for a in range(0, rows.numel(), chunk):
        r = rows[a:a + chunk]
        dz, t = _chunk_logits(hidden, weight, bias, r, softcap, keep_tanh=True)
        c = dz.shape[0]
        if temperature != 1.0:
            dz.div_(temperature)
        dz.sub_(lse[a:a + c, None]).exp_()  # softmax, in place of the logits
        dz[torch.arange(c, device=dz.device), targets[a:a + c]] -= 1
        dz.mul_(row_grad[a:a + c, None] if temperature == 1.0 else row_grad[a:a + c, None] / temperature)
        if t is not None:
            dz.mul_(t.mul_(t).neg_().add_(1))  # d cap*tanh(u/cap) / du = 1 - tanh^2
            del t
        if need_b:
            d_bias += dz.sum(0)
        dz = dz.to(hidden.dtype)
        if need_h:
            d_hidden.index_copy_(0, r, dz @ weight)
        if need_w and dz.dtype == acc:
            d_weight.addmm_(dz.t(), hidden.index_select(0, r))
        elif need_w:  # a 16-bit matmul (fp32 inside the GEMM), accumulated over chunks in fp32
            d_weight += (dz.t() @ hidden.index_select(0, r)).to(acc)
        del dz
    if need_w:
        d_weight = d_weight.to(weight.dtype)
    if need_b:
        d_bias = d_bias.to(bias.dtype)
    return d_hidden, d_weight, d_bias


def cp_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    group: dist.ProcessGroup | None,
    *,
    bias: torch.Tensor | None = None,
    chunk_size: int = 4096,
    softcap: float | None = None,
    ignore_index: int = -100,
) -> CPLoss:
    """``cp_cross_entropy(hidden @ weight.T + bias, labels, group)`` without the ``(N, V)`` logits.

    Note [vlmcp chunked linear cross-entropy]: a chunk of ``chunk_size`` target rows at a time,
    forward and backward; O(N) saved besides the inputs. Exact: the same loss and gradients
    as the full-logits path (float64 to rounding).

    Args:
        hidden: ``(N, H)`` this rank's last hidden states (after the final norm), float16,
            bfloat16, float32 or float64.
        weight: ``(V, H)`` the LM head's weight (the embedding under tied embeddings), the
            dtype of ``hidden``.
        labels: ``(N,)`` targets, shifted on the global row; ``ignore_index`` where none.
        group: the CP group, or None for one process.
        bias: ``(V,)`` the head's bias, or None.
        chunk_size: target rows per chunk (a chunk's logits are ``chunk_size x V``).
        softcap: ``cap``: the logits are ``cap * tanh(z / cap)`` (Gemma-2-style final logit
            softcapping), or None.
        ignore_index: label value that is not a target.

    Returns:
        :class:`~vlmcp.CPLoss` ``(loss, mean)``: this rank's share of the group's mean token
        loss (float32; float64 for float64 inputs) and the group's mean, detached.

    Under ``torch.autocast`` the head runs in the autocast dtype, as ``nn.Linear`` would, and the
    log-sum-exp in float32.

    Raises:
        TypeError: ``group`` is neither a process group nor None; dtypes that differ or are
            not floating.
        ValueError: bad shapes, ``chunk_size < 1``, ``softcap <= 0``, or a target outside
            ``[0, V)`` (checked on this rank's labels, before the all-reduce).
    """
    check_group(group)
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden must be (N, H) and weight (V, H), got {tuple(hidden.shape)} and "
                         f"{tuple(weight.shape)}")
    if labels.shape != hidden.shape[:1]:
        raise ValueError(f"labels must be (N,) = {tuple(hidden.shape[:1])}, got {tuple(labels.shape)}")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"bias must be (V,) = {tuple(weight.shape[:1])}, got {tuple(bias.shape)}")
    device = hidden.device.type
    if torch.is_autocast_enabled(device):  # what F.linear does under autocast; then no autocast inside
        low = torch.get_autocast_dtype(device)
        hidden, weight = hidden.to(low), weight.to(low)
        bias = None if bias is None else bias.to(low)
    check_head_options(hidden, weight, bias, chunk_size, softcap)
    rows = torch.nonzero(labels != ignore_index).squeeze(1)
    targets = labels.index_select(0, rows)
    if rows.numel() and bool(((targets < 0) | (targets >= weight.shape[0])).any()):
        raise ValueError(f"labels must be in [0, {weight.shape[0]}) or ignore_index={ignore_index}, got "
                         f"{targets[(targets < 0) | (targets >= weight.shape[0])][:5].tolist()}")
    with torch.autocast(device, enabled=False):
        local = _LinearCrossEntropy.apply(hidden, weight, bias, labels, rows, chunk_size,
                                          None if softcap is None else float(softcap))
    return normalize_over_group(local, labels, group, ignore_index)


def chunk_transient_bytes(chunk_size: int, vocab: int, dtype: torch.dtype = torch.bfloat16, *,
                          softcap: bool = False, hidden_size: int = 0) -> int:
    """Peak bytes :func:`cp_linear_cross_entropy` allocates at once beyond its outputs (forward or backward).

    Per chunk, ``C x V`` elements: the logits in the accumulation dtype (float32; float64 for
    float64) plus, at the peak, either the 16-bit matmul output before its upcast and the
    16-bit ``dz`` of the backward matmuls (16-bit inputs), or the ``tanh`` the softcap's chain
    rule keeps (whichever is larger). With ``hidden_size`` and a 16-bit dtype, also the chunk's
    16-bit ``d_weight`` partial and its float32 copy (``V x H`` each), added to the float32
    accumulator. Not counted: the O(N) vectors, ``d_hidden`` (``N x H``, the size of
    ``hidden``) and the ``d_weight`` accumulator (``V x H`` in float32), which do not depend
    on the chunk.

    Args:
        chunk_size: C, target rows per chunk (a rank with fewer targets uses that many).
        vocab: V.
        dtype: the hidden states' and the head's dtype.
        softcap: whether a softcap is applied.
        hidden_size: H, to count the 16-bit ``d_weight`` partials (0: leave them out).
    """
    acc = _accumulation_dtype(dtype)
    item, acc_item = torch.empty((), dtype=dtype).element_size(), torch.empty((), dtype=acc).element_size()
    cv = int(chunk_size) * int(vocab)
    if dtype == acc:
        return cv * acc_item * (2 if softcap else 1)
    partial = int(vocab) * int(hidden_size) * (item + acc_item)  # d_weight's 16-bit partial, upcast
    return max(cv * (acc_item + (acc_item if softcap else item)), cv * item + partial)
