"""LLaMA-Factory's training YAML as ``vlmcp train --config`` (issue 24, item 7): mapped or refused."""

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vlmcp.cli import _Parser, main
from vlmcp.cli import train as train_cmd
from vlmcp.cli.config_file import add_config_arguments, resolved_config
from vlmcp.cli.config_flags import config_actions
from vlmcp.cli.llamafactory import KEYS, Maps, NoEffect, Refused, mapped_dests

pytest.importorskip("yaml")
ASSETS = Path(__file__).parent / "assets" / "llamafactory"

ISSUE_KEYS = (
    "model_name_or_path",
    "finetuning_type",
    "lora_rank",
    "lora_target",
    "dataset",
    "dataset_dir",
    "cutoff_len",
    "max_samples",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "learning_rate",
    "num_train_epochs",
    "lr_scheduler_type",
    "warmup_ratio",
    "bf16",
    "freeze_vision_tower",
    "freeze_multi_modal_projector",
    "freeze_language_model",
    "image_max_pixels",
    "image_min_pixels",
    "video_max_pixels",
    "video_fps",
    "video_maxlen",
    "output_dir",
    "logging_steps",
    "save_steps",
    "report_to",
    "template",
    "context_parallel_size",
    "quantization_bit",
    "deepspeed",
)
"""The keys issue 24 lists (item 7)."""

# stand-ins for the flags other branches add (ft-loop, ft-lora), used only while those are missing
_STAND_INS = {
    "grad_accum": dict(type=int),
    "epochs": dict(type=float),
    "weight_decay": dict(type=float),
    "max_grad_norm": dict(type=float),
    "warmup_steps": dict(type=int),
    "warmup_ratio": dict(type=float),
    "lr_scheduler": dict(choices=("cosine", "linear", "constant")),
    "save_total_limit": dict(type=int),
    "eval_every": dict(type=int),
    "report_to": dict(choices=("none", "tensorboard")),
    "log_every": dict(type=int),
    "freeze": dict(action="append", choices=("vision", "projector", "llm")),
    "lora": dict(action="store_true"),
    "lora_rank": dict(type=int),
    "lora_alpha": dict(type=float),
    "lora_dropout": dict(type=float),
    "lora_targets": dict(),
}


def _train_parser(stand_ins=False):
    parser = _Parser(prog="vlmcp")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    train_cmd.add_parser(sub)
    train = sub.choices["train"]
    if stand_ins:
        have = config_actions(train)
        group = train.add_argument_group("stand-ins")
        for dest, kw in _STAND_INS.items():
            if dest not in have:
                group.add_argument("--" + dest.replace("_", "-"), dest=dest, default=None, **kw)
    return parser


