"""The DP x CP world of a ``Trainer`` run, and the two ``Accelerator`` methods that must see only DP.

:class:`~vlmcp.integrations.transformers.CPTrainerMixin` replaces, on its ``Accelerator``
instance, ``prepare_data_loader`` (sharded over the D data-parallel replicas, not the D*P
processes) and ``prepare_model`` (no DDP: vlmcp reduces the gradients itself): Note [vlmcp
Trainer integration: what vlmcp takes over from Trainer].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from vlmcp.train.groups import dp_cp_groups

__all__ = ["Mesh", "build_mesh", "prepare_data_loader_over_dp", "prepare_model_without_ddp"]


@dataclass(frozen=True, eq=False)
class Mesh:
    """The DP x CP groups of this rank (None: one process, no group)."""

    world: dist.ProcessGroup | None
    """All of Trainer's processes (torch.distributed's default group: accelerate's)."""
    cp_group: dist.ProcessGroup | None
    dp_group: dist.ProcessGroup | None
    cp_size: int
    dp_size: int
    dp_rank: int




def build_mesh(cp_size: int) -> Mesh:
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world % cp_size:
        raise ValueError(f"cp_size={cp_size} does not divide the {world} processes of the run")
    if world == 1:
        return Mesh(world=None, cp_group=None, dp_group=None, cp_size=1, dp_size=1, dp_rank=0)
    cp_group, dp_group = dp_cp_groups(dist.group.WORLD, cp_size)
    return Mesh(world=dist.group.WORLD, cp_group=cp_group if cp_size > 1 else None, dp_group=dp_group,
                 cp_size=cp_size, dp_size=world // cp_size, dp_rank=dist.get_rank(dp_group))


def prepare_data_loader_over_dp(accelerator, mesh_of, data_loader, device_placement=None,
                                 slice_fn_for_dispatch=None):
    """``Accelerator.prepare_data_loader`` with the DP replicas as the processes: every CP rank of a
    replica gets the same batches (the same sampler seed, the same shard)."""
    from accelerate.data_loader import prepare_data_loader

    mesh = mesh_of()
    if getattr(data_loader, "_is_accelerate_prepared", False):  # prepared here before (a second evaluate)
        if data_loader not in accelerator._dataloaders:
            accelerator._dataloaders.append(data_loader)
        return data_loader
    if device_placement is None:
        device_placement = accelerator.device_placement
    prepared = prepare_data_loader(
        data_loader, accelerator.device, num_processes=mesh.dp_size, process_index=mesh.dp_rank,
        split_batches=accelerator.split_batches, put_on_device=device_placement,
        rng_types=accelerator.rng_types.copy(), dispatch_batches=False, even_batches=accelerator.even_batches,
        slice_fn_for_dispatch=slice_fn_for_dispatch, use_seedable_sampler=accelerator.use_seedable_sampler,
        data_seed=accelerator.dataloader_config.data_seed, non_blocking=accelerator.non_blocking,
        use_stateful_dataloader=accelerator.use_stateful_dataloader)
    accelerator._dataloaders.append(prepared)
    return prepared


def prepare_model_without_ddp(original, model, device_placement=None, evaluation_mode=False):
    """accelerate's ``prepare_model`` without DDP: vlmcp reduces the gradients itself."""
    return original(model, device_placement=device_placement, evaluation_mode=True)
