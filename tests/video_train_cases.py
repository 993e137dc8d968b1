"""Rank functions of the video training tests (importable by name from spawned ranks)."""

from __future__ import annotations

import torch.distributed as dist


def probe_row0(model, processor, index, cp_group) -> dict:
    """After training: the model's CP logits on training row 0 (its bad videos left out), gathered."""
    import torch

    import vlmcp
    import vlmcp.hf
    from vlmcp.data.hf.rows import build_row

    row = build_row(processor, index, 0)
    batch = vlmcp.hf.shard_inputs(model, row.inputs, cp_group, labels=row.labels, cu_seqlens=row.cu_seqlens)
    with torch.no_grad():
        logits = model(**batch.model_inputs).logits[0]
    return {"logits": vlmcp.unshard(logits, batch.shard, cp_group), "cu_seqlens": row.cu_seqlens,
            "samples": [i for i in index.rows[0] if i not in row.skipped], "keys": sorted(row.inputs)}


def train_then_resume(group: dist.ProcessGroup, cfg, resumed, index, probe) -> dict:
    """``cfg``'s run (checkpoints every ``cfg.checkpoint_every`` steps), its last checkpoint removed,
    then ``resumed`` (``resume=True`` from the one before) in the same spawned group: both summaries."""
    from tests.train_cases import hf_rank
    from vlmcp.train.checkpoint import checkpoint_path

    first = hf_rank(group, cfg, index, probe)
    if dist.get_rank(group) == 0:
        checkpoint_path(cfg.checkpoints, cfg.steps).unlink()
    dist.barrier(group)
    return {"first": first, "second": hf_rank(group, resumed, index)}


def long_video_probe(model, processor, index, cp_group) -> dict:
    """After training: row 0 again under the run's layout, its strategy and each rank's ViT patch rows."""
    import torch

    import vlmcp.hf
    from vlmcp.data.hf.rows import build_row

    rows: list[int] = []
    hook = model.model.visual.register_forward_pre_hook(lambda m, args: rows.append(int(args[0].shape[0])))
    row = build_row(processor, index, 0)
    batch = vlmcp.hf.shard_inputs(model, row.inputs, cp_group, labels=row.labels, cu_seqlens=row.cu_seqlens,
                                  image_strategy="auto")
    with torch.no_grad():
        model(**batch.model_inputs)
    hook.remove()
    vit = torch.tensor([sum(rows)])
    gathered = [torch.zeros_like(vit) for _ in range(dist.get_world_size(cp_group))]
    dist.all_gather(gathered, vit, group=cp_group)
    return {"strategy": batch.shard.plan.image_strategy, "vit_rows": [int(g) for g in gathered],
            "patch_rows": int(row.inputs["pixel_values_videos"].shape[0]),
            "frame_groups": int(row.inputs["video_grid_thw"][:, 0].sum())}


def check_probe_is_transformers(probe: dict, cfg, index) -> None:
    """The probed CP logits of each conversation of row 0 equal the saved model's, run alone in one
    process by plain transformers on the conversation's own encoding."""
    import torch
    from transformers import AutoModelForImageTextToText

    from vlmcp.data.hf.encode import encode_conversation
    from vlmcp.data.hf.processor import load_processor

    loaded = AutoModelForImageTextToText.from_pretrained(cfg.output_dir, dtype=torch.float32).eval()
    processor = load_processor(cfg.output_dir)
    cu = probe["cu_seqlens"]
    for k, i in enumerate(probe["samples"]):
        sample = encode_conversation(processor, index.conversations[i], cfg.video)
        with torch.no_grad():
            want = loaded(input_ids=sample.input_ids[None], mm_token_type_ids=sample.mm_token_type_ids[None],
                          **sample.pixels).logits[0]
        torch.testing.assert_close(probe["logits"][int(cu[k]):int(cu[k + 1])], want, rtol=1e-4, atol=1e-4)
