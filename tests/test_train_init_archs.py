"""``vlmcp train --model`` on ``vlmcp init-model`` directories of more architectures (issues 17, 18).

Qwen3.5 (Gated DeltaNet layers, exact under CP) at CP=2: the loss falls, the saved directory
reloads in plain transformers with the logits it trained to, and a run resumed from its
step-3 checkpoint continues the uninterrupted run's losses exactly; with ``--fsdp`` at DP=2 x CP=2,
bf16 and activation checkpointing it learns and its saved directory reloads. InternVL (tiles) and
LLaVA-OneVision (anyres grids, two-image samples), Gemma 3 (sliding windows, bidirectional
images) and SmolVLM (crops and a global image, row/column tokens) at CP=2: the loss falls and the saved
directory reloads with the logits it trained to. The helpers are ``tests/test_train_hf.py``'s.
"""

import pytest

pytest.importorskip("transformers")

from tests.test_train_hf import STEPS, _check_trained, _config, _probe, _run, needs_hf_cp  # noqa: E402
from vlmcp.data.hf.export import export_shapes  # noqa: E402
from vlmcp.debug.init_model import init_model  # noqa: E402

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return export_shapes(tmp_path_factory.mktemp("shapes"), 24)


@needs_hf_cp
def test_qwen3_5_cp2_learns_saves_what_it_trained_and_resumes_exactly(data, tmp_path):
    model = init_model("qwen3_5", tmp_path / "model")
    cfg = _config(model, data, tmp_path / "out", cp=2, checkpoint_every=3)
    summary, index = _run(cfg, 2, _probe)
    _check_trained(summary, index, cfg)
    assert sorted(p.name for p in cfg.checkpoints.iterdir()) == ["step_00000003.pt", "step_00000006.pt"]
    (cfg.checkpoints / "step_00000006.pt").unlink()
    again = _config(model, data, tmp_path / "again", cp=2, resume=True, checkpoint_dir=str(cfg.checkpoints))
    resumed, _ = _run(again, 2)
    assert resumed["start_step"] == 3 and len(resumed["losses"]) == STEPS - 3
    assert resumed["losses"] == summary["losses"][3:]  # bit-exact on CPU


@needs_hf_cp
def test_internvl_cp2_learns_and_saves_what_it_trained(data, tmp_path):
    """Images cut into up to 4 tiles and a thumbnail, framed by <img> ... </img>: the planned
    token counts are the processor's, tiles concatenate along dim 0 in packed rows."""
    model = init_model("internvl", tmp_path / "model")
    cfg = _config(model, data, tmp_path / "out", cp=2)
    summary, index = _run(cfg, 2, _probe)
    _check_trained(summary, index, cfg)


@needs_hf_cp
def test_llava_onevision_cp2_learns_and_saves_what_it_trained(data, tmp_path):
    """Anyres images (base tile + grid, padded tiles per image) and two-image samples (base
    tile + newline each): rows pad every sample's tiles to the row's most."""
    model = init_model("llava_onevision", tmp_path / "model")
    cfg = _config(model, data, tmp_path / "out", cp=2)
    summary, index = _run(cfg, 2, _probe)
    _check_trained(summary, index, cfg)


@needs_hf_cp
def test_gemma3_cp2_learns_and_saves_what_it_trained(data, tmp_path):
    """Sliding-window and full layers, bidirectional images: ``token_type_ids`` (1 at the soft
    tokens) travels with the rows into ``shard_inputs``; each image's planned tokens include the
    ``\\n\\n`` the processor writes around it."""
    import torch

    from vlmcp.data.hf.processor import load_processor
    from vlmcp.data.hf.rows import build_row

    model = init_model("gemma3", tmp_path / "model")
    cfg = _config(model, data, tmp_path / "out", cp=2)
    summary, index = _run(cfg, 2, _probe)
    _check_trained(summary, index, cfg)
    processor = load_processor(model)
    row = build_row(processor, index, 0).inputs
    soft = processor.tokenizer.convert_tokens_to_ids("<image_soft_token>")
    assert int(row["token_type_ids"].sum()) > 0 and row["token_type_ids"].shape == row["input_ids"].shape
    assert torch.equal(row["token_type_ids"], (row["input_ids"] == soft).long())


@needs_hf_cp
def test_smolvlm_cp2_learns_and_saves_what_it_trained(data, tmp_path):
    """Images split into crops and a global image (row/column tokens and newlines written around the
    ``<image>`` runs): the planned tokens are the processor's, and packed samples' ``pixel_values``
    (1, tiles, 3, 8, 8) and ``pixel_attention_mask`` pad to the row's most tiles."""
    from vlmcp.data.hf.processor import load_processor
    from vlmcp.data.hf.rows import build_row

    model = init_model("smolvlm", tmp_path / "model")
    cfg = _config(model, data, tmp_path / "out", cp=2)
    summary, index = _run(cfg, 2, _probe)
    _check_trained(summary, index, cfg)
    row = build_row(load_processor(model), index, 0).inputs
    pv, mask = row["pixel_values"], row["pixel_attention_mask"]
    assert pv.dim() == 5 and pv.shape[2:] == (3, 8, 8) and mask.shape == (*pv.shape[:2], 8, 8)


@needs_hf_cp
def test_qwen3_5_fsdp_dp2_cp2_bf16_checkpointed_learns_and_reloads(data, tmp_path):
    """Gated DeltaNet layers under CP with ``--fsdp`` at DP=2 x CP=2 (4 ranks), bf16 parameters
    and activation checkpointing: the loss falls and the saved directory reloads in transformers."""
    import torch
    from transformers import AutoModelForImageTextToText

    model = init_model("qwen3_5", tmp_path / "model")
    cfg = _config(model, data, tmp_path / "out", cp=2, dp=2, fsdp=True, dtype="bfloat16",
                  activation_checkpointing=True)
    summary, _ = _run(cfg, 4)
    losses = summary["losses"]
    assert len(losses) == STEPS and all(map(torch.isfinite, torch.tensor(losses))), losses
    assert losses[-1] < losses[0] - 0.1, losses
    _, info = AutoModelForImageTextToText.from_pretrained(cfg.output_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
