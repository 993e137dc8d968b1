"""Step 6 of the data flow: turn per-rank gradient shares into exact gradients.

Note [vlmcp gradient rules]
---------------------------
After ``backward()`` on a CP rank a parameter's gradient is one of three things,
and the parameter carries which (its *rule*, set by whoever lays it out, e.g.
:func:`vlmcp.vision.place_vision`; untagged parameters are shares)::

    rule          on rank r after backward            over the CP group   over DP
    SHARE         rank r's share of the full gradient  sum                 mean
    FULL          the full gradient (same on all r)     mean                mean
    PARTITIONED   full gradient of rank r's own slice   nothing             mean
    EXPERT        its EP group's tokens' whole          nothing             sum over the
                  gradient of rank r's own experts                          expert-DP group, x 1/D

SHARE covers the LLM and the vision modes ``replicate``, ``broadcast`` (full on the
source, zero elsewhere), ``scatter`` (full for own images) and the ViT under
``hidden_shard``; FULL is ``allreduce_hook`` (its embedding gradient was already
summed, so summing the parameters again would count the vision gradient P times);
PARTITIONED is ``hidden_shard``'s slice of the projector's last layer. EXPERT is an MoE layer's
experts under expert parallelism (:mod:`vlmcp.hf.moe`): EP rank j of an EP group of E ranks holds
experts ``[j E_tot/E, (j+1) E_tot/E)`` and receives every (token, expert) pair of its EP group for
them, so after backward it holds the sum of the contributions (shares) of all the EP group's ranks.
The ranks holding the same experts in the other EP groups (the *expert-DP* group, W/E ranks of the
W = D*P world) hold the rest: their sum is the gradient of every rank's tokens, D replicas' worth,
hence the 1/D. Nothing is reduced over EP: the ranks of an EP group hold different experts.

:func:`reduce_gradients` applies the table with one flat all-reduce per dtype over
CP (FULL gradients are divided by P first, so they ride in the same buffer as the
shares), one per dtype over DP and, for EXPERT gradients, one per dtype over the
expert-DP group.

The other convention: torch DDP (or FSDP) over the whole DP x CP group averages
every gradient over D*P ranks. Scale each rank's loss by P (as Megatron does) and
SHARE parameters come out exact. FULL ones come out P times too large and
PARTITIONED and EXPERT ones must not enter DDP at all (their slices differ across ranks):
give DDP :func:`ddp_ignored_params` and call :func:`finish_ddp_gradients` after
backward, which divides FULL gradients by P, averages PARTITIONED ones over DP and
sums EXPERT ones over the expert-DP group divided by W (= D*P). Under FSDP2 the experts
are their own units over the expert-DP group whose reduce-scatter sums
(:func:`vlmcp.hf.moe.fully_shard_experts`); the division by W is left to
:func:`finish_ddp_gradients`.
Give DDP a process group of its own (``dist.new_group`` over the same ranks), never
the CP group object: DDP all-reduces buckets *during* backward, in an order that
differs between ranks whose graphs differ (``broadcast``, ``scatter``), while the
placement's dual collectives run on the CP group; one shared communicator deadlocks
(tests/test_vlm.py runs real DDP so, exact in every mode).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "GradRule", "GradTag", "ReductionReport", "ddp_ignored_params", "finish_ddp_gradients",
    "gradient_copies", "grad_norms", "grad_rule", "grad_tag", "local_part", "partition_of",
    "reduce_gradients", "restore_grad_tags", "set_grad_rule",
]


class GradRule(str, Enum):
    """What a parameter's gradient holds after backward; see Note [vlmcp gradient rules]."""

    SHARE = "share"
    FULL = "full"
    PARTITIONED = "partitioned"
    EXPERT = "expert"


_SLICED = (GradRule.PARTITIONED, GradRule.EXPERT)


class GradTag(NamedTuple):
    """A parameter's gradient rule and, for PARTITIONED and EXPERT, where its slice sits."""

    rule: GradRule
    cp_size: int
    shard_dim: int | None  # PARTITIONED, EXPERT: the split dimension of the full tensor
    shard_index: int | None  # PARTITIONED, EXPERT: which of the equal slices this is
    parts: int | None = None  # EXPERT: the EP size E (PARTITIONED: cp_size slices)

    @property
    def slices(self) -> int:
        """Into how many equal slices the full tensor was cut (1 when it was not)."""
        if self.rule is GradRule.EXPERT:
            return int(self.parts)
        return self.cp_size if self.rule is GradRule.PARTITIONED else 1


_ATTR = "_vlmcp_grad_tag"


