"""Step 2 of the data flow: the complete image embeddings on every rank of a CP group.

Note [vlmcp vision placement modes]
-----------------------------------
``place_vision(encoder, mode=..., group=cp_group)`` fixes once how a
:class:`VisionEncoder`'s work is spread over the CP group, and tags every vision
parameter with its gradient rule (Note [vlmcp gradient rules]); afterwards
``encoder(images)`` returns ``(sum of tokens, out_dim)`` on every rank::

    mode            who runs ViT + projector        forward -> backward (dual)
    replicate       every rank, all images          - -> -                      (SHARE)
    broadcast       rank src, all images            broadcast -> reduce-sum     (SHARE)
    scatter         rank r, the images it owns      all-gather rows ->          (SHARE)
                    (assign_images, patches^2)      reduce-scatter rows
    hidden_shard    every rank up to fc2; fc2 keeps all-gather on hidden ->     (ViT SHARE,
                    its own out_dim/P columns       reduce-scatter on hidden     fc2 PARTITIONED)
    allreduce_hook  every rank, all images          - -> all-reduce of the      (FULL)
                                                    embedding gradient (hook)

Every rank joins every collective, including a rank that encodes no image in
``scatter`` (its empty part stays attached to the projector) and the ranks that
only receive in ``broadcast`` (their placeholder requires grad exactly when the
source's output does). A batch without images communicates nothing; every rank
knows that from the (identical) image list. Every rank must backpropagate through
the returned tensor (use it in its graph even if it selects no row of it),
because the backward runs the dual collective.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Literal, get_args

import torch
import torch.distributed as dist
from torch import nn

from vlmcp.comm import all_gather, broadcast
from vlmcp.grads import GradRule, grad_tag, set_grad_rule
from vlmcp.vision.assign import assign_images, vit_cost
from vlmcp.vision.tower import VisionEncoder

__all__ = ["VisionMode", "VisionPlacement", "place_vision"]

VisionMode = Literal["replicate", "broadcast", "scatter", "hidden_shard", "allreduce_hook"]


@dataclass(frozen=True, kw_only=True, eq=False)
class VisionPlacement:
    """How a placed encoder spreads its work; see Note [vlmcp vision placement modes]."""

    mode: VisionMode
    """One of ``replicate``, ``broadcast``, ``scatter``, ``hidden_shard``, ``allreduce_hook``."""
    group: dist.ProcessGroup
    """The CP group; every rank of it gets the complete embeddings."""
    src: int = 0
    """``broadcast`` only: the rank (within ``group``) that runs the encoder."""
    grad_tags: Mapping = field(default_factory=lambda: MappingProxyType({}))
    """Parameter name (within the encoder) -> gradient tag, set by :func:`place_vision`.

    :func:`vlmcp.grads.reduce_gradients` re-applies these to the parameters before
    every reduction, so a rule survives parameters being re-created after placement
    (``deepcopy``, ``.to()`` with ``overwrite_module_params_on_conversion``)."""

    def __deepcopy__(self, memo):
        return self  # frozen, read-only tags; a copied model shares the CP group (not copyable)

    def __post_init__(self):
        if self.mode not in get_args(VisionMode):
            raise ValueError(f"vision mode must be one of {get_args(VisionMode)}, got {self.mode!r}")
        world = dist.get_world_size(self.group)
        if isinstance(self.src, bool) or not isinstance(self.src, int) or not 0 <= self.src < world:
            raise ValueError(f"src must be a rank of the CP group, an int in [0, {world}), got {self.src!r}")

    def embed(
        self, encoder: VisionEncoder, images: Sequence[torch.Tensor], tokens: list[int]
    ) -> torch.Tensor:
        """The complete embeddings ``(sum(tokens), out_dim)`` on every rank (called by the encoder)."""
        if sum(tokens) == 0:  # no image anywhere: every rank sees the same empty list
            return encoder.projector.fc2.weight.new_zeros(0, encoder.out_dim)
        return getattr(self, f"_{self.mode}")(encoder, images, tokens)

    def _replicate(self, encoder, images, tokens):
        return encoder.encode(images)

    def _allreduce_hook(self, encoder, images, tokens):
        emb = encoder.encode(images)
        if emb.requires_grad:
            # The seed's recipe: sum the ranks' embedding gradients before the projector's
            # backward; the vision parameters then hold FULL gradients on every rank.
            emb.register_hook(self._sum_gradient)
        return emb

    def _sum_gradient(self, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()  # never reduce in place into a gradient autograd may still hold
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=self.group)
        return grad

    def _broadcast(self, encoder, images, tokens):
        if dist.get_rank(self.group) == self.src:
            x = encoder.encode(images)
        else:
            w = encoder.projector.fc2.weight
            # Same requires_grad as the source's output, so every rank runs the reduce.
            x = w.new_empty(sum(tokens), encoder.out_dim).requires_grad_(_needs_grad(encoder))
        return broadcast(x, self.src, self.group)

    def _scatter(self, encoder, images, tokens):
        world, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        owner = assign_images([vit_cost(t) for t in tokens], world)
        mine = [i for i in range(len(images)) if owner[i] == rank]
        rows = [sum(t for t, o in zip(tokens, owner, strict=True) if o == r) for r in range(world)]
        local = encoder.encode([images[i] for i in mine])  # (rows[rank], out_dim), maybe 0 rows
        if _needs_grad(encoder) and not local.requires_grad:  # no image here and a frozen projector
            local = local.detach().requires_grad_()
        gathered = all_gather(local, self.group, dim=0, sizes=rows)  # rank-major
        # Back to image order: image i's rows start after every earlier rank's rows and
        # after the images its owner encoded before it.
        start, seen = [0] * len(images), [sum(rows[:r]) for r in range(world)]
        for i, o in enumerate(owner):
            start[i], seen[o] = seen[o], seen[o] + tokens[i]
        order = torch.cat([torch.arange(s, s + t) for s, t in zip(start, tokens, strict=True)])
        return gathered.index_select(0, order.to(gathered.device))

    def _hidden_shard(self, encoder, images, tokens):
        local = encoder.encode(images)  # (N, out_dim / P): fc2 holds this rank's columns
        return all_gather(local, self.group, dim=1)


def _needs_grad(encoder: VisionEncoder) -> bool:
    """Whether an encoder output requires grad: the same answer on every rank (metadata)."""
    return torch.is_grad_enabled() and any(p.requires_grad for p in encoder.parameters())


def place_vision(
    encoder: VisionEncoder,
    *,
    mode: VisionMode,
    group: dist.ProcessGroup,
    src: int = 0,
) -> VisionEncoder:
    """Place ``encoder`` on the CP group ``group`` (in place) and tag its parameters.

    Call it once, on every rank, after building (and identically initializing) the
    encoder and before building the optimizer: ``hidden_shard`` replaces
    ``projector.fc2`` with this rank's slice of output columns.

    Args:
        encoder: a :class:`VisionEncoder`, not placed yet.
        mode: see Note [vlmcp vision placement modes].
        group: the CP group.
        src: ``broadcast`` only, the rank within ``group`` that runs the encoder.

    Returns:
        ``encoder``; ``encoder(images)`` now returns the complete embeddings on every rank.

    Raises:
        ValueError: unknown mode, ``src`` outside the group, ``hidden_shard`` with an
            ``out_dim`` not divisible by P, or an encoder placed already (no
            communication happens before these checks).
    """
    if not isinstance(encoder, VisionEncoder):
        raise TypeError(f"place_vision expects a VisionEncoder, got {type(encoder).__name__}")
    if encoder.placement is not None:
        raise ValueError(f"this encoder is placed already (mode={encoder.placement.mode!r})")
    placement = VisionPlacement(mode=mode, group=group, src=src)  # validates mode and src
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if mode == "hidden_shard" and encoder.out_dim % world:
        raise ValueError(
            f"hidden_shard splits the projector output (out_dim={encoder.out_dim}) over the CP "
            f"group, but {encoder.out_dim} is not divisible by P={world}")
    rule = GradRule.FULL if mode == "allreduce_hook" else GradRule.SHARE
    for p in encoder.parameters():
        set_grad_rule(p, rule, world)
    if mode == "hidden_shard":
        encoder.projector.fc2 = _column_slice(encoder.projector.fc2, rank, world)
    tags = MappingProxyType({n: grad_tag(p) for n, p in encoder.named_parameters()})
    encoder.placement = replace(placement, grad_tags=tags)
    return encoder


def _column_slice(fc: nn.Linear, rank: int, world: int) -> nn.Linear:
    """This rank's ``out_features / world`` output columns of ``fc``, tagged PARTITIONED."""
    n = fc.out_features // world
    part = nn.Linear(fc.in_features, n, bias=fc.bias is not None, device=fc.weight.device,
                     dtype=fc.weight.dtype)
    with torch.no_grad():
        part.weight.copy_(fc.weight[rank * n:(rank + 1) * n])
        if fc.bias is not None:
            part.bias.copy_(fc.bias[rank * n:(rank + 1) * n])
    for p in part.parameters():
        set_grad_rule(p, GradRule.PARTITIONED, world, shard_dim=0, shard_index=rank)
    return part
