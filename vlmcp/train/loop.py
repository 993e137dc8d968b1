"""``vlmcp train``'s loop, run on every rank of a DP x CP world.

Each step every CP group takes one packed row of the built-in dataset (DP replicas
take consecutive rows), runs :func:`vlmcp.train.step.forward_backward`, makes the
gradients exact with :func:`vlmcp.reduce_gradients` (sum over CP, mean over DP),
and steps AdamW. Rank 0 draws the progress bar, writes the metrics and the
checkpoints. Nothing random happens after initialization (no dropout, data is a
pure function of the data position), so a resumed run on CPU reproduces the
uninterrupted one exactly.
"""

from __future__ import annotations

import math
import os
import signal
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from vlmcp.data import VOCAB_SIZE, ShapesConfig, ShapesDataset, pack_rows
from vlmcp.grads import grad_norms, reduce_gradients
from vlmcp.layout import plan_cp
from vlmcp.models import VLM, LLMConfig, VLMConfig
from vlmcp.train.checkpoint import (
    capture_rng_state,
    load_latest_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from vlmcp.train.config import TrainConfig
from vlmcp.train.progress import MetricsWriter, ProgressBar
from vlmcp.train.state import full_state, load_full_state
from vlmcp.train.step import forward_backward
from vlmcp.vision import VisionConfig, place_vision

__all__ = ["dataset_config", "lr_at", "model_config", "train_rank"]

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
WARMUP_STEPS = 5


def model_config(cfg: TrainConfig) -> VLMConfig:
    """The reference VLM sized by the run's flags."""
    llm = LLMConfig(vocab_size=VOCAB_SIZE, hidden=cfg.hidden, layers=cfg.layers, heads=cfg.heads,
                    kv_heads=cfg.kv_heads, mlp_hidden=2 * cfg.hidden)
    vision = VisionConfig(out_dim=cfg.hidden, patch_size=8, width=32, depth=2, heads=2,
                          mlp_hidden=64, projector_hidden=64)
    return VLMConfig(llm=llm, vision=vision)


def dataset_config(cfg: TrainConfig) -> ShapesConfig:
    return ShapesConfig(seed=cfg.seed, patch_size=8)


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up, then cosine decay to 10% (a pure function of the step: resumable)."""
    if step < WARMUP_STEPS:
        return cfg.lr * (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / max(1, cfg.steps - WARMUP_STEPS)
    return cfg.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress))))


def _mesh_groups(cfg: TrainConfig, device_type: str):
    world = dist.get_world_size()
    if world != cfg.world_size:
        raise ValueError(f"--cp {cfg.cp} x --dp {cfg.dp} = {cfg.world_size}, but the world has {world} ranks")
    mesh = init_device_mesh(device_type, (cfg.dp, cfg.cp), mesh_dim_names=("dp", "cp"))
    return mesh.get_group("cp"), mesh.get_group("dp")


def train_rank(group: dist.ProcessGroup, cfg: TrainConfig, fault: tuple[int, int] | None = None) -> dict:
    """Run the whole training on this rank; returns a summary (identical on every rank).

    Args:
        group: the world (DP x CP) group; the CP and DP groups are built from it.
        cfg: the run.
        fault: ``(rank, step)``: that rank kills itself (SIGKILL) at that step, to
            test that the others fail fast. For tests only.
    """
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" \
        else torch.device("cpu")
    cp_group, dp_group = _mesh_groups(cfg, device.type)
    rank, cp_rank, dp_rank = dist.get_rank(group), dist.get_rank(cp_group), dist.get_rank(dp_group)
    dtype = _DTYPES[cfg.dtype]

    torch.manual_seed(cfg.seed)
    model = VLM(model_config(cfg)).to(device=device, dtype=dtype)
    place_vision(model.vision, mode=cfg.vision_mode, group=cp_group)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    dataset = ShapesDataset(dataset_config(cfg))
    start, position = 0, 0
    if cfg.resume:
        ckpt = load_latest_checkpoint(cfg.checkpoint_dir)
        if ckpt is not None:
            load_full_state(model, optimizer, ckpt.state)
            restore_rng_state(ckpt.state["rng"])
            start, position = ckpt.step, int(ckpt.state["data_position"])
    metrics = None
    if rank == 0 and cfg.metrics_jsonl:
        metrics = MetricsWriter(cfg.metrics_jsonl, resume_step=start if cfg.resume else None)
    bar = ProgressBar(cfg.steps, initial=start, enabled=rank == 0)
    parts = {"vision": list(model.vision.tower.parameters()),
             "projector": list(model.vision.projector.parameters()),
             "llm": list(model.llm.parameters())}
    losses = []
    for step in range(start, cfg.steps):
        t0 = time.perf_counter()
        if fault is not None and fault == (rank, step):
            os.kill(os.getpid(), signal.SIGKILL)
        rows = pack_rows(dataset, cfg.seq_len, position, cfg.dp)
        row, position = rows[dp_rank], rows[-1].stop
        plan = plan_cp(row.is_image, cfg.cp, row.cu_seqlens)
        for group_ in optimizer.param_groups:
            group_["lr"] = lr_at(cfg, step)
        optimizer.zero_grad(set_to_none=True)
        out = forward_backward(model, row, plan.for_rank(cp_rank), cp_group, backend=cfg.attention,
                               image_attention=cfg.image_attention)
        reduce_gradients(model, cp_group, dp_group)
        norms = grad_norms(parts, cp_group)
        optimizer.step()
        loss = out.mean.detach().double().reshape(1).to(device)
        dist.all_reduce(loss, group=dp_group)
        loss = float(loss) / cfg.dp
        losses.append(loss)
        seconds = time.perf_counter() - t0
        tokens = cfg.seq_len * cfg.dp
        bar.update(step + 1, loss=loss, tokens=tokens)
        if metrics is not None:
            metrics.write({"step": step + 1, "loss": loss, "grad_norm_vision": norms["vision"],
                           "grad_norm_projector": norms["projector"], "grad_norm_llm": norms["llm"],
                           "tokens": tokens, "seconds": seconds})
        done = step + 1
        if cfg.checkpoint_dir and (done == cfg.steps or
                                   (cfg.checkpoint_every and done % cfg.checkpoint_every == 0)):
            state = full_state(model, optimizer, cp_group)  # a collective: every rank joins
            if rank == 0:
                state.update(rng=capture_rng_state(), data_position=position, config=asdict(cfg))
                save_checkpoint(cfg.checkpoint_dir, done, state)
    bar.close()
    curve = None
    if metrics is not None:
        metrics.close()
        from vlmcp.report import plot_loss_curve  # matplotlib only at the end, on rank 0

        curve = str(plot_loss_curve(cfg.metrics_jsonl, Path(cfg.metrics_jsonl).with_suffix(".png")))
    return {"start_step": start, "steps": cfg.steps, "losses": losses, "loss_curve": curve}
