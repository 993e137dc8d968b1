"""GLM-4.5V (``glm4v_moe``) and GLM-4.6V (``glm46v``): GLM-4.1V's ViT, inputs, positions and videos.

Both are GLM-4.1V to vlmcp (``glm4v.py``): ``model.visual`` with ``merger.down_proj`` last, M-RoPE
``(3, L)`` from the model's own ``get_rope_index`` per sample, video frames written with the image
placeholder (``mm_token_type_ids`` tells them apart), images and videos not mixed in one row.

GLM-4.5V's language model is MoE (``Glm4vMoeTextMoE``: a sigmoid router with a score-correction bias
and group top-k, routed experts and a shared one; layers below ``first_k_dense_replace`` dense).
Routing is per token, so CP changes nothing in it; its router computes in float32, an island lifted
for the float64 check only (Note [vlmcp float64 parity: float32 islands]). With
``output_router_logits`` its forward adds ``router_aux_loss_coef`` times the load-balancing loss of
the softmax of those logits; :meth:`Glm4vMoeAdapter.auxiliary_loss` adds each rank's share of the
whole row's (Note [vlmcp HF MoE auxiliary loss under CP]).

GLM-4.6V (``Glm46VForConditionalGeneration``) builds its language model and ViT from the sub-configs'
own model types (``AutoModel``): ``glm4v_text`` (GLM-4.6V-Flash, dense) or ``glm4v_moe_text``
(GLM-4.6V, MoE); the same auxiliary loss applies where the latter sets ``output_router_logits``.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlmcp.hf.adapters.glm4v import Glm4vAdapter
from vlmcp.hf.moe_aux import router_aux_loss

__all__ = ["GLM46V", "GLM4V_MOE", "Glm4vMoeAdapter"]


@dataclass(frozen=True, kw_only=True)
class Glm4vMoeAdapter(Glm4vAdapter):
    """GLM-4.5V / GLM-4.6V: GLM-4.1V's adapter, and the MoE router's auxiliary loss."""

    def auxiliary_loss(self, model, output, weights, group):
        return router_aux_loss(model, output, weights, group, ("num_local_experts", "n_routed_experts"))


GLM4V_MOE = Glm4vMoeAdapter(name="glm4v_moe", model_types=("glm4v_moe",))
GLM46V = Glm4vMoeAdapter(name="glm46v", model_types=("glm46v",))
