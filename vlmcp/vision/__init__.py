"""The vision side of a VLM under context parallelism.

* :class:`VisionEncoder` (:class:`VisionConfig`): the reference ViT + MLP projector;
  ``encoder(images)`` -> image embeddings ``(sum of tokens, out_dim)``.
* :func:`place_vision`: spread the encoder over a CP group in one of five modes
  (``replicate``, ``broadcast``, ``scatter``, ``hidden_shard``, ``allreduce_hook``);
  every rank then gets the complete embeddings, and every parameter carries its
  gradient rule for :func:`vlmcp.grads.reduce_gradients`.
* :func:`check_images_match`: the images fill the plan's image spans (run before
  any collective).
* :func:`assign_images`: ``scatter``'s cost-balanced image-to-rank assignment.
"""

from vlmcp.vision.assign import assign_images, vit_cost
from vlmcp.vision.checks import check_images_match
from vlmcp.vision.placement import VisionMode, VisionPlacement, place_vision
from vlmcp.vision.tower import Projector, VisionConfig, VisionEncoder, VisionTower, image_tokens

__all__ = [
    "Projector", "VisionConfig", "VisionEncoder", "VisionMode", "VisionPlacement", "VisionTower",
    "assign_images", "check_images_match", "image_tokens", "place_vision", "vit_cost",
]