def set_grad_rule(
    param: nn.Parameter, rule: GradRule | str, cp_size: int, shard_dim: int | None = None,
    shard_index: int | None = None, parts: int | None = None,
) -> None:
    """Tag ``param`` with its gradient rule for a CP group of ``cp_size`` ranks.

    Args:
        param: the parameter.
        rule: a :class:`GradRule`.
        cp_size: P of the CP group the layout was made for (checked by the reducers).
        shard_dim: for PARTITIONED and EXPERT, the dimension of the full tensor that was
            split into equal slices (``cp_size`` of them; EXPERT: ``parts``).
        shard_index: for PARTITIONED and EXPERT, which slice this rank holds.
        parts: for EXPERT, the EP size E (the slices of the full tensor).
    """
    rule = GradRule(rule)
    if (rule in _SLICED) != (shard_dim is not None and shard_index is not None):
        raise ValueError(f"shard_dim and shard_index are required for PARTITIONED only (and EXPERT), "
                         f"got rule={rule}")
    if (rule is GradRule.EXPERT) != (parts is not None):
        raise ValueError(f"parts is required for EXPERT only, got rule={rule}, parts={parts!r}")
    setattr(param, _ATTR, GradTag(rule, cp_size, shard_dim, shard_index, parts))


def grad_tag(param: nn.Parameter) -> GradTag | None:
    """The parameter's full tag (rule, CP size, partition), or None when untagged."""
    return getattr(param, _ATTR, None)


def restore_grad_tags(model: nn.Module) -> None:
    """Re-apply the tags that placed submodules recorded (``module.placement.grad_tags``).

    Tags live on parameter objects; re-created parameters (deepcopy, ``.to()`` with
    ``overwrite_module_params_on_conversion``) would silently fall back to SHARE, which turns
    ``allreduce_hook``'s FULL gradients into P-times gradients. The placement keeps
    them by name: the reducers and the checkpoint state (:mod:`vlmcp.train.checkpoint.state`)
    put them back first. A record with ``own_params_only`` covers the listed parameters of the
    module itself (an HF base model's LLaVA-NeXT ``image_newline``), not its submodules'.
    Call it yourself before using :func:`grad_rule`,
    :func:`partition_of` or :func:`local_part` on a copied model.
    """
    for module in model.modules():
        placement = getattr(module, "placement", None)
        tags = getattr(placement, "grad_tags", None)
        if not tags:
            continue
        own = getattr(placement, "own_params_only", False)  # a record of some of the module's own parameters
        for name, p in module.named_parameters(recurse=not own):
            if own and name not in tags:
                continue
            if name not in tags:
                raise ValueError(f"parameter {name!r} of a placed {type(module).__name__} has no "
                                 "recorded gradient rule (was the module changed after placement?)")
            setattr(p, _ATTR, tags[name])


def grad_rule(param: nn.Parameter) -> GradRule:
    """The parameter's :class:`GradRule` (SHARE when untagged)."""
    tag = getattr(param, _ATTR, None)
    return GradRule.SHARE if tag is None else tag.rule


def partition_of(param: nn.Parameter) -> tuple[int, int, int] | None:
    """``(shard_dim, shard_index, cp_size)`` of a PARTITIONED parameter, else None."""
    tag = getattr(param, _ATTR, None)
    if tag is None or tag.rule is not GradRule.PARTITIONED:
        return None
    return tag.shard_dim, tag.shard_index, tag.cp_size


def local_part(param: nn.Parameter, full: torch.Tensor) -> torch.Tensor:
    """The part of a full-size tensor (a reference weight or gradient) that ``param`` holds.

    Identity for SHARE and FULL; for PARTITIONED and EXPERT, this rank's slice. Lets a
    parity check compare a sharded parameter with the single-process model, and a
    checkpoint of full tensors load at any CP (and EP) size.
    """
    tag = getattr(param, _ATTR, None)
    if tag is None or tag.rule not in _SLICED:
        return full
    size = full.shape[tag.shard_dim] // tag.slices
    return full.narrow(tag.shard_dim, tag.shard_index * size, size)


@dataclass(frozen=True, kw_only=True)
class ReductionReport:
    """Collectives one reduction issued (for tests and logs)."""

    cp_collectives: int
    """All-reduces over the CP group (one per dtype)."""
    cp_bytes: int
    """Bytes in those buffers."""
    dp_collectives: int
    """All-reduces over the DP group (one per dtype)."""
    dp_bytes: int
    """Bytes in those buffers."""
    expert_collectives: int = 0
    """All-reduces of EXPERT gradients over the expert-DP group (one per dtype)."""
    expert_bytes: int = 0
    """Bytes in those buffers."""


