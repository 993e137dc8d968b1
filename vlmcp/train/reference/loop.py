"""``vlmcp train``'s loop, run on every rank of a DP x CP world.

Each step every CP group takes one packed row of the built-in dataset (DP replicas
take consecutive rows), runs :func:`vlmcp.train.reference.step.forward_backward`, makes the
gradients exact with :func:`vlmcp.reduce_gradients` (sum over CP, mean over DP),
and steps AdamW. Rank 0 draws the progress bar, writes the metrics and the
checkpoints. Nothing random happens after initialization (no dropout, data is a
pure function of the data position), so a resumed run on CPU reproduces the
uninterrupted one exactly.

A SIGTERM or Ctrl-C on any rank (the launcher forwards its own; :mod:`vlmcp.train.stop`)
finishes the step, saves a checkpoint and ends the run cleanly: one all-reduce per step over the world carries
the flag, so every rank stops after the same step. A collective that times out ends the
rank with one line naming the step (Note [vlmcp stalled peers and orphaned ranks]).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import timedelta

import torch
import torch.distributed as dist

from vlmcp.attention import usp_groups
from vlmcp.data import VOCAB_SIZE, ShapesConfig, ShapesDataset, pack_rows
from vlmcp.grads import grad_norms, reduce_gradients
from vlmcp.layout import CostModel
from vlmcp.models import VLM, LLMConfig, VLMConfig
from vlmcp.report.metrics import MetricsWriter
from vlmcp.train.checkpoint import (
    Checkpoint,
    capture_rng_state,
    load_resume_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from vlmcp.train.faults import stall_guard
from vlmcp.train.groups import dp_cp_groups
from vlmcp.train.options import TORCH_DTYPES
from vlmcp.train.progress import ProgressBar
from vlmcp.train.reference.config import TrainConfig
from vlmcp.train.reference.step import forward_backward
from vlmcp.train.schedule import lr_at
from vlmcp.train.state import full_state, load_full_state
from vlmcp.train.stop import StopSignals, stop_signals
from vlmcp.vision import VisionConfig, place_vision

__all__ = ["check_resumable", "cost_model", "dataset_config", "model_config", "train_rank"]


def model_config(cfg: TrainConfig) -> VLMConfig:
    """The reference VLM sized by the run's flags."""
    llm = LLMConfig(vocab_size=VOCAB_SIZE, hidden=cfg.hidden, layers=cfg.layers, heads=cfg.heads,
                    kv_heads=cfg.kv_heads, mlp_hidden=2 * cfg.hidden)
    vision = VisionConfig(out_dim=cfg.hidden, patch_size=8, width=32, depth=2, heads=2,
                          mlp_hidden=64, projector_hidden=64)
    return VLMConfig(llm=llm, vision=vision)


def dataset_config(cfg: TrainConfig) -> ShapesConfig:
    """The built-in dataset of a run; raises if ``--seq-len`` cannot hold its longest sample."""
    data = ShapesConfig(seed=cfg.seed, patch_size=8)
    if cfg.seq_len < data.max_sample_len:
        raise ValueError(f"--seq-len {cfg.seq_len} is shorter than the longest built-in sample "
                         f"({data.max_sample_len} tokens)")
    return data


def cost_model(cfg: TrainConfig) -> CostModel:
    """``image_strategy="auto"``'s weights: this run's LLM shape, ``--flops-per-byte``.

    Every rank builds it from the same flags, so every rank makes the same choice
    (a per-rank measured value would let ranks disagree and hang).
    """
    return CostModel.for_transformer(hidden_size=cfg.hidden, mlp_ratio=2.0, kv_heads=cfg.kv_heads,
                                     head_dim=cfg.hidden // cfg.heads,
                                     itemsize=TORCH_DTYPES[cfg.dtype].itemsize,
                                     flops_per_byte=cfg.flops_per_byte,
                                     image_attention=cfg.image_attention)


# Fields a checkpoint must agree on to continue the same run (CP size, vision mode,
# attention backend and step count may change: the state is stored layout-free).
_RESUME_FIELDS = ("seed", "seq_len", "dp", "hidden", "layers", "heads", "kv_heads", "dtype")


