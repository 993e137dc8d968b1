"""Expert parallelism (EP) for the MoE language models of Hugging Face VLMs, composed with CP and FSDP2.

``vlmcp.hf.parallelize(model, cp_group, ..., ep_group=ep_group)`` keeps, on each rank of an EP group
of E ranks, ``1/E`` of every MoE layer's routed experts; tokens go to their experts' ranks by an
all-to-all and come back, dropless, for every router the adapters know (Note [vlmcp expert parallel:
dispatch and combine]). In a training loop::

    check_ep(model.config, world, ep)                       # before any rank starts (the CLI)
    ep_group, edp_group = expert_groups(world_group, ep)
    vlmcp.hf.parallelize(model, cp_group, ep_group=ep_group)
    ...  loss.backward()
    vlmcp.reduce_gradients(model, cp_group, dp_group, expert_dp_group=edp_group)
    load = expert_load(model, world_group)                  # per-expert token counts of the step

* :func:`check_ep` (:mod:`.shard`): the refusals, from the config alone, in one line.
* :func:`expert_groups` (:mod:`.groups`): EP groups of consecutive ranks, expert-DP groups strided.
* :mod:`.registry`: the experts classes vlmcp shards (:func:`register_experts` adds one).
* :mod:`.dispatch`, :mod:`.local`, :mod:`.forward`: the exchange, the local experts (a grouped matmul
  on CUDA, else a loop), the forward installed on each experts module.
* :func:`fully_shard_experts` (:mod:`.fsdp`): FSDP2 units of the experts over the expert-DP group.
* :func:`gather_experts`, :func:`slice_experts`, :func:`load_experts` (:mod:`.checkpoint`): full
  experts in checkpoints, resumable at another E.
* :func:`expert_load`, :func:`local_expert_counts` (:mod:`.stats`): per-expert token counts.
"""

from vlmcp.hf.moe.checkpoint import expert_shapes, gather_experts, load_experts, slice_experts
from vlmcp.hf.moe.fsdp import fully_shard_experts
from vlmcp.hf.moe.groups import expert_groups
from vlmcp.hf.moe.registry import EXPERTS, ExpertsSpec, register_experts
from vlmcp.hf.moe.shard import ExpertShard, check_ep, expert_shards
from vlmcp.hf.moe.stats import ExpertLoad, expert_load, local_expert_counts

__all__ = [
    "EXPERTS", "ExpertLoad", "ExpertShard", "ExpertsSpec", "check_ep", "expert_groups", "expert_load",
    "expert_shapes", "expert_shards", "fully_shard_experts", "gather_experts", "load_experts",
    "local_expert_counts", "register_experts", "slice_experts",
]
