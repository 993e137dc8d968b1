"""Which samples of a packed row are split over the CP group, and which are placed whole.

Note [vlmcp whole-sample placement]
-----------------------------------
Splitting a sample (zigzag text, replicated images) balances it perfectly, but every
split sample costs each rank about 2 kernel calls and a merge per ring step, sends its
K/V around the ring, and repeats its image tokens' work on every rank. For a row of
hundreds of short samples (SFT, preference data) that overhead is most of the time.
``sample_placement="whole"`` instead gives each sample to one rank::

    split:  rank 0 [ a0 a3 | b0 b3 | c0 c3 | d0 d3 ]    every sample cut in 2P chunks,
            rank 1 [ a1 a2 | b1 b2 | c1 c2 | d1 d2 ]    K/V travel, outputs merged
    whole:  rank 0 [ a a a a | d d ]                    no K/V travel, no merge, images
            rank 1 [ b b | c c c ]                      encoded for (needed by) one rank

Whole samples are balanced by cost, longest-processing-time first: take samples from
the most to the least expensive (cost = ``flops_per_pair x`` attended pairs +
``flops_per_token x`` tokens, the cost model's weights) and give each to the rank with
the least load (lowest rank on ties); LPT is within 4/3 of the best maximum. Every
rank still holds the same slot count, so the busiest rank's tokens set the row's
padding (reported by ``vlmcp bench attention`` and ``vlmcp plan``).

``sample_placement="auto"`` keeps long samples split and places short ones whole: it
tries length thresholds (samples up to the threshold go whole) -- none, all, and up
to 8 quantiles of the row's sample lengths -- builds each candidate layout and keeps
the one whose busiest rank :func:`~vlmcp.layout.cost.estimate_cost` prices lowest
(the idea of WLB-LLM and ByteScale: don't split what is cheaper to keep whole). It
reads only the row's metadata and the (configured) cost model, so every rank picks
the same placement.

Downstream: ring attention exchanges only split samples' tokens (``shard.travels``);
Ulysses computes whole samples locally for all heads; in every vision mode each rank
merges only the image rows of the tokens it holds, so a whole sample's images are
used by its owner alone (``replicate``/``allreduce_hook`` still encode every image on
every rank; ``scatter`` encodes each image once, on the rank ``assign_images`` picks).
"""

from __future__ import annotations

from typing import Literal

import torch

__all__ = ["SamplePlacement", "lpt_assign", "sample_costs"]

SamplePlacement = Literal["split", "whole", "auto"]


def sample_costs(images, cu: torch.Tensor, flops_per_pair: float, flops_per_token: float,
                 image_attention: str = "causal") -> torch.Tensor:
    """``DoubleTensor[S]``: the cost of computing each sample whole on one rank (one layer)."""
    keys = images.keys_per_query(image_attention)
    S = cu.numel() - 1
    pairs = torch.zeros(S, dtype=torch.float64).index_add_(0, images.sample_ids, keys.double())
    return flops_per_pair * pairs + flops_per_token * (cu[1:] - cu[:-1]).double()


def lpt_assign(costs: torch.Tensor, cp_size: int) -> torch.Tensor:
    """``LongTensor[S]``: each sample's rank, greedy largest-first onto the least-loaded rank."""
    load = [0.0] * cp_size
    owner = torch.empty(costs.numel(), dtype=torch.long)
    # stable: equal costs keep row order, so every rank computes the same assignment
    for i in sorted(range(costs.numel()), key=lambda i: -float(costs[i])):
        r = min(range(cp_size), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += float(costs[i])
    return owner


def auto_thresholds(seqlens: torch.Tensor) -> list[int]:
    """Candidate length thresholds for ``"auto"``: -1 (split all), quantiles, the longest (all whole)."""
    qs = torch.quantile(seqlens.double(), torch.linspace(0.0, 1.0, 9, dtype=torch.float64))
    return sorted({-1, int(seqlens.max()), *(int(q) for q in qs)})
