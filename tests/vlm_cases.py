"""Rank functions for the end-to-end VLM tests (module level: they are pickled by name)."""

from vlmcp.debug.parity.vlm import ParityCase, parity_case


def parity_grid(group, cases):
    return [parity_case(group, ParityCase(**case)) for case in cases]


def double_count_trap(group):
    """allreduce_hook: summing grads over CP counts the vision gradient P times; reduce_gradients doesn't."""
    import copy

    import torch
    import torch.distributed as dist

    from vlmcp.debug.parity.vlm import builtin_row, verify_model_config
    from vlmcp.grads import reduce_gradients
    from vlmcp.models import VLM
    from vlmcp.train.specs.reference.step import forward_backward
    from vlmcp.vision import place_vision

    row, P = builtin_row(), dist.get_world_size(group)
    torch.manual_seed(0)
    ref = VLM(verify_model_config()).double()
    naive, exact = copy.deepcopy(ref), copy.deepcopy(ref)
    forward_backward(ref, row, row.plan(1).for_rank(0), None)
    plan = row.plan(P)
    for model in (naive, exact):
        place_vision(model.vision, mode="allreduce_hook", group=group)
    # A copy of a placed model (EMA, eval) re-creates its parameters, which drops their
    # rule tags; the placement keeps them, so the copy still reduces exactly.
    exact = copy.deepcopy(exact)
    for model in (naive, exact):
        forward_backward(model, row, plan.for_rank(dist.get_rank(group)), group)
    for p in naive.parameters():  # the classic recipe: all-reduce every gradient over CP
        dist.all_reduce(p.grad, group=group)
    reduce_gradients(exact, group)
    ratios, exact_err, llm_naive_err = [], 0.0, 0.0
    ref_params = dict(ref.named_parameters())
    for (name, pn), pe in zip(naive.named_parameters(), exact.parameters(), strict=True):
        g = ref_params[name].grad
        if name.startswith("vision.") and g.norm() > 0:
            ratios.append(float(pn.grad.norm() / g.norm()))
        if name.startswith("llm."):
            llm_naive_err = max(llm_naive_err, float((pn.grad - g).norm() / g.norm()))
        exact_err = max(exact_err, float((pe.grad - g).norm() / g.norm().clamp(min=1e-300)))
    return min(ratios), max(ratios), exact_err, llm_naive_err


def bad_image_count(group):
    """Too few images for the plan: every rank raises the same error before any collective."""
    import torch
    import torch.distributed as dist

    from vlmcp.debug.parity.vlm import builtin_row, verify_model_config
    from vlmcp.models import VLM
    from vlmcp.train.specs.reference.step import forward_backward
    from vlmcp.vision import place_vision

    row = builtin_row()
    torch.manual_seed(0)
    model = VLM(verify_model_config())
    place_vision(model.vision, mode="scatter", group=group)
    plan = row.plan(dist.get_world_size(group))
    broken = type(row)(**{**row.__dict__, "images": row.images[:1]})
    try:
        forward_backward(model, broken, plan.for_rank(dist.get_rank(group)), group)
    except ValueError as err:
        message = str(err)
    else:
        message = None
    t = torch.ones(1)
    dist.all_reduce(t, group=group)  # the group is still usable: nobody entered a collective
    return message, float(t)


def real_ddp_convention(group, modes):
    """torch DDP over the (DP x) CP group with the loss scaled by P: exact in every vision mode.

    DDP averages every gradient over the P ranks; with the loss scaled by P the shares
    come out exact, and ``finish_ddp_gradients`` fixes the rest (FULL divided by P,
    PARTITIONED ones kept out of DDP). Returns the worst relative error per mode.
    """
    import copy

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from vlmcp.debug.parity.vlm import builtin_row, verify_model_config
    from vlmcp.grads import ddp_ignored_params, finish_ddp_gradients, local_part
    from vlmcp.models import VLM
    from vlmcp.train.specs.reference.step import forward_backward
    from vlmcp.vision import place_vision

    row, P = builtin_row(), dist.get_world_size(group)
    torch.manual_seed(0)
    ref = VLM(verify_model_config()).double()
    base = copy.deepcopy(ref)
    forward_backward(ref, row, row.plan(1).for_rank(0), None)
    plan = row.plan(P)
    # DDP gets a communicator of its own: its bucket all-reduces run during backward, in an
    # order that differs between ranks (broadcast/scatter graphs differ), while the
    # placement's dual collectives run on the CP group; sharing one would deadlock.
    ddp_group = dist.new_group(dist.get_process_group_ranks(group))
    errors = {}
    for mode in modes:
        model = copy.deepcopy(base)
        place_vision(model.vision, mode=mode, group=group)
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ddp_ignored_params(model))
        ddp = DistributedDataParallel(model, process_group=ddp_group,
                                      find_unused_parameters=mode in ("broadcast", "scatter"))
        forward_backward(ddp, row, plan.for_rank(dist.get_rank(group)), group, loss_scale=P)
        finish_ddp_gradients(model, group)
        ref_grads = dict(ref.named_parameters())
        errors[mode] = max(
            float((p.grad - local_part(p, ref_grads[n].grad)).norm() / ref_grads[n].grad.norm())
            for n, p in model.named_parameters())
    return errors


