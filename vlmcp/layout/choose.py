"""``plan_cp``: validate a row, build its layout, or let the cost model choose one.

This module sits above both the layouts (:mod:`vlmcp.layout.plan`) and their prices
(:mod:`vlmcp.layout.cost`), so neither imports the other's chooser.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal, get_args

import torch

from vlmcp.layout.cost import CostEstimate, CostModel, estimate_cost
from vlmcp.layout.images import row_images
from vlmcp.layout.plan import CPPlan, ImageStrategy, build_plan
from vlmcp.layout.validate import check_cp_size, check_cu_seqlens, check_is_image

__all__ = ["choose_image_strategy", "choose_plan", "plan_cp"]


def plan_cp(
    is_image: torch.Tensor,
    cp_size: int,
    cu_seqlens: torch.Tensor | None = None,
    image_strategy: ImageStrategy | Literal["auto"] = "replicate",
    cost_model: CostModel | None = None,
    image_ids: torch.Tensor | None = None,
) -> CPPlan:
    """Plan how a (packed) multimodal row is laid out over a CP group.

    See Note [vlmcp layout: replicated images anywhere, per-sample zigzag text].

    Args:
        is_image: ``BoolTensor[L]``, True at image tokens, anywhere in a sample (text
            before, between and after images; several images; a video run).
        cp_size: P >= 1.
        cu_seqlens: ``IntTensor[S+1]`` sample boundaries, or None for one sample.
        image_strategy: ``"replicate"`` keeps image tokens whole on every rank and
            zigzags only text; ``"shard"`` zigzags the merged sample; ``"auto"`` plans
            both and returns the one whose busiest rank ``cost_model`` prices lower
            (ties, and P = 1, give ``"replicate"``). The decision reads only this
            metadata, so every rank that passes the same row gets the same plan.
        cost_model: the :class:`~vlmcp.layout.cost.CostModel` for ``"auto"``
            (default ``CostModel()``); only valid with ``"auto"``. It must be the same on
            every rank (built from configuration), or ranks may pick different layouts.
        image_ids: optional ``LongTensor[L]``: each image token's image index (images
            numbered 0, 1, ... in row order, each one contiguous, within one sample),
            ``-1`` at text. None: every maximal run of image tokens in a sample is one
            image, so two images placed back to back need ``image_ids``.

    Returns:
        A :class:`CPPlan`; ``plan.for_rank(r)`` gives rank r's :class:`RankShard`.
        ``plan.image_strategy`` is the layout built (under ``"auto"``, the one chosen)
        and ``plan.cost_estimates`` holds the estimates it was chosen by.

    Raises:
        TypeError, ValueError: for malformed input (the message names the bad value),
            before anything is planned.
    """
    check_is_image(is_image)
    check_cp_size(cp_size)
    choices = (*get_args(ImageStrategy), "auto")
    if image_strategy not in choices:
        raise ValueError(f"image_strategy must be one of {choices}, got {image_strategy!r}")
    if cost_model is not None and image_strategy != "auto":
        raise ValueError(
            f"cost_model is only used by image_strategy='auto', got image_strategy={image_strategy!r}")
    is_image = is_image.detach().cpu()
    cu = check_cu_seqlens(cu_seqlens, is_image.numel())
    images = row_images(is_image, cu, image_ids)
    if image_strategy == "auto":
        candidates = [build_plan(cu, is_image, images, cp_size, s) for s in get_args(ImageStrategy)]
        return choose_plan(candidates, cost_model)
    return build_plan(cu, is_image, images, cp_size, image_strategy)


def choose_plan(candidates: Sequence[CPPlan], cost_model: CostModel | None = None) -> CPPlan:
    """The candidate layout of one row whose busiest rank costs least.

    A layout within ``max_local_tokens`` beats one over it; otherwise the lower cost
    wins and a tie goes to the earlier candidate (``plan_cp`` passes ``replicate``
    first: the seed's layout). At P = 1 both layouts hold every token, so the first
    is returned. The result carries every candidate's estimate in ``cost_estimates``.
    """
    if not candidates:
        raise ValueError("choose_plan needs at least one candidate plan")
    first = candidates[0]
    for plan in candidates[1:]:
        if plan.cp_size != first.cp_size or not torch.equal(plan.cu_seqlens, first.cu_seqlens):
            raise ValueError("choose_plan's candidates must plan the same row for the same cp_size")
    estimates = tuple(estimate_cost(plan, cost_model) for plan in candidates)
    best = 0
    if first.cp_size > 1:
        best = min(range(len(candidates)), key=lambda i: (not estimates[i].fits, estimates[i].cost))
    return dataclasses.replace(candidates[best], cost_estimates=estimates)


def choose_image_strategy(
    is_image: torch.Tensor,
    cp_size: int,
    cu_seqlens: torch.Tensor | None = None,
    cost_model: CostModel | None = None,
    image_ids: torch.Tensor | None = None,
) -> tuple[ImageStrategy, dict[str, CostEstimate]]:
    """What ``plan_cp(..., image_strategy="auto")`` picks for this row, and why.

    Args:
        is_image, cp_size, cu_seqlens, image_ids: as for :func:`plan_cp`.
        cost_model: the weights (default ``CostModel()``).

    Returns:
        ``(strategy, estimates)``: ``"replicate"`` or ``"shard"``, and the
        :class:`~vlmcp.layout.cost.CostEstimate` of each layout keyed by its name.
    """
    plan = plan_cp(is_image, cp_size, cu_seqlens, image_strategy="auto", cost_model=cost_model,
                   image_ids=image_ids)
    return plan.image_strategy, {e.image_strategy: e for e in plan.cost_estimates}
