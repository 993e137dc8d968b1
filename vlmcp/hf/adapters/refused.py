"""Model types vlmcp refuses by name, with the reason (before ``parallelize`` changes anything).

Without this table some of them would pass :func:`~vlmcp.hf.adapters.adapter_for`'s placeholder default
(a ``text_config``, an image token and ``get_image_features``), whose causal masks and 1-D positions
are not what they compute. Each entry names the layer or input and why; making one exact is writing
its adapter (and removing it here).
"""

from __future__ import annotations

__all__ = ["REFUSED", "refusal"]

REFUSED: dict[str, str] = {
    "mistral4": (
        "transformers' 'mistral4' model type is the text-only Mistral4ForCausalLM (no vision tower, no image "
        "merge); Mistral 4's VLM checkpoints are 'mistral3' models whose text_config is 'mistral4', which "
        "vlmcp runs (Mistral3's adapter; tests/test_hf_new_archs.py)"),
    "ernie4_5_vl_moe": (
        "no adapter: its MoE layers send each token to the text or the vision experts by "
        "moe_mm_token_type_ids (a per-token input besides mm_token_type_ids), its M-RoPE positions come from "
        "its own get_rope_index, and its resampler merges patches spatially and temporally; none of it is "
        "written or tested under CP"),
    "step3p7": (
        "no adapter: with use_bidirectional_attention its sliding layers open a bidirectional window around "
        "every token (_bidirectional_window_overlay), a mask vlmcp's plan does not express, and its local "
        "image crops (pixel_values_local, num_local_patches) need per-image token rules vlmcp does not have"),
    "minicpmv4_6": (
        "no adapter: its merger downsamples each image by target_sizes and downsample_mode (a forward "
        "input), which set the image's token count; the placeholder default cannot read them and no rule "
        "is written"),
    "molmo2": (
        "no adapter: its image tokens attend to each other bidirectionally (block_sequence_ids from "
        "mm_token_type_ids) and its features are pooled by image_token_pooling indices into every crop's "
        "patches, which vlmcp's per-image selection (scatter, per-sample references) cannot split"),
}
"""``config.model_type`` -> why vlmcp refuses it (tests/test_hf_refusals.py)."""


def refusal(model) -> str | None:
    """The refusal message for ``model``'s ``config.model_type``, or None where it is not refused."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    why = REFUSED.get(model_type)
    if why is None:
        return None
    return (f"{type(model).__name__} (model_type={model_type!r}) is refused by vlmcp: {why}. Register an "
            "adapter (vlmcp.hf.register_adapter) that handles this to run it")
