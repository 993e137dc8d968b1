"""Rank functions for the Trainer integration tests (importable by name from spawned ranks).

Each spawned group runs a whole grid: transformers' ``Trainer`` and accelerate keep one
distributed state per process, so the one-process reference runs in a group of its own.
Every rank sets the environment accelerate reads (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``; the gloo group exists already, so accelerate adopts it) and trains a
float64 model with ``use_cpu=True``.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.nn import functional as F

from vlmcp.grads import local_part
from vlmcp.hf.debug.float64 import float64_exact, float64_norms

STEPS = 2
TRAIN = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=STEPS, learning_rate=5e-3,
             weight_decay=0.1, max_grad_norm=0.5, logging_steps=1, save_strategy="no", report_to=[], seed=0,
             optim="adamw_torch", disable_tqdm=True, dataloader_num_workers=0, remove_unused_columns=False,
             use_cpu=True)


def trainer_env(group: dist.ProcessGroup) -> None:
    """What accelerate reads to join the (already initialized) gloo group as a multi-CPU run."""
    world = dist.get_world_size(group)
    os.environ.update(OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1")
    if world > 1:
        rank = str(dist.get_rank(group))
        os.environ.update(RANK=rank, WORLD_SIZE=str(world), LOCAL_RANK=rank, LOCAL_WORLD_SIZE=str(world))


def load(model_dir: str):
    """The float64 model (RMSNorms in float64) and its processor."""
    from transformers import AutoModelForImageTextToText

    from vlmcp.data.hf.processor import load_processor

    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float64, attn_implementation="sdpa")
    float64_norms(model)
    return model, load_processor(model_dir)


def float64_causal_lm_loss(outputs, labels, num_items_in_batch=None):
    """HF's causal LM loss without its ``logits.float()`` (a float32 downcast of a float64 model)."""
    logits = outputs.logits[:, :-1]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100,
                           reduction="sum")
    return loss / num_items_in_batch


def _result(trainer) -> dict:
    history = [h for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h]
    model = trainer.accelerator.unwrap_model(trainer.model)
    return {"losses": [h["loss"] for h in history], "grad_norms": [h["grad_norm"] for h in history],
            "weights": {n: p.detach().clone() for n, p in model.named_parameters()}}


def run_trainer(model_dir: str, data: str, out: str, cp: dict | None, **train):
    """Train ``STEPS`` steps; ``cp=None``: plain ``Trainer`` (padded batches, the reference), else
    ``CPTrainer(cp_size=cp["cp_size"], cp_options=CPOptions(**cp["options"]))`` on packed rows.

    Returns:
        ``(result, trainer)``: the logged losses and gradient norms and the final weights.
    """
    from transformers import Trainer, TrainingArguments

    from vlmcp.integrations.conversations import ConversationCollator, ConversationDataset
    from vlmcp.integrations.transformers import CPOptions, CPTrainer

    model, processor = load(model_dir)
    dataset = ConversationDataset.from_files(data, processor, 512)
    args = TrainingArguments(output_dir=out, **{**TRAIN, **train})
    if cp is None:
        trainer = Trainer(model=model, args=args, train_dataset=dataset, compute_loss_func=float64_causal_lm_loss,
                          data_collator=ConversationCollator(processor, pack=False))
    else:
        trainer = CPTrainer(model=model, args=args, train_dataset=dataset, cp_size=cp["cp_size"],
                            cp_options=CPOptions(**cp.get("options", {})),
                            data_collator=ConversationCollator(processor))
    with float64_exact(torch.float64):
        trainer.train()
    return _result(trainer), trainer


def compare(result: dict, reference: dict, group: dist.ProcessGroup, model) -> dict:
    """Worst relative errors of the logged losses, gradient norms and final weights (every rank's)."""
    def rel(a, b):
        return max(abs(x - y) / max(abs(y), 1e-300) for x, y in zip(a, b, strict=True))

    params = dict(model.named_parameters())
    worst, name = 0.0, ""
    for n, w in result["weights"].items():
        ref = local_part(params[n], reference["weights"][n]) if w.shape != reference["weights"][n].shape \
            else reference["weights"][n]
        err = float((w - ref).norm() / max(float(ref.norm()), 1e-300))
        if err > worst:
            worst, name = err, n
    errs = torch.tensor([rel(result["losses"], reference["losses"]),
                         rel(result["grad_norms"], reference["grad_norms"]), worst], dtype=torch.float64)
    dist.all_reduce(errs, op=dist.ReduceOp.MAX, group=group)
    return {"loss": float(errs[0]), "grad_norm": float(errs[1]), "weights": float(errs[2]), "worst": name,
            "losses": result["losses"], "ref_losses": reference["losses"], "grad_norms": result["grad_norms"]}


def plain_grid(group: dist.ProcessGroup, runs: list[tuple[str, str, str]]) -> list[dict]:
    """Plain ``Trainer`` on this group's processes, one result per ``(model_dir, data, out)``."""
    trainer_env(group)
    return [run_trainer(model_dir, data, out, None)[0] for model_dir, data, out in runs]


def cp_grid(group: dist.ProcessGroup, cases: list[dict], references: list[dict]) -> list[dict]:
    """``CPTrainer`` on every case (``model_dir``, ``data``, ``out``, ``cp``), compared with its reference."""
    trainer_env(group)
    out = []
    for case, reference in zip(cases, references, strict=True):
        result, trainer = run_trainer(case["model_dir"], case["data"], case["out"], case["cp"])
        model = trainer.accelerator.unwrap_model(trainer.model)
        out.append({"case": case["name"], **compare(result, reference, group, model)})
    return out
