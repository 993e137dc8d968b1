"""Slice each MoE layer's experts over the EP group and install the dispatching forward.

Called by :func:`vlmcp.hf.parallelize` with ``ep_group=``: :func:`plan_expert_parallel` runs every
check before anything changes (:func:`check_ep`'s arithmetic, the registry's refusals by path and
class), :func:`apply_expert_parallel` then keeps, on EP rank j of E, experts
``[j*El, (j+1)*El)`` of every layer (``El = E_tot/E``), tags them with the gradient rule EXPERT
(Note [vlmcp gradient rules]; the tags recorded on the module for :func:`vlmcp.grads.restore_grad_tags`)
and sets :func:`~vlmcp.hf.moe.forward.ep_experts_forward` on the module instance (Llama 4: also
:func:`~vlmcp.hf.moe.forward.llama4_moe_forward` on its block). Routers, shared experts, gates
and norms are untouched: replicated, rule SHARE.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Literal

import torch.distributed as dist
from torch import nn

from vlmcp.grads import GradRule, GradTag, grad_tag, set_grad_rule
from vlmcp.hf.hub_kernels import keep_instance_forward
from vlmcp.hf.moe.forward import ep_experts_forward, llama4_moe_forward
from vlmcp.hf.moe.registry import MODEL_TYPES, ExpertsSpec, check_routing, expert_count, find_experts

__all__ = ["ExpertShard", "apply_expert_parallel", "check_ep", "expert_shards", "plan_expert_parallel"]


@dataclass(frozen=True, kw_only=True, eq=False)
class ExpertShard:
    """What one experts module holds under expert parallelism (``module._vlmcp_ep``)."""

    group: dist.ProcessGroup | None
    """The EP group (None: one EP rank, nothing exchanged)."""
    size: int
    """E, the EP size."""
    rank: int
    """j, this rank's index in the EP group."""
    num_experts: int
    """E_tot, the layer's experts over the group."""
    spec: ExpertsSpec
    """The class's registry entry."""
    kernel: Literal["auto", "grouped", "loop"] = "auto"
    """The local experts' kernel (:func:`vlmcp.hf.moe.local.local_experts`)."""
    grad_tags: dict[str, GradTag] = field(default_factory=dict)
    """The EXPERT tags by parameter name (read by :func:`vlmcp.grads.restore_grad_tags`)."""

    @property
    def num_local(self) -> int:
        """El = E_tot / E experts on this rank."""
        return self.num_experts // self.size

    @property
    def first(self) -> int:
        """The global id of this rank's first expert."""
        return self.rank * self.num_local

    def __deepcopy__(self, memo):
        return self


def check_ep(config, world: int, ep: int) -> None:
    """Refuse, in one line and before any rank starts, an EP size the model and world cannot take.

    Args:
        config: the model's config (a VLM's top-level config or its text config).
        world: the ranks of the run (CP x DP).
        ep: the EP size E.

    Raises:
        ValueError: E not a positive int, E not dividing the world, E > 1 on a model without routed
            experts, on a MoE language model vlmcp's expert parallel does not know, with an expert
            count E does not divide, or with capacity-limited (token-dropping) routing.
    """
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        raise ValueError(f"the EP size must be a positive int, got {ep!r}")
    if world % ep:
        raise ValueError(f"--ep {ep} must divide the world of {world} ranks (cp x dp)")
    if ep == 1:
        return
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    name = getattr(text, "model_type", type(text).__name__)
    count = expert_count(text)
    if count is None:
        raise ValueError(f"--ep {ep}: the {name} language model has no routed experts to shard")
    if name not in MODEL_TYPES:
        raise ValueError(f"--ep {ep}: vlmcp's expert parallel does not know the MoE language model {name!r} "
                         f"(known: {sorted(MODEL_TYPES)})")
    if count % ep:
        raise ValueError(f"--ep {ep} must divide the {count} routed experts of {name}")
    check_routing(text)


