"""Rank functions for the expert-parallel tests (importable by name from spawned ranks).

Each function runs a whole grid inside one spawned group. The reference is the unmodified
transformers model in one process, in float64: each packed row's samples run alone (HF computes
their positions and merge), the row's token loss is their summed token losses over its target
count, and, where the model's forward adds a router auxiliary loss, ``router_aux_loss_coef`` times
HF's ``load_balancing_loss_func`` of the router logits of the *whole row* (every sample's, per
layer: the row's global statistics); with DP the replicas' rows are averaged.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.nn import functional as F

import vlmcp
import vlmcp.hf
from vlmcp.debug.float64 import float64_exact, float64_norms
from vlmcp.debug.float64.islands import _load_balancing
from vlmcp.debug.parity.hf import _sample_inputs, compare_gradients
from vlmcp.debug.synthetic import synthetic_row
from vlmcp.debug.tiny import tiny_arch, tiny_config, tiny_model
from vlmcp.grads import finish_ddp_gradients, grad_norms, reduce_gradients
from vlmcp.hf.inputs import shift_hf_labels
from vlmcp.hf.moe import expert_groups, expert_load, expert_shards, fully_shard_experts, gather_experts
from vlmcp.layout.validate import check_cu_seqlens
from vlmcp.train.groups import dp_cp_groups

ARCHS = ("qwen3_vl_moe", "qwen3_5_moe", "glm4v_moe", "kimi_k25", "gemma4", "minimax_m3_vl", "llama4",
         "mistral4", "nemotron_h_omni")
"""Every MoE adapter vlmcp has (``mistral4``: Mistral3 over a Mistral 4 LM)."""
AUX = ("qwen3_vl_moe", "qwen3_5_moe", "glm4v_moe", "minimax_m3_vl")
"""The architectures whose forward adds a router auxiliary loss (switched on in these tests)."""
TEXT_ONLY = ((12,), (7,))


def ep_model(arch: str) -> torch.nn.Module:
    """The tiny float64 model of ``arch``, its auxiliary loss on where it has one."""
    aux = {"text_config": {"output_router_logits": True, "router_aux_loss_coef": 0.5}}
    overrides = aux if arch in AUX else {}
    model = tiny_model(tiny_config(arch, **overrides), torch.float64)
    float64_norms(model)
    return model


def reference_step(model, inputs: dict, labels: torch.Tensor, cu: torch.Tensor | None, scale: float) -> float:
    """The unmodified model's loss of one packed row (token loss + the row's aux loss); backward of
    ``scale`` times it."""
    cu = check_cu_seqlens(cu, inputs["input_ids"].shape[1])
    losses, count, router = [], 0, []
    for s, sample in enumerate(_sample_inputs(model, inputs, cu)):
        a, b = int(cu[s]), int(cu[s + 1])
        tgt = shift_hf_labels(labels[0, a:b], torch.tensor([0, b - a]))
        out = model(**sample)
        losses.append(F.cross_entropy(out.logits[0], tgt, ignore_index=-100, reduction="sum"))
        count += int((tgt != -100).sum())
        if getattr(out, "router_logits", None) is not None:
            router.append(out.router_logits)
    loss = torch.stack(losses).sum() / max(count, 1)
    text = model.config.get_text_config()
    if router and getattr(text, "output_router_logits", False):
        layers = tuple(torch.cat(per_layer, 0) for per_layer in zip(*router, strict=True))
        experts = text.num_experts if hasattr(text, "num_experts") else text.n_routed_experts
        loss = loss + text.router_aux_loss_coef * _load_balancing(layers, experts, text.num_experts_per_tok)
    (loss * scale).backward()
    return float(loss.detach())


def _rows(model, arch: str, dp: int, text_only: bool = False) -> list[tuple]:
    samples = TEXT_ONLY if text_only else tiny_arch(arch).samples
    return [synthetic_row(model, samples, seed=1 + d) for d in range(dp)]


def _reference(arch: str, dp: int, text_only: bool = False):
    ref = ep_model(arch)
    rows = _rows(ref, arch, dp, text_only)
    with float64_exact(torch.float64):
        losses = [reference_step(ref, *row, scale=1.0 / dp) for row in rows]
    return ref, rows, losses


def _ep_case(group, ref, rows, losses, cp: int, ep: int, attention: str, fsdp: bool = False,
             checkpointing: bool = False) -> dict:
    """One (layout, backend) against the reference: loss and every gradient, experts sliced."""
    world = dist.get_world_size(group)
    cp_group, dp_group = dp_cp_groups(group, cp)
    ep_group, edp_group = expert_groups(group, ep)
    model = copy.deepcopy(ref)
    for p in model.parameters():
        p.grad = None
    if checkpointing:  # the recomputation runs both all-to-alls again, inside backward
        model.train()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    vlmcp.hf.parallelize(model, cp_group, attention=attention, ep_group=ep_group)
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        fully_shard_experts(model, edp_group, world)
        mesh = init_device_mesh("cpu", (world,))
        ignored = {p for n, p in model.named_parameters() if n in set(vlmcp.ddp_ignored_params(model))}
        for m in model.modules():
            if type(m).__name__ in set(model._no_split_modules):
                fully_shard(m, mesh=mesh, ignored_params=ignored or None)
        fully_shard(model, mesh=mesh, ignored_params=ignored or None)
    inputs, labels, cu = rows[dist.get_rank(dp_group)]
    calls, real, wrapper = _recording()
    dist.all_to_all_single = wrapper
    try:
        with float64_exact(torch.float64):
            batch = vlmcp.hf.shard_inputs(model, inputs, cp_group, labels=labels, cu_seqlens=cu)
            res = vlmcp.hf.causal_lm_loss(model, batch, cp_group, chunk_size=4)
            (res.loss * (cp if fsdp else 1)).backward()
    finally:
        dist.all_to_all_single = real
    refused = ""
    if fsdp:
        report = finish_ddp_gradients(model, cp_group, dp_group, expert_dp_group=edp_group)
    else:
        if world // ep > 1:  # EXPERT gradients without their expert-DP group: refused before any reduction
            refused = _refused(lambda: reduce_gradients(model, cp_group, dp_group))
        report = reduce_gradients(model, cp_group, dp_group, expert_dp_group=edp_group)
    layers = sum(1 for m in model.modules() if getattr(m, "_vlmcp_ep", None) is not None)
    k = model.config.get_text_config()
    k = getattr(k, "num_experts_per_tok", None) or k.top_k_experts
    pairs = torch.tensor([batch.shard.num_tokens * k * layers])
    dist.all_reduce(pairs, group=group)
    total = res.loss.detach().clone()
    dist.all_reduce(total, group=cp_group)
    truth = losses[dist.get_rank(dp_group)]
    loss_err = torch.tensor([abs(float(total) - truth) / abs(truth)], dtype=torch.float64)
    dist.all_reduce(loss_err, op=dist.ReduceOp.MAX, group=group)
    err, worst = compare_gradients(model, ref, group)
    load = expert_load(model, group)
    shards = expert_shards(model)
    grads = dict(ref.named_parameters())
    full = gather_experts(model, {n: p.grad for n, p in model.named_parameters() if n in shards})
    expert_err = max((float((g - grads[n].grad).norm() / grads[n].grad.norm()) for n, g in full.items()),
                     default=0.0)
    out = {"case": (cp, world // cp, ep, attention, fsdp), "loss_rel_error": float(loss_err), "grad": err,
           "worst": worst, "experts": len(full), "expert_grad": expert_err,
           "expert_pairs": int(load.counts.sum()), "routed_pairs": int(pairs),
           "load_shape": tuple(load.counts.shape), "a2a_calls": len(calls), "moe_layers": layers,
           "imbalance": load.imbalance, "refused": refused,
           "expert_collectives": report.expert_collectives, "expert_bytes": report.expert_bytes,
           "expert_numel": sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
                               for n, p in model.named_parameters() if n in shards)}
    if fsdp:
        from torch.distributed.tensor import DTensor

        out["expert_meshes"] = sorted({p.device_mesh.size() for n, p in model.named_parameters()
                                       if n in shards and isinstance(p, DTensor)})
        out["expert_placements"] = sorted({str(p.placements) for n, p in model.named_parameters()
                                           if n in shards and isinstance(p, DTensor)})
    if not fsdp:
        params = [p for p in model.parameters() if p.requires_grad]
        norm = grad_norms({"all": params}, cp_group, dp_group)["all"]
        true = float(torch.stack([p.grad.double().norm() for p in ref.parameters()
                                  if p.grad is not None]).norm())
        out["norm_rel_error"] = abs(norm - true) / true
    return out


def grid(group: dist.ProcessGroup, archs, layouts, backends=("ring", "ulysses"), fsdp: bool = False,
         text_only: bool = False, checkpointing: bool = False) -> list[dict]:
    """Every (arch, (cp, ep), backend) case; the world is ``cp * dp`` ranks (``dp = world / cp``)."""
    world = dist.get_world_size(group)
    out = []
    for arch in archs:
        dp = world // layouts[0][0]
        ref, rows, losses = _reference(arch, dp, text_only)
        for cp, ep in layouts:
            for attention in backends:
                out.append({"arch": arch, "text_only": text_only, "checkpointing": checkpointing,
                            **_ep_case(group, ref, rows, losses, cp, ep, attention, fsdp, checkpointing)})
    return out


def suite(group: dist.ProcessGroup, fast_archs, fsdp_archs, tmp: str) -> dict:
    """The 4-rank job of the default test run: the layouts of a world of 4 for ``fast_archs``, FSDP2,
    a text-only row, the exchange's units and the checkpoint round trip."""
    return {"grid": grid(group, fast_archs, [(2, 4), (2, 2)]),
            "fsdp": grid(group, fsdp_archs, [(2, 2), (2, 4)], ("ring",), fsdp=True),
            "text_only": grid(group, ("qwen3_vl_moe",), [(2, 4)], ("ulysses",), text_only=True),
            "dispatch": dispatch_exact(group), "rows": all_to_all_rows(group),
            "checkpoint": checkpoint_round_trip(group, tmp)}