def check_resumable(ckpt: Checkpoint, cfg: TrainConfig) -> None:
    """Raise if ``ckpt`` cannot continue the run ``cfg`` describes (the message names why)."""
    saved = ckpt.state["config"]
    changed = [f"--{f.replace('_', '-')} {saved.get(f)!r} -> {getattr(cfg, f)!r}"
               for f in _RESUME_FIELDS if saved.get(f) != getattr(cfg, f)]
    if changed:
        raise ValueError(f"cannot resume {ckpt.path}: it belongs to another run ({', '.join(changed)})")
    if ckpt.step > cfg.steps:
        raise ValueError(f"cannot resume {ckpt.path}: its step {ckpt.step} is past --steps {cfg.steps}")


def _resume(cfg: TrainConfig, model, optimizer, group, device: torch.device) -> tuple[int, int]:
    """Load the latest checkpoint on every rank; returns ``(start step, data position)``.

    Ranks must agree on the step: with a directory that is not shared (or lagging),
    ranks could otherwise continue from different parameters and a different number
    of remaining steps, and one would wait forever for the others. The command line
    reported skipped checkpoints already; ranks stay quiet.
    """
    ckpt = load_resume_checkpoint(cfg.checkpoint_dir)
    # on the group's device: NCCL reduces CUDA tensors only
    step = torch.tensor([-1 if ckpt is None else ckpt.step], dtype=torch.float64, device=device)
    lo, hi = step.clone(), step.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=group)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=group)
    if lo != hi:
        raise RuntimeError(f"ranks found different latest checkpoints in {cfg.checkpoint_dir} "
                           f"(steps {int(lo)} to {int(hi)}); is the directory shared by every rank?")
    if ckpt is None:
        return 0, 0
    check_resumable(ckpt, cfg)
    load_full_state(model, optimizer, ckpt.state)
    restore_rng_state(ckpt.state["rng"])
    return ckpt.step, int(ckpt.state["data_position"])


def train_rank(group: dist.ProcessGroup, cfg: TrainConfig,
               on_step: Callable[[int, int], None] | None = None) -> dict:
    """Run the whole training on this rank; returns a summary.

    Args:
        group: the world (DP x CP) group; the CP and DP groups are split from it.
        cfg: the run.
        on_step: called as ``on_step(rank in group, step)`` before each step (tests
            use it to kill a rank).

    Returns:
        ``start_step``, ``steps``, ``losses`` (per step, identical on every rank),
        ``loss_curve`` (rank 0), ``param_checksum`` (sum of this rank's parameters) and
        ``stopped`` (None, or the line saying where a SIGTERM or SIGINT stopped the run).

    Raises:
        vlmcp.train.faults.CollectiveTimeout: a peer did not answer within ``cfg.timeout``.
    """
    if dist.get_world_size(group) != cfg.world_size:
        raise ValueError(f"--cp {cfg.cp} x --dp {cfg.dp} = {cfg.world_size}, but the group has "
                         f"{dist.get_world_size(group)} ranks")
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" \
        else torch.device("cpu")
    timeout = timedelta(seconds=cfg.timeout)
    cp_group, dp_group = dp_cp_groups(group, cfg.cp, timeout)
    if cfg.usp_size is not None:
        usp_groups(cp_group, cfg.usp_size, timeout)  # every rank, here: new_group is collective over the job
    with stop_signals() as stop:  # from the start: a SIGTERM while loading still ends with a checkpoint
        return _train(group, cfg, on_step, device, cp_group, dp_group, stop)