def plan_expert_parallel(model: nn.Module, root: str, ep_group: dist.ProcessGroup | None
                         ) -> list[tuple[str, nn.Module, ExpertsSpec]]:
    """Every check of :func:`apply_expert_parallel`, changing nothing; returns its targets.

    Raises:
        ValueError: as :func:`check_ep` (from the modules' own expert counts), no routed experts under
            ``model.<root>`` for an EP group of more than one rank, layers with different expert counts,
            experts already sharded (FSDP before ``parallelize``, or a second call), and the registry's
            refusals (:func:`vlmcp.hf.moe.registry.find_experts`).
    """
    if ep_group is not None and not isinstance(ep_group, dist.ProcessGroup):
        raise TypeError(f"ep_group must be a ProcessGroup or None, got {type(ep_group).__name__}")
    size = 1 if ep_group is None else dist.get_world_size(ep_group)
    check_routing(model.config.get_text_config())
    targets = find_experts(model, root)
    if not targets and size > 1:
        raise ValueError(f"ep_group of {size} ranks, but {type(model).__name__} has no routed experts "
                         f"under {root}")
    counts = set()
    for path, module, spec in targets:
        if getattr(module, "_vlmcp_ep", None) is not None:
            raise ValueError(f"{path} is sharded over an EP group already (parallelize once)")
        for name in (spec.up, "down_proj"):
            p = getattr(module, name)
            if type(p.data).__name__ != "Tensor" or p.is_meta:
                where = " on meta" if p.is_meta else ""
                raise ValueError(f"{path}.{name} is a {type(p.data).__name__}{where}: call parallelize on "
                                 "loaded weights, before fully_shard")
        counts.add(module.down_proj.shape[0])
    if len(counts) > 1:
        raise ValueError(f"the MoE layers have different expert counts {sorted(counts)}")
    if counts and next(iter(counts)) % size:
        raise ValueError(f"the EP group's {size} ranks must divide the {next(iter(counts))} routed experts")
    for path, _, spec in targets:
        block = type(model.get_submodule(path.rsplit(".", 1)[0])).__name__
        if spec.scaled_input and block != "Llama4TextMoe":
            raise ValueError(f"{path}: a {spec.class_name} outside a Llama4TextMoe block (in a {block})")
    return targets


def apply_expert_parallel(model: nn.Module, targets: list[tuple[str, nn.Module, ExpertsSpec]],
                          ep_group: dist.ProcessGroup | None, cp_size: int,
                          kernel: Literal["auto", "grouped", "loop"] = "auto") -> None:
    """Shard ``targets`` (from :func:`plan_expert_parallel`) over ``ep_group``, in place.

    A one-rank (or None) group keeps every expert and installs the forward all the same (its
    per-expert counts and the grouped kernel); nothing is tagged then.
    """
    size = 1 if ep_group is None else dist.get_world_size(ep_group)
    rank = 0 if ep_group is None else dist.get_rank(ep_group)
    for path, module, spec in targets:
        total = module.down_proj.shape[0]
        local = total // size
        tags = {}
        for name in (spec.up, "down_proj"):
            full = getattr(module, name)
            if size > 1:
                part = nn.Parameter(full.detach()[rank * local:(rank + 1) * local].clone(),
                                    requires_grad=full.requires_grad)
                setattr(module, name, part)
                set_grad_rule(part, GradRule.EXPERT, cp_size, shard_dim=0, shard_index=rank, parts=size)
                tags[name] = grad_tag(part)
        shard = ExpertShard(group=ep_group if size > 1 else None, size=size, rank=rank, num_experts=total,
                            spec=spec, kernel=kernel, grad_tags=tags)
        module._vlmcp_ep = shard
        if tags:
            module.placement = shard  # restore_grad_tags reads module.placement.grad_tags
        module.forward = types.MethodType(ep_experts_forward, module)
        keep_instance_forward(module)
        if spec.scaled_input:
            block = model.get_submodule(path.rsplit(".", 1)[0])
            block.forward = types.MethodType(llama4_moe_forward, block)
            keep_instance_forward(block)


def expert_shards(model: nn.Module) -> dict[str, ExpertShard]:
    """``{parameter name: its ExpertShard}`` of every expert parameter sliced over more than one EP rank."""
    out = {}
    for path, module in model.named_modules():
        shard = getattr(module, "_vlmcp_ep", None)
        if shard is None or shard.size == 1:
            continue
        clean = path.replace("_checkpoint_wrapped_module.", "")
        for name in (shard.spec.up, "down_proj"):
            out[f"{clean}.{name}" if clean else name] = shard
    return out