def suite2(group: dist.ProcessGroup, archs) -> dict:
    """The 2-rank job: ``--cp 2 --ep 2`` for every arch and backend, activation checkpointing, refusals."""
    return {"grid": grid(group, archs, [(2, 2)]),
            "checkpointing": grid(group, ("qwen3_vl_moe", "llama4"), [(2, 2)], ("ring",), checkpointing=True),
            "refusals": refusals(group)}


def _experts_module(num_experts: int = 8, hidden: int = 16, inter: int = 8, seed: int = 0):
    """A Qwen3-VL-MoE experts module (float64, eager), every rank the same weights."""
    from transformers import Qwen3VLMoeTextConfig
    from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeTextExperts

    cfg = Qwen3VLMoeTextConfig(hidden_size=hidden, moe_intermediate_size=inter, num_experts=num_experts,
                               experts_implementation="eager")
    torch.manual_seed(seed)
    m = Qwen3VLMoeTextExperts(cfg).double()
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return m


# Per rank: tokens and their top-2 experts (of 8). EP=4: rank 3 holds experts 6 and 7, which no token
# picks (it receives nothing), and rank 3 has no token (it sends nothing); rank 1 sends to itself only.
ROUTES = {0: [[0, 1], [2, 5], [1, 4], [0, 3], [5, 2]], 1: [[2, 3], [3, 2]], 2: [[4, 0], [1, 5], [3, 4]],
          3: []}


