"""InternVL (2.5, 3): a ViT with CLS (``model.vision_tower``), pixel shuffle, ``model.multi_modal_projector``.

Inputs: ``pixel_values (tiles, 3, H, W)``, the tiles of every image in order (the
processor splits each image into up to ``max_patches`` tiles plus a thumbnail and drops
the per-image tile counts). Every tile goes through the ViT on its own and gives
``(H/patch) * (W/patch) * downsample_ratio**2`` LLM tokens (``image_seq_length``), the
CLS dropped; an image's tiles are one run of ``<IMG_CONTEXT>`` between ``<img>`` and
``</img>``. So vlmcp's unit is the tile: token counts, ``scatter``'s split and whole
placement's per-image check all run per tile, and an image's tiles stay in order.
Positions are 1-D, restarting per sample. The projector's last Linear is ``linear_2``.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlmcp.hf.adapters.base import HFAdapter, blank_image, image_batch, select_rows

__all__ = ["INTERNVL", "InternVLAdapter"]


def _pair(x) -> tuple[int, int]:
    return (int(x[0]), int(x[1])) if isinstance(x, (list, tuple)) else (int(x), int(x))


@dataclass(frozen=True, kw_only=True)
class InternVLAdapter(HFAdapter):
    """InternVL: one ``pixel_values`` row per tile, a fixed token count per tile."""

    vision_modules: tuple[str, ...] = ("model.vision_tower", "model.multi_modal_projector")
    projector_last: str | None = "model.multi_modal_projector.linear_2"
    features_per_image: bool = False

    def _tile_tokens(self, config, height: int, width: int) -> int:
        """Tokens of one ``height x width`` tile, as ``InternVLModel.get_image_features`` computes them."""
        ph, pw = _pair(config.vision_config.patch_size)
        if config.vision_feature_select_strategy != "default":
            raise ValueError("InternVL under vlmcp needs vision_feature_select_strategy='default' (the model "
                             "pixel-shuffles a square patch grid, which the CLS of 'full' breaks)")
        side = (height // ph) * (width // pw)
        grid = int(side ** 0.5)
        ratio = float(config.downsample_ratio)
        shuffled = int(grid * ratio)
        if grid * grid != side or shuffled != grid * ratio:
            raise ValueError(f"InternVL tiles must give a square patch grid divisible by 1/downsample_ratio; "
                             f"a {height}x{width} tile gives {height // ph}x{width // pw} patches")
        return shuffled * shuffled

    def image_tokens(self, model, pixels):
        pv = image_batch(pixels, "InternVL", rows="tiles")
        return [self._tile_tokens(model.config, pv.shape[2], pv.shape[3])] * pv.shape[0]

    def select_images(self, pixels, index):
        return select_rows(pixels, index)

    def dummy_images(self, model):
        weight = model.model.multi_modal_projector.linear_1.weight
        return blank_image(model.config, weight, *_pair(model.config.vision_config.image_size))

INTERNVL = InternVLAdapter(name="internvl", model_types=("internvl",))
