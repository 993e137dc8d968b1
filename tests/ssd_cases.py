"""Rank functions for the Mamba-2 (SSD) CP tests (importable by name from spawned ranks).

One spawned group per P runs a whole grid (spawning costs seconds): the Mamba-2 layer (transformers'
``NemotronHMamba2Mixer``, run by vlmcp's CP forward) against the same module on each sample alone, the
collectives and bytes of one layer, and (P = 2, 3) the whole tiny Nemotron-H-Omni against the unmodified
model (tests/hf_qwen3_5_cases.py's pattern). A row is samples of text ``("t", n)`` and image ``("i", n)``
runs (tests/gdn_cases.py's ``row``); replicated rows carry shares: each rank's loss weighs its copy of a
replicated output by a different fraction, the fractions summing to one.
"""

from __future__ import annotations

import copy
from typing import NamedTuple

import torch
import torch.distributed as dist

import vlmcp
import vlmcp.comm.collectives as collectives
from tests.gdn_cases import _counted, row
from vlmcp.debug.float64 import float64_exact
from vlmcp.debug.parity.hf import HFParityCase, hf_parity, reference_for
from vlmcp.hf.attention import CPContext
from vlmcp.hf.layers import mamba2
from vlmcp.mixers import segment_layout, ssd_exchange_bytes

HIDDEN = 16


class Dims(NamedTuple):
    heads: int
    head_dim: int
    groups: int
    state: int
    chunk: int = 16


SMALL = Dims(4, 6, 2, 5)  # two heads per group
WIDE = Dims(24, 4, 12, 4)  # heads and groups divisible by P = 2, 3, 4 (the Ulysses road)
LONG = Dims(4, 6, 2, 5, 64)  # the byte rows: 64-token chunks


def mixer(d: Dims, dtype: torch.dtype, seed: int = 0):
    """A seeded transformers ``NemotronHMamba2Mixer`` with random decays, skips and time-step biases."""
    from transformers import NemotronHConfig
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMamba2Mixer

    config = NemotronHConfig(hidden_size=HIDDEN, layers_block_type=["linear_attention"], vocab_size=8,
                             mamba_num_heads=d.heads, mamba_head_dim=d.head_dim, n_groups=d.groups,
                             ssm_state_size=d.state, conv_kernel=4, chunk_size=d.chunk, use_conv_bias=True,
                             num_attention_heads=2, num_key_value_heads=2, head_dim=8)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = NemotronHMamba2Mixer(config, 0).to(dtype).eval()
        with torch.no_grad():
            module.A_log.copy_(torch.empty(d.heads).uniform_(0.0, 2.5))
            module.D.copy_(torch.randn(d.heads))
            module.dt_bias.copy_(torch.empty(d.heads).uniform_(-4.0, 0.5))
            module.norm.weight.copy_(1 + 0.1 * torch.randn(d.heads * d.head_dim))
    return module


def _shares(shard, rank: int, P: int, dtype) -> torch.Tensor:
    fraction = (rank + 1) / (P * (P + 1) / 2)  # of a replicated output's weight; sums to 1 over ranks
    return torch.ones(shard.num_tokens, dtype=dtype).masked_fill(shard.replicated, fraction)


def compare_layer(group: dist.ProcessGroup | None, case: dict) -> dict:
    """One case: vlmcp's CP forward of the Mamba-2 layer against transformers' module on each sample alone.

    Outputs row by row, and the gradients of the input and of every parameter summed over ranks, as
    worst relative errors over ranks (``group=None``: one process, P = 1).
    """
    P, rank = (1, 0) if group is None else (dist.get_world_size(group), dist.get_rank(group))
    dtype = getattr(torch, case["dtype"])
    dims = {"small": SMALL, "wide": WIDE}[case.get("dims", "small")]
    is_image, cu = row(case["samples"])
    L = is_image.numel()
    gen = torch.Generator().manual_seed(case.get("seed", 3))
    x, dout = (torch.randn(L, HIDDEN, generator=gen, dtype=torch.float64).to(dtype) for _ in range(2))
    ref = mixer(dims, dtype)
    mod = copy.deepcopy(ref)
    mamba2.prepare(mod)
    plan = vlmcp.plan_cp(is_image, P, cu, image_strategy=case.get("strategy", "replicate"),
                         sample_placement=case.get("placement", "split"))
    shard = plan.for_rank(rank)
    xr, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    with float64_exact(dtype):
        bounds = zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)
        out_ref = torch.cat([ref(xr[None, a:b])[0] for a, b in bounds])
        (out_ref * dout).sum().backward()
        ctx = CPContext(shard=shard, group=group, backend=case.get("backend", "ring"))
        out = mod(shard.shard(xc)[None], vlmcp_cp=ctx)[0]
        valid = shard.positions >= 0
        share = _shares(shard, rank, P, dtype)
        (out[valid] * (shard.shard(dout) * share[:, None])[valid]).sum().backward()
    res = {k: v for k, v in case.items() if k != "samples"}
    res["L"] = L
    res["out"] = float((out.detach()[valid] - out_ref.detach()[shard.positions[valid]]).abs().max()
                       / out_ref.detach().abs().max())
    grads = [("x", xc.grad, xr.grad)] + [(n, p.grad, dict(ref.named_parameters())[n].grad)
                                         for n, p in mod.named_parameters()]
    for n, g, want in grads:
        g = g.clone()
        if group is not None:
            dist.all_reduce(g, group=group)
        res[f"grad_{n}"] = float((g - want).abs().max() / want.abs().max())
    keys = [k for k in res if k == "out" or k.startswith("grad_")]
    if group is not None:
        errs = torch.tensor([res[k] for k in keys], dtype=torch.float64)
        dist.all_reduce(errs, op=dist.ReduceOp.MAX, group=group)
        res.update({k: float(e) for k, e in zip(keys, errs, strict=True)})
    return res


