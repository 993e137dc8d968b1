"""Rank functions for the Gated DeltaNet CP tests (importable by name from spawned ranks).

One spawned group per P runs a whole grid (spawning costs seconds). A case is a row
(samples of text ``("t", n)`` and image ``("i", n)`` runs), a layout and a dtype; the
CP ops run on each rank's shard and are compared with the single-process ops on the
global row: outputs row by row, and input gradients summed over the ranks (replicated
rows carry shares: each rank's loss weighs its copy of a replicated output by a
different fraction, the fractions summing to one).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
from torch.nn import functional as F

import vlmcp
import vlmcp.comm.collectives as collectives
from vlmcp.mixers import causal_conv1d_cp, chunk_gated_delta_rule, exchange_bytes, gated_delta_rule_cp
from vlmcp.mixers.deltanet_ulysses import gated_deltanet_ulysses
from vlmcp.mixers.segments import segment_layout

HK, HV, K, V, KERNEL = 2, 4, 8, 6, 4
CONV = 2 * HK * K + HV * V
CHUNK = 32


def row(samples) -> tuple[torch.Tensor, torch.Tensor]:
    """``is_image (L,)`` and ``cu_seqlens (S+1,)`` of a row given as samples of ``("t"|"i", n)`` runs."""
    runs = [torch.full((n,), kind == "i") for s in samples for kind, n in s]
    lens = [sum(n for _, n in s) for s in samples]
    return torch.cat(runs), F.pad(torch.cumsum(torch.tensor(lens), 0), (1, 0))


class Dims(NamedTuple):
    hk: int
    hv: int
    k: int
    v: int

    @property
    def conv(self) -> int:
        return 2 * self.hk * self.k + self.hv * self.v


SMALL = Dims(HK, HV, K, V)
WIDE = Dims(12, 12, 4, 4)  # heads divisible by P = 2, 3, 4 (the Ulysses road)


def _inputs(L: int, dtype: torch.dtype, seed: int, d: Dims = SMALL) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    return {"x": rand(L, d.conv), "weight": rand(d.conv, 1, KERNEL) * 0.5, "bias": rand(d.conv) * 0.1,
            "q": rand(L, d.hk, d.k), "k": rand(L, d.hk, d.k), "v": rand(L, d.hv, d.v),
            "g": F.logsigmoid(rand(L, d.hv) + 2.0), "beta": torch.sigmoid(rand(L, d.hv)),
            "dout": rand(L, d.hv, d.v)}


def _conv_reference(x, weight, bias, cu):
    """transformers' ``causal_conv1d_fn`` (pad k-1, truncate) on each sample alone."""
    out = []
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        xs = x[a:b].t().unsqueeze(0)
        out.append(F.conv1d(xs, weight, bias, padding=KERNEL - 1, groups=x.shape[1])[0, :, : b - a].t())
    return torch.cat(out)


def _split(mixed, d: Dims = SMALL):
    q, k, v = torch.split(F.silu(mixed), [d.hk * d.k, d.hk * d.k, d.hv * d.v], dim=-1)
    return q.reshape(-1, d.hk, d.k), k.reshape(-1, d.hk, d.k), v.reshape(-1, d.hv, d.v)


def _rule_ops(t, cu_or_shard, group):
    qkvgb = (t["q"], t["k"], t["v"], t["g"], t["beta"])
    if group is False:
        return chunk_gated_delta_rule(*qkvgb, cu_or_shard, chunk_size=CHUNK, use_qk_l2norm=True)[0]
    return gated_delta_rule_cp(*qkvgb, cu_or_shard, group, chunk_size=CHUNK, use_qk_l2norm=True)


def _layer_reference(t, cu, d: Dims = SMALL):
    q, k, v = _split(_conv_reference(t["x"], t["weight"], t["bias"], cu), d)
    return chunk_gated_delta_rule(q, k, v, t["g"], t["beta"], cu, chunk_size=CHUNK, use_qk_l2norm=True)[0]


def _layer_ops(t, cu_or_shard, group):
    if group is False:
        return _layer_reference(t, cu_or_shard)
    q, k, v = _split(causal_conv1d_cp(t["x"], t["weight"], t["bias"], cu_or_shard, group))
    return gated_delta_rule_cp(q, k, v, t["g"], t["beta"], cu_or_shard, group, chunk_size=CHUNK,
                               use_qk_l2norm=True)


