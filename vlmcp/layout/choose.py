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
from vlmcp.layout.sample_placement import SamplePlacement, auto_thresholds, lpt_assign, sample_costs
from vlmcp.layout.validate import check_cp_size, check_cu_seqlens, check_is_image

__all__ = ["choose_image_strategy", "choose_plan", "plan_cp"]


def plan_cp(
    is_image: torch.Tensor,
    cp_size: int,
    cu_seqlens: torch.Tensor | None = None,
    image_strategy: ImageStrategy | Literal["auto"] = "replicate",
    cost_model: CostModel | None = None,
    image_ids: torch.Tensor | None = None,
    sample_placement: SamplePlacement = "split",
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
        cost_model: the :class:`~vlmcp.layout.cost.CostModel` behind ``image_strategy=
            "auto"`` and ``sample_placement="whole"``/``"auto"`` (default ``CostModel()``);
            not valid otherwise. It must be the same on every rank (built from
            configuration), or ranks may pick different layouts.
        image_ids: optional ``LongTensor[L]``: each image token's image index (images
            numbered 0, 1, ... in row order, each one contiguous, within one sample),
            ``-1`` at text. None: every maximal run of image tokens in a sample is one
            image, so two images placed back to back need ``image_ids``.
        sample_placement: ``"split"`` (every sample zigzagged: megatron-core's / TE's
            order), ``"whole"`` (every sample on one rank, balanced by cost) or ``"auto"``
            (short samples whole, long ones split, the threshold chosen per row by the
            cost model). See Note [vlmcp whole-sample placement].

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
    placements = get_args(SamplePlacement)
    if sample_placement not in placements:
        raise ValueError(f"sample_placement must be one of {placements}, got {sample_placement!r}")
    if cost_model is not None and image_strategy != "auto" and sample_placement == "split":
        raise ValueError(
            "cost_model is only used by image_strategy='auto' or sample_placement='whole'/'auto', got "
            f"image_strategy={image_strategy!r}, sample_placement={sample_placement!r}")
    if cost_model is not None and not isinstance(cost_model, CostModel):
        raise TypeError(f"cost_model must be a CostModel, got {type(cost_model).__name__}")
    is_image = is_image.detach().cpu()
    cu = check_cu_seqlens(cu_seqlens, is_image.numel())
    images = row_images(is_image, cu, image_ids)
    build = lambda strategy, whole: build_plan(cu, is_image, images, cp_size, strategy, whole)  # noqa: E731
    whole = _place_samples(cu, is_image, images, cp_size, image_strategy, sample_placement,
                           cost_model or CostModel(), build)
    if image_strategy == "auto":
        return choose_plan([build(s, whole) for s in get_args(ImageStrategy)], cost_model)
    return build(image_strategy, whole)


def _place_samples(cu, is_image, images, cp_size, image_strategy, sample_placement, model, build):
    """``LongTensor[S]`` of whole-sample ranks (-1: split), or None to split every sample."""
    if sample_placement == "split" or cp_size == 1:
        return None
    costs = sample_costs(images, cu, model.flops_per_pair, model.flops_per_token, model.image_attention)
    if sample_placement == "whole":
        return lpt_assign(costs, cp_size)
    seqlens = cu[1:] - cu[:-1]
    strategy = "replicate" if image_strategy == "auto" else image_strategy
    best = None
    for threshold in auto_thresholds(seqlens):  # ascending: a tie keeps more samples split
        short = seqlens <= threshold
        whole = torch.full_like(seqlens, -1)
        whole[short] = lpt_assign(costs[short], cp_size)
        cost = estimate_cost(build(strategy, whole), model).cost
        if best is None or cost < best[0]:
            best = (cost, whole)
    return best[1] if bool((best[1] >= 0).any()) else None


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
