"""Step 2 of the data flow: the complete image embeddings on every rank of a CP group.

``place_vision(encoder, mode=..., group=cp_group)`` fixes once how a :class:`VisionEncoder`'s
work is spread over the CP group, and tags every vision parameter with its gradient rule
(Note [vlmcp gradient rules]); afterwards ``encoder(images)`` returns ``(sum of tokens,
out_dim)`` on every rank. The modes themselves, their collectives and duals, are
:mod:`vlmcp.vision.modes` (Note [vlmcp vision placement modes]); an image is one unit. A batch
without images communicates nothing; every rank knows that from the (identical) image list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import get_args

import torch
import torch.distributed as dist

from vlmcp.grads import grad_tag, set_grad_rule
from vlmcp.vision.modes import VisionMode, column_slice, mode_rule, needs_grad, placed_features
from vlmcp.vision.tower import VisionEncoder

__all__ = ["VisionMode", "VisionPlacement", "place_vision"]

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
        w = encoder.projector.fc2.weight
        if sum(tokens) == 0:  # no image anywhere: every rank sees the same empty list
            return w.new_zeros(0, encoder.out_dim)

        def run(index):
            return encoder.encode(images if index is None else [images[i] for i in index])

        return placed_features(self.mode, self.group, tokens, run,
                               lambda rows: w.new_empty(rows, encoder.out_dim), src=self.src,
                               requires_grad=needs_grad(encoder))


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
    rule = mode_rule(mode)
    for p in encoder.parameters():
        set_grad_rule(p, rule, world)
    if mode == "hidden_shard":
        encoder.projector.fc2 = column_slice(encoder.projector.fc2, rank, world)
    tags = MappingProxyType({n: grad_tag(p) for n, p in encoder.named_parameters()})
    encoder.placement = replace(placement, grad_tags=tags)
    return encoder

