"""Per-token log-probabilities and per-sample sums on a CP rank: what RL and preference losses need.

Note [vlmcp log-probs and per-sample sums under CP]
---------------------------------------------------
RL actors (verl, OpenRLHF, TRL's GRPO) and preference losses (DPO) do not take the mean
token loss: they take each target token's log-probability, and sums of it per sample (a
sequence's log-likelihood), then a nonlinear function of those sums::

    per token   logp_i = log softmax(z_i / T)[target_i]              cp_token_logprobs
    per sample  s_k = sum of logp_i over sample k's targets           per_sample_sum
    DPO         L = -mean_pairs logsigmoid(beta * ((s_c - ref_c) - (s_r - ref_r)))

Under CP a sample's tokens are spread over the ranks, so:

* ``logp_i`` is local: a rank's logits hold the whole vocabulary for its own slots, so
  :func:`cp_token_logprobs` communicates nothing. Given the last hidden states and the LM
  head's weight it computes them a chunk of target rows at a time, forward and backward,
  never holding the ``(N, vocab)`` logits: the chunks are those of Note [vlmcp chunked
  linear cross-entropy] (the same chunk logits, softcap included), with a gradient per row
  instead of one for the sum (``dz = g_i * (onehot(target) - softmax(z / T)) / T``, times
  ``1 - tanh^2`` under a softcap; then ``d_hidden = dz @ W``, ``d_W += dz.T @ hidden``).
  Rows without a target cost nothing and get a zero gradient.
* ``s_k`` needs every rank: :func:`per_sample_sum` sums this rank's slots of each sample
  (padding out; a replicated slot, which every rank holds, counted on rank 0 only) and
  all-reduces the ``(S,)`` vector: one all-reduce of S numbers. Its dual is the identity
  (:func:`vlmcp.comm.all_reduce_sum`, Megatron's ``g``): the sums are then the same on every
  rank, every rank computes the *whole* loss from them, and the gradient arriving at the
  sums is already the full one, so each rank's values get the true gradient of their own
  slots and every parameter gradient is this rank's share (Note [vlmcp gradient rules]):
  :func:`vlmcp.reduce_gradients` sums them. Do not divide such a loss by P; a share loss
  (:func:`vlmcp.cp_cross_entropy`) can be added to it as is.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from vlmcp.comm import all_reduce_sum
from vlmcp.layout import RankShard
from vlmcp.loss.linear_cross_entropy import (
    _accumulation_dtype,
    _chunk_logits,
    backward_in_forward_dtypes,
    check_head_options,
    chunked_head_backward,
)

__all__ = ["cp_token_logprobs", "per_sample_sum"]


class _LinearLogProbs(torch.autograd.Function):
    """``logp[rows] = log softmax(cap(hidden[rows] @ W.T + b) / T)[targets]``, 0 elsewhere; ``(N,)``."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, rows, chunk_size, temperature, softcap):
        targets = labels.index_select(0, rows)
        out = torch.zeros(hidden.shape[0], dtype=_accumulation_dtype(hidden.dtype), device=hidden.device)
        lse = torch.empty(rows.numel(), dtype=out.dtype, device=hidden.device)
        for a in range(0, rows.numel(), chunk_size):
            z = _chunk_logits(hidden, weight, bias, rows[a:a + chunk_size], softcap)[0].div_(temperature)
            c = z.shape[0]
            lse[a:a + c] = torch.logsumexp(z, dim=1)
            out[rows[a:a + c]] = z.gather(1, targets[a:a + c, None]).squeeze(1) - lse[a:a + c]
            del z
        ctx.save_for_backward(hidden, weight, bias, rows, targets, lse)
        ctx.chunk_size, ctx.temperature, ctx.softcap = chunk_size, temperature, softcap
        return out

    @backward_in_forward_dtypes
    def backward(ctx, grad):
        hidden, weight, bias, rows, targets, lse = ctx.saved_tensors
        row_grad = -grad.to(lse.dtype).index_select(0, rows)  # log p_i = -CE_i
        grads = chunked_head_backward(hidden, weight, bias, rows, targets, lse, row_grad,
                                      ctx.needs_input_grad[:3], ctx.chunk_size, ctx.softcap, ctx.temperature)
        return (*grads, None, None, None, None, None)


