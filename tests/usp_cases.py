"""Rank functions of the USP tests (module level: spawned ranks import them by name).

:func:`usp_grid` runs everything a world size needs in one spawned group: the parity
grid (:func:`tests.attention_cases.run_case` with ``backend="usp"``), the logged
messages of each communication case next to those of ring (U = 1) or Ulysses (U = P),
bad calls, a few VLM training steps against one process, and subgroups in a DP x CP job.
"""

from __future__ import annotations

import torch.distributed as dist

import vlmcp
from tests.attention_cases import CommLog, make_row, parity_grid, run_case
from vlmcp.attention import cp_attention, usp_groups
from vlmcp.attention.exchange import exchange_of
from vlmcp.attention.usp import _leading
from vlmcp.debug.parity.vlm import ParityCase, parity_case
from vlmcp.train.groups import dp_cp_groups

HEAD_DIM = 8


def usp_messages(group, samples, strategy, image_attention, heads, kv_heads, ulysses_size, placement="split"):
    """Forward and backward messages of one bf16 USP call, and the same for the backend it equals.

    Returns ``{"usp": (fwd, bwd), "same": (fwd, bwd) or None, "travelling": T per CP rank,
    "text": text tokens per CP rank, "late": image tokens with text before them}``; entries
    carry their group's ranks.
    """
    rank, P = dist.get_rank(group), dist.get_world_size(group)
    is_image, cu, ids, q, k, v, dout = make_row(samples, heads, kv_heads, HEAD_DIM, 0)
    plan = vlmcp.plan_cp(is_image, P, cu, image_strategy=strategy, image_ids=ids, sample_placement=placement)
    shard = plan.for_rank(rank)
    usp_groups(group, ulysses_size)  # created before logging: new_group is not what we count

    def logged(backend, **kw):
        lq, lk, lv = (shard.shard(t).bfloat16().requires_grad_() for t in (q, k, v))
        with CommLog(groups=True) as fwd:
            out = cp_attention(lq, lk, lv, shard, group, backend, image_attention, **kw)
        loss = (out * shard.shard(dout).bfloat16()).sum()
        with CommLog(groups=True) as bwd:
            loss.backward()
        return fwd.entries, bwd.entries

    same = {1: "ring", P: "ulysses"}.get(ulysses_size)
    return {"usp": logged("usp", ulysses_size=ulysses_size), "same": logged(same) if same else None,
            "travelling": exchange_of(shard).counts,
            "text": tuple(int(plan.for_rank(p).is_text.sum()) for p in range(P)),
            "late": int(((plan.owner < 0) & ~_leading(plan)).sum())}


def bad_usp_calls(group):
    """Each bad USP call raises before any communication; returns ``(label, type, message)``."""
    rank, P = dist.get_rank(group), dist.get_world_size(group)
    is_image, cu, ids, q, k, v, _ = make_row(["t3 i5 t4", (0, 7)], 6, 2, HEAD_DIM, 0)
    shard = vlmcp.plan_cp(is_image, P, cu, image_ids=ids).for_rank(rank)
    lq, lk, lv = (shard.shard(t) for t in (q, k, v))
    calls = {
        "missing": lambda: cp_attention(lq, lk, lv, shard, group, "usp"),
        "not_divisor": lambda: cp_attention(lq, lk, lv, shard, group, "usp", ulysses_size=3),
        "heads": lambda: cp_attention(lq, lk, lv, shard, group, "usp", ulysses_size=4),
        "other_backend": lambda: cp_attention(lq, lk, lv, shard, group, "ring", ulysses_size=2),
    }
    out = []
    with CommLog(forbid=True):
        for label, call in calls.items():
            try:
                call()
                out.append((label, None, ""))
            except (ValueError, TypeError) as e:
                out.append((label, type(e).__name__, str(e)))
    return out


def dp_cp_usp(group, samples):
    """A world of 4 as 2 CP groups of 2: usp refuses to create subgroups lazily, then
    ``usp_groups`` on every rank makes them; parity for U = 1 and U = 2 on the CP group."""
    cp_group, _ = dp_cp_groups(group, 2)
    is_image, cu, ids, q, k, v, _ = make_row(samples, 6, 3, HEAD_DIM, 0)
    shard = vlmcp.plan_cp(is_image, 2, cu, image_ids=ids).for_rank(dist.get_rank(cp_group))
    refused = ""
    with CommLog(forbid=True):
        try:
            cp_attention(*(shard.shard(t) for t in (q, k, v)), shard, cp_group, "usp", ulysses_size=2)
        except ValueError as e:
            refused = str(e)
    made = {U: usp_groups(cp_group, U) for U in (1, 2)}
    ranks = {U: [None if g is None else dist.get_process_group_ranks(g) for g in (m.ulysses, m.ring)]
             for U, m in made.items()}
    errs = [run_case(cp_group, samples, "replicate", "usp", "causal", 3, "float64", heads=6,
                     ulysses_size=U) for U in (1, 2)]
    return refused, ranks, errs


def usp_grid(group, parity_cases, message_cases, dp_cp_samples=None, vlm_cases=()):
    """Everything one world size runs (one spawn): see the module docstring. ``vlm_cases``:
    :class:`~vlmcp.debug.parity.vlm.ParityCase` keyword dicts, one VLM training step each."""
    out = {"parity": parity_grid(group, parity_cases),
           "vlm": [parity_case(group, ParityCase(**case)) for case in vlm_cases],
           "messages": [usp_messages(group, *case) for case in message_cases],
           "bad": bad_usp_calls(group) if dist.get_world_size(group) == 4 else []}
    if dp_cp_samples is not None:
        out["dp_cp"] = dp_cp_usp(group, dp_cp_samples)
    return out