def _cp_size(cp_group: dist.ProcessGroup | None) -> int:
    # None is one process, as in cp_attention and cp_cross_entropy; never the global group,
    # which would silently sum over data-parallel replicas too
    return 1 if cp_group is None else dist.get_world_size(cp_group)


def _trainable(model: nn.Module, cp_size: int) -> list[nn.Parameter]:
    names = {p: n for n, p in model.named_parameters()}
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        tag = getattr(p, _ATTR, None)
        if tag is not None and tag.cp_size != cp_size:
            raise ValueError(
                f"parameter {names[p]!r} was laid out for a CP group of {tag.cp_size} "
                f"ranks, but the CP group passed has {cp_size}")
        if p.grad is not None and p.grad.is_sparse:
            raise NotImplementedError("sparse gradients are not supported")
    return params


def _all_reduce_flat(params: list[nn.Parameter], group, scale: float) -> tuple[int, int]:
    """Sum the gradients of ``params`` over ``group`` (one buffer per dtype), then scale.

    Every rank must put the same buffers into the collective, whether or not its graph
    reached a parameter (``broadcast``: off the source), so a missing gradient enters
    as zeros. One extra element per parameter carries "this rank has a gradient";
    a parameter no rank has a gradient for keeps ``grad=None`` afterwards, as in a
    single process (AdamW skips it instead of decaying it). 16-bit gradients are
    summed in float32 (Megatron's practice: bf16 sums lose low bits as P grows).
    """
    buckets: dict[tuple, list[nn.Parameter]] = defaultdict(list)
    for p in params:
        buckets[(p.dtype, p.device)].append(p)
    nbytes = 0
    for (dtype, _), bucket in buckets.items():
        acc = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
        grads = [p.grad.reshape(-1) if p.grad is not None else p.new_zeros(p.numel()) for p in bucket]
        present = [p.new_ones(1) if p.grad is not None else p.new_zeros(1) for p in bucket]
        flat = torch.cat(grads + present).to(acc)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        sizes = [p.numel() for p in bucket]
        parts = torch.split(flat[: sum(sizes)], sizes)
        anyone = flat[sum(sizes):] > 0
        for p, g, has in zip(bucket, parts, anyone.tolist(), strict=True):
            if not has:
                p.grad = None
                continue
            g = g.view_as(p) * scale if scale != 1.0 else g.view_as(p)
            if p.grad is None:
                p.grad = g.to(dtype).clone()
            else:
                p.grad.copy_(g)
        nbytes += flat.numel() * flat.element_size()
    return len(buckets), nbytes


def _expert_dp(params: list[nn.Parameter], names: dict, world: int,
               expert_dp_group: dist.ProcessGroup | None) -> int:
    """The expert-DP size W/E the EXPERT parameters need, checked against ``expert_dp_group``."""
    sizes = {grad_tag(p).parts for p in params}
    if len(sizes) != 1 or world % next(iter(sizes)):
        raise ValueError(f"EXPERT parameters were laid out for EP sizes {sorted(sizes)}, which must be one "
                         f"size dividing the world of {world} ranks (CP x DP)")
    need = world // next(iter(sizes))
    have = 1 if expert_dp_group is None else dist.get_world_size(expert_dp_group)
    if have != need:
        first = next(n for p, n in names.items() if p in set(params))
        raise ValueError(f"EXPERT parameters ({first!r}, ...) need their expert-DP group of {need} ranks "
                         f"(world {world} / EP {next(iter(sizes))}); got "
                         f"{'none' if expert_dp_group is None else f'a group of {have}'}: pass "
                         "expert_dp_group from vlmcp.hf.moe.expert_groups")
    return need


def _reduce_experts(experts: list[nn.Parameter], edp: int, expert_dp_group: dist.ProcessGroup | None,
                    scale: float) -> tuple[int, int]:
    """Sum EXPERT gradients over the expert-DP group of ``edp`` ranks, then scale (no communication
    when it has one rank)."""
    if not experts:
        return 0, 0
    if edp > 1:
        return _all_reduce_flat(experts, expert_dp_group, scale)
    for p in experts:
        if p.grad is not None and scale != 1.0:
            p.grad.mul_(scale)
    return 0, 0


