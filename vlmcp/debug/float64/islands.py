"""transformers' float32 islands, lifted for float64 parity (the reference and the CP model alike).

Note [vlmcp float64 parity: float32 islands]
--------------------------------------------
Several HF modules compute in float32 whatever the model dtype: RMSNorms (``x.float()``),
the ViT rotary embeddings of the Qwen-VL family and Kimi-K2.5, GLM-4.1V's and SigLIP2's
position interpolation, MoE routers (Qwen3-VL-MoE's softmax and load-balancing loss, Qwen3.5-MoE's
softmax, DeepSeek-V3's sigmoid and group top-k), Qwen3.5's (and Qwen3.5-MoE's) zero-centred and
gated norms, its decay and gated-delta-rule kernel, Kimi-K2.5's temporal merge, Nemotron-H's gated
norm, Mamba-2 decay, SSD scan, router and float32 logits, RADIO's position interpolation, GLM-4.5V's
and MiniMax-M3-VL's sigmoid routers, MiniMax-M3-VL's and Gemma 4's norms (Gemma 4's is ``x * w``, not
Gemma 3's ``x * (1 + w)``), Gemma 4's ViT pooling and router, and Llama 4's norms, complex rotary and
router. In a float64 model each rounds the gradient to float32; a replicated token's gradient arrives in P
shares, each rounded on its own, so CP and one process then differ by ~1e-8 relative: float32
noise, not a CP error. float64 parity therefore runs both models with those steps in the input
dtype, for the duration only::

    with float64_exact(torch.float64):      # every island of every loaded transformers module
        reference and CP forward/backward   # (class- and module-wide, restored on exit)

:data:`ISLANDS` is the one table: (transformers module, attribute path, replacement). An entry
applies when its module is loaded (a model of it exists); a replacement named by a string is
built by :func:`~vlmcp.debug.float64.rewrite.in_dtype` (the original function with its
``torch.float32`` read as float64, and its ``.float()`` calls as ``.to(float64)``: Nemotron-H's SSD
scan, its logits, RADIO's position interpolation). Entries apply in table order, each built after
the ones above it are in place, so an ``in_dtype`` copy of a function calls the lifted versions of
the module's functions above it (Nemotron-H's mixer forward calls the lifted ``mamba2_chunk_scan``).
:func:`float64_norms` makes one model's RMSNorm instances compute in their input dtype.
A router's expert choice is a top-k of its scores, as in float32; the tiny test models are
far from ties.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.nn import functional as F

from vlmcp.debug.float64.rewrite import in_dtype
from vlmcp.deps import at_least
from vlmcp.hf.hub_kernels import keep_instance_forward

__all__ = ["ISLANDS", "float64_exact", "float64_norms"]


def _rms_norm(self, hidden_states: torch.Tensor) -> torch.Tensor:
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _zero_centred_norm(self, x: torch.Tensor) -> torch.Tensor:
    """Gemma's and Qwen3.5's RMSNorm, ``x * (1 + w)``, in the input dtype."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)


def float64_norms(model: nn.Module) -> int:
    """Make the HF RMSNorms of ``model`` compute in their input dtype (in place); returns the count.

    Instance forwards, which the hub-kernel kernelization of transformers 5.25's ``train()``/``eval()``
    leaves in place (Note [vlmcp instance forwards and hub kernels]).
    """
    n = 0
    for m in model.modules():
        name = type(m).__name__
        if hasattr(m, "with_scale") or not isinstance(getattr(m, "weight", None), nn.Parameter):
            continue  # Gemma 4's (x * w or no weight) and the weightless ones: their ISLANDS entries
        if name.endswith("RMSNorm") and hasattr(m, "variance_epsilon"):
            m.forward = types.MethodType(_rms_norm, m)
        elif name.startswith("Gemma") and name.endswith("RMSNorm") and hasattr(m, "eps"):
            m.forward = types.MethodType(_zero_centred_norm, m)
        else:
            continue
        keep_instance_forward(m)
        n += 1
    return n


def _rotary_vision(module: str) -> Callable:
    """``apply_rotary_pos_emb_vision`` of ``module`` in the input dtype."""

    def rotary(q, k, cos, sin):
        rotate_half = sys.modules[module].rotate_half
        cos, sin = cos.unsqueeze(-2).to(q.dtype), sin.unsqueeze(-2).to(q.dtype)
        return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)

    return rotary