def _train(group, cfg: TrainConfig, on_step, device, cp_group, dp_group, stop: StopSignals) -> dict:
    rank, cp_rank, dp_rank = dist.get_rank(group), dist.get_rank(cp_group), dist.get_rank(dp_group)
    dtype = TORCH_DTYPES[cfg.dtype]

    torch.manual_seed(cfg.seed)
    model = VLM(model_config(cfg)).to(device=device, dtype=dtype)
    place_vision(model.vision, mode=cfg.vision_mode, group=cp_group)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    dataset = ShapesDataset(dataset_config(cfg))
    start, position = _resume(cfg, model, optimizer, group, device) if cfg.resume else (0, 0)
    metrics = None
    if rank == 0 and cfg.metrics_jsonl:
        metrics = MetricsWriter(cfg.metrics_jsonl, resume_step=start if cfg.resume else None)
    bar = ProgressBar(cfg.steps, initial=start, enabled=rank == 0)
    parts = {"vision": list(model.vision.tower.parameters()),
             "projector": list(model.vision.projector.parameters()),
             "llm": list(model.llm.parameters())}
    costs = cost_model(cfg) if cfg.image_strategy == "auto" or cfg.sample_placement != "split" else None
    losses, strategies = [], []
    stopped = None
    for step in range(start, cfg.steps):
        with stall_guard(f"step {step + 1}"):
            loss, norms, plan, seconds, position = _step(cfg, model, optimizer, dataset, parts, costs, step,
                                                         position, (rank, dp_rank, cp_rank), cp_group,
                                                         dp_group, device, on_step)
            flag = torch.tensor([float(stop.flag), float(stop.interrupted)], dtype=torch.float64,
                                device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)  # every rank stops after the same step
        losses.append(loss)
        strategies.append(plan.image_strategy)
        tokens = cfg.seq_len * cfg.dp
        bar.update(step + 1, loss=loss, tokens=tokens)
        if metrics is not None:
            metrics.write({"step": step + 1, "loss": loss, "grad_norm_vision": norms["vision"],
                           "grad_norm_projector": norms["projector"], "grad_norm_llm": norms["llm"],
                           "tokens": tokens, "seconds": seconds})
        done = step + 1
        sigterm = bool(flag[0]) and done < cfg.steps
        if cfg.checkpoint_dir and (done == cfg.steps or sigterm or
                                   (cfg.checkpoint_every and done % cfg.checkpoint_every == 0)):
            with stall_guard(f"checkpoint of step {done}"):
                state = full_state(model, optimizer, cp_group)  # a collective: every rank joins
            if rank == 0:
                state.update(rng=capture_rng_state(), data_position=position, config=asdict(cfg))
                save_checkpoint(cfg.checkpoint_dir, done, state)
        if sigterm:
            where = f"checkpoint step_{done:08d}.pt; continue with --resume" if cfg.checkpoint_dir \
                else "no --checkpoint-dir, nothing saved"
            kind = "SIGINT" if flag[1] else "SIGTERM"
            stopped = f"{kind}: stopped after step {done} of {cfg.steps}, {where}"
            break
    bar.close()
    curve = None
    if metrics is not None:
        metrics.close()
        from vlmcp.report import plot_loss_curve  # matplotlib only at the end, on rank 0

        curve = str(plot_loss_curve(cfg.metrics_jsonl, cfg.loss_curve_png))
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    return {"start_step": start, "steps": cfg.steps, "losses": losses, "loss_curve": curve,
            "param_checksum": checksum, "image_strategies": strategies, "stopped": stopped}


def _step(cfg, model, optimizer, dataset, parts, costs, step, position, ranks, cp_group, dp_group, device,
          on_step):
    """One optimizer step; returns ``(DP-mean loss, gradient norms, the row's plan, seconds, next data
    position)``. ``ranks``: this rank in the world, DP and CP groups."""
    t0 = time.perf_counter()
    rank, dp_rank, cp_rank = ranks
    if on_step is not None:
        on_step(rank, step)
    rows = pack_rows(dataset, cfg.seq_len, position, cfg.dp)
    row = rows[dp_rank]
    plan = row.plan(cfg.cp, image_strategy=cfg.image_strategy, cost_model=costs,
                    sample_placement=cfg.sample_placement)
    for group_ in optimizer.param_groups:
        group_["lr"] = lr_at(cfg, step)
    optimizer.zero_grad(set_to_none=True)
    out = forward_backward(model, row, plan.for_rank(cp_rank), cp_group, backend=cfg.attention,
                           image_attention=cfg.image_attention, ulysses_size=cfg.usp_size)
    reduce_gradients(model, cp_group, dp_group)
    norms = grad_norms(parts, cp_group)
    optimizer.step()
    loss = out.mean.detach().double().reshape(1).to(device)
    dist.all_reduce(loss, group=dp_group)
    return float(loss) / cfg.dp, norms, plan, time.perf_counter() - t0, rows[-1].stop
