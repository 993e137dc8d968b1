"""``vlmcp train --model`` with ``--freeze`` and ``--lora`` (issue 24, items 4 and 5), on tiny models.

Three spawned runs at CP=2 cover it: a frozen ViT and projector under ``broadcast`` with activation
checkpointing (the set-up that hung: frozen weights saved bit-identical); LoRA under FSDP2 and
activation checkpointing with ``hidden_shard`` and adapters in the ViT too (the PEFT adapter
reloads with ``PeftModel.from_pretrained`` and gives the trained model's logits); and the same run
resumed from its middle checkpoint with ``--merge-lora`` (the merged model gives the adapter's
logits: the resume is exact and the merge right).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from tests.test_train_hf import _probe  # noqa: E402
from tests.train_cases import hf_rank  # noqa: E402
from vlmcp.cli import main  # noqa: E402
from vlmcp.data.hf.encode import encode_conversation  # noqa: E402
from vlmcp.data.hf.export import export_shapes  # noqa: E402
from vlmcp.debug.init_model import init_model  # noqa: E402
from vlmcp.launch import spawn_ranks  # noqa: E402
from vlmcp.train.specs.hf.config import HFTrainConfig  # noqa: E402
from vlmcp.train.specs.hf.launch import plan_data, preload_model_code  # noqa: E402

pytestmark = pytest.mark.timeout(240)
STEPS, SEQ = 4, 128


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune")
    return {"data": export_shapes(root / "shapes", 16), "qwen2_vl": init_model("qwen2_vl", root / "qwen2_vl"),
            "root": root}


def _config(files, out, **kw):
    return HFTrainConfig(model=str(files["qwen2_vl"]), data=str(files["data"]), output_dir=str(out),
                         seq_len=SEQ, lr=3e-3, timeout=120.0, cp=2, steps=STEPS, **kw)


def _run(cfg, probe=None):
    preload_model_code(cfg.model)
    index = plan_data(cfg)
    summary = spawn_ranks(hf_rank, cfg.world_size, cfg, index, probe, timeout=200, threads_per_rank=1)
    return summary[0], index


def _weights(directory):
    from safetensors.torch import load_file

    return load_file(str(directory / "model.safetensors"))


def _sample_logits(model, processor, index, probe):
    """Each sample of the probe's row alone, in one process: logits concatenated in row order."""
    out = []
    for i in probe["samples"]:
        inputs = encode_conversation(processor, index.conversations[i])
        batch = {"input_ids": inputs.input_ids[None], **inputs.pixels}
        if inputs.mm_token_type_ids is not None:
            batch["mm_token_type_ids"] = inputs.mm_token_type_ids[None]
        with torch.no_grad():
            out.append(model(**batch).logits[0])
    return torch.cat(out)


def test_frozen_vit_and_projector_under_broadcast_with_checkpointing(files, tmp_path):
    cfg = _config(files, tmp_path, vision_mode="broadcast", activation_checkpointing=True,
                  freeze=("vision", "projector"), metrics_jsonl=str(tmp_path / "m.jsonl"), checkpoint_every=2)
    summary, _ = _run(cfg)
    assert summary["stopped"] is None and len(summary["losses"]) == STEPS
    # the checkpoints leave the frozen weights out; --resume takes them from --model: exact
    from vlmcp.train.checkpoint import load_checkpoint

    ckpt = load_checkpoint(tmp_path / "checkpoints" / "step_00000002.pt").state
    assert not any("visual" in k for k in ckpt["model"]) and len(ckpt["frozen"]["names"]) > 20
    (tmp_path / "checkpoints" / f"step_{STEPS:08d}.pt").unlink()
    resumed, _ = _run(_config(files, tmp_path, vision_mode="broadcast", activation_checkpointing=True,
                              freeze=("vision", "projector"), checkpoint_every=2, resume=True))
    assert resumed["start_step"] == 2 and resumed["losses"] == summary["losses"][2:]
    before, after = _weights(files["qwen2_vl"]), _weights(tmp_path)
    frozen = [k for k in before if "visual" in k]
    assert frozen and all(torch.equal(before[k], after[k]) for k in frozen)  # bit-identical
    assert any(not torch.equal(before[k], after[k]) for k in before if "visual" not in k)  # the LLM trained
    rows = [json.loads(line) for line in open(tmp_path / "m.jsonl")]
    assert all(r["grad_norm_vision"] == 0 and r["grad_norm_projector"] == 0 and r["grad_norm_llm"] > 0
               for r in rows)