def _glm4v_positions(self, embeddings, lengths, image_shapes, h_coords, w_coords):
    """``Glm4vVisionEmbeddings.forward`` with the bicubic interpolation in the table's dtype."""
    table = self.position_embedding.weight
    side = int(table.shape[0] ** 0.5)
    grid_2d = table.view(side, side, -1).permute(2, 0, 1).unsqueeze(0)
    ends = torch.as_tensor(lengths, device=embeddings.device).cumsum(0)
    token = torch.arange(embeddings.shape[0], device=embeddings.device)
    image = (token.unsqueeze(0) >= ends.unsqueeze(1)).sum(0)
    h, w = image_shapes[image, 1].to(table.dtype), image_shapes[image, 2].to(table.dtype)
    grid = torch.stack(((w_coords + 0.5) / w * 2 - 1, (h_coords + 0.5) / h * 2 - 1), -1)[None, :, None]
    pos = F.grid_sample(grid_2d, grid.to(table.dtype), mode=self.interpolated_method, align_corners=False,
                        padding_mode="border")
    return embeddings + pos[0, :, :, 0].T.to(embeddings.device)


def _siglip2_positions(positional_embeddings, spatial_shapes, max_length):
    """``Siglip2VisionEmbeddings.resize_positional_embeddings`` in the table's dtype: the same bilinear
    antialiased weights as ``F.interpolate``'s, computed in that dtype."""
    dtype, device = positional_embeddings.dtype, spatial_shapes.device
    grid_size = positional_embeddings.shape[0]
    sizes = spatial_shapes.to(dtype)[:, None]
    positions = torch.arange(max_length, device=device, dtype=dtype)[None, :, None]
    rows = torch.div(positions, sizes[..., 1:], rounding_mode="floor")
    index = torch.cat([rows, positions - rows * sizes[..., 1:]], dim=-1)
    index = index * (positions < sizes.prod(-1, keepdim=True))
    scale = grid_size / sizes
    center = (index + 0.5) * scale - 0.5
    source = torch.arange(grid_size, device=device, dtype=dtype)
    weights = (1 - (source - center[..., None]).abs().div(scale.clamp(min=1)[..., None])).clamp(min=0)
    weights = weights / weights.sum(-1, keepdim=True)
    weights = (weights[..., 0, :, None] * weights[..., 1, None, :]).flatten(-2)
    flat = positional_embeddings.reshape(-1, positional_embeddings.shape[-1])
    return weights.to(flat.device) @ flat


def _softmax_router(self, hidden_states):
    """``Qwen3VLMoeTextTopKRouter.forward`` (and ``Qwen3_5MoeTopKRouter``'s, the same steps) with the
    softmax in the logits' dtype."""
    logits = F.linear(hidden_states.reshape(-1, self.hidden_dim), self.weight)
    top, index = torch.topk(logits.softmax(-1), self.top_k, dim=-1)
    return logits, top / top.sum(-1, keepdim=True), index


def _load_balancing(gate_logits, num_experts=None, top_k=2, attention_mask=None):
    """``load_balancing_loss_func`` of Qwen3-VL-MoE in the logits' dtype."""
    if gate_logits is None or not isinstance(gate_logits, tuple):
        return 0
    counts, probs, rows = 0, 0, 0
    for layer in gate_logits:
        weights = layer.softmax(-1)
        keep = torch.ones(weights.shape[0], dtype=weights.dtype) if attention_mask is None \
            else attention_mask.reshape(-1).to(weights.dtype)
        chosen = torch.topk(weights, top_k, dim=-1).indices.reshape(-1)
        counts = counts + torch.zeros(num_experts, dtype=weights.dtype).scatter_add_(
            0, chosen, keep.repeat_interleave(top_k))
        probs = probs + (weights * keep[:, None]).sum(0)
        rows = rows + keep.sum()
    return (counts / rows * probs / rows).sum() * num_experts


