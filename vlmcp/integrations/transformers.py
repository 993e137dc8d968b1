"""vlmcp inside transformers' ``Trainer``: :class:`CPTrainer`, and :class:`CPTrainerMixin` for its subclasses.

``pip install 'vlmcp[trainer]'`` (transformers 5, accelerate, TRL). Docs: docs/trainers.md.

Note [vlmcp Trainer integration: what vlmcp takes over from Trainer]
--------------------------------------------------------------------
``Trainer`` (transformers 5.24, accelerate 1.15) assumes that every process holds its own
batch and that DDP averages the gradients of all of them. Under CP the P ranks of a CP
group share one row, so the mixin takes over these places (each a ``Trainer`` method, or a
method of its ``Accelerator`` instance replaced on that instance), and nothing else::

    Trainer alone (D*P processes)                  CPTrainerMixin
    ---------------------------------------------  ---------------------------------------------
    the dataloader sharded over all D*P processes  sharded over DP only (accelerate's own
    (CP ranks get different rows: ring attention   prepare_data_loader with num_processes=D,
    mixes them; measured: gradient error 2.3)      process_index=dp_rank); shard_inputs checks it
    DDP over D*P: averages the CP shares (loss/P), no DDP (accelerate prepares the model in
    broadcasts rank 0's weights at wrap time       evaluation mode: autocast and compile only);
    (hidden_shard's slices: error 1.23), reduces   rank 0's weights broadcast once at set-up
    during backward                                (hidden_shard's slices within each DP group);
                                                   vlmcp.reduce_gradients after the step's last
                                                   backward: sum over CP, mean over DP, by rule
    compute_loss: the model's loss of the batch    shard_inputs -> vlmcp.hf.causal_lm_loss (the
                                                   model's forward, the head chunked: never the
                                                   logits), scaled to sum / num_items_in_batch * D
    num_items_in_batch: labels[..., 1:] of each    the packed row's targets (each sample shifted
    process, summed over D*P                       alone), summed over DP and accumulation
    clip_grad_norm_ of this process's gradients    the true norm (hidden_shard slices summed
    (before any CP reduction: P times too loose)   over CP), then clip_grads_with_norm_
    logs the mean over processes of their losses   each CP rank returns its CP group's loss, so
                                                   the mean over D*P processes is the true loss

so at DP=1 the logged losses and the weights are those of a plain ``Trainer`` on one process
with the same arguments and seed, and at DP=D those of a plain ``Trainer`` on D processes (to
float64 rounding; tests/test_trainer.py). Under accelerate's FSDP2 (``fsdp=...``,
``fsdp_config={"fsdp_version": 2}``) the model is ``fully_shard``-ed over all D*P ranks by
accelerate, the loss is scaled by P more (FSDP averages over D*P) and
:func:`vlmcp.finish_ddp_gradients` completes the rules after the step's last backward.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal, get_args

import torch
import torch.distributed as dist
from torch import nn

import vlmcp.hf
from vlmcp.deps import check_versions
from vlmcp.grads import (
    GradRule,
    finish_ddp_gradients,
    grad_norms,
    grad_rule,
    reduce_gradients,
    restore_grad_tags,
)
from vlmcp.integrations.dp_world import (
    Mesh,
    build_mesh,
    prepare_data_loader_over_dp,
    prepare_model_without_ddp,
)
from vlmcp.layout.plan import ImageStrategy
from vlmcp.layout.sample_placement import SamplePlacement
from vlmcp.vision.placement import VisionMode

try:
    from transformers import Trainer
except ImportError as err:  # pragma: no cover - the extra is missing
    raise ImportError("vlmcp.integrations.transformers needs transformers, accelerate and TRL: "
                      "pip install 'vlmcp[trainer]'") from err

__all__ = ["CPOptions", "CPTrainer", "CPTrainerMixin"]


@dataclass(frozen=True, kw_only=True)
class CPOptions:
    """How :class:`CPTrainerMixin` runs the model (the arguments of ``parallelize`` and ``shard_inputs``)."""

    attention: Literal["ring", "ulysses"] = "ring"
    """``vlmcp.cp_attention``'s backend."""
    vision_mode: VisionMode = "replicate"
    """Where image features are computed (Note [vlmcp HF vision placement])."""
    sample_placement: SamplePlacement = "split"
    """``shard_inputs``' ``sample_placement``."""
    image_strategy: ImageStrategy | Literal["auto"] = "replicate"
    """``shard_inputs``' ``image_strategy``."""
    check_same_row: bool = True
    """The row guard of ``shard_inputs`` (Note [vlmcp row guard: one row per CP group])."""
    loss_chunk_size: int | None = 4096
    """Target tokens per chunk of the LM head in :func:`vlmcp.hf.causal_lm_loss`; None: the full
    logits and :func:`vlmcp.cp_cross_entropy` (a LoRA-wrapped head, say)."""

    def __post_init__(self):
        choices = {"attention": ("ring", "ulysses"), "vision_mode": get_args(VisionMode),
                   "sample_placement": get_args(SamplePlacement),
                   "image_strategy": (*get_args(ImageStrategy), "auto"), "check_same_row": (True, False)}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"CPOptions.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        chunk = self.loss_chunk_size
        if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
            raise ValueError(f"CPOptions.loss_chunk_size must be a positive int or None, got {chunk!r}")