def _missing():
    train = next(a for a in _train_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[
        "train"
    ]
    return sorted(mapped_dests() - set(config_actions(train)))


def test_every_mapping_target_is_a_flag_of_vlmcp_train():
    assert not _missing(), "LLaMA-Factory keys mapped onto flags vlmcp train does not have"


def test_every_key_the_issue_lists_is_mapped_or_refused():
    assert set(ISSUE_KEYS) <= set(KEYS)
    for key in ("quantization_bit", "deepspeed"):
        assert isinstance(KEYS[key], Refused)
    assert all(isinstance(e, (Maps, NoEffect, Refused)) for e in KEYS.values())


@pytest.fixture()
def lf_dir(tmp_path, monkeypatch):
    """A LLaMA-Factory-like working directory: the model directory and data/dataset_info.json."""
    model = tmp_path / "tiny-qwen2-vl"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2_vl"}))
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _parse(parser, path, *extra):
    return parser.parse_args(["train", "--config", str(path), *extra])


def test_the_lora_yaml_maps_to_the_flags_it_means(lf_dir, capsys):
    args = _parse(_train_parser(stand_ins=True), ASSETS / "qwen2_vl_lora_sft.yaml")
    got = resolved_config(args)
    want = dict(
        model="tiny-qwen2-vl",
        image_max_pixels=262144,
        video_max_pixels=16384,
        lora=True,
        lora_rank=8,
        lora_alpha=16,
        lora_targets="all",
        dataset="mllm_demo",
        seq_len=256,
        truncate=True,
        max_samples=16,
        output_dir="saves/tiny-qwen2-vl/lora/sft",
        log_every=1,
        checkpoint_every=500,
        metrics_jsonl="saves/tiny-qwen2-vl/lora/sft/metrics.jsonl",
        report_to="none",
        grad_accum=2,
        lr=1e-3,
        epochs=1.0,
        lr_scheduler="cosine",
        warmup_ratio=0.1,
        dtype="float32",
        timeout=180000000.0,
        cp=2,
        image_min_pixels=1024,
    )
    assert {k: got[k] for k in want} == want
    assert got["freeze"] is None  # LoRA: the base is frozen by LoRA itself
    notes = capsys.readouterr().out
    assert "seed absent: vlmcp's default --seed (see --help), not transformers' 42" in notes
    assert "learning_rate absent" not in notes
    for key in ("trust_remote_code", "overwrite_cache", "preprocessing_num_workers", "overwrite_output_dir"):
        assert f"note: --config {ASSETS / 'qwen2_vl_lora_sft.yaml'}: {key}:" in notes
    # the command line wins over the file
    assert _parse(_train_parser(stand_ins=True), ASSETS / "qwen2_vl_lora_sft.yaml", "--cp", "4").cp == 4


def test_llamafactory_defaults_fill_what_changes_training(lf_dir):
    path = lf_dir / "min.yaml"
    path.write_text(
        "model_name_or_path: tiny-qwen2-vl\nstage: sft\ndataset: mllm_demo\nfinetuning_type: full\n"
    )
    got = resolved_config(_parse(_train_parser(stand_ins=True), path))
    assert got["freeze"] == ["vision", "projector"] and not got["lora"]  # LLaMA-Factory's freeze defaults
    assert (got["seq_len"], got["truncate"]) == (2048, True)  # cutoff_len's default
    assert (got["image_max_pixels"], got["image_min_pixels"]) == (768 * 768, 32 * 32)
    assert got["dataset_dir"] is None  # vlmcp's default is LLaMA-Factory's: ./data
    # finetuning_type's default is lora, at rank 8 on every linear layer, alpha twice the rank
    path.write_text("model_name_or_path: tiny-qwen2-vl\nstage: sft\n")
    got = resolved_config(_parse(_train_parser(stand_ins=True), path))
    assert (got["lora"], got["lora_rank"], got["lora_alpha"], got["lora_targets"], got["freeze"]) == (
        True, 8, 16, "all", None)
    path.write_text("model_name_or_path: tiny-qwen2-vl\nstage: sft\nlora_rank: 4\n")
    assert resolved_config(_parse(_train_parser(stand_ins=True), path))["lora_alpha"] == 8
    # LoRA with the vision tower unfrozen: LLaMA-Factory's lora_target all reaches into it
    path.write_text("model_name_or_path: tiny-qwen2-vl\nstage: sft\nfreeze_vision_tower: false\n")
    got = resolved_config(_parse(_train_parser(stand_ins=True), path))
    assert (got["lora_vision"], got["freeze"]) == ("all", None)
    # older and rarer keys map where they mean a vlmcp flag
    path.write_text("model_name_or_path: tiny-qwen2-vl\nfinetuning_type: full\ntrain_mm_proj_only: true\n"
                    "freeze_vision_tower: false\nfreeze_multi_modal_projector: false\n"
                    "image_max_pixels: 4096\nreport_to: [tensorboard]\nmix_strategy: concat\n")
    got = resolved_config(_parse(_train_parser(stand_ins=True), path))
    want = (["vision", "llm"], 4096, "tensorboard")
    assert (got["freeze"], got["image_max_pixels"], got["report_to"]) == want


def _lf_error(capsys, path):
    with pytest.raises(SystemExit) as exit_:
        _parse(_train_parser(stand_ins=True), path)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and str(path) in err and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    "line, message",
    [
        ("quantization_bit: 4", "quantization_bit: 4 cannot be honoured: vlmcp trains unquantized weights"),
        (
            "deepspeed: examples/deepspeed/ds_z3_config.json",
            "deepspeed: 'examples/deepspeed/ds_z3_config.json' cannot be honoured: vlmcp shards with FSDP2",
        ),
        ("per_device_train_batch_size: 2", "must be 1, got 2: vlmcp packs conversations"),
        (
            "template: llava",
            "'llava' is not the chat template of tiny-qwen2-vl (model_type 'qwen2_vl'; its family's "
            "template is qwen2_vl)",
        ),
        ("stage: dpo", "vlmcp trains supervised fine-tuning (stage: sft), not 'dpo'"),
        ("finetuning_type: freeze", "vlmcp trains lora or full, not 'freeze'"),
        ("fp16: true", "not float16"),
        ("lr_scheduler_type: polynomial", "--lr-scheduler takes one of cosine, linear, constant"),
        ("report_to: wandb", "--report-to takes one of none, tensorboard"),
        ("galore_rank: 16", "unknown key 'galore_rank': neither a LLaMA-Factory training key"),
        ("resume_from_checkpoint: saves/x/checkpoint-100", "vlmcp resumes its own checkpoints: --resume"),
        ("learning_rate: fast", "--lr takes a float, got 'fast'"),
    ("image_resolution: 512", "give image_max_pixels (pixels) instead"),
    ("mix_strategy: interleave_under", "'interleave_under' cannot be honoured: vlmcp concatenates"),
    ("freeze_trainable_layers: 2", "freeze_trainable_layers: 2 cannot be honoured: LLaMA-Factory's freeze"),
    ("freeze_multi_modal_projector: false", "false with LoRA: vlmcp's --lora trains adapters only"),
    ("freeze_vision_tower: false\nlora_target: q_proj", "false with lora_target 'q_proj': LLaMA-Factory"),
    ],
)
def test_a_key_vlmcp_cannot_honour_exits_2_naming_it_and_the_file(lf_dir, capsys, line, message):
    path = lf_dir / "bad.yaml"
    path.write_text(f"model_name_or_path: tiny-qwen2-vl\nstage: sft\n{line}\n")
    assert message in _lf_error(capsys, path)