# the projector's adapters include merger.mlp.2, which hidden_shard slices (and FSDP leaves out)
LORA = dict(lora=True, lora_rank=4, lora_alpha=8.0, lora_vision="qkv", lora_projector="all",
            vision_mode="hidden_shard", fsdp=True, activation_checkpointing=True, checkpoint_every=2)


@pytest.fixture(scope="module")
def lora_run(files):
    out = files["root"] / "lora"
    cfg = _config(files, out, **LORA)
    summary, index = _run(cfg, _probe)
    return summary, index, cfg


def _peft_model(files, out):
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    base = AutoModelForImageTextToText.from_pretrained(str(files["qwen2_vl"]), dtype=torch.float32)
    return PeftModel.from_pretrained(base, str(out)).eval()


def test_lora_under_fsdp_and_checkpointing_saves_a_peft_adapter_that_reloads(files, lora_run):
    from vlmcp.data.hf.processor import load_processor

    summary, index, cfg = lora_run
    out = files["root"] / "lora"
    assert summary["stopped"] is None and len(summary["losses"]) == STEPS
    assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()
    assert not (out / "model.safetensors").exists()
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8 and config["peft_type"] == "LORA"
    targets = set(config["target_modules"])
    assert any("language_model" in t and t.endswith("q_proj") for t in targets)
    assert any(t.endswith("qkv") for t in targets)
    assert {"model.visual.merger.mlp.0", "model.visual.merger.mlp.2"} <= targets
    model = _peft_model(files, out)
    got = _sample_logits(model, load_processor(str(out)), index, summary["probe"])
    probe, cu = summary["probe"], summary["probe"]["cu_seqlens"]
    trained = torch.cat([probe["logits"][int(cu[k]):int(cu[k + 1])] for k in range(len(probe["samples"]))])
    torch.testing.assert_close(got, trained, rtol=1e-4, atol=1e-4)  # the in-memory trained model's
    base = model.get_base_model()
    with model.disable_adapter():
        untrained = _sample_logits(base, load_processor(str(out)), index, summary["probe"])
    assert (got - untrained).abs().max() > 1e-3  # the adapter changed the model


def test_lora_resumes_exactly_and_merges(files, lora_run, tmp_path):
    from transformers import AutoModelForImageTextToText

    from vlmcp.data.hf.processor import load_processor

    summary, index, _ = lora_run
    shutil.copytree(files["root"] / "lora" / "checkpoints", tmp_path / "checkpoints")
    shutil.rmtree(tmp_path / "checkpoints" / f"step_{STEPS:08d}")  # resume from step 2
    cfg = _config(files, tmp_path, resume=True, merge_lora=True, **LORA)
    resumed, _ = _run(cfg)
    assert resumed["start_step"] == 2 and resumed["losses"] == summary["losses"][2:]
    merged = AutoModelForImageTextToText.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    adapter = _peft_model(files, files["root"] / "lora")
    processor = load_processor(str(tmp_path))
    torch.testing.assert_close(_sample_logits(merged, processor, index, summary["probe"]),
                               _sample_logits(adapter, processor, index, summary["probe"]),
                               rtol=1e-5, atol=1e-5)
    before, after = _weights(files["qwen2_vl"]), _weights(tmp_path)
    # frozen and without an adapter: bit-identical (merger.mlp.2's bias gathered from its hidden_shard slices)
    untouched = [k for k in before if k.endswith(".bias") or "norm" in k or "lm_head" in k or "embed" in k
                 or "mlp.fc1" in k]
    assert "visual.merger.mlp.2.bias" in untouched
    assert all(torch.equal(before[k], after[k]) for k in untouched)
    for k in ("model.layers.0.self_attn.k_proj.weight", "visual.merger.mlp.2.weight"):
        assert not torch.equal(before[k], after[k]), k  # merged


def _error(capsys, argv):
    """The one-line error of a bad command line (rc 2, argparse's or vlmcp's)."""
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    assert rc == 2
    return capsys.readouterr().err


