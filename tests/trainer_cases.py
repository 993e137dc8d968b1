"""Rank functions for the Trainer integration tests (importable by name from spawned ranks).

Each spawned group runs a whole grid (:func:`p2_suite`, :func:`p4_suite`). accelerate keeps one
distributed state per process: the one-process references run first with no launcher
environment (accelerate then sees one process, whatever torch.distributed holds), each rank its
own, then the state is reset and every rank sets the environment accelerate reads for a multi-CPU
run (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``; the gloo group exists
already, so accelerate adopts it). Models are float64 with ``use_cpu=True``.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.nn import functional as F

from vlmcp.debug.float64 import float64_exact, float64_norms
from vlmcp.grads import local_part

STEPS = 2
TRAIN = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=STEPS,
             learning_rate=5e-3, weight_decay=0.1, max_grad_norm=0.5, logging_steps=1, save_strategy="no",
             report_to=[], seed=0, optim="adamw_torch", disable_tqdm=True, dataloader_num_workers=0,
             remove_unused_columns=False,
             use_cpu=True)


def trainer_env(group: dist.ProcessGroup) -> None:
    """What accelerate reads to join the (already initialized) gloo group as a multi-CPU run; its
    state (made by a one-process run before) is reset."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    world = dist.get_world_size(group)
    os.environ.update(OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1")
    if world > 1:
        rank = str(dist.get_rank(group))
        os.environ.update(RANK=rank, WORLD_SIZE=str(world), LOCAL_RANK=rank, LOCAL_WORLD_SIZE=str(world))


def load(model_dir: str):
    """The float64 model (RMSNorms in float64) and its processor."""
    from transformers import AutoModelForImageTextToText

    from vlmcp.data.hf.processor import load_processor

    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float64,
                                                        attn_implementation="sdpa")
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


def run_trainer(model_dir: str, data: str, out: str, cp: dict | None, lora: dict | None = None, **train):
    """Train ``STEPS`` steps; ``cp=None``: plain ``Trainer`` (padded batches, the reference), else
    ``CPTrainer(cp_size=cp["cp_size"], cp_options=CPOptions(**cp["options"]))`` on packed rows;
    ``lora``: a ``peft.LoraConfig``'s fields, the model wrapped by ``get_peft_model`` (seeded).

    Returns:
        ``(result, trainer)``: the logged losses and gradient norms and the final weights.
    """
    from transformers import Trainer, TrainingArguments

    from vlmcp.integrations.conversations import ConversationCollator, ConversationDataset
    from vlmcp.integrations.transformers import CPOptions, CPTrainer

    model, processor = load(model_dir)
    if lora is not None:
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(0)  # the same adapter weights in the reference and under CP
        model = get_peft_model(model, LoraConfig(**lora)).to(torch.float64)
    dataset = ConversationDataset.from_files(data, processor, 512)
    args = TrainingArguments(output_dir=out, **{**TRAIN, **train})
    if cp is None:
        trainer = Trainer(model=model, args=args, train_dataset=dataset,
                          compute_loss_func=float64_causal_lm_loss,
                          data_collator=ConversationCollator(processor, pack=False))
    else:
        trainer = CPTrainer(model=model, args=args, train_dataset=dataset, cp_size=cp["cp_size"],
                            cp_options=CPOptions(**cp.get("options", {})),
                            data_collator=ConversationCollator(processor))
    with float64_exact(torch.float64):
        trainer.train()
        evaluated = trainer.evaluate(eval_dataset=dataset)["eval_loss"]
    return {**_result(trainer), "eval_loss": evaluated}, trainer


def compare(result: dict, reference: dict, group: dist.ProcessGroup, model) -> dict:
    """Worst relative errors of the logged losses, gradient norms and final weights (every rank's)."""
    def rel(a, b):
        return max(abs(x - y) / max(abs(y), 1e-300) for x, y in zip(a, b, strict=True))

    params = dict(model.named_parameters())
    refs = {n: local_part(params[n], r) if result["weights"][n].shape != r.shape else r
            for n, r in reference["weights"].items()}
    floor = 1e-3 * max(float(r.norm()) for r in refs.values())  # a near-zero weight: the model's scale
    worst, name = 0.0, ""
    for n, w in result["weights"].items():
        err = float((w - refs[n]).norm()) / max(float(refs[n].norm()), floor)
        if err > worst:
            worst, name = err, n
    errs = torch.tensor([rel(result["losses"], reference["losses"]),
                         rel(result["grad_norms"], reference["grad_norms"]), worst,
                         rel([result["eval_loss"]], [reference["eval_loss"]])], dtype=torch.float64)
    dist.all_reduce(errs, op=dist.ReduceOp.MAX, group=group)
    return {"loss": float(errs[0]), "grad_norm": float(errs[1]), "weights": float(errs[2]),
            "eval_loss": float(errs[3]), "worst": name,
            "losses": result["losses"], "ref_losses": reference["losses"], "grad_norms": result["grad_norms"]}


