"""The routed-experts ``forward`` vlmcp installs on each EP-sharded experts module (and Llama 4's block).

Same signature as transformers' experts: ``experts(hidden (T, H), top_k_index (T, K), top_k_weights
(T, K)) -> (T, H)``, with the router, shared experts and gates around it untouched. It is set on the
module *instance* (so a later ``set_experts_implementation`` cannot run HF's kernel on the local
slice with global ids) and kept through hub-kernel kernelization (Note [vlmcp instance forwards and
hub kernels]). Steps: Note [vlmcp expert parallel: dispatch and combine].
"""

from __future__ import annotations

import torch
from torch import nn

from vlmcp.hf.moe.dispatch import combine, dispatch, plan_dispatch
from vlmcp.hf.moe.local import local_experts
from vlmcp.hf.moe.stats import record_counts

__all__ = ["ep_experts_forward", "llama4_moe_forward"]


def ep_experts_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                       top_k_weights: torch.Tensor) -> torch.Tensor:
    """This rank's tokens through their experts, wherever those live in the EP group.

    Args:
        self: an experts module :func:`vlmcp.hf.moe.shard.apply_expert_parallel` sharded
            (``self._vlmcp_ep``: its :class:`~vlmcp.hf.moe.shard.ExpertShard`).
        hidden_states: ``(T, H_in)`` this rank's tokens (T may be 0).
        top_k_index: ``(T, K)`` global expert ids.
        top_k_weights: ``(T, K)`` router weights (Llama 4: the scores that scale the input).

    Returns:
        ``(T, H_out)`` in ``hidden_states``' dtype: the weighted sum of each token's K expert outputs.
    """
    shard = self._vlmcp_ep
    spec = shard.spec
    tokens, k = top_k_index.shape
    plan = plan_dispatch(top_k_index, shard.num_experts, shard.group)
    record_counts(self, plan.counts)
    rows = hidden_states.index_select(0, plan.order // k)  # (S, H_in) sorted by expert
    if spec.scaled_input:  # Llama 4: x * score goes in, the output is added unweighted
        rows = rows * top_k_weights.reshape(-1).index_select(0, plan.order).unsqueeze(-1).to(rows.dtype)
    y = local_experts(self, spec, dispatch(rows, plan, shard.group), plan.local_counts, shard.kernel)
    y = combine(y, plan, shard.group).view(tokens, k, y.shape[-1])
    if not spec.scaled_input:
        y = (y * top_k_weights.unsqueeze(-1)).to(hidden_states.dtype)
    # the eager kernel's order: index_add_ expert by expert, ascending, into zeros
    slot = torch.argsort(top_k_index, dim=1, stable=True)
    y = y.gather(1, slot.unsqueeze(-1).expand_as(y))
    out = y.new_zeros(tokens, y.shape[-1])
    for j in range(k):
        out = out + y[:, j]
    return out


def llama4_moe_forward(self: nn.Module, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``Llama4TextMoe.forward`` with the routed experts dispatched instead of run densely.

    HF runs every expert on every token, the input scaled by a score that is exactly 0 off the
    router's top-k (``sigmoid(-inf)``); experts without biases map 0 to 0, so only the top-k terms
    are nonzero, and those are what the experts module computes here (input scaled, output unweighted).
    The dispatch runs inside ``self.experts(...)``, so an FSDP unit on the experts gathers them first.
    """
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    router_scores, router_logits = self.router(hidden_states)
    top_k_index = torch.topk(router_logits, self.top_k, dim=1).indices  # the router's own choice
    routed = self.experts(hidden_states, top_k_index, router_scores.gather(1, top_k_index))
    out = self.shared_expert(hidden_states)
    out.add_(routed)
    return out, router_logits