def test_flags_are_in_help_with_their_defaults_and_checked(files, capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for words in ("--freeze {vision,projector,llm}", "--lora-rank R LoRA rank r (default: 8)",
                  "alpha / r (default: 16.0)", "reproducible) (default: 0.0)",
                  "all (every Linear but the LM head)", "(q_proj,v_proj) (default: all)", "--merge-lora",
                  "--lora-vision [all|NAMES]", "--lora-projector [all|NAMES]"):
        assert words in text, words
    base = ["train", "--model", str(files["qwen2_vl"]), "--data", str(files["data"]),
            "--output-dir", str(tmp_path / "o")]
    assert "--lora-rank needs --lora" in _error(capsys, [*base, "--lora-rank", "4"])
    assert "--merge-lora needs --lora" in _error(capsys, [*base, "--merge-lora"])
    assert "leaves nothing to train" in _error(capsys, [*base, "--freeze", "vision", "--freeze", "projector",
                                                        "--freeze", "llm"])
    assert "which --freeze vision keeps" in _error(capsys, [*base, "--lora", "--lora-vision", "--freeze",
                                                            "vision"])
    llm = _error(capsys, [*base, "--lora", "--lora-targets", "q_proj", "--freeze", "llm", "--lora-vision"])
    assert "which --freeze llm keeps" in llm
    assert "needs --model" in _error(capsys, ["train", "--freeze", "vision"])
    # resolved on the model's architecture (meta device) before any rank starts
    typo = _error(capsys, [*base, "--lora", "--lora-targets", "q_proj,qq_proj"])
    assert "--lora-targets 'qq_proj' matches no Linear layer" in typo
    assert "invalid choice: 'vit'" in _error(capsys, [*base, "--freeze", "vit"])


def test_resume_refuses_other_freeze_and_lora_settings(files, tmp_path):
    from vlmcp.train.checkpoint.run import check_resumable

    cfg = _config(files, tmp_path, lora=True, lora_rank=4, freeze=("vision",))
    check_resumable(cfg.to_dict(), cfg, 2, tmp_path)  # the same run
    for saved, words in (({"lora_rank": 8}, "--lora-rank 8 -> 4"), ({"freeze": ["projector"]}, "--freeze"),
                         ({"lora": False}, "--lora False -> True")):
        with pytest.raises(ValueError, match="belongs to another run") as e:
            check_resumable({**cfg.to_dict(), **saved}, cfg, 2, tmp_path)
        assert words in str(e.value)
    plain = _config(files, tmp_path)
    old = {k: v for k, v in plain.to_dict().items() if not k.startswith(("lora", "freeze", "merge"))}
    check_resumable(old, plain, 2, tmp_path)  # a checkpoint from before these fields: the defaults


def test_the_run_names_what_it_trains(files):
    from transformers import AutoModelForImageTextToText

    from vlmcp.train.specs.hf.finetune import describe_trainable, prepare_model

    model = AutoModelForImageTextToText.from_pretrained(str(files["qwen2_vl"]))
    total = sum(p.numel() for p in model.parameters())
    cfg = _config(files, files["root"] / "x", lora=True, lora_rank=4, freeze=("vision",),
                  lora_projector="all")
    lora = prepare_model(cfg, model)
    line = describe_trainable(cfg, lora)
    trained = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    assert f"training {trained:,} of {total + trained:,} parameters" in line
    assert "LoRA r=4, alpha=16 on 16 layers, none on the frozen vision" in line, line
    assert describe_trainable(_config(files, files["root"] / "x"), model) is None  # a plain run says nothing


def test_gradient_norms_are_logged_by_the_adapters_parts():
    """Idefics3 (SmolVLM) names its tower vision_model and its projector connector: the logged
    vision/projector/llm norms follow the adapter, not parameter-name guesses."""
    from vlmcp.debug.tiny import tiny_model
    from vlmcp.hf.freeze import part_names
    from vlmcp.train.optim import PARTS, squared_norms
    from vlmcp.train.specs.hf.model import hf_parts

    model = tiny_model("idefics3", torch.float32)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    sq = squared_norms(model, hf_parts(model)).sum(1)
    params = dict(model.named_parameters())
    want = [sum(params[n].numel() for n in part_names(model)[part]) for part in PARTS]
    assert sq.tolist() == want and min(want) > 0


def test_resume_refuses_a_model_whose_frozen_weights_changed(files):
    from transformers import AutoModelForImageTextToText

    from vlmcp.train.checkpoint.frozen import check_frozen, frozen_record

    model = AutoModelForImageTextToText.from_pretrained(str(files["qwen2_vl"]))
    model.model.visual.requires_grad_(False)
    record = frozen_record(model, None)
    assert check_frozen(record, model, None, "CKPT") == record["names"]
    with torch.no_grad():
        model.model.visual.blocks[0].mlp.fc1.weight[0, 0] += 1e-3
    with pytest.raises(ValueError, match=r"cannot resume from CKPT: --model's frozen weights differ .*"
                                         r"blocks\.0\.mlp\.fc1\.weight"):
        check_frozen(record, model, None, "CKPT")