def _recording():
    """Wrap ``dist.all_to_all_single`` to record each call's element size and split sizes (restore after)."""
    calls, real = [], dist.all_to_all_single

    def wrapper(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
        calls.append({"itemsize": input.element_size(), "row": int(torch.tensor(input.shape[1:]).prod()),
                      "in": list(input_split_sizes or []), "out": list(output_split_sizes or []),
                      "numel": input.numel()})
        return real(output, input, output_split_sizes=output_split_sizes, input_split_sizes=input_split_sizes,
                    group=group, async_op=async_op)

    return calls, real, wrapper


def dispatch_exact(group: dist.ProcessGroup) -> list[dict]:
    """``ep_experts_forward`` against HF's eager experts on all ranks' tokens at once, EP 4 and 2 of a
    world of 4: outputs, input and weight gradients (float64), and every all-to-all's splits."""
    from vlmcp.hf.moe.forward import ep_experts_forward
    from vlmcp.hf.moe.registry import EXPERTS
    from vlmcp.hf.moe.shard import apply_expert_parallel

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    gen = torch.Generator().manual_seed(3)
    xs = {r: torch.randn(len(ROUTES[r]), 16, generator=gen, dtype=torch.float64) for r in range(world)}
    ws = {r: torch.rand(len(ROUTES[r]), 2, generator=gen, dtype=torch.float64) for r in range(world)}
    gs = {r: torch.randn(len(ROUTES[r]), 16, generator=gen, dtype=torch.float64) for r in range(world)}
    ids = {r: torch.tensor(ROUTES[r], dtype=torch.long).view(-1, 2) for r in range(world)}
    ref = _experts_module()
    x_all = torch.cat([xs[r] for r in range(world)]).requires_grad_()
    y_all = ref(x_all, torch.cat([ids[r] for r in range(world)]), torch.cat([ws[r] for r in range(world)]))
    (y_all * torch.cat([gs[r] for r in range(world)])).sum().backward()
    lo = sum(len(ROUTES[r]) for r in range(rank))
    hi = lo + len(ROUTES[rank])
    out = []
    for ep in (4, 2):
        ep_group, edp_group = expert_groups(group, ep)
        m = _experts_module()
        spec = EXPERTS[type(m).__name__]
        apply_expert_parallel(m, [("experts", m, spec)], ep_group, cp_size=1)
        assert m.forward.__func__ is ep_experts_forward
        calls, real, wrapper = _recording()
        dist.all_to_all_single = wrapper
        try:
            x = xs[rank].clone().requires_grad_()
            y = m(x, ids[rank], ws[rank])
            (y * gs[rank]).sum().backward()
        finally:
            dist.all_to_all_single = real
        fwd_err = float((y.detach() - y_all.detach()[lo:hi]).abs().max()) if hi > lo else 0.0
        dx_err = float((x.grad - x_all.grad[lo:hi]).abs().max()) if hi > lo else 0.0
        shard = m._vlmcp_ep
        w_err = 0.0
        for name in ("gate_up_proj", "down_proj"):
            g = getattr(m, name).grad.clone()
            dist.all_reduce(g, group=edp_group)
            truth = getattr(ref, name).grad[shard.first:shard.first + shard.num_local]
            w_err = max(w_err, float((g - truth).abs().max() / getattr(ref, name).grad.abs().max()))
        out.append({"ep": ep, "rank": rank, "fwd_err": fwd_err, "dx_err": dx_err, "w_err": w_err,
                    "grad_none": [getattr(m, n).grad is None for n in ("gate_up_proj", "down_proj")],
                    "calls": calls})
    return out


def expected_splits(ep: int, rank: int, num_experts: int = 8) -> tuple[list[int], list[int]]:
    """``(in_splits, out_splits)`` of rank ``rank``'s dispatch from :data:`ROUTES`, counted by hand."""
    local, first = num_experts // ep, rank - rank % ep
    dest = [0] * ep
    for e in sum(ROUTES[rank], []):
        dest[e // local] += 1
    src = [sum(1 for e in sum(ROUTES[s], []) if e // local == rank % ep) for s in range(first, first + ep)]
    return dest, src


def all_to_all_rows(group: dist.ProcessGroup) -> dict:
    """:func:`vlmcp.comm.all_to_all_uneven` with uneven and zero splits (rank 3 sends and receives
    nothing): forward blocks bitwise, backward each sender's rows of the receivers' cotangent."""
    from vlmcp.comm import all_to_all_uneven

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    c = torch.tensor([[2, 3, 0, 0], [0, 1, 4, 0], [1, 0, 2, 0], [0, 0, 0, 0]])
    gen = torch.Generator().manual_seed(1)
    blocks = {(s, d): torch.randn(int(c[s, d]), 3, generator=gen, dtype=torch.float64)
              for s in range(world) for d in range(world)}
    cot = {(s, d): torch.randn(int(c[s, d]), 3, generator=gen, dtype=torch.float64)
           for s in range(world) for d in range(world)}
    x = torch.cat([blocks[(rank, d)] for d in range(world)]).requires_grad_()
    y = all_to_all_uneven(x, group, c[:, rank].tolist(), c[rank].tolist())
    (y * torch.cat([cot[(s, rank)] for s in range(world)])).sum().backward()
    bad = ""
    try:
        all_to_all_uneven(x.detach(), group, c[:, rank].tolist(), [1, 1, 1, 1])
    except ValueError as e:
        bad = str(e)
    return {"fwd": torch.equal(y.detach(), torch.cat([blocks[(s, rank)] for s in range(world)])),
            "bwd": torch.equal(x.grad, torch.cat([cot[(rank, d)] for d in range(world)])),
            "shapes": (tuple(x.shape), tuple(y.shape)), "bad": bad}


def checkpoint_round_trip(group: dist.ProcessGroup, tmp: str) -> dict:
    """Full experts saved at E=2 (plain, under FSDP2, through torch DCP), loaded at E=4 and E=1."""
    import torch.distributed.checkpoint as dcp

    from vlmcp.hf.moe import expert_shapes, load_experts, slice_experts

    world, rank = dist.get_world_size(group), dist.get_rank(group)
    cp_group, _ = dp_cp_groups(group, 2)
    base, other = ep_model("qwen3_vl_moe"), tiny_model("qwen3_vl_moe", torch.float64, seed=7)
    truth = {n: p.detach().clone() for n, p in base.named_parameters() if ".experts." in n}
    out = {}
    models = {}
    for ep, src in ((2, base), (4, other), (1, other)):
        ep_group, edp_group = expert_groups(group, ep)
        m = copy.deepcopy(src)
        vlmcp.hf.parallelize(m, cp_group, ep_group=ep_group)
        models[ep] = (m, edp_group)
    m2 = models[2][0]
    full = gather_experts(m2)
    out["gathered_exact"] = all(torch.equal(full[n], truth[n]) for n in truth)
    out["shapes"] = ({n: tuple(s) for n, s in expert_shapes(m2).items()}
                     == {n: tuple(t.shape) for n, t in truth.items()})
    # optimizer moments: any per-parameter tensor keyed by name; here each rank's slice holds its rank
    marks = gather_experts(m2, {n: torch.full_like(p, float(rank)) for n, p in m2.named_parameters()
                                if n in truth})
    first = float(rank - rank % 2)  # the EP group's first rank: its 2 experts, then the next rank's
    out["gather_order"] = all(m[:2].eq(first).all() and m[2:].eq(first + 1).all() for m in marks.values())
    m4 = models[4][0]
    load_experts(m4, full)
    out["load_e4"] = all(torch.equal(gather_experts(m4)[n], truth[n]) for n in truth)
    out["slice_e4"] = [tuple(t.shape) for t in slice_experts(m4, {n: full[n] for n in truth}).values()][0]
    m1 = models[1][0]
    with torch.no_grad():
        for n, p in m1.named_parameters():
            if n in truth:
                p.copy_(slice_experts(m1, {n: full[n]})[n])
    out["load_e1"] = all(torch.equal(dict(m1.named_parameters())[n], truth[n]) for n in truth)
    local = {n: p.detach() for n, p in m2.named_parameters() if n in truth}
    try:
        slice_experts(m4, local)
        out["refused"] = ""
    except ValueError as e:
        out["refused"] = str(e)
    # torch DCP: the full tensors are identical on every rank, so its one copy is everyone's
    path = f"{tmp}/dcp"
    dcp.save({n: full[n] for n in truth}, checkpoint_id=path, process_group=group)
    loaded = {n: torch.empty(s, dtype=torch.float64) for n, s in expert_shapes(m4).items()}
    dcp.load(loaded, checkpoint_id=path, process_group=group)
    fresh = copy.deepcopy(other)
    vlmcp.hf.parallelize(fresh, cp_group, ep_group=expert_groups(group, 4)[0])
    load_experts(fresh, loaded)
    out["dcp_e4"] = all(torch.equal(gather_experts(fresh)[n], truth[n]) for n in truth)
    # the trap the helpers close: EP-local tensors saved under the parameters' names keep one EP rank's
    bad = f"{tmp}/dcp_local"
    dcp.save(local, checkpoint_id=bad, process_group=group)
    back = {n: torch.empty_like(t) for n, t in local.items()}
    dcp.load(back, checkpoint_id=bad, process_group=group)
    out["local_dcp_lost_experts"] = any(not torch.equal(back[n], local[n]) for n in local)
    # FSDP2: experts sharded over the expert-DP group, gathered and loaded through their DTensors
    from torch.distributed.tensor import DTensor

    for ep in (2, 4):
        ep_group, edp_group = expert_groups(group, ep)
        m = copy.deepcopy(other)
        vlmcp.hf.parallelize(m, cp_group, ep_group=ep_group)
        fully_shard_experts(m, edp_group, world)
        load_experts(m, full)
        sliced = slice_experts(m, {n: full[n] for n in truth})
        out[f"fsdp_e{ep}"] = all(torch.equal(gather_experts(m)[n], truth[n]) for n in truth)
        out[f"fsdp_e{ep}_dtensor"] = all(isinstance(t, DTensor) and t.device_mesh.size() == world // ep
                                         for t in sliced.values())
    # experts left to the decoder blocks' units over the world: their gradients would mix EP ranks'
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    ep_group, edp_group = expert_groups(group, 2)
    m = copy.deepcopy(other)
    vlmcp.hf.parallelize(m, cp_group, ep_group=ep_group)
    mesh = init_device_mesh("cpu", (world,))
    for block in m.modules():
        if type(block).__name__ in set(m._no_split_modules):
            fully_shard(block, mesh=mesh)
    out["fsdp_over_the_world"] = _refused(
        lambda: finish_ddp_gradients(m, cp_group, dp_cp_groups(group, 2)[1], expert_dp_group=edp_group))
    return out


def _refused(fn) -> str:
    try:
        fn()
    except (ValueError, TypeError) as e:
        return str(e)
    return ""


def refusals(group: dist.ProcessGroup) -> dict:
    """What ``parallelize(..., ep_group=)`` refuses, by name, each before changing the model."""
    from torch import nn

    ep_group, _ = expert_groups(group, 2)
    out = {}

    def attempt(key, model):
        before = {n: tuple(p.shape) for n, p in model.named_parameters()}
        out[key] = _refused(lambda: vlmcp.hf.parallelize(model, group, ep_group=ep_group))
        out[key + "_unchanged"] = (before == {n: tuple(p.shape) for n, p in model.named_parameters()}
                                   and getattr(model, "_vlmcp_hf", None) is None)

    class MyExperts(nn.Module):
        def forward(self, x, i, w):
            return x

    m = ep_model("qwen3_vl_moe")
    m.model.language_model.layers[1].mlp.experts = MyExperts()
    attempt("unknown_class", m)
    m = ep_model("qwen3_vl_moe")
    m.model.language_model.layers[1].mlp.experts = nn.ModuleList([nn.Linear(4, 4) for _ in range(4)])
    attempt("module_list", m)
    m = ep_model("qwen3_vl_moe")
    m.config.text_config.capacity_factor = 1.25
    attempt("capacity", m)
    m = ep_model("qwen3_vl_moe")
    m.model.language_model.layers[0].mlp.experts.has_bias = True
    attempt("bias", m)
    cfg = tiny_config("qwen3_vl_moe")
    cfg.text_config.num_experts = 3
    attempt("odd_count", tiny_model(cfg, torch.float64))
    m = ep_model("qwen3_vl_moe")
    m.model.language_model.layers[1].mlp.experts = tiny_model(cfg, torch.float64).model.language_model.layers[
        1].mlp.experts
    attempt("mixed_counts", m)
    attempt("dense", tiny_model("qwen3_vl", torch.float64))
    m = ep_model("qwen3_vl_moe")
    out["not_a_group"] = _refused(lambda: vlmcp.hf.parallelize(m, group, ep_group="ep"))
    # text-only and zero-token corners are in dispatch_exact; here the running model refuses a re-shard
    m = ep_model("qwen3_vl_moe")
    vlmcp.hf.parallelize(m, group, ep_group=ep_group)
    out["twice"] = _refused(lambda: vlmcp.hf.parallelize(m, group, ep_group=ep_group))
    return out
