"""Rank functions of the fault tests (module level: spawned ranks import them by name)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

import vlmcp
from tests import rows
from vlmcp.attention import cp_attention, reference_attention, reference_mask, usp_groups
from vlmcp.train.groups import dp_cp_groups

NAN_SAMPLES = ["t3 i5 t6", "i4 t9", (0, 7)]
"""Three packed samples (text before an image, an image first, text only); their text is
not a multiple of 2P, so the plans have padding slots."""
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 8
NAN_SPOTS = (("q", 10, 1), ("k", 10, 0), ("v", 10, 1), ("k", 5, 1), ("q", 4, 0))
"""``(tensor, global position, head)`` of the one NaN of each case: text of sample 0 at 10,
an image token (replicated on every rank) at 4 and 5."""


def nan_inputs(spot, dtype):
    """The row, ``q, k, v`` with one NaN, and the ``(L, H)`` outputs it must make NaN.

    A NaN query makes its own row and head NaN; a NaN key or value makes NaN every
    query row that attends to it, in the query heads of its key head (GQA).
    """
    is_image, cu, ids = rows.make_row(NAN_SAMPLES)
    L, g = is_image.numel(), HEADS // KV_HEADS
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(L, h, HEAD_DIM, generator=gen, dtype=torch.float64).to(dtype)
               for h in (HEADS, KV_HEADS, KV_HEADS))
    name, j, h = spot
    {"q": q, "k": k, "v": v}[name][j, h] = float("nan")
    affected = torch.zeros(L, HEADS, dtype=torch.bool)
    if name == "q":
        affected[j, h] = True
    else:
        seen = reference_mask(is_image, cu)[:, j]
        affected[:, h * g:(h + 1) * g] = seen[:, None]
    return is_image, cu, ids, q, k, v, affected


def check_nan_output(out, lse, positions, spot, is_image, cu, ids, q, k, v, affected) -> None:
    """The affected outputs are NaN (lse too, unless the NaN is a value), padding is exactly 0
    (lse -inf), and the samples the NaN cannot reach equal one process's attention."""
    valid = positions >= 0
    pos = positions[valid]
    o, s, hit = out[valid].double(), lse[valid].double(), affected[pos]
    assert bool(o[hit].isnan().all()), (spot, "an affected output is not NaN")
    if spot[0] != "v":  # the log-sum-exp depends on the scores only
        assert bool(s[hit].isnan().all()), (spot, "an affected lse is not NaN")
    assert bool((out[~valid] == 0).all()) and bool(lse[~valid].isneginf().all()), (spot, "padding not 0")
    sample = torch.searchsorted(cu, torch.arange(is_image.numel()), right=True) - 1
    other = sample[pos] != sample[spot[1]]
    ref, ref_lse = reference_attention(*(t.double().nan_to_num() for t in (q, k, v)), is_image, cu,
                                       image_ids=ids)
    tol = 1e-2 if out.dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(o[other], ref[pos][other], rtol=tol, atol=tol)
    torch.testing.assert_close(s[other], ref_lse[pos][other], rtol=tol, atol=tol)


def nan_grid(group, dtypes) -> tuple[int, list[float]]:
    """NaN cases on every backend: ring, Ulysses and USP (U = 2) over the whole group, and ring
    and Ulysses on CP subgroups of two ranks. Returns the number of checked calls, and the
    timeouts (seconds) of the world group and of the subgroups vlmcp made of it (CP, DP,
    Ulysses, ring)."""
    from vlmcp.attention.usp_groups import group_timeout

    sub, dp = dp_cp_groups(group, 2)
    usp = usp_groups(group, 2)
    timeouts = [group_timeout(g).total_seconds() for g in (group, sub, dp, usp.ulysses, usp.ring)]
    runs = [(group, "ring", None), (group, "ulysses", None), (group, "usp", 2),
            (sub, "ring", None), (sub, "ulysses", None)]
    checked = 0
    for cp_group, backend, u in runs:
        rank = dist.get_rank(cp_group)
        for dtype in (getattr(torch, name) for name in dtypes):
            for spot in NAN_SPOTS:
                is_image, cu, ids, q, k, v, affected = nan_inputs(spot, dtype)
                plan = vlmcp.plan_cp(is_image, dist.get_world_size(cp_group), cu, image_ids=ids)
                shard = plan.for_rank(rank)
                out, lse = cp_attention(shard.shard(q), shard.shard(k), shard.shard(v), shard, cp_group,
                                        backend, return_lse=True, ulysses_size=u)
                check_nan_output(out, lse, shard.positions, spot, is_image, cu, ids, q, k, v, affected)
                checked += 1
    return checked, timeouts


def raise_os_error(group):
    if dist.get_rank(group) == 1:
        raise OSError(28, "No space left on device: cannot write checkpoint /x/step_00000002.pt")
    dist.barrier(group=group)