def _gated_norm(self, hidden_states, gate):
    """``Qwen3_5RMSNormGated.forward`` in the input dtype."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon)) * F.silu(gate)


def _gated_deltanet(module: str) -> Callable:
    """``Qwen3_5GatedDeltaNet.forward`` of ``module`` (Qwen3.5's or Qwen3.5-MoE's) in the input dtype."""

    def forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):
        return _qwen3_5_gated_deltanet(sys.modules[module], self, hidden_states, cache, attention_mask)

    return forward


def _qwen3_5_gated_deltanet(m, self, hidden_states, cache=None, attention_mask=None):
    """``Qwen3_5GatedDeltaNet.forward`` of a whole sequence, ``g`` and the kernel in the input dtype
    (``m``: the transformers module of the class).

    A cache is left untouched: the reference's single forward never reads it back.
    """
    if cache is not None and cache.get_seq_length() > 0:
        raise NotImplementedError("the float64 reference runs one whole forward, not cached decoding")
    hidden_states = m.apply_mask_to_padding_states(hidden_states, attention_mask)
    batch, seq_len, _ = hidden_states.shape
    mixed = m.causal_conv1d_fn(self.in_proj_qkv(hidden_states).transpose(1, 2), self.conv1d.weight.squeeze(1),
                               self.conv1d.bias, activation=self.activation).transpose(1, 2)
    q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
    q = q.reshape(batch, seq_len, -1, self.head_k_dim)
    k = k.reshape(batch, seq_len, -1, self.head_k_dim)
    v = v.reshape(batch, seq_len, -1, self.head_v_dim)
    z = self.in_proj_z(hidden_states).reshape(batch, seq_len, -1, self.head_v_dim)
    beta = self.in_proj_b(hidden_states).sigmoid()
    g = -self.A_log.exp() * F.softplus(self.in_proj_a(hidden_states) + self.dt_bias)
    kernel = in_dtype(m.torch_chunk_gated_delta_rule, hidden_states.dtype)
    out, _ = kernel(q, k, v, g=g, beta=beta, initial_state=None, output_final_state=False,
                    use_qk_l2norm_in_kernel=True)
    out = self.norm(out.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
    return self.out_proj(out.reshape(batch, seq_len, -1))


def _kimi_temporal_merge(self, hidden_states, grid_thw, kernel_height, kernel_width, kwargs=None):
    """``Kimi_K25VisionModel.temporal_merge`` in the input dtype."""
    m = sys.modules["transformers.models.kimi_k25.modeling_kimi_k25"]
    index, frame_weight, n = m.get_vision_temporal_merge_index(grid_thw, kernel_height, kernel_width,
                                                               kwargs=kwargs)
    kernel = kernel_height * kernel_width
    pooled = hidden_states.new_zeros(n * kernel, hidden_states.shape[-1])
    pooled.index_add_(0, index, hidden_states * frame_weight[:, None].to(hidden_states.dtype))
    return pooled.view(n, kernel, -1)


def _llama4_router(self, hidden_states):
    """``Llama4Router.forward`` with the sigmoid in the logits' dtype."""
    logits = F.linear(hidden_states, self.weight, self.bias)
    top, index = torch.topk(logits, self.top_k, dim=1)
    return torch.sigmoid(torch.full_like(logits, float("-inf")).scatter_(1, index, top)), logits


def _modeling(name: str) -> str:
    return f"transformers.models.{name}.modeling_{name}"


_QWEN3_5 = (("qwen3_5", "Qwen3_5"), ("qwen3_5_moe", "Qwen3_5Moe"))
"""Qwen3.5 and Qwen3.5-MoE: the same norms and Gated DeltaNet, each in its own module."""


