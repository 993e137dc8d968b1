"""LLaMA-Factory's training YAML as ``vlmcp train --config``: each key mapped to a flag, or refused.

:data:`KEYS` is the table: a LLaMA-Factory key -> the vlmcp flags (dests) it sets and how
its value converts (:class:`Maps`), a key accepted because it changes nothing vlmcp does
(:class:`NoEffect`, printed as a note), or a key vlmcp cannot honour (:class:`Refused`:
an error naming the key, the file and why, exit 2). A key in none of these, and no vlmcp
flag either, is an error too: nothing in the file is silently ignored. A key whose flag
this vlmcp does not have is an error naming the flag, never dropped.

Keys the file leaves out take vlmcp's defaults, except where LLaMA-Factory's default
changes what trains (:data:`LLAMAFACTORY_DEFAULTS`): ``finetuning_type`` is ``lora``,
LoRA's rank is 8 on every linear layer (``lora_target: all``) with alpha twice the rank, a
full fine-tune freezes the vision tower and the projector, ``cutoff_len`` is 2048 and cuts
over-long conversations (``--truncate``), and images are bounded to 32*32 ... 768*768
pixels. Relative paths are the current directory's, as in LLaMA-Factory. vlmcp keys
(``vision_mode: broadcast``) may sit beside LLaMA-Factory's in the file.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlmcp.cli.config_flags import convert_value, key_to_dest
from vlmcp.ranks import say

__all__ = ["KEYS", "LLAMAFACTORY_DEFAULTS", "TEMPLATES", "Maps", "NoEffect", "Refused", "is_llamafactory",
           "mapped_dests", "translate"]


@dataclass(frozen=True)
class Maps:
    """The key sets ``dests``: ``convert(value, context)`` returns ``{dest: value}`` (default:
    the value as ``dests[0]``'s flag takes it)."""

    dests: tuple[str, ...]
    convert: Callable[[Any, _Context], dict[str, Any]] | None = None


@dataclass(frozen=True)
class NoEffect:
    """Accepted (the value checked by ``check``) because it changes nothing vlmcp does: ``why``."""

    why: str
    check: Callable[[Any], bool] = lambda value: True


@dataclass(frozen=True)
class Refused:
    """vlmcp cannot honour the key (or this value of it, when ``unless`` accepts it): ``why``."""

    why: str
    unless: Callable[[Any], bool] = lambda value: False


@dataclass
class _Context:
    file: Path
    raw: Mapping[str, Any]
    actions: Mapping[str, argparse.Action]
    given: argparse.Namespace | None
    notes: list[str] = field(default_factory=list)

    def error(self, key: str, message: str) -> ValueError:
        return ValueError(f"--config {self.file}: {key}: {message}")


def _bool(key: str):
    def check(value, ctx):
        if not isinstance(value, bool):
            raise ctx.error(key, f"true or false, got {value!r}")
        return value
    return check


def _finetuning_type(value, ctx):
    if value == "lora":
        return {"lora": True}
    if value == "full":
        return {}
    raise ctx.error("finetuning_type", f"vlmcp trains lora or full, not {value!r} (LLaMA-Factory's freeze "
                    "trains some layers; vlmcp freezes whole towers: --freeze vision|projector|llm)")


def _lora_target(value, ctx):
    if isinstance(value, list):
        value = ",".join(map(str, value))
    return {"lora_targets": value}


def _names(dest: str):
    def convert(value, ctx):
        names = value if isinstance(value, list) else str(value).split(",")
        return {dest: ",".join(n.strip() for n in names if n.strip())}
    return convert


def _cutoff_len(value, ctx):
    return {"seq_len": value, "truncate": True}


def _stage(value, ctx):
    if value != "sft":
        raise ctx.error("stage", f"vlmcp trains supervised fine-tuning (stage: sft), not {value!r}")
    return {}


def _do_train(value, ctx):
    if value is not True:
        raise ctx.error("do_train", f"vlmcp train trains: do_train: true, got {value!r}")
    return {}


def _batch_size(value, ctx):
    if value != 1:
        raise ctx.error("per_device_train_batch_size",
                        f"must be 1, got {value!r}: vlmcp packs conversations into one row of --seq-len "
                        f"tokens "
                        "(cutoff_len) per CP group per step, so a larger batch is more tokens per row: raise "
                        "cutoff_len, or gradient_accumulation_steps for more rows per step")
    return {}


def _bf16(value, ctx):
    if not isinstance(value, bool):
        raise ctx.error("bf16", f"true or false, got {value!r}")
    if value:
        ctx.notes.append("bf16: true trains bfloat16 parameters (--dtype bfloat16; gradients are reduced in "
                         "float32), not float32 master weights under autocast")
        return {"dtype": "bfloat16"}
    return {}


def _fp16(value, ctx):
    if value is True:
        raise ctx.error("fp16", "vlmcp trains float32, float64 or bfloat16 (bf16: true), not float16")
    return {}


def _freeze(part: str, key: str):
    def convert(value, ctx):
        if not isinstance(value, bool):
            raise ctx.error(key, f"true or false, got {value!r}")
        return {"freeze": [part]} if value else {}
    return convert


def _train_mm_proj_only(value, ctx):
    if not isinstance(value, bool):
        raise ctx.error("train_mm_proj_only", f"true or false, got {value!r}")
    return {"freeze": ["vision", "llm"]} if value else {}


def _report_to(value, ctx):
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    return {"report_to": value}


def _plot_loss(value, ctx):
    if not isinstance(value, bool):
        raise ctx.error("plot_loss", f"true or false, got {value!r}")
    if not value:
        return {}
    out = ctx.raw.get("output_dir")
    if out is None:
        raise ctx.error("plot_loss", "needs output_dir (the loss curve goes to output_dir/metrics.png)")
    return {"metrics_jsonl": str(Path(str(out)) / "metrics.jsonl")}


def _model(value, ctx):
    if not isinstance(value, str):
        raise ctx.error("model_name_or_path", f"a local model directory, got {value!r}")
    if not (Path(value) / "config.json").is_file() and getattr(ctx.given, "model", None) is None:
        raise ctx.error("model_name_or_path", f"{value} is not a local model directory (no config.json); "
                        "vlmcp "
                                              "downloads nothing: download it first (huggingface-cli "
                                              "download "
                                              f"{value} --local-dir DIR) and give the directory")
    return {"model": value}


def _template(value, ctx):
    model = getattr(ctx.given, "model", None) or ctx.raw.get("model_name_or_path")
    config = Path(str(model)) / "config.json" if model else None
    if config is None or not config.is_file():
        raise ctx.error("template", "needs the model directory (model_name_or_path) to check the template "
                                    "against")
    model_type = json.loads(config.read_text()).get("model_type")
    names = TEMPLATES.get(model_type, ())
    if value not in names:
        known = f"its family's template is {' or '.join(names)}" if names else \
            "LLaMA-Factory has no template vlmcp knows to be that model's"
        raise ctx.error("template", f"{value!r} is not the chat template of {model} (model_type "
                                    f"{model_type!r}; "
                                    f"{known}): vlmcp renders every conversation with the model's own chat "
                                    "template (its chat_template.jinja), so a template of another family "
                                    "cannot "
                                    "be honoured; give the model's own or remove the key")
    return {}


def _equals(*accepted):
    return lambda value: value in accepted


TEMPLATES: dict[str, tuple[str, ...]] = {
    "qwen2_vl": ("qwen2_vl",), "qwen2_5_vl": ("qwen2_vl",),
    "qwen3_vl": ("qwen3_vl", "qwen3_vl_nothink"), "qwen3_vl_moe": ("qwen3_vl", "qwen3_vl_nothink"),
    "qwen3_5": ("qwen3_5", "qwen3_5_nothink"), "qwen3_5_moe": ("qwen3_5", "qwen3_5_nothink"),
    "llava": ("llava",), "llava_next": ("llava_next", "llava_next_mistral", "llava_next_llama3",
                                        "llava_next_qwen", "llava_next_yi"),
    "internvl": ("intern_vl",), "gemma3": ("gemma3",), "glm4v": ("glm4v",), "mistral3": ("mistral_small",),
}
"""model_type -> the LLaMA-Factory templates of its chat-template family (what ``template`` may be)."""

_NETWORK = "vlmcp runs offline and reads local files only"
_FREEZE_TUNING = "LLaMA-Factory's freeze tuning trains some layers; vlmcp freezes whole towers (--freeze)"

KEYS: dict[str, Maps | NoEffect | Refused] = {
    # model
    "model_name_or_path": Maps(("model",), _model),
    "trust_remote_code": NoEffect("vlmcp runs transformers' own model code only, never a repository's",
                                  lambda v: isinstance(v, bool)),
    "image_max_pixels": Maps(("image_max_pixels",)),
    "image_resolution": Refused("an older LLaMA-Factory key whose meaning changed between versions (a side "
                                "length, then pixels): give image_max_pixels (pixels) instead"),
    "video_resolution": Refused("an older LLaMA-Factory key whose meaning changed between versions (a side "
                                "length, then pixels): give video_max_pixels (pixels) instead"),
    "image_min_pixels": Maps(("image_min_pixels",)),
    "video_max_pixels": Maps(("video_max_pixels",)),
    "video_min_pixels": Maps(("video_min_pixels",)),
    "video_fps": Maps(("video_fps",)),
    "video_maxlen": Maps(("video_max_frames",)),
    "flash_attn": Refused("vlmcp's CP attention replaces the model's (--attention ring|ulysses)",
                          unless=_equals("auto")),
    "quantization_bit": Refused("vlmcp trains unquantized weights (no QLoRA)", unless=lambda v: v is None),
    "quantization_method": Refused("vlmcp trains unquantized weights (no QLoRA)", unless=lambda v: v is None),
    "double_quantization": Refused("vlmcp trains unquantized weights", unless=lambda v: v is None),
    "use_unsloth": Refused("vlmcp's kernels are its own", unless=_equals(False)),
    "enable_liger_kernel": Refused("vlmcp's loss is its own chunked cross-entropy (--loss chunked)",
                                   unless=_equals(False)),
    "rope_scaling": Refused("vlmcp trains the model's own positions", unless=lambda v: v is None),
    "adapter_name_or_path": Refused("vlmcp starts LoRA from a fresh adapter", unless=lambda v: v is None),
    "hf_hub_token": Refused(_NETWORK), "ms_hub_token": Refused(_NETWORK),
    "model_revision": Refused(_NETWORK, unless=_equals("main")),
    "use_fast_tokenizer": Refused("vlmcp uses the processor's tokenizer as the model directory has it",
                                  unless=_equals(True)),
    "low_cpu_mem_usage": NoEffect("vlmcp loads the model as transformers does",
                                  lambda v: isinstance(v, bool)),
    "upcast_layernorm": Refused("vlmcp keeps every parameter in --dtype", unless=_equals(False)),
    "upcast_lmhead_output": Refused("vlmcp's chunked loss computes the head's logits in float32 already",
                                    unless=_equals(False)),
    "print_param_status": NoEffect("vlmcp prints no parameter table", lambda v: isinstance(v, bool)),
    "cache_dir": Refused(_NETWORK),
    # method
    "stage": Maps((), _stage),
    "do_train": Maps((), _do_train),
    "finetuning_type": Maps(("lora",), _finetuning_type),
    "lora_rank": Maps(("lora_rank",)),
    "lora_alpha": Maps(("lora_alpha",)),
    "lora_dropout": Maps(("lora_dropout",)),
    "lora_target": Maps(("lora_targets",), _lora_target),
    "additional_target": Refused("vlmcp trains LoRA adapters only (--lora-targets), no extra full modules",
                                 unless=lambda v: v is None),
    "use_dora": Refused("vlmcp trains plain LoRA", unless=_equals(False)),
    "use_rslora": Refused("vlmcp trains plain LoRA (alpha / rank scaling)", unless=_equals(False)),
    "pissa_init": Refused("vlmcp initialises LoRA as PEFT does by default", unless=_equals(False)),
    "freeze_vision_tower": Maps(("freeze", "lora_vision"), _freeze("vision", "freeze_vision_tower")),
    "freeze_multi_modal_projector": Maps(("freeze",), _freeze("projector", "freeze_multi_modal_projector")),
    "freeze_language_model": Maps(("freeze",), _freeze("llm", "freeze_language_model")),
    "train_mm_proj_only": Maps(("freeze",), _train_mm_proj_only),
    "freeze_trainable_layers": Refused(_FREEZE_TUNING),
    "freeze_trainable_modules": Refused(_FREEZE_TUNING),
    "freeze_extra_modules": Refused(_FREEZE_TUNING),
    "use_llama_pro": Refused("vlmcp adds no blocks", unless=_equals(False)),
    "create_new_adapter": Refused("vlmcp starts LoRA from a fresh adapter", unless=_equals(False)),
    "deepspeed": Refused("vlmcp shards with FSDP2 (--fsdp) over its own DP x CP ranks, not DeepSpeed",
                         unless=lambda v: v is None),
    "disable_gradient_checkpointing": Maps(("activation_checkpointing",),
                                           lambda v, ctx: {"activation_checkpointing": not _bool(
                                               "disable_gradient_checkpointing")(v, ctx)}),
    # dataset
    "dataset": Maps(("dataset",), _names("dataset")),
    "eval_dataset": Maps(("eval_dataset",), _names("eval_dataset")),
    "dataset_dir": Maps(("dataset_dir",)),
    "media_dir": Maps(("image_root",)),
    "template": Maps((), _template),
    "cutoff_len": Maps(("seq_len", "truncate"), _cutoff_len),
    "max_samples": Maps(("max_samples",)),
    "packing": NoEffect("vlmcp always packs conversations into rows, each attending only to itself",
                        _equals(True, None)),
    "neat_packing": NoEffect("vlmcp's packed conversations never attend to each other",
                             lambda v: isinstance(v, bool)),
    "overwrite_cache": NoEffect("vlmcp keeps no preprocessing cache", lambda v: isinstance(v, bool)),
    "preprocessing_num_workers": NoEffect("vlmcp plans the data once and decodes on each rank's thread",
                                          lambda v: isinstance(v, int) or v is None),
    "dataloader_num_workers": NoEffect("each rank decodes its rows in one background thread",
                                       lambda v: isinstance(v, int)),
    "streaming": Refused("vlmcp plans every row up front", unless=_equals(False)),
    "mix_strategy": Refused("vlmcp concatenates the datasets in order (then shuffles the rows per epoch)",
                            unless=_equals("concat")),
    "interleave_probs": Refused("vlmcp concatenates the datasets", unless=lambda v: v is None),
    "ignore_pad_token_for_loss": Refused("vlmcp never trains on padding", unless=_equals(True)),
    "enable_thinking": Refused("vlmcp renders with the model's chat template as it is",
                               unless=_equals(True, None)),
    "disable_shuffling": Refused("vlmcp shuffles the rows every epoch (--seed)", unless=_equals(False)),
    "val_size": Refused("vlmcp evaluates held-out data it is given (eval_dataset, --eval-data FILE), it "
                        "splits none off", unless=lambda v: not v),
    "mask_history": Refused("vlmcp trains every assistant turn (per-turn loss: false in the data)",
                            unless=_equals(False)),
    "train_on_prompt": Refused("vlmcp trains the assistant turns only", unless=_equals(False)),
    "tokenized_path": Refused("vlmcp tokenizes the conversations itself", unless=lambda v: v is None),
    # output and logging
    "output_dir": Maps(("output_dir",)),
    "logging_steps": Maps(("log_every",)),
    "save_steps": Maps(("checkpoint_every",)),
    "save_total_limit": Maps(("save_total_limit",)),
    "plot_loss": Maps(("metrics_jsonl",), _plot_loss),
    "overwrite_output_dir": NoEffect("vlmcp writes the model into output_dir and refuses a directory holding "
                                     "another run's checkpoints (--resume continues it)",
                                     lambda v: isinstance(v, bool)),
    "save_only_model": Refused("vlmcp's checkpoints always hold the optimizer state (for an exact --resume)",
                               unless=_equals(False)),
    "report_to": Maps(("report_to",), _report_to),
    "run_name": NoEffect("vlmcp names nothing by run", lambda v: isinstance(v, str) or v is None),
    "logging_dir": Refused("vlmcp writes its logs beside --metrics-jsonl", unless=lambda v: v is None),
    "save_strategy": Refused("vlmcp saves every save_steps steps", unless=_equals("steps")),
    "logging_strategy": Refused("vlmcp logs every logging_steps steps", unless=_equals("steps")),
    # train
    "per_device_train_batch_size": Maps((), _batch_size),
    "gradient_accumulation_steps": Maps(("grad_accum",)),
    "learning_rate": Maps(("lr",)),
    "num_train_epochs": Maps(("epochs",)),
    "max_steps": Maps(("steps",)),
    "lr_scheduler_type": Maps(("lr_scheduler",)),
    "warmup_ratio": Maps(("warmup_ratio",)),
    "warmup_steps": Maps(("warmup_steps",)),
    "weight_decay": Maps(("weight_decay",)),
    "max_grad_norm": Maps(("max_grad_norm",)),
    "seed": Maps(("seed",)),
    "bf16": Maps(("dtype",), _bf16),
    "fp16": Maps((), _fp16),
    "pure_bf16": Maps(("dtype",), lambda v, ctx: {"dtype": "bfloat16"} if _bool("pure_bf16")(v, ctx) else {}),
    "optim": Refused("vlmcp trains with AdamW", unless=_equals("adamw_torch", "adamw_torch_fused")),
    "ddp_timeout": Maps(("timeout",)),
    "resume_from_checkpoint": Refused("vlmcp resumes its own checkpoints: --resume (they are in "
                                      "output_dir/checkpoints)", unless=lambda v: v is None),
    "gradient_checkpointing": Maps(("activation_checkpointing",)),
    "context_parallel_size": Maps(("cp",)),
    "sequence_parallel_size": Maps(("cp",)),
    # eval
    "per_device_eval_batch_size": Refused("vlmcp evaluates one packed row per CP group at a time",
                                          unless=_equals(1)),
    "eval_strategy": Refused("vlmcp evaluates every eval_steps steps (--eval-every)",
                             unless=_equals("steps", "no")),
    "eval_steps": Maps(("eval_every",)),
    "do_eval": NoEffect("vlmcp evaluates when --eval-data is given", lambda v: isinstance(v, bool)),
    "eval_on_each_dataset": Refused("vlmcp evaluates the --eval-data files together", unless=_equals(False)),
    "do_predict": Refused("vlmcp train trains; it does not generate", unless=_equals(False)),
    "predict_with_generate": Refused("vlmcp train trains; it does not generate", unless=_equals(False)),
    "compute_accuracy": Refused("vlmcp's evaluation is the token-weighted loss", unless=_equals(False)),
    "ddp_find_unused_parameters": NoEffect("vlmcp reduces gradients itself, not through DDP",
                                           lambda v: isinstance(v, bool) or v is None),
    "dataloader_pin_memory": NoEffect("each rank builds its rows itself", lambda v: isinstance(v, bool)),
}
"""Every LLaMA-Factory training key vlmcp reads (see the module docstring)."""

LLAMAFACTORY_DEFAULTS: dict[str, Any] = {
    "finetuning_type": "lora", "cutoff_len": 2048, "image_max_pixels": 768 * 768, "image_min_pixels": 32 * 32,
}
"""LLaMA-Factory's defaults that vlmcp applies when the file leaves the key out (plus LoRA's
rank 8, target ``all`` and alpha = 2 x rank, and a full fine-tune's frozen vision tower and
projector)."""


_VLMCP_DEFAULTS = {"learning_rate": "5.0e-5", "num_train_epochs": "3.0", "lr_scheduler_type": "linear",
                   "seed": "42"}
"""transformers' ``TrainingArguments`` defaults that vlmcp does not take: an absent key gets vlmcp's
default, and a note says so."""


def mapped_dests() -> set[str]:
    """Every vlmcp flag (dest) some LLaMA-Factory key maps to (the test checks each exists)."""
    return {d for entry in KEYS.values() if isinstance(entry, Maps) for d in entry.dests}


_MARKERS = ("model_name_or_path", "stage", "finetuning_type", "template", "cutoff_len", "do_train")


def is_llamafactory(raw: Mapping[str, Any], actions: Mapping[str, argparse.Action]) -> bool:
    """Whether a config file is LLaMA-Factory's: it has one of its marker keys."""
    return any(key in raw for key in _MARKERS)


def _merge(values: dict[str, Any], key: str, produced: dict[str, Any], ctx: _Context, origin: dict) -> None:
    for dest, value in produced.items():
        action = ctx.actions.get(dest)
        if action is None:
            flag = "--" + dest.replace("_", "-")
            raise ctx.error(key, f"maps to vlmcp's {flag}, which this vlmcp does not have "
                                 "yet; remove the key (nothing is ignored silently)")
        value = convert_value(action, value, f"--config {ctx.file}: {key}")
        if isinstance(action, argparse._AppendAction):
            values[dest] = values.get(dest, []) + [v for v in value if v not in values.get(dest, [])]
            continue
        if dest in values and values[dest] != value:
            raise ctx.error(key, f"sets {action.option_strings[-1]} {value!r}, but {origin[dest]} set it to "
                                 f"{values[dest]!r}; keep one")
        values[dest] = value
        origin[dest] = key


def _lora_towers(values: dict[str, Any], ctx: _Context, origin: dict) -> None:
    """LoRA with an unfrozen vision tower or projector, as LLaMA-Factory means it.

    Its ``lora_target: all`` takes every linear layer but the LM head and the projector, and the
    vision tower's too unless ``freeze_vision_tower`` (the default): ``--lora-vision all``.
    """
    if ctx.raw.get("freeze_vision_tower", True) is False:
        if values.get("lora_targets", "all") != "all":
            raise ctx.error("freeze_vision_tower", f"false with lora_target {values['lora_targets']!r}: "
                            "LLaMA-Factory matches those names in the vision tower too, vlmcp names the "
                            "vision tower's adapters apart: use lora_target: all, or set the vlmcp key "
                            "lora_vision to the vision tower's module names")
        _merge(values, "freeze_vision_tower (false, with lora_target all)", {"lora_vision": "all"}, ctx,
               origin)
    if ctx.raw.get("freeze_multi_modal_projector", True) is False:
        raise ctx.error("freeze_multi_modal_projector", "false with LoRA: vlmcp's --lora trains adapters "
                        "only, never a projector's own weights beside them; keep it true (LLaMA-Factory's "
                        "default), or set the vlmcp key lora_projector: all for adapters on the projector")


def translate(raw: Mapping[str, Any], file: Path, actions: Mapping[str, argparse.Action],
              given: argparse.Namespace | None) -> dict[str, Any]:
    """The vlmcp flag values (by dest) of a LLaMA-Factory training YAML.

    Raises:
        ValueError: naming the file and the key, for a key vlmcp cannot honour, a value it
            cannot take, an unknown key, or a key whose flag this vlmcp does not have.
    """
    ctx = _Context(file=file, raw=raw, actions=actions, given=given)
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    filled = {k: v for k, v in LLAMAFACTORY_DEFAULTS.items() if k not in raw}
    for key, value in {**raw, **filled}.items():
        entry = KEYS.get(key)
        if key in filled and isinstance(entry, Maps) and set(entry.dests) & set(values):
            continue  # the file set that flag by another key (image_resolution, a vlmcp key)
        if entry is None:
            dest = key_to_dest(key, actions)
            if dest is None:
                raise ValueError(f"--config {file}: unknown key {key!r}: neither a LLaMA-Factory training "
                                 "key "
                                 "vlmcp reads (docs/training.md lists them) nor a vlmcp flag")
            _merge(values, key, {dest: value}, ctx, origin)
        elif isinstance(entry, Refused):
            if not entry.unless(value):
                raise ctx.error(key, f"{value!r} cannot be honoured: {entry.why}")
        elif isinstance(entry, NoEffect):
            if not entry.check(value):
                raise ctx.error(key, f"unexpected value {value!r}")
            ctx.notes.append(f"{key}: {json.dumps(value)} changes nothing: {entry.why}")
        else:
            where = key if key in raw else f"{key} (absent: LLaMA-Factory's default {value!r})"
            produced = entry.convert(value, ctx) if entry.convert else {entry.dests[0]: value}
            _merge(values, where, produced, ctx, origin)
    if values.get("lora"):  # LLaMA-Factory's LoRA defaults: rank 8, every linear layer, alpha = 2 x rank
        lora = {"lora_rank": ("lora_rank", 8), "lora_target": ("lora_targets", "all")}
        for key, (dest, default) in lora.items():
            if key not in raw and dest not in raw:
                _merge(values, f"{key} (absent: LLaMA-Factory's default {default!r})", {dest: default}, ctx,
                       origin)
        if "lora_alpha" not in raw and "lora_alpha" not in values:
            _merge(values, "lora_alpha (absent: LLaMA-Factory's default 2 x lora_rank)",
                   {"lora_alpha": 2 * values["lora_rank"]}, ctx, origin)
        _lora_towers(values, ctx, origin)
    else:
        for key, part in (("freeze_vision_tower", "vision"), ("freeze_multi_modal_projector", "projector")):
            if key not in raw:  # LLaMA-Factory freezes both by default in a full fine-tune
                _merge(values, f"{key} (absent: LLaMA-Factory's default true)", {"freeze": [part]}, ctx,
                       origin)
    for key, theirs in _VLMCP_DEFAULTS.items():
        dest = KEYS[key].dests[0]
        if key not in raw and dest not in values:
            ctx.notes.append(f"{key} absent: vlmcp's default --{dest.replace('_', '-')} (see --help), not "
                             f"transformers' {theirs}")
    for note in ctx.notes:
        say(f"vlmcp train: note: --config {file}: {note}")
    return values