def _row_targets(labels: torch.Tensor, cu_seqlens: torch.Tensor | None) -> int:
    """Next-token targets of a batch: each sample's labels but its first (HF's shift, per sample)."""
    if cu_seqlens is None:
        return int((labels[..., 1:] != -100).sum())
    trained = labels.reshape(-1) != -100
    trained[cu_seqlens[:-1].long().to(trained.device)] = False
    return int(trained.sum())


class CPTrainerMixin:
    """Context parallelism for a ``transformers.Trainer`` subclass: ``class T(CPTrainerMixin, Trainer)``.

    Put it first among the bases (LLaMA-Factory's ``CustomSeq2SeqTrainer``, ms-swift's trainers,
    TRL's ``SFTTrainer``): it overrides ``compute_loss``, ``training_step``, ``prediction_step``
    and the gradient-norm and token-count hooks (Note [vlmcp Trainer integration: what vlmcp takes
    over from Trainer]). The batch must be one packed row with ``cu_seqlens``
    (:class:`vlmcp.integrations.conversations.ConversationCollator`).

    Args:
        cp_size: P, ranks per CP group (consecutive global ranks); the world must be a multiple.
        cp_options: :class:`CPOptions` (attention, vision mode, layout, row guard).
        *args, **kwargs: the trainer's own.

    Raises:
        ValueError: before training, for what it cannot run exactly (named with the reason):
            DeepSpeed, ``nn.DataParallel``, accelerate's own ``parallelism_config``, FSDP1,
            ``compute_loss_func``, label smoothing, a model parallelized already, and
            ``hidden_shard`` with checkpoints, FSDP or an optimizer built before the trainer.
    """

    def __init__(self, *args, cp_size: int = 1, cp_options: CPOptions | None = None, **kwargs) -> None:
        trl = any(c.__module__.split(".")[0] == "trl" for c in type(self).__mro__)
        check_versions("transformers", "accelerate", *(("trl",) if trl else ()))
        if isinstance(cp_size, bool) or not isinstance(cp_size, int) or cp_size < 1:
            raise ValueError(f"cp_size must be an int >= 1, got {cp_size!r}")
        options = CPOptions() if cp_options is None else cp_options
        if not isinstance(options, CPOptions):
            raise TypeError(f"cp_options must be a CPOptions, got {type(options).__name__}")
        self.cp_options = options
        self._vlmcp_mesh: Mesh | None = None
        super().__init__(*args, **kwargs)
        self._vlmcp_refuse()
        self._vlmcp_mesh = build_mesh(cp_size)
        self._vlmcp_parallelize()
        self._vlmcp_sync_weights()
        self.loss_is_scaled_for_ga = True  # normalized by the whole accumulated batch's targets
        self._vlmcp_logged: torch.Tensor | None = None

    # ---- set-up ---------------------------------------------------------------------------
    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()
        acc = self.accelerator
        mesh = lambda: self._vlmcp_mesh  # built after Trainer.__init__, read when a dataloader is made
        acc.prepare_data_loader = functools.partial(prepare_data_loader_over_dp, acc, mesh)
        if not self.is_fsdp_enabled:
            acc.prepare_model = functools.partial(prepare_model_without_ddp, acc.prepare_model)

    def _vlmcp_refuse(self) -> None:
        args, mode = self.args, self.cp_options.vision_mode
        why = None
        if self.is_deepspeed_enabled:
            why = "DeepSpeed reduces and partitions gradients itself; use FSDP2 or no sharding"
        elif args.n_gpu > 1:
            why = "nn.DataParallel (several GPUs in one process): launch one process per GPU (torchrun)"
        elif getattr(self.accelerator, "parallelism_config", None) is not None:
            why = ("accelerate's ParallelismConfig (its cp_size wraps torch's context_parallel, which knows "
                   "no images or packed samples); vlmcp's cp_size replaces it")
        elif self.is_fsdp_enabled and getattr(self.accelerator.state.fsdp_plugin, "fsdp_version", 1) != 2:
            why = "FSDP1 (flat parameters lose vlmcp's per-parameter gradient rules); set fsdp_version=2"
        elif self.is_fsdp_enabled and mode in ("hidden_shard", "broadcast", "scatter"):
            why = (f"vision_mode={mode!r} under FSDP: the projector slice of hidden_shard differs per CP "
                   "rank, and broadcast/scatter skip the ViT on some ranks, so FSDP's collectives would not "
                   "match")
        elif self.compute_loss_func is not None:
            why = "compute_loss_func reads whole-batch logits; under CP each rank holds its own slots only"
        elif args.label_smoothing_factor:
            why = "label smoothing is not implemented under CP"
        elif mode == "hidden_shard" and args.save_strategy != "no":
            why = ("hidden_shard: rank 0 would save (and resume) only its slice of the projector; set "
                   "save_strategy='no' or use another vision mode")
        elif mode == "hidden_shard" and self.optimizer is not None:
            why = "hidden_shard replaces the projector's last Linear: let the trainer build the optimizer"
        elif getattr(self.accelerator.unwrap_model(self.model), "_vlmcp_hf", None) is not None:
            why = "the model is parallelized already: pass it as loaded; the trainer parallelizes it"
        if self.accelerator.dispatch_batches:
            why = "dispatch_batches=True: rank 0 would split one batch over every process, CP ranks included"
        if why is not None:
            raise ValueError(f"{type(self).__name__}: {why}")

    def _vlmcp_parallelize(self) -> None:
        o = self.cp_options
        vlmcp.hf.parallelize(self.accelerator.unwrap_model(self.model), self._vlmcp_mesh.cp_group,
                             attention=o.attention, vision_mode=o.vision_mode,
                             check_same_row=o.check_same_row)

    def _vlmcp_sync_weights(self) -> None:
        """Every rank starts from global rank 0's weights, as DDP's wrap makes it (one broadcast per
        parameter, once); a PARTITIONED slice (hidden_shard) from the first DP replica of its CP rank."""
        mesh = self._vlmcp_mesh
        if mesh.dp_group is None:  # one process
            return
        model = self.accelerator.unwrap_model(self.model)
        restore_grad_tags(model)
        first_replica = dist.get_global_rank(mesh.dp_group, 0)
        with torch.no_grad():
            for p in model.parameters():
                if grad_rule(p) is GradRule.PARTITIONED:
                    dist.broadcast(p.data, src=first_replica, group=mesh.dp_group)
                else:
                    dist.broadcast(p.data, src=dist.get_global_rank(mesh.world, 0), group=mesh.world)

    # ---- what each step does ---------------------------------------------------------------
    def get_cp_size(self) -> int:
        return self._vlmcp_mesh.cp_size if self._vlmcp_mesh is not None else super().get_cp_size()

    def _vlmcp_row_loss(self, model: nn.Module, batch):
        """This rank's loss share of the row (:class:`vlmcp.CPLoss`): the one place the loss is chosen."""
        return vlmcp.hf.causal_lm_loss(model, batch, self._vlmcp_mesh.cp_group,
                                       chunk_size=self.cp_options.loss_chunk_size)

    def _vlmcp_batch(self, model: nn.Module, inputs: dict):
        inputs = dict(inputs)
        labels, cu = inputs.pop("labels", None), inputs.pop("cu_seqlens", None)
        if labels is None:
            raise ValueError(f"{type(self).__name__}: the batch has no labels (use vlmcp's "
                             "ConversationCollator)")
        if cu is None and inputs["input_ids"].shape[0] != 1:
            raise ValueError(f"{type(self).__name__}: a batch of {inputs['input_ids'].shape[0]} padded rows; "
                             "CP takes one packed row with cu_seqlens (ConversationCollator(processor, "
                             "pack=True))")
        o = self.cp_options
        batch = vlmcp.hf.shard_inputs(self.accelerator.unwrap_model(model), inputs, self._vlmcp_mesh.cp_group,
                                      labels=labels, cu_seqlens=cu, sample_placement=o.sample_placement,
                                      image_strategy=o.image_strategy)
        return batch, _row_targets(labels, cu)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """This rank's share of ``sum(token losses) / num_items_in_batch``, scaled as DDP would want it."""
        if return_outputs:
            raise NotImplementedError(f"{type(self).__name__}: no model outputs under CP (each rank holds "
                                      "the logits of its own slots); evaluate with prediction_loss_only=True")
        batch, targets = self._vlmcp_batch(model, inputs)
        res = self._vlmcp_row_loss(model, batch)
        scale = self._vlmcp_scale(targets, num_items_in_batch)
        logged = res.mean.detach() * scale
        if self.is_fsdp_enabled:
            scale *= self._vlmcp_mesh.cp_size  # FSDP averages over D*P ranks: Note [vlmcp gradient rules]
        self._vlmcp_logged = logged
        return res.loss * scale

    def _vlmcp_scale(self, targets: int, num_items_in_batch) -> float:
        """What turns the row's mean token loss into Trainer's per-process loss: ``targets /
        num_items_in_batch``, times D when the items are counted over DP (DDP's mean over D then
        gives the global token mean, as in Trainer's own ``compute_loss``)."""
        if num_items_in_batch is None:
            return 1.0
        scale = targets / max(float(num_items_in_batch), 1.0)
        if self.args.average_tokens_across_devices:
            scale *= self._vlmcp_mesh.dp_size  # the DP mean of reduce_gradients (or FSDP) divides by D
        return scale

    def training_step(self, model, inputs, num_items_in_batch=None):
        """The trainer's step (backward included), then the exact gradients after the step's last
        micro-batch; returns the CP group's loss (the same on its ranks), for logging."""
        super().training_step(model, inputs, num_items_in_batch)
        if self.accelerator.sync_gradients:
            mesh, unwrapped = self._vlmcp_mesh, self.accelerator.unwrap_model(model)
            if self.is_fsdp_enabled:
                finish_ddp_gradients(unwrapped, mesh.cp_group, mesh.dp_group)
            else:
                reduce_gradients(unwrapped, mesh.cp_group, mesh.dp_group)
        return self._vlmcp_logged

    def _get_num_items_in_batch(self, batch_samples, device):
        """The targets of the step's micro-batches, over DP (every CP rank of a replica holds the same)."""
        mesh = self._vlmcp_mesh
        if not batch_samples:
            return None
        count = sum(_row_targets(b["labels"], b.get("cu_seqlens")) for b in batch_samples)
        total = torch.tensor(count, dtype=torch.int64, device=self.args.device)
        if self.args.average_tokens_across_devices and mesh.dp_size > 1:
            dist.all_reduce(total, group=mesh.dp_group)
        return total.to(device)

    def _vlmcp_grad_norm(self, model) -> torch.Tensor:
        params = [p for p in self.accelerator.unwrap_model(model).parameters() if p.grad is not None]
        norm = grad_norms({"all": params}, self._vlmcp_mesh.cp_group)["all"]
        dtype = params[0].grad.dtype if params else torch.float32
        return torch.tensor(norm, dtype=dtype, device=self.args.device)

    def _clip_grad_norm(self, model):
        if self.is_fsdp_enabled:  # DTensor gradients: accelerate's norm is the true one after finishing
            return super()._clip_grad_norm(model)
        norm = self._vlmcp_grad_norm(model)
        params = [p for p in self.accelerator.unwrap_model(model).parameters() if p.grad is not None]
        torch.nn.utils.clip_grads_with_norm_(params, self.args.max_grad_norm, norm)
        return norm

    def _get_grad_norm(self, model, grad_norm=None):
        if grad_norm is None and not self.is_fsdp_enabled:
            grad_norm = self._vlmcp_grad_norm(model)
        return super()._get_grad_norm(model, grad_norm)

    def _track_num_input_tokens(self, inputs):
        if self.args.include_num_input_tokens_seen == "no":
            return
        before = self.state.num_input_tokens_seen
        super()._track_num_input_tokens(inputs)  # summed over every process: each replica counted P times
        self.state.num_input_tokens_seen = before + (self.state.num_input_tokens_seen - before) // max(
            self._vlmcp_mesh.cp_size, 1)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Evaluation: the batch's loss as Trainer's (token mean over the DP replicas' batches), no logits."""
        if not prediction_loss_only and self.compute_metrics is not None:
            raise NotImplementedError(f"{type(self).__name__}: compute_metrics needs logits, and under CP "
                                      "each rank holds its own slots only; evaluate the loss (no "
                                      "compute_metrics)")
        inputs = self._prepare_inputs(inputs)
        num_items = self._get_num_items_in_batch([inputs], self.args.device)  # as Trainer's prediction_step
        with torch.no_grad(), self.compute_loss_context_manager():
            batch, targets = self._vlmcp_batch(model, inputs)
            res = self._vlmcp_row_loss(model, batch)
        return res.mean.detach() * self._vlmcp_scale(targets, num_items), None, None

    def save_model(self, output_dir=None, _internal_call=False):
        if self.cp_options.vision_mode == "hidden_shard" and self._vlmcp_mesh.cp_size > 1:
            raise ValueError(f"{type(self).__name__}: hidden_shard holds a slice of the projector on each "
                             "rank; save_model would write rank 0's slice")
        return super().save_model(output_dir, _internal_call)


class CPTrainer(CPTrainerMixin, Trainer):
    """``transformers.Trainer`` with context parallelism: ``CPTrainer(model, args, ..., cp_size=2)``.

    See :class:`CPTrainerMixin` for the arguments and Note [vlmcp Trainer integration: what vlmcp
    takes over from Trainer] for what it changes. Feed it
    :class:`~vlmcp.integrations.conversations.ConversationDataset` and
    :class:`~vlmcp.integrations.conversations.ConversationCollator` (one packed row per batch).
    """