def dcp_config(directory, **kw):
    """An HF run's config whose checkpoints go to ``directory`` (FSDP: DCP checkpoints)."""
    from vlmcp.train.specs.hf.config import HFTrainConfig

    directory = Path(directory)
    base = dict(model=str(directory / "model"), data=str(directory / "data.jsonl"),
                output_dir=str(directory / "out"), checkpoint_dir=str(directory), fsdp=True, steps=2,
                seq_len=64)
    return HFTrainConfig(**{**base, **kw})


def dcp_round(group, directory, mode):
    """FSDP over the group: ``"save"`` trains two steps and checkpoints each (returns the parameter
    sums after each); ``"load"`` resumes (returns the step and the parameter sum)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from vlmcp.train.checkpoint.run import load_run_checkpoint, save_run_checkpoint

    cfg = dcp_config(directory, resume=mode == "load")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(group),)))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)

    def param_sum():
        return float(sum(p.full_tensor().double().sum() for p in model.parameters()))

    if mode == "load":
        step, _ = load_run_checkpoint(cfg, model, opt, group, torch.device("cpu"))
        return step, param_sum()
    sums = []
    for step in (1, 2):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        save_run_checkpoint(cfg, model, opt, step, 10 * step, group, group)
        sums.append(param_sum())
    return sums


def hf_sigterm_in_last_step(group, cfg, index):
    """``hf_rank`` with a SIGTERM to every rank while it prepares the last step (exactly then:
    the handler runs before the step's all-reduce reads the flag)."""
    import os
    import signal

    from tests.train_cases import hf_rank
    from vlmcp.data.hf.rows import RowLoader

    calls = {"n": 0}
    original = RowLoader.next

    def next_row(self):
        calls["n"] += 1
        if calls["n"] == cfg.steps:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self)

    RowLoader.next = next_row
    try:
        return hf_rank(group, cfg, index)
    finally:
        RowLoader.next = original


def dcp_refusals(group, directories):
    """Resume from each crafted checkpoint directory (each holds one FSDP checkpoint of
    :func:`dcp_round`): what each rank raised. Then past every check: the allow-list reader and
    planner inside ``dcp.load`` itself (a file swapped in after the checks)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from vlmcp.train.checkpoint.dcp_reader import SafeLoadPlanner, SafeReader
    from vlmcp.train.checkpoint.run import load_run_checkpoint

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(group),)))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    refused = []
    for directory in directories:
        try:
            load_run_checkpoint(dcp_config(directory, resume=True), model, opt, group, torch.device("cpu"))
            refused.append(None)
        except ValueError as err:
            refused.append(str(err))
    inside = []
    for directory in directories:
        path = Path(directory) / "step_00000001"
        try:
            dcp.load({"optimizer": get_state_dict(model, opt)[1]}, checkpoint_id=path, process_group=group,
                     storage_reader=SafeReader(path), planner=SafeLoadPlanner(allow_partial_load=True))
            inside.append(None)
        except CheckpointException as err:  # every rank's errors, on every rank (a BaseException)
            inside.append(str(err))
    return refused, inside


def _file_size_limit(limit: int):
    """From here on this process cannot write a file beyond ``limit`` bytes: a real write error
    from the kernel (EFBIG, errno 27), like a full disk (ENOSPC) without needing one."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of killing the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def dcp_full_disk(group, directory):
    """An FSDP checkpoint save whose rank 1 cannot write its shard."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from vlmcp.train.checkpoint.run import save_run_checkpoint

    cfg = dcp_config(directory)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64))
    fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(group),)))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    if dist.get_rank(group) == 1:
        _file_size_limit(1024)
    save_run_checkpoint(cfg, model, opt, 1, 10, group, group)


def final_model_full_disk(group, cfg):
    """The final save of ``cfg.model``'s weights, whose ``model.safetensors`` meets a full file
    system inside safetensors' own (Rust) writer on rank 0."""
    import transformers.modeling_utils as modeling
    from transformers import AutoModelForImageTextToText

    from vlmcp.data.hf.processor import load_processor
    from vlmcp.train.specs.hf.final_model import save_trained_model

    model = AutoModelForImageTextToText.from_pretrained(cfg.model)
    real = modeling.safe_save_file

    def save_file(tensors, filename, metadata=None):
        _file_size_limit(4096)  # the config and processor files before it fit
        return real(tensors, filename, metadata=metadata)

    modeling.safe_save_file = save_file
    save_trained_model(cfg, model, load_processor(cfg.model), group, group, step=1)


def lock_taker(path, barrier, results, rounds):
    """A run that, in each of ``rounds`` rounds, tries to take the lock of ``path`` at the same moment
    as the others (``barrier``), reports whether it won, holds it until every taker has tried, and
    lets it go."""
    import os
    import warnings

    from vlmcp.train.lock import RunLock, RunLocked

    warnings.simplefilter("ignore")  # the winner's "taking over" warning
    for round_ in range(rounds):
        barrier.wait()
        lock = RunLock(path, "--output-dir")
        try:
            lock.acquire()
            results.put((round_, os.getpid(), True))
        except RunLocked:
            results.put((round_, os.getpid(), False))
        barrier.wait()  # every taker has tried; the parent looks at the file
        barrier.wait()
        lock.release()
        barrier.wait()  # released; the parent plants the next stale lock