def sft_run(group: dist.ProcessGroup, model_dir: str, data: str, out: str, steps: int) -> dict:
    """TRL's ``SFTTrainer`` with the mixin at CP = the group's size, on vlmcp's packed rows (float32)."""
    from transformers import AutoModelForImageTextToText
    from trl import SFTConfig, SFTTrainer

    from vlmcp.data.hf.processor import load_processor
    from vlmcp.integrations.conversations import ConversationCollator, ConversationDataset
    from vlmcp.integrations.transformers import CPTrainerMixin

    class CPSFTTrainer(CPTrainerMixin, SFTTrainer):
        pass

    processor = load_processor(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32,
                                                        attn_implementation="sdpa")
    dataset = ConversationDataset.from_files(data, processor, 512)
    args = SFTConfig(output_dir=out, per_device_train_batch_size=4, max_steps=steps, learning_rate=3e-3,
                     logging_steps=1, save_strategy="no", report_to=[], seed=0, disable_tqdm=True,
                     remove_unused_columns=False, dataset_kwargs={"skip_prepare_dataset": True}, use_cpu=True,
                     bf16=False)
    trainer = CPSFTTrainer(model=model, args=args, train_dataset=dataset.as_hf_dataset(),
                           processing_class=processor, cp_size=dist.get_world_size(group),
                           data_collator=ConversationCollator(processor, dataset=dataset))
    trainer.train()
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    return {"losses": _result(trainer)["losses"],
            "activation_checkpointing": bool(unwrapped.is_activation_checkpointing)}


class _NaiveCPTrainer:
    """The issue's first attempt: Trainer's compute_loss through shard_inputs, Trainer's own sampler."""

    @staticmethod
    def build(model, args, dataset, collator, group):
        from transformers import Trainer

        import vlmcp
        import vlmcp.hf

        class Naive(Trainer):
            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                inputs = dict(inputs)
                labels, cu = inputs.pop("labels"), inputs.pop("cu_seqlens")
                batch = vlmcp.hf.shard_inputs(self.accelerator.unwrap_model(model), inputs, group,
                                              labels=labels, cu_seqlens=cu)
                return vlmcp.cp_cross_entropy(model(**batch.model_inputs).logits[0], batch.labels, group).loss

        vlmcp.hf.parallelize(model, group)
        return Naive(model=model, args=args, train_dataset=dataset, data_collator=collator)


def naive_trainer_refused(group: dist.ProcessGroup, model_dir: str, data: str, out: str) -> str:
    """The row guard's message when Trainer's sampler gives the CP ranks different rows."""
    from transformers import TrainingArguments

    from vlmcp.integrations.conversations import ConversationCollator, ConversationDataset

    model, processor = load(model_dir)
    dataset = ConversationDataset.from_files(data, processor, 512)
    args = TrainingArguments(output_dir=out, **{**TRAIN, "max_steps": 1})
    trainer = _NaiveCPTrainer.build(model, args, dataset, ConversationCollator(processor), group)
    try:
        trainer.train()
    except ValueError as err:
        return str(err)
    return ""


def p2_suite(group: dist.ProcessGroup, setup: dict) -> dict:
    """Everything at P=2: the one-process references (rank r runs every other one), CPTrainer at
    DP=1 x CP=2 against them, plain Trainer on 2 processes (DP=2's reference), the naive Trainer
    the row guard refuses, SFTTrainer with the mixin, and the DPO grid."""
    from tests.logprob_cases import dpo_grid

    rank = dist.get_rank(group)
    runs = sorted(setup["references"].items())
    mine = {name: run_trainer(cp=None, **run)[0] for i, (name, run) in enumerate(runs) if i % 2 == rank}
    gathered = [None, None]
    dist.all_gather_object(gathered, mine, group=group)
    references = {**gathered[0], **gathered[1]}
    trainer_env(group)
    out = {"references": {k: {"losses": v["losses"], "grad_norms": v["grad_norms"]}
                          for k, v in references.items()}}
    out["cp"] = [cp_case(group, case, references[case["reference"]]) for case in setup["cases"]]
    ddp = setup["ddp_reference"]
    ddp_result, _ = run_trainer(ddp["model_dir"], ddp["data"], ddp["out"], None)
    out["ddp_reference"] = ddp_result if rank == 0 else None
    out["naive"] = naive_trainer_refused(group, **setup["naive"])
    out["guard"] = row_guard_messages(group)
    out["synced"] = weights_synced(group, **setup["naive"])
    out["refusals"] = refusals(group, **setup["naive"])
    trainer_env(group)
    out["sft"] = sft_run(group, **setup["sft"])
    out["dpo"] = dpo_grid(group, setup["dpo"])
    return out