ISLANDS: tuple[tuple[str, str, Callable | str] | tuple[str, str, Callable | str, str], ...] = (
    *((_modeling(m), "apply_rotary_pos_emb_vision", _rotary_vision(_modeling(m)))
      for m in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "glm4v", "qwen3_5", "qwen3_5_moe",
                "kimi_k25", "glm4v_moe")),
    (_modeling("glm4v"), "Glm4vVisionEmbeddings.forward", _glm4v_positions),
    (_modeling("glm4v_moe"), "Glm4vMoeVisionEmbeddings.forward", _glm4v_positions),
    (_modeling("glm4v_moe"), "Glm4vMoeTextTopkRouter.forward", "in_dtype"),
    (_modeling("glm4v_moe"), "load_balancing_loss_func", _load_balancing),
    *((_modeling("llama4"), f, "in_dtype") for f in (
        "apply_rotary_emb", "vision_apply_rotary_emb", "Llama4TextL2Norm.forward",
        "Llama4TextRMSNorm.forward")),
    (_modeling("llama4"), "Llama4Router.forward", _llama4_router),
    (_modeling("minimax_m3_vl"), "MiniMaxM3VLRMSNorm.forward", "in_dtype"),
    *((_modeling("gemma4"), f, "in_dtype") for f in (
        "Gemma4RMSNorm.forward", "Gemma4VisionPooler._avg_pool_by_positions", "Gemma4VisionPooler.forward",
        "Gemma4TextRouter.forward")),
    (_modeling("minimax_m3_vl"), "MiniMaxM3VLTopKRouter.forward", "in_dtype"),
    (_modeling("minimax_m3_vl"), "load_balancing_loss_func", _load_balancing),
    (_modeling("siglip2"), "Siglip2VisionEmbeddings.resize_positional_embeddings",
     staticmethod(_siglip2_positions)),
    (_modeling("qwen3_vl_moe"), "Qwen3VLMoeTextTopKRouter.forward", _softmax_router),
    (_modeling("qwen3_vl_moe"), "load_balancing_loss_func", _load_balancing),
    *((_modeling(m), f"{prefix}RMSNorm.forward", _zero_centred_norm) for m, prefix in _QWEN3_5),
    *((_modeling(m), f"{prefix}RMSNormGated.forward", _gated_norm) for m, prefix in _QWEN3_5),
    *((_modeling(m), f"{p}GatedDeltaNet.forward", _gated_deltanet(_modeling(m))) for m, p in _QWEN3_5),
    (_modeling("qwen3_5_moe"), "Qwen3_5MoeTopKRouter.forward", _softmax_router),
    (_modeling("deepseek_v3"), "DeepseekV3TopkRouter.forward", "in_dtype"),
    (_modeling("kimi_k25"), "Kimi_K25VisionModel.temporal_merge", _kimi_temporal_merge),
    (_modeling("nemotron_h"), "mamba2_chunk_scan", "in_dtype"),
    (_modeling("nemotron_h"), "mamba2_scan_forward", "in_dtype", "5.25"),  # A's float() moved here in 5.25
    (_modeling("nemotron_h"), "NemotronHMamba2Mixer.forward", "in_dtype"),  # after the scan: calls it
    (_modeling("nemotron_h"), "NemotronHRMSNormGated.forward", "in_dtype"),
    (_modeling("nemotron_h"), "NemotronHTopkRouter.forward", "in_dtype"),
    (_modeling("nemotron_h"), "NemotronHForCausalLM.forward", "in_dtype"),  # logits.float()
    (_modeling("radio"), "RadioPatchEmbeddings._interpolate_position_embedding", "in_dtype"),
)
"""(transformers module, attribute path within it, replacement or ``"in_dtype"``[, the transformers
release it first exists in]): every float32 island vlmcp's float64 parity lifts (Note [vlmcp float64
parity: float32 islands]). An entry of a later release is skipped on an earlier one; one that is
missing where it should exist raises (a renamed island must not be skipped silently)."""


@contextlib.contextmanager
def float64_exact(dtype: torch.dtype) -> Iterator[None]:
    """While active and ``dtype`` is float64, every :data:`ISLANDS` entry of a loaded module is patched.

    Class-level patches (a module whose forward vlmcp replaced on the instance keeps vlmcp's);
    everything is restored on exit. Nothing happens for other dtypes.
    """
    if dtype != torch.float64:
        yield
        return
    saved = []
    try:
        for module_name, path, replacement, *since in ISLANDS:  # in order: each built after those above
            module = sys.modules.get(module_name)
            if module is None or (since and not at_least("transformers", since[0])):
                continue  # no model of it exists, or not in this release
            *owners, name = path.split(".")
            owner = module
            for part in owners:
                owner = getattr(owner, part)
            if replacement == "in_dtype":
                replacement = in_dtype(getattr(owner, name), dtype)
            saved.append((owner, name, owner.__dict__[name]))
            setattr(owner, name, replacement)
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)