def test_a_key_whose_flag_is_missing_is_an_error_naming_the_flag(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="vlmcp train")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--model", default=None)
    parser.add_argument("--lora", action="store_true")
    add_config_arguments(parser)
    path = tmp_path / "lf.yaml"
    path.write_text("stage: sft\nlearning_rate: 2.0e-5\ngradient_accumulation_steps: 8\n")
    with pytest.raises(SystemExit):
        parser.parse_args(["--config", str(path)])
    err = capsys.readouterr().err
    assert "gradient_accumulation_steps: maps to vlmcp's --grad-accum, which this vlmcp does not have" in err
    path.write_text("stage: sft\nlearning_rate: 2.0e-5\ncutoff_len: 512\n")  # the default too: --truncate
    with pytest.raises(SystemExit):
        parser.parse_args(["--config", str(path)])
    assert "cutoff_len: maps to vlmcp's --seq-len" in capsys.readouterr().err


def test_an_unknown_lf_key_through_main_exits_2(lf_dir, capsys):
    path = lf_dir / "bad.yaml"
    path.write_text("model_name_or_path: tiny-qwen2-vl\nstage: sft\ndeepspeed: ds.json\n")
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--config", str(path)])
    assert exit_.value.code == 2 and "deepspeed" in capsys.readouterr().err


def _lf_workdir(root):
    """LLaMA-Factory's layout for the assets: tiny-qwen2-vl/ and data/ with dataset_info.json (mllm_demo)."""
    pytest.importorskip("transformers")
    from vlmcp.data.hf.export import export_shapes
    from vlmcp.debug.init_model import init_model

    init_model("qwen2_vl", root / "tiny-qwen2-vl")
    export_shapes(root / "data", 16)
    info = {"mllm_demo": {"file_name": "train.jsonl", "formatting": "sharegpt",
                          "columns": {"messages": "messages", "images": "images"},
                          "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                                   "assistant_tag": "assistant"}}}
    (root / "data" / "dataset_info.json").write_text(json.dumps(info))
    return root


def _run_yaml(root, config, *extra):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    return subprocess.run([sys.executable, "-m", "vlmcp", "train", "--config", str(config), *extra],
                          cwd=root, env=env, capture_output=True, text=True, timeout=280)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["qwen2_vl_full_sft.yaml", "qwen2_vl_lora_sft.yaml"])
def test_a_llamafactory_yaml_trains_with_cp2_in_one_command(tmp_path, name, monkeypatch, capsys):
    root = _lf_workdir(tmp_path)
    done = _run_yaml(root, ASSETS / name, "--seq-len", "48")  # the command line wins over cutoff_len
    assert done.returncode == 0, done.stdout + done.stderr
    out = root / "saves" / "tiny-qwen2-vl" / ("full" if "full" in name else "lora") / "sft"
    resolved = (out / "vlmcp_config.yaml").read_text()
    for line in ("cp: 2", "seq_len: 48", "truncate: true", 'dataset: "mllm_demo"', 'model: "tiny-qwen2-vl"'):
        assert line in resolved, resolved
    assert "spawning 2 gloo ranks (cp=2, dp=1)" in done.stdout
    assert re.search(r"conversations cut at --seq-len: [1-9]", done.stdout), done.stdout  # --truncate
    assert "note: --config" in done.stdout  # the keys that change nothing are named
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics and (out / "metrics.png").is_file()
    if "full" in name:
        assert len(metrics) == 3 and (out / "config.json").is_file()
        assert "image_max_pixels: 4096" in resolved
    else:  # LoRA: a PEFT adapter (--lora's output), trained for one epoch of two-row steps
        assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()
        assert "grad_accum: 2" in resolved and 'lr_scheduler: "cosine"' in resolved
    # the resolved config is the same run's: resumed from it, the finished run has nothing to do
    monkeypatch.chdir(root)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["train", "--config", str(out / "vlmcp_config.yaml"), "--resume"]) == 0
    assert "nothing to do" in capsys.readouterr().out
