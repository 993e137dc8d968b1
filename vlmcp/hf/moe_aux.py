"""The MoE router's load-balancing loss of a whole row, as each CP rank's share.

Note [vlmcp HF MoE auxiliary loss under CP]
-------------------------------------------
Qwen3-VL-MoE's forward adds ``router_aux_loss_coef * aux`` to its loss when
``output_router_logits`` is set (transformers 5.24 ``load_balancing_loss_func``): over the
``R`` rows of every layer's router logits (layers x tokens)::

    f_e = (top-k assignments to expert e) / R       (counts: no gradient)
    p_e = (sum of softmax(router logits)[:, e]) / R
    aux = E * sum_k,e f_{k,e} * p_e

It is not a sum over tokens, so the ranks' own ``aux`` of their local tokens do not add up
to the row's. But ``f`` carries no gradient and ``aux`` is linear in ``p``: with the counts
and ``R`` summed over the CP group first (one all-reduce, no gradient, so no dual), rank r's

    share_r = E * sum_k,e f_{k,e} * (sum over rank r's rows of softmax[:, e]) / R

adds up to the row's ``aux`` over the group, value and gradient (Note [vlmcp gradient
rules]). Each token counts once: padding slots never, a replicated token (an image under
``image_strategy="replicate"``) on rank 0 only, the rule the labels follow. The result is
what the model's own forward computes on the whole row in one process.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from vlmcp.layout import RankShard

__all__ = ["load_balancing_share", "router_aux_loss", "token_weights"]


def token_weights(shard: RankShard, group: dist.ProcessGroup | None) -> torch.Tensor:
    """``BoolTensor[N]``: the local slots that count once over the group (no padding; replicated
    tokens on rank 0 only)."""
    rank = 0 if group is None else dist.get_rank(group)
    keep = shard.positions >= 0
    return keep & ~shard.replicated if rank > 0 else keep


def load_balancing_share(router_logits: Sequence[torch.Tensor], num_experts: int, top_k: int,
                         weights: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """This rank's share of the row's load-balancing loss (Note [vlmcp HF MoE auxiliary loss under CP]).

    Args:
        router_logits: one ``(N, E)`` tensor per MoE layer, this rank's slots.
        num_experts: E.
        top_k: experts per token.
        weights: ``BoolTensor[N]`` from :func:`token_weights`.
        group: the CP group, or None.

    Returns:
        A scalar in float32 (float64 for float64 logits); summed over the group it is
        ``load_balancing_loss_func`` of the whole row.
    """
    device = router_logits[0].device
    acc = torch.promote_types(router_logits[0].dtype, torch.float32)  # HF: float32 (float64 in float64)
    w = weights.to(device=device, dtype=acc)
    counts = torch.zeros(num_experts + 1, dtype=torch.float64, device=device)  # per expert, then R
    prob = torch.zeros(num_experts, dtype=acc, device=device)
    for layer in router_logits:
        if layer.shape != (w.numel(), num_experts):
            raise ValueError(f"router logits of shape {tuple(layer.shape)}, expected "
                             f"({w.numel()}, {num_experts})")
        p = torch.softmax(layer, dim=-1)
        chosen = torch.topk(p.detach(), top_k, dim=-1).indices
        counts[:num_experts] += torch.zeros(num_experts, device=device, dtype=torch.float64).scatter_add_(
            0, chosen.reshape(-1), w.double().repeat_interleave(top_k))
        counts[num_experts] += w.sum().double()
        prob = prob + (p.to(acc) * w[:, None]).sum(0)
    if group is not None:
        dist.all_reduce(counts, group=group)
    rows = counts[num_experts].clamp(min=1)
    f = (counts[:num_experts] / rows).to(acc)
    return num_experts * (f * prob).sum() / rows.to(acc)


def router_aux_loss(model, output, weights: torch.Tensor, group: dist.ProcessGroup | None,
                    experts: Sequence[str]) -> torch.Tensor | None:
    """This rank's share of the auxiliary loss a MoE VLM's forward adds to its loss,
    ``router_aux_loss_coef * aux`` (an adapter's ``auxiliary_loss``); None when the forward
    returned no ``aux_loss``.

    Args:
        model: the HF model (its ``config.text_config`` holds the coefficient and the router's sizes).
        output: the forward's output (``aux_loss``, ``router_logits``).
        weights, group: as in :func:`load_balancing_share`.
        experts: the text config's fields that may hold the expert count, the first present wins
            (``num_experts``; GLM-4.5V: ``num_local_experts`` or ``n_routed_experts``).

    Raises:
        NotImplementedError: the text config has none of ``experts``.
    """
    if getattr(output, "aux_loss", None) is None:
        return None
    text = model.config.text_config
    count = next((n for n in (getattr(text, f, None) for f in experts) if n), None)
    if count is None:
        raise NotImplementedError(f"{type(model).__name__} returns aux_loss but its text config names no "
                                  f"expert count ({' / '.join(experts)})")
    share = load_balancing_share(output.router_logits, int(count), int(text.num_experts_per_tok), weights,
                                 group)
    return float(text.router_aux_loss_coef) * share
