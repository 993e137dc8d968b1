"""Module-level functions run on spawned ranks (they must be importable by name)."""

import os
import time

import torch
import torch.distributed as dist

import vlmcp


def report_rank(group):
    t = torch.tensor([dist.get_rank(group)])
    dist.all_reduce(t, group=group)
    return dist.get_rank(group), dist.get_world_size(group), int(t)


def raise_on_rank_one(group):
    if dist.get_rank(group) == 1:
        raise ValueError("boom on purpose")
    dist.barrier(group=group)  # rank 0 waits here until killed


def hang_forever(group):
    time.sleep(600)


def die_on_rank_zero(group):
    if dist.get_rank(group) == 0:
        os._exit(3)
    dist.barrier(group=group)


def unshard_round_trip(group, cases):
    """shard -> unshard is the identity, for every case, inside one spawned group."""
    rank, P = dist.get_rank(group), dist.get_world_size(group)
    checked = 0
    for samples, strategy in cases:
        is_image = torch.cat([torch.cat([torch.ones(i, dtype=torch.bool), torch.zeros(t, dtype=torch.bool)])
                              for i, t in samples])
        cu = torch.tensor([0] + [i + t for i, t in samples]).cumsum(0)
        L = is_image.numel()
        plan = vlmcp.plan_cp(is_image, P, cu, image_strategy=strategy)
        shard = plan.for_rank(rank)
        g = torch.Generator().manual_seed(len(samples) * 1000 + L)
        for x, dim in ((torch.randn(L, 5, generator=g, dtype=torch.float64), 0),
                       (torch.randint(0, 100, (3, L), generator=g), 1)):
            back = vlmcp.unshard(shard.shard(x, dim=dim), shard, group, dim=dim)
            assert torch.equal(back, x), (samples, strategy, dim)
            checked += 1
    return checked