def _ulysses_ops(t, cu_or_shard, group):
    if group is False:
        return _layer_reference(t, cu_or_shard, WIDE)
    return gated_deltanet_ulysses(t["x"], t["weight"], t["bias"], t["g"], t["beta"], cu_or_shard, group,
                                  key_heads=WIDE.hk, key_dim=WIDE.k, value_heads=WIDE.hv, value_dim=WIDE.v,
                                  activation=F.silu, chunk_size=CHUNK)


OPS = {"rule": (_rule_ops, ("q", "k", "v", "g", "beta"), SMALL),
       "layer": (_layer_ops, ("x", "weight", "bias", "g", "beta"), SMALL),
       "ulysses": (_ulysses_ops, ("x", "weight", "bias", "g", "beta"), WIDE)}


def _compare(group, op: str, case: dict) -> dict:
    P, rank = dist.get_world_size(group), dist.get_rank(group)
    dtype = getattr(torch, case["dtype"])
    is_image, cu = row(case["samples"])
    L = is_image.numel()
    fn, leaves, dims = OPS[op]
    base = _inputs(L, dtype, case.get("seed", 0), dims)
    # one process, the whole row
    ref = {n: base[n].clone().requires_grad_(n in leaves) for n in base}
    out_ref = fn(ref, cu, False)
    (out_ref * ref["dout"]).sum().backward()
    # CP: this rank's shard of the same global leaves
    plan = vlmcp.plan_cp(is_image, P, cu, image_strategy=case.get("strategy", "replicate"),
                         sample_placement=case.get("placement", "split"))
    shard = plan.for_rank(rank)
    glob = {n: base[n].clone().requires_grad_(n in leaves) for n in base}
    per_token = {n: shard.shard(glob[n]) if glob[n].shape[0] == L and n not in ("weight", "bias") else glob[n]
                 for n in glob}
    out = fn(per_token, shard, group)
    fraction = (rank + 1) / (P * (P + 1) / 2)  # of a replicated output's weight; sums to 1 over ranks
    share = torch.ones(shard.num_tokens, dtype=dtype).masked_fill(shard.replicated, fraction)
    dout = shard.shard(base["dout"]) * share[:, None, None]
    (out * dout).sum().backward()
    valid = shard.positions >= 0
    scale = out_ref.detach().abs().max()
    res = {"op": op, **{k: v for k, v in case.items() if k != "samples"}, "L": L,
           "out": float((out.detach()[valid] - out_ref.detach()[shard.positions[valid]]).abs().max() / scale),
           "pad_out": float(out.detach()[~valid].abs().max()) if bool((~valid).any()) else 0.0}
    for n in leaves:
        grad = glob[n].grad.clone()
        dist.all_reduce(grad, group=group)
        res[f"grad_{n}"] = float((grad - ref[n].grad).abs().max() / ref[n].grad.abs().max())
    keys = ["out", "pad_out"] + [f"grad_{n}" for n in leaves]
    errs = torch.tensor([res[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(errs, op=dist.ReduceOp.MAX, group=group)
    res.update({k: float(e) for k, e in zip(keys, errs, strict=True)})
    return res


def _short_conv(dtype: torch.dtype, hidden: int):
    """A seeded transformers ``Lfm2ShortConv`` (kernel 3, with biases)."""
    from transformers import Lfm2Config
    from transformers.models.lfm2.modeling_lfm2 import Lfm2ShortConv

    config = Lfm2Config(hidden_size=hidden, num_hidden_layers=1, layer_types=["conv"], conv_L_cache=3,
                        conv_bias=True, vocab_size=8, intermediate_size=8, num_attention_heads=2,
                        num_key_value_heads=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Lfm2ShortConv(config, 0).to(dtype)


def _compare_short_conv(group, case: dict) -> dict:
    """LFM2's short convolution: transformers' module on each sample alone against vlmcp's CP forward."""
    import copy

    from vlmcp.hf.attention import CPContext
    from vlmcp.hf.layers.short_conv import prepare

    P, rank = dist.get_world_size(group), dist.get_rank(group)
    dtype = getattr(torch, case["dtype"])
    is_image, cu = row(case["samples"])
    L, H = is_image.numel(), 16
    gen = torch.Generator().manual_seed(7)
    x, dout = (torch.randn(L, H, generator=gen, dtype=torch.float64).to(dtype) for _ in range(2))
    ref = _short_conv(dtype, H)
    xr = x.clone().requires_grad_()
    bounds = zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)
    out_ref = torch.cat([ref(xr[None, a:b])[0] for a, b in bounds])
    (out_ref * dout).sum().backward()
    mod = copy.deepcopy(ref)
    mod.zero_grad(set_to_none=True)
    prepare(mod)
    plan = vlmcp.plan_cp(is_image, P, cu, image_strategy=case.get("strategy", "replicate"),
                         sample_placement=case.get("placement", "split"))
    shard = plan.for_rank(rank)
    xc = x.clone().requires_grad_()
    out = mod(shard.shard(xc)[None], vlmcp_cp=CPContext(shard=shard, group=group, backend="ring"))[0]
    fraction = (rank + 1) / (P * (P + 1) / 2)
    share = torch.ones(shard.num_tokens, dtype=dtype).masked_fill(shard.replicated, fraction)
    valid = shard.positions >= 0
    (out[valid] * (shard.shard(dout) * share[:, None])[valid]).sum().backward()
    res = {"op": "short_conv", **{k: v for k, v in case.items() if k != "samples"}, "L": L,
           "out": float((out.detach()[valid] - out_ref.detach()[shard.positions[valid]]).abs().max()
                        / out_ref.detach().abs().max())}
    grads = [("x", xc.grad, xr.grad)] + [(n, p.grad, dict(ref.named_parameters())[n].grad)
                                         for n, p in mod.named_parameters()]
    for n, g, want in grads:
        g = g.clone()
        dist.all_reduce(g, group=group)
        res[f"grad_{n}"] = float((g - want).abs().max() / want.abs().max())
    keys = [k for k in res if k == "out" or k.startswith("grad_")]
    errs = torch.tensor([res[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(errs, op=dist.ReduceOp.MAX, group=group)
    res.update({k: float(e) for k, e in zip(keys, errs, strict=True)})
    res["pad_out"] = 0.0  # padding outputs are out_proj's bias here, and nothing reads them
    return res


def parity_grid(group: dist.ProcessGroup, cases: list[dict]) -> list[dict]:
    """Every op (the bare rule; conv + silu + rule, state passing and Ulysses) of every case: worst relative
    errors over ranks."""
    return [_compare(group, op, case) for case in cases for op in OPS]


def short_conv_grid(group: dist.ProcessGroup, cases: list[dict]) -> list[dict]:
    """LFM2's short convolution on every case (run in a group that has imported transformers already)."""
    return [_compare_short_conv(group, case) for case in cases]


def _counted(calls: list, name: str, fn):
    def wrapper(out, x, group):
        calls.append((name, tuple(x.shape), out.numel() * out.element_size()))
        return fn(out, x, group=group)
    return wrapper


def exchange_counts(group: dist.ProcessGroup, rows: list) -> list[dict]:
    """Per row: the collectives of one conv + rule forward and backward, their bytes, the layout's count."""
    P, rank = dist.get_world_size(group), dist.get_rank(group)
    out = []
    for samples in rows:
        is_image, cu = row(samples)
        L = is_image.numel()
        shard = vlmcp.plan_cp(is_image, P, cu).for_rank(rank)
        t = {n: x.requires_grad_(n in ("x", "g", "beta")) for n, x in _inputs(L, torch.float64, 1).items()}
        local = {n: shard.shard(x) if x.shape[0] == L and n not in ("weight", "bias") else x
                 for n, x in t.items()}
        calls: list = []
        saved = (collectives._all_gather_flat, collectives._reduce_scatter_flat)
        collectives._all_gather_flat = _counted(calls, "all_gather", saved[0])
        collectives._reduce_scatter_flat = _counted(calls, "reduce_scatter", saved[1])
        try:
            o = _layer_ops(local, shard, group)
            (o * shard.shard(t["dout"])).sum().backward()
        finally:
            collectives._all_gather_flat, collectives._reduce_scatter_flat = saved
        layout = segment_layout(shard)
        out.append({"L": L, "calls": calls, "export_sizes": layout.export_sizes,
                    "map_bytes": exchange_bytes(layout, HV, K, V, torch.float64)})
    return out


def suite(group: dist.ProcessGroup, cases: list[dict], byte_rows: list | None = None) -> dict:
    """One group's job: the parity grid, and (optionally) the exchange's collectives and bytes."""
    return {"parity": parity_grid(group, cases),
            "bytes": exchange_counts(group, byte_rows) if byte_rows else []}