def reduce_gradients(
    model: nn.Module, cp_group: dist.ProcessGroup | None, dp_group: dist.ProcessGroup | None = None, *,
    expert_dp_group: dist.ProcessGroup | None = None,
) -> ReductionReport:
    """Make every gradient of ``model`` exact: each rule's CP reduction, then the DP mean.

    Call it after ``backward()`` of the loss from :func:`vlmcp.cp_cross_entropy`
    (local token losses over the CP group's target count), on every rank of the
    DP x CP grid. A parameter without a gradient on this rank counts as zero if
    another rank has one; a parameter no rank has a gradient for keeps ``grad=None``.

    Args:
        model: the module whose ``requires_grad`` parameters are reduced (same
            parameters, in the same order, on every rank).
        cp_group: the CP group the layout was planned for; None for no CP (one rank
            per replica; never the global group).
        dp_group: the ranks holding the same CP rank in other data-parallel replicas,
            or None.
        expert_dp_group: with expert parallelism (EXPERT parameters), the ranks holding
            the same experts in the other EP groups (:func:`vlmcp.hf.moe.expert_groups`);
            None only where the EP group is the whole world.

    Returns:
        A :class:`ReductionReport`. Afterwards SHARE and FULL gradients equal the full
        gradient of the DP-mean loss on every CP rank; PARTITIONED and EXPERT ones equal
        the full gradient of this rank's slice.
    """
    cp_size = _cp_size(cp_group)
    dp_size = 1 if dp_group is None else dist.get_world_size(dp_group)
    restore_grad_tags(model)
    params = _trainable(model, cp_size)
    names = {p: n for n, p in model.named_parameters()}
    experts = [p for p in params if grad_rule(p) is GradRule.EXPERT]
    edp = _expert_dp(experts, names, cp_size * dp_size, expert_dp_group) if experts else 1  # before any comm
    dense = [p for p in params if grad_rule(p) is not GradRule.EXPERT]
    cp = [p for p in dense if grad_rule(p) is not GradRule.PARTITIONED]
    cp_n = cp_bytes = dp_n = dp_bytes = 0
    if cp_size > 1 and cp:
        for p in cp:
            if grad_rule(p) is GradRule.FULL and p.grad is not None:
                p.grad.div_(cp_size)  # the sum over CP of FULL/P is their mean
        cp_n, cp_bytes = _all_reduce_flat(cp, cp_group, 1.0)
    if dp_size > 1 and dense:
        dp_n, dp_bytes = _all_reduce_flat(dense, dp_group, 1.0 / dp_size)
    ex_n, ex_bytes = _reduce_experts(experts, edp, expert_dp_group, 1.0 / dp_size)
    return ReductionReport(cp_collectives=cp_n, cp_bytes=cp_bytes, dp_collectives=dp_n, dp_bytes=dp_bytes,
                           expert_collectives=ex_n, expert_bytes=ex_bytes)


def ddp_ignored_params(model: nn.Module) -> list[str]:
    """Names of the parameters torch DDP (or FSDP) over the DP x CP group must not touch.

    They are PARTITIONED (their slice differs across CP ranks) and EXPERT (each EP rank
    holds other experts under the same name). Pass the list to
    ``DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)``
    before wrapping (FSDP2: ``ignored_params`` of every unit over the world), and let
    :func:`finish_ddp_gradients` reduce them.
    """
    restore_grad_tags(model)
    return [n for n, p in model.named_parameters() if grad_rule(p) in _SLICED]


def _is_dtensor(t) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def _fsdp_experts(model: nn.Module, world: int) -> set[nn.Parameter]:
    """Parameters of the experts units :func:`vlmcp.hf.moe.fully_shard_experts` made for ``world`` ranks."""
    return {p for m in model.modules() if getattr(m, "_vlmcp_fsdp_experts", None) == world
            for p in m.parameters()}