def p4_suite(group: dist.ProcessGroup, cases: list[dict], reference: dict) -> list[dict]:
    """CPTrainer at DP=2 x CP=2 against plain Trainer on 2 processes."""
    trainer_env(group)
    return [cp_case(group, case, reference) for case in cases]


def cp_case(group: dist.ProcessGroup, case: dict, reference: dict) -> dict:
    """One CPTrainer run (``case``: name, model_dir, data, out, cp, train overrides) against ``reference``."""
    result, trainer = run_trainer(case["model_dir"], case["data"], case["out"], case["cp"],
                                  lora=case.get("lora"), **case.get("train", {}))
    model = trainer.accelerator.unwrap_model(trainer.model)
    return {"case": case["name"], **compare(result, reference, group, model)}


def row_guard_messages(group: dist.ProcessGroup) -> dict:
    """shard_inputs on rows that differ by rank: refused (the message), unless the guard is off."""
    import vlmcp.hf
    from vlmcp.debug.synthetic import synthetic_row
    from vlmcp.debug.tiny import tiny_model

    out = {}
    for check_at_parallelize in (True, False):
        model = tiny_model("qwen2_vl", torch.float64)
        vlmcp.hf.parallelize(model, group, check_same_row=check_at_parallelize)
        same = synthetic_row(model, ((5, (1, 4, 4), 9), (12,)), seed=1)
        vlmcp.hf.shard_inputs(model, same[0], group, labels=same[1], cu_seqlens=same[2])  # the same row: fine
        inputs, labels, cu = synthetic_row(model, ((5, (1, 4, 4), 9), (12,)), seed=1 + dist.get_rank(group))
        try:
            vlmcp.hf.shard_inputs(model, inputs, group, labels=labels, cu_seqlens=cu)
            out[check_at_parallelize] = ""
        except ValueError as err:
            out[check_at_parallelize] = str(err)
        vlmcp.hf.shard_inputs(model, inputs, group, labels=labels, cu_seqlens=cu, check_same_row=False)
    return out


def refusals(group: dist.ProcessGroup, model_dir: str, data: str, out: str) -> dict:
    """CPTrainer's refusals at construction, by case: the message."""
    from transformers import TrainingArguments

    from vlmcp.integrations.conversations import ConversationCollator, ConversationDataset
    from vlmcp.integrations.transformers import CPOptions, CPTrainer

    cases = {"cp_size": (dict(cp_size=3), {}),
             "compute_loss_func": (dict(compute_loss_func=float64_causal_lm_loss), {}),
             "hidden_shard_save": (dict(cp_options=CPOptions(vision_mode="hidden_shard")),
                                   {"save_strategy": "steps"}),
             "label_smoothing": (dict(), {"label_smoothing_factor": 0.1})}
    messages = {}
    for name, (kwargs, train) in cases.items():
        model, processor = load(model_dir)
        dataset = ConversationDataset.from_files(data, processor, 512)
        args = TrainingArguments(output_dir=out, **{**TRAIN, **train})
        try:
            CPTrainer(model=model, args=args, train_dataset=dataset,
                      data_collator=ConversationCollator(processor),
                      **{"cp_size": 2, **kwargs})
            messages[name] = ""
        except ValueError as err:
            messages[name] = str(err)
    return messages


def weights_synced(group: dist.ProcessGroup, model_dir: str, data: str, out: str) -> bool:
    """Ranks that loaded different weights start from rank 0's (as DDP's wrap would make them)."""
    from transformers import TrainingArguments

    from vlmcp.integrations.conversations import ConversationCollator, ConversationDataset
    from vlmcp.integrations.transformers import CPTrainer

    model, processor = load(model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(dist.get_rank(group))
    CPTrainer(model=model, args=TrainingArguments(output_dir=out, **TRAIN), cp_size=2,
              train_dataset=ConversationDataset.from_files(data, processor, 512),
              data_collator=ConversationCollator(processor))
    reference, _ = load(model_dir)
    return all(torch.equal(p, r) for p, r in zip(model.parameters(), reference.parameters(), strict=True))
