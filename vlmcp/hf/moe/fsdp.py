"""FSDP2 with expert parallelism: each experts module its own unit over the expert-DP group.

The non-expert parameters are sharded over the world as without EP. The experts of EP rank j are
the same tensors on the W/E ranks of its expert-DP group (and different ones across the EP group),
so they are sharded over that group only, as torchtitan's first EP did, on dimension 1 (``Shard(1)``:
never uneven when El < W/E, and never the EP dimension). Apply it before the decoder blocks' and the
root's ``fully_shard``: a unit over the world then leaves the experts' parameters alone (they are
managed by the inner unit), as it must: sharding them over the world would all-gather different
ranks' experts as one tensor.

The unit's reduce-scatter *sums* over the expert-DP group (divide factor 1, sum reduction: FSDP's
own divide factor would be the group size, and with a one-rank group and float64 it divides twice
in torch 2.13); :func:`vlmcp.grads.finish_ddp_gradients` then divides by W, as it does for the
other rules under the loss-times-P convention (Note [vlmcp gradient rules]).
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

__all__ = ["fully_shard_experts"]


def fully_shard_experts(model: nn.Module, expert_dp_group: dist.ProcessGroup, world_size: int, *,
                        mp_policy=None, reshard_after_forward: bool = True) -> int:
    """``fully_shard`` every EP-sharded experts module over ``expert_dp_group``; returns how many.

    Args:
        model: the model after :func:`vlmcp.hf.parallelize` with an ``ep_group``.
        expert_dp_group: from :func:`vlmcp.hf.moe.expert_groups`.
        world_size: W = D*P, the ranks of the run (the other units' mesh), which
            :func:`vlmcp.grads.finish_ddp_gradients` checks.
        mp_policy: FSDP2's ``MixedPrecisionPolicy`` (the one the other units get).
        reshard_after_forward: as ``fully_shard``'s.
    """
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import Shard

    edp = dist.get_world_size(expert_dp_group)
    mods = [m for m in model.modules() if getattr(m, "_vlmcp_ep", None) is not None and m._vlmcp_ep.size > 1]
    if mods and mods[0]._vlmcp_ep.size * edp != world_size:
        raise ValueError(f"EP size {mods[0]._vlmcp_ep.size} x expert-DP size {edp} is not the world size "
                         f"{world_size}")
    if not mods:
        return 0
    device = next(mods[0].parameters()).device
    mesh = DeviceMesh.from_group(expert_dp_group, device.type)
    for m in mods:
        fully_shard(m, mesh=mesh, mp_policy=mp_policy or MixedPrecisionPolicy(),
                    reshard_after_forward=reshard_after_forward, shard_placement_fn=lambda p: Shard(1))
        m.set_gradient_divide_factor(1.0)
        m.set_force_sum_reduction_for_comms(True)
        m._vlmcp_fsdp_experts = world_size
    return len(mods)