def copied_model_state(group):
    """A deep copy of a hidden_shard model still saves full tensors and loads its own slice."""
    import copy

    import torch
    import torch.distributed as dist

    from vlmcp.debug.parity.vlm import verify_model_config
    from vlmcp.models import VLM
    from vlmcp.train.checkpoint.state import full_state, load_full_state
    from vlmcp.vision import place_vision

    torch.manual_seed(0)
    full = VLM(verify_model_config())
    model = copy.deepcopy(full)
    place_vision(model.vision, mode="hidden_shard", group=group)
    clone = copy.deepcopy(model)  # drops the parameters' rule tags; the placement keeps them
    state = full_state(clone, torch.optim.AdamW(clone.parameters()), group)
    same = all(torch.equal(state["model"][n], p) for n, p in full.named_parameters())
    fresh = VLM(verify_model_config())
    place_vision(fresh.vision, mode="hidden_shard", group=group)
    fresh_copy = copy.deepcopy(fresh)
    load_full_state(fresh_copy, torch.optim.AdamW(fresh_copy.parameters()), state)
    rank, P = dist.get_rank(group), dist.get_world_size(group)
    fc2 = fresh_copy.vision.projector.fc2.weight
    rows = full.vision.projector.fc2.weight.shape[0] // P
    own = torch.equal(fc2, full.vision.projector.fc2.weight[rank * rows:(rank + 1) * rows])
    return same, own


def interleaved_rows():
    """Chat-layout rows: (0) text around and between images, two images back to back, a sample
    that ends in an image, a text-only sample; (1) one 1-token image opening a sample."""
    import torch

    from vlmcp.data import random_row

    rows = [[[5, (16, 16), 3, (16, 24), (8, 16), 9], [7], [2, (24, 16), 6, (16, 8)]],
            [[(8, 8), 25], [6]]]
    return [random_row(samples, 8, torch.Generator().manual_seed(3 + i)) for i, samples in enumerate(rows)]


def interleaved_parity(group, modes):
    """Every vision mode on the interleaved rows, against one process."""
    from vlmcp.debug.parity.vlm import ParityCase, parity_case

    chat, single = interleaved_rows()
    assert len(chat.images) == 5 and chat.image_ids.max() == 4
    out = []
    for m in modes:
        out.append(parity_case(group, ParityCase(vision_mode=m, dtype="float64"), row=chat))
        out.append(parity_case(group, ParityCase(vision_mode=m, attention="ulysses", dtype="float64",
                                                 image_attention="bidirectional"), row=chat))
        out.append(parity_case(group, ParityCase(vision_mode=m, attention="ulysses", dtype="float32",
                                                 image_strategy="shard"), row=chat))
    out.append(parity_case(group, ParityCase(vision_mode="scatter", dtype="float64"), row=single))
    out.append(parity_case(group, ParityCase(vision_mode="broadcast", dtype="float64",
                                             image_strategy="shard"), row=single))
    out.append(parity_case(group, ParityCase(vision_mode="hidden_shard", dtype="float32",
                                             image_attention="bidirectional"), row=single))
    return out


def placement_parity(group, modes):
    """Whole-sample and auto placement (issue 12) in every vision mode, against one process."""
    import torch

    from vlmcp.data import random_row
    from vlmcp.debug.parity.vlm import ParityCase, parity_case

    samples = [[3, (16, 16), 30, (8, 8), 40], [5, (8, 8), 4], [6], [2, (8, 16), 3], [7], [4, (8, 8), 2]]
    row = random_row(samples, 8, torch.Generator().manual_seed(5))
    P = torch.distributed.get_world_size(group)
    placements = {p: row.plan(P, sample_placement=p).whole.tolist() for p in ("whole", "auto")}
    out = []
    for m in modes:
        out.append(parity_case(group, ParityCase(vision_mode=m, dtype="float64", sample_placement="auto"),
                               row=row))
        out.append(parity_case(group, ParityCase(vision_mode=m, attention="ulysses", dtype="float64",
                                                 sample_placement="whole"), row=row))
    return placements, out