def layer_grid(group: dist.ProcessGroup, cases: list[dict]) -> list[dict]:
    """Every case of the grid, with how many calls took the Ulysses road."""
    calls = []
    saved = mamba2.mamba2_ulysses
    mamba2.mamba2_ulysses = lambda *a, **k: calls.append(1) or saved(*a, **k)
    try:
        out = []
        for case in cases:
            before = len(calls)
            out.append({**compare_layer(group, case), "ulysses_road": len(calls) - before})
        return out
    finally:
        mamba2.mamba2_ulysses = saved


def exchange_counts(group: dist.ProcessGroup, rows: list) -> list[dict]:
    """Per row: the collectives of one Mamba-2 layer's forward and backward (ring: state passing), their
    bytes, and the layout's count of the maps' bytes."""
    P, rank = dist.get_world_size(group), dist.get_rank(group)
    mod = mixer(LONG, torch.float64)
    mamba2.prepare(mod)
    out = []
    for samples in rows:
        is_image, cu = row(samples)
        L = is_image.numel()
        shard = vlmcp.plan_cp(is_image, P, cu).for_rank(rank)
        x = torch.randn(shard.num_tokens, HIDDEN, dtype=torch.float64, requires_grad=True)
        calls: list = []
        saved = (collectives._all_gather_flat, collectives._reduce_scatter_flat)
        collectives._all_gather_flat = _counted(calls, "all_gather", saved[0])
        collectives._reduce_scatter_flat = _counted(calls, "reduce_scatter", saved[1])
        try:
            y = mod(x[None], vlmcp_cp=CPContext(shard=shard, group=group, backend="ring"))
            y.sum().backward()
        finally:
            collectives._all_gather_flat, collectives._reduce_scatter_flat = saved
        layout = segment_layout(shard)
        out.append({"L": L, "calls": calls, "export_sizes": layout.export_sizes,
                    "map_bytes": ssd_exchange_bytes(layout, LONG.heads, LONG.head_dim, LONG.state,
                                                    torch.float64)})
    return out


def model_grid(group: dist.ProcessGroup, cases: list[HFParityCase]) -> list[dict]:
    """The whole tiny Nemotron-H-Omni: ``hf_parity`` per case (one reference per row), with how many Mamba-2
    calls took the Ulysses road."""
    calls, refs, out = [], {}, []
    saved = mamba2.mamba2_ulysses
    mamba2.mamba2_ulysses = lambda *a, **k: calls.append(1) or saved(*a, **k)
    try:
        for c in cases:
            key = (c.dtype, c.seed, c.samples)
            if key not in refs:
                refs[key] = reference_for(c)
            before = len(calls)
            out.append({**hf_parity(group, c, refs[key]), "ulysses_road": len(calls) - before})
    finally:
        mamba2.mamba2_ulysses = saved
    return out


def shard_local_error(group: dist.ProcessGroup, case: HFParityCase) -> dict:
    """The trap: the same model with its Mamba-2 mixers left as transformers ships them (each rank scans its
    shard alone, from a zero state): ``hf_parity`` of that, to show the error vlmcp's mixer removes."""
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMamba2Mixer

    from vlmcp.hf.layers import audit

    mamba2.register()
    saved = audit._REGISTERED[NemotronHMamba2Mixer]
    audit._REGISTERED[NemotronHMamba2Mixer] = lambda module: None  # accepted, never prepared
    try:
        return hf_parity(group, case)
    finally:
        audit._REGISTERED[NemotronHMamba2Mixer] = saved


def suite(group: dist.ProcessGroup, layer_cases: list[dict], byte_rows: list | None,
          model_cases: list[HFParityCase], trap: HFParityCase | None = None) -> dict:
    """One group's job: the layer grid, the layer's collectives and bytes, the whole model's parity grid,
    and (``trap``) the error of the unmodified Mamba-2 mixers under CP."""
    return {"layer": layer_grid(group, layer_cases),
            "bytes": exchange_counts(group, byte_rows) if byte_rows else [],
            "model": model_grid(group, model_cases),
            "trap": shard_local_error(group, trap) if trap is not None else None}