def cp_token_logprobs(
    logits_or_hidden: torch.Tensor,
    labels: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    *,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    chunk_size: int = 4096,
    temperature: float = 1.0,
    softcap: float | None = None,
    ignore_index: int = -100,
) -> torch.Tensor:
    """Each local target's log-probability: Note [vlmcp log-probs and per-sample sums under CP].

    Args:
        logits_or_hidden: ``(N, vocab)`` this rank's logits, or with ``weight`` its last
            hidden states ``(N, H)`` (after the final norm): then the head runs a chunk of
            ``chunk_size`` target rows at a time and the ``(N, vocab)`` logits never exist.
        labels: ``(N,)`` targets shifted on the global row (:func:`vlmcp.hf.shard_inputs`'
            ``batch.labels``); ``ignore_index`` where there is none.
        group: the CP group, or None. Checked only: every rank's logits hold the whole
            vocabulary for its own slots, so no collective is needed.
        weight: ``(vocab, H)`` the LM head's weight, to pass hidden states.
        bias: ``(vocab,)`` the head's bias, with ``weight``.
        chunk_size: target rows per chunk of logits (with ``weight``).
        temperature: the logits are divided by it (the sampling temperature of RL rollouts).
        softcap: with ``weight``, ``cap``: the head's logits are ``cap * tanh(z / cap)`` before the
            temperature (Gemma-2-style final logit softcapping), as in
            :func:`vlmcp.cp_linear_cross_entropy`; pass capped logits yourself otherwise.
        ignore_index: label value that is not a target.

    Returns:
        ``(N,)`` float32 (float64 for float64 inputs): ``log p(label)`` at targets, 0 elsewhere;
        autograd flows to the logits (or to the hidden states, weight and bias).

    Raises:
        TypeError: ``group`` is neither a process group nor None; dtypes that differ or are not
            floating.
        ValueError: bad shapes, a target outside ``[0, vocab)``, ``chunk_size < 1``,
            ``temperature <= 0``, ``softcap <= 0`` or a softcap given with logits.
    """
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed ProcessGroup (the CP group) or None, got "
                        f"{type(group).__name__}")
    x = logits_or_hidden
    if x.dim() != 2 or labels.shape != x.shape[:1]:
        raise ValueError(f"logits_or_hidden must be (N, vocab) or (N, H) and labels (N,), got "
                         f"{tuple(x.shape)} and {tuple(labels.shape)}")
    if not float(temperature) > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    vocab = x.shape[1] if weight is None else weight.shape[0]
    rows = torch.nonzero(labels != ignore_index).squeeze(1)
    targets = labels.index_select(0, rows)
    if rows.numel() and bool(((targets < 0) | (targets >= vocab)).any()):
        raise ValueError(f"labels must be in [0, {vocab}) or ignore_index={ignore_index}, got "
                         f"{targets[(targets < 0) | (targets >= vocab)][:5].tolist()}")
    if weight is None:
        if bias is not None or softcap is not None:
            raise ValueError("bias and softcap are the LM head's: pass them with weight= (hidden states), "
                             "not with logits")
        z = x.index_select(0, rows).to(_accumulation_dtype(x.dtype)) / float(temperature)
        picked = z.gather(1, targets[:, None]).squeeze(1) - torch.logsumexp(z, dim=1)
        return torch.zeros(x.shape[0], dtype=z.dtype, device=x.device).index_put((rows,), picked)
    bad_bias = bias is not None and bias.shape != weight.shape[:1]
    if weight.dim() != 2 or weight.shape[1] != x.shape[1] or bad_bias:
        raise ValueError(f"weight must be (vocab, H) with H = {x.shape[1]} and bias (vocab,), got "
                         f"{tuple(weight.shape)} and {None if bias is None else tuple(bias.shape)}")
    check_head_options(x, weight, bias, chunk_size, softcap)
    with torch.autocast(x.device.type, enabled=False):
        return _LinearLogProbs.apply(x, weight, bias, labels, rows, chunk_size, float(temperature),
                                     None if softcap is None else float(softcap))


def per_sample_sum(values: torch.Tensor, shard: RankShard, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Each packed sample's sum of ``values`` over the whole row, on every rank (one all-reduce).

    Args:
        values: ``(N,)`` one value per local slot of ``shard`` (e.g. :func:`cp_token_logprobs`);
            padding slots are left out, and a replicated slot (every rank holds it) counts on
            rank 0 only, so each global token counts once.
        shard: this rank's :class:`~vlmcp.RankShard` (``batch.shard`` of ``shard_inputs``).
        group: the CP group the shard was planned for, or None for one process.

    Returns:
        ``(S,)`` the per-sample sums of the whole row (S = samples in the row, the padding
        sample included), the same on every rank. Backward: the identity (the dual of the
        forward's all-reduce when every rank computes the whole loss from the sums: Note
        [vlmcp log-probs and per-sample sums under CP]).

    Raises:
        ValueError: ``values`` is not ``(N,)``, or ``group``'s size is not the shard's P.
    """
    if values.shape != (shard.num_tokens,):
        raise ValueError(f"values must be ({shard.num_tokens},): one per local slot of the shard, got "
                         f"{tuple(values.shape)}")
    size = 1 if group is None else dist.get_world_size(group)
    if size != shard.cp_size:
        raise ValueError(f"the shard was planned for P={shard.cp_size} ranks but the group has {size}")
    own = ~shard.is_pad & (~shard.replicated if shard.rank > 0 else torch.ones_like(shard.replicated))
    own = own.to(values.device)
    samples = shard.sample_starts.numel()
    local = values.new_zeros(samples).index_add(0, shard.sample_ids.to(values.device)[own], values[own])
    return local if group is None or size == 1 else all_reduce_sum(local, group)
