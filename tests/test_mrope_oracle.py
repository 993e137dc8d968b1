"""M-RoPE ids on interleaved packed rows against transformers' own ``Qwen2VLModel.get_rope_index``."""

import functools
import types

import pytest
import torch

import vlmcp
from tests import rows

qwen2_vl = pytest.importorskip("transformers.models.qwen2_vl.modeling_qwen2_vl")


def hf_rope_index(input_types, grids_thw, kinds, merge):
    """transformers' unmodified ``get_rope_index`` on one sample (bound to a stand-in ``self``)."""
    model = types.SimpleNamespace(config=types.SimpleNamespace(
        vision_config=types.SimpleNamespace(spatial_merge_size=merge)))
    model.get_vision_position_ids = functools.partial(qwen2_vl.Qwen2VLModel.get_vision_position_ids, model)
    patches = [torch.tensor([t, h * merge, w * merge]) for t, h, w in grids_thw]
    images = [g for g, k in zip(patches, kinds, strict=True) if k == 1]
    videos = [g for g, k in zip(patches, kinds, strict=True) if k == 2]
    ids, _ = qwen2_vl.Qwen2VLModel.get_rope_index(
        model, torch.zeros(1, input_types.numel(), dtype=torch.long), input_types[None],
        torch.stack(images) if images else None, torch.stack(videos) if videos else None)
    return ids[:, 0]


@pytest.mark.parametrize("merge", [1, 2])
def test_interleaved_packed_row_matches_get_rope_index(merge):
    # grids in LLM tokens; HF needs a text token between media (its vision start/end markers)
    samples = [("t5 i6 t3 i4 t9", [(1, 2, 3), (1, 2, 2)], [1, 1]),
               ("t7", [], []),
               ("t2 i12 t1 i8 t4 i3", [(3, 2, 2), (1, 4, 2), (1, 1, 3)], [2, 1, 1]),  # a video first
               ("i4 t6", [(1, 2, 2)], [1])]
    is_image, cu, ids = rows.make_row([s for s, _, _ in samples])
    grids = torch.tensor([g for _, gs, _ in samples for g in gs])
    mine = vlmcp.mrope_position_ids(is_image, grids, cu, ids)
    for s, (spec, gs, kinds) in enumerate(samples):
        a, b = int(cu[s]), int(cu[s + 1])
        types_ = torch.zeros(b - a, dtype=torch.int32)
        img = ids[a:b]
        for j, k in enumerate(kinds):
            types_[img == int(img[img >= 0].min()) + j] = k
        assert torch.equal(mine[:, a:b], hf_rope_index(types_, gs, kinds, merge)), spec
    # positions restart per sample and survive sharding
    plan = vlmcp.plan_cp(is_image, 3, cu, image_ids=ids)
    for shard in plan.shards():
        local = shard.shard_position_ids(mine)
        valid = shard.positions >= 0
        assert torch.equal(local[:, valid], mine[:, shard.positions[valid]])