def finish_ddp_gradients(
    model: nn.Module, cp_group: dist.ProcessGroup | None, dp_group: dist.ProcessGroup | None = None, *,
    expert_dp_group: dist.ProcessGroup | None = None,
) -> ReductionReport:
    """Complete the gradients after DDP averaged them over DP x CP with the loss scaled by P.

    See Note [vlmcp gradient rules]. SHARE gradients are already exact; FULL ones are
    divided by P; PARTITIONED ones (ignored by DDP) are averaged over ``dp_group`` and
    divided by P, in one all-reduce per dtype; EXPERT ones (ignored by DDP) are summed over
    ``expert_dp_group`` and divided by W = D*P (under FSDP2, :func:`vlmcp.hf.moe.fully_shard_experts`
    makes FSDP's reduce-scatter that sum; they are then divided by W here, without communication).

    Args:
        model: the module wrapped by DDP (its ``requires_grad`` parameters).
        cp_group: the CP group (only its size is used; nothing is sent over it), or None.
        dp_group: the DP group of this CP rank, or None.
        expert_dp_group: with expert parallelism, as for :func:`reduce_gradients`.

    Returns:
        A :class:`ReductionReport` (DP and expert-DP collectives only).

    Raises:
        ValueError: an EXPERT parameter FSDP-sharded other than by ``fully_shard_experts``
            (over the world, say: it would mix different ranks' experts).
    """
    cp_size = _cp_size(cp_group)
    dp_size = 1 if dp_group is None else dist.get_world_size(dp_group)
    world = cp_size * dp_size
    restore_grad_tags(model)
    params = _trainable(model, cp_size)
    names = {p: n for n, p in model.named_parameters()}
    sharded = _fsdp_experts(model, world)
    experts = [p for p in params if grad_rule(p) is GradRule.EXPERT]
    for p in experts:
        if _is_dtensor(p) and p not in sharded:
            raise ValueError(f"EXPERT parameter {names[p]!r} is FSDP-sharded, but not by "
                             f"vlmcp.hf.moe.fully_shard_experts for a world of {world} ranks: its gradient "
                             "would mix different ranks' experts or be averaged instead of summed")
    plain = [p for p in experts if not _is_dtensor(p)]
    edp = _expert_dp(plain, names, world, expert_dp_group) if plain else 1  # before anything changes
    for p in params:
        if grad_rule(p) is GradRule.FULL and p.grad is not None:
            p.grad.div_(cp_size)
        elif p in sharded and p.grad is not None:
            p.grad.mul_(1.0 / world)  # FSDP summed it over the expert-DP group
    ex_n, ex_bytes = _reduce_experts(plain, edp, expert_dp_group, 1.0 / world)
    parts = [p for p in params if grad_rule(p) is GradRule.PARTITIONED]
    dp_n = dp_bytes = 0
    if dp_size > 1 and parts:
        dp_n, dp_bytes = _all_reduce_flat(parts, dp_group, 1.0 / (dp_size * cp_size))
    else:
        for p in parts:
            if p.grad is not None:
                p.grad.div_(cp_size)
    return ReductionReport(cp_collectives=0, cp_bytes=0, dp_collectives=dp_n, dp_bytes=dp_bytes,
                           expert_collectives=ex_n, expert_bytes=ex_bytes)


def gradient_copies(param: nn.Parameter, cp_size: int, dp_size: int = 1) -> int:
    """On how many ranks of the D x P world the same reduced gradient of ``param`` sits.

    Divide the squared norm of each rank's gradient by it and sum over the world, and every
    value of the exact gradient counts once: W = D*P for SHARE and FULL, D for a
    PARTITIONED slice, W/E for an EXPERT slice (its expert-DP group), 1 for an FSDP shard
    (a DTensor, over the world or, for experts, over the expert-DP group).
    """
    if _is_dtensor(param) or _is_dtensor(param.grad):
        return 1
    tag = grad_tag(param)
    rule = GradRule.SHARE if tag is None else tag.rule
    if rule is GradRule.PARTITIONED:
        return dp_size
    if rule is GradRule.EXPERT:
        return cp_size * dp_size // tag.parts
    return cp_size * dp_size


def grad_norms(
    parts: dict[str, list[nn.Parameter]], cp_group: dist.ProcessGroup | None,
    dp_group: dist.ProcessGroup | None = None,
) -> dict[str, float]:
    """L2 norm of the exact gradient of each named group of parameters (after reduction).

    SHARE and FULL gradients are identical on every rank after :func:`reduce_gradients`;
    PARTITIONED ones hold different slices on the CP ranks of a replica, EXPERT ones
    different experts across each EP group: each rank's squares are divided by
    :func:`gradient_copies` and summed over the CP group, then over the DP group (one
    all-reduce each), so every value counts once.

    Returns:
        ``{name: norm}``, identical on every rank.
    """
    cp_size = 1 if cp_group is None else dist.get_world_size(cp_group)
    dp_size = 1 if dp_group is None else dist.get_world_size(dp_group)
    sq = torch.zeros(len(parts), dtype=torch.float64)
    for i, params in enumerate(parts.values()):
        for p in params:
            if p.grad is not None:
                g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                sq[i] += g.detach().double().pow(2).sum().cpu() / gradient_copies(p, cp_size, dp_size)
    # the parameters' device is the group's (NCCL: CUDA), even when no gradient exists
    dev = next((p.device for ps in parts.values() for p in ps), torch.device("cpu"))
    for group, size in ((cp_group, cp_size), (dp_group, dp_size)):
        if size > 1:
            sq_dev = sq.to(dev)
            dist.all_reduce(sq_dev, group=group)
            sq = sq_dev.cpu()
    return {name: float(sq[i]) ** 0.5 for i, name in enumerate(parts)}
