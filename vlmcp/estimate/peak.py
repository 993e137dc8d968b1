"""A CP rank's predicted peak memory for one training step of a HF VLM, term by term, from its config.

Note [vlmcp memory estimate: a rank's peak]
-------------------------------------------
For a row of ``L`` tokens, ``V`` of them visual (``images`` images), on a CP group of ``P``
ranks (``D`` data-parallel replicas), the busiest rank holds::

    states       parameters + gradients + AdamW's two moments, b bytes each (the parameters'
                 dtype); under FSDP (vlmcp train --fsdp: every block its own unit, sharded over
                 all D*P ranks) 1/(D*P) of them, plus the unsharded root unit (embeddings, head,
                 what no block holds) and two blocks (the one computing, the one prefetched)
    LLM          n_r tokens x (layers x per_layer + once + final norm)  [checkpointed: per-layer
                 input only], n_r = V + ceil((L - V) / P) under image_strategy="replicate",
                 ceil(L / P) under "shard"; plus the image-token mask (1 byte per token)
    ViT          the tower's ViT tokens this rank encodes x (blocks x per_block + once + merger)
                 (+ Pixtral's (n, n) block-diagonal mask over them, checkpointed or not):
                 every image under replicate, allreduce_hook, hidden_shard and broadcast (the
                 source rank is the busiest), ceil(images / P) images under scatter
    loss         20 bytes per target saved (row index, target, log-sum-exp); a transient: one
                 chunk of logits (:func:`vlmcp.loss.chunk_transient_bytes`), the head's float32
                 gradient accumulator (V x H x 4, 16-bit weights only: a float32 one is the
                 gradient itself) and the hidden states' gradient (n_r x H); ``--loss full`` is
                 not estimated
    recompute    with checkpointing, one block's full saved set while backward recomputes it
                 (the larger of an LLM layer on n_r tokens and a ViT block on the rank's patches);
                 with offloading, the same set copied back to the device for its backward
    peak         states + saved on the device + max(loss transient, recompute)

Under FSDP the root unit's gradients (the embedding's and the head's, in b) also stay unsharded
from the head's backward to the end of backward, so ``fsdp_unsharded`` counts the root twice.

With ``offload_activations`` the saved tensors live in host memory: the device keeps none of
them (``host`` says how many bytes the host needs). The per-token terms are
Note [vlmcp memory estimate: saved bytes per token]; ``tests/test_estimate.py`` holds them to
the exact counter on tiny models. Not counted: allocator fragmentation, the backward's
transient gradients of activations (one block's at a time), communication buffers, the
CUDA context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from vlmcp.estimate.ops import ACC
from vlmcp.estimate.text import text_blocks
from vlmcp.estimate.towers import Tower, tower_for
from vlmcp.loss import chunk_transient_bytes

__all__ = ["EstimateSetup", "MemoryEstimate", "ModelStates", "estimate_memory", "max_seq_len", "model_states"]

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
VISION_MODES = ("replicate", "allreduce_hook", "broadcast", "scatter", "hidden_shard")


@dataclass(frozen=True, kw_only=True)
class EstimateSetup:
    """What the estimate is for: the row, the parallel layout and the step's options."""

    seq_len: int
    """L: tokens of the row (visual tokens included)."""
    cp: int = 1
    """P: ranks of the CP group."""
    dp: int = 1
    """D: data-parallel replicas (FSDP shards over D*P ranks)."""
    visual_tokens: int = 0
    """V: the row's visual LLM tokens (fixed-size images: a multiple of the tokens per image)."""
    images: int | None = None
    """Images (frame groups for a video) the visual tokens come in; None: one for a model with any image
    size, V / tokens-per-image for fixed-size images."""
    fsdp: bool = False
    """FSDP2 over all D*P ranks, every block its own unit (``vlmcp train --fsdp``)."""
    activation_checkpointing: bool = False
    """Every decoder layer and ViT block checkpointed (HF's non-reentrant checkpointing)."""
    offload_activations: bool = False
    """The saved tensors kept in host memory (``vlmcp train --offload-activations``)."""
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    """Parameters' and activations' dtype (AdamW's moments take the parameters')."""
    image_strategy: Literal["replicate", "shard"] = "replicate"
    """Visual tokens on every rank, or sharded with the text."""
    vision_mode: Literal["replicate", "allreduce_hook", "broadcast", "scatter", "hidden_shard"] = "replicate"
    """Which rank encodes which images (``scatter``: ceil(images / P) each)."""
    chunk_size: int = 4096
    """The chunked loss' targets per chunk."""
    attention: Literal["ring", "ulysses", "usp"] = "ring"
    """CP attention; only ring (the default of ``vlmcp train``) is estimated: Ulysses saves its
    all-to-all's head-split copies too (measured: up to 10% more without checkpointing)."""

    def __post_init__(self) -> None:
        for name in ("seq_len", "cp", "dp", "chunk_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.visual_tokens < self.seq_len:
            raise ValueError(f"visual tokens must be in [0, seq_len), got {self.visual_tokens} of "
                             f"{self.seq_len}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {tuple(DTYPE_BYTES)}, got {self.dtype!r}")
        if self.image_strategy not in ("replicate", "shard"):
            raise ValueError(f"image_strategy must be 'replicate' or 'shard', got {self.image_strategy!r}")
        if self.vision_mode not in VISION_MODES:
            raise ValueError(f"vision_mode must be one of {VISION_MODES}, got {self.vision_mode!r}")
        if self.attention != "ring":
            raise NotImplementedError(f"attention {self.attention!r} is not estimated (ring is; Ulysses' "
                                      "head-split copies are not written)")
        if self.fsdp and self.vision_mode in ("broadcast", "scatter"):  # as vlmcp train --fsdp refuses them
            raise ValueError(f"fsdp takes vision_mode replicate, allreduce_hook or hidden_shard (as vlmcp "
                             f"train --fsdp), got {self.vision_mode!r}")
        if self.images is not None and not 1 <= self.images <= self.visual_tokens:
            raise ValueError(f"images must be in [1, visual tokens {self.visual_tokens}], got {self.images}")


@dataclass(frozen=True, kw_only=True)
class ModelStates:
    """Parameter counts of the model, from the config (a model on the meta device: no weights)."""

    params: int
    """Distinct parameters (tied embeddings once)."""
    root: int
    """Parameters no FSDP block unit holds (embeddings, head, norms, projector)."""
    largest_block: int
    """Parameters of the largest block (``_no_split_modules``): an FSDP unit."""


def model_states(config: Any) -> ModelStates:
    """Count the parameters of the HF model ``config`` describes, built on the meta device."""
    import torch
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    blocks = set(getattr(model, "_no_split_modules", None) or ())
    in_block: set[int] = set()
    largest = 0
    for module in model.modules():
        if type(module).__name__ in blocks:
            ps = {id(p): p.numel() for p in module.parameters()}
            in_block.update(ps)
            largest = max(largest, sum(ps.values()))
    params = {id(p): p.numel() for p in model.parameters()}
    root = sum(n for i, n in params.items() if i not in in_block)
    return ModelStates(params=sum(params.values()), root=root, largest_block=largest)


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    """The busiest rank's predicted bytes, term by term (Note [vlmcp memory estimate: a rank's peak])."""

    llm_tokens: int
    """n_r: the rank's LLM tokens (visual ones included)."""
    visual_on_rank: int
    """Of them, visual tokens."""
    vit_tokens: int
    """ViT tokens (patches) the rank encodes."""
    targets: int
    """Tokens with a next-token target on the rank."""
    offloaded: bool = False
    """The saved bytes live in host memory."""
    terms: dict[str, int] = field(default_factory=dict)
    """Bytes of each term, in print order: states (params, grads, adamw, fsdp_unsharded), saved
    (llm, vit, loss), transients (loss_chunk, recompute)."""

    @property
    def states(self) -> int:
        return sum(self.terms[k] for k in ("params", "grads", "adamw", "fsdp_unsharded"))

    @property
    def saved(self) -> int:
        """Saved-for-backward bytes: what :class:`~vlmcp.debug.meters.saved_tensors.SavedTensorMeter`
        counts."""
        return sum(self.terms[k] for k in ("llm", "vit", "loss"))

    @property
    def on_device_saved(self) -> int:
        return 0 if self.offloaded else self.saved

    @property
    def peak(self) -> int:
        return self.states + self.on_device_saved + max(self.terms["loss_chunk"], self.terms["recompute"])


def _vit_tokens(tower: Tower, visual: int, images: int) -> int:
    return visual * tower.vit_per_llm_token + images * tower.per_image_vit


def estimate_memory(config: Any, setup: EstimateSetup, states: ModelStates | None = None) -> MemoryEstimate:
    """The busiest CP rank's predicted peak for one training step of the model ``config`` describes.

    Args:
        config: the HF VLM config (``AutoConfig.from_pretrained(dir)``: config.json only).
        setup: the row and the layout.
        states: :func:`model_states` of ``config`` (computed when None; pass it to reuse).

    Raises:
        NotImplementedError: an architecture, block or activation the estimate does not know (named).
        ValueError: a row the model cannot hold (visual tokens that are not whole images).
    """
    b = DTYPE_BYTES[setup.dtype]
    tower = tower_for(config, b)  # first: it names a refused architecture
    text = text_blocks(config, b)
    P, L, V = setup.cp, setup.seq_len, setup.visual_tokens
    images = setup.images
    if tower.llm_tokens_per_image is not None and V:
        if V % tower.llm_tokens_per_image:
            raise ValueError(f"{config.model_type}: images are {tower.llm_tokens_per_image} tokens each; "
                             f"visual tokens {V} are not a whole number of images")
        whole = V // tower.llm_tokens_per_image
        if images not in (None, whole):
            raise ValueError(f"{config.model_type}: {V} visual tokens are {whole} images, not {images}")
        images = whole
    images = (1 if V else 0) if images is None else images
    T = L - V
    n_r = V + math.ceil(T / P) if setup.image_strategy == "replicate" else math.ceil(L / P)
    visual_r = V if setup.image_strategy == "replicate" else min(math.ceil(V / P), n_r)
    targets = min(math.ceil(T / P), n_r)
    images_r = math.ceil(images / P) if setup.vision_mode == "scatter" else images
    visual_vit = V * images_r // images if images else 0  # the rank's images' LLM tokens (equal images)
    vit_tokens = _vit_tokens(tower, visual_vit, images_r)
    head_tokens = visual_vit * tower.vit_per_llm_token  # the ViT tokens the merger or projector reads
    if tower.vit_per_image:  # tiled: the ViT tokens follow the tiles, not the LLM tokens
        if V and setup.images is None:
            raise ValueError(f"{config.model_type}: give images (the tiles the ViT encodes); its visual "
                             "tokens do not determine them (unpadding, newlines)")
        vit_tokens = images_r * tower.vit_per_image
        head_tokens = images_r * (tower.vit_per_image - tower.per_image_vit)
    ckpt = setup.activation_checkpointing
    layer = text.checkpointed if ckpt else text.per_layer
    llm = n_r * (text.layers * layer + (text.once_checkpointed if ckpt else text.once) + text.final_norm)
    llm += (n_r if V else 0) + (text.fixed_checkpointed if ckpt else text.fixed)  # the image-token mask
    block = tower.checkpointed if ckpt else tower.per_block
    once = tower.once - (tower.rotary if ckpt else 0)
    vit = (vit_tokens * (tower.blocks * block + once) + head_tokens * tower.head
           + visual_vit * tower.head_llm + images_r * tower.per_image_once + tower.fixed
           + tower.mask_bytes * vit_tokens ** 2) if images_r else 0
    loss = 20 * targets + 4
    chunk = chunk_transient_bytes(min(setup.chunk_size, targets), text.vocab, _torch_dtype(setup.dtype),
                                  softcap=text.softcap is not None, hidden_size=text.hidden)
    chunk += (ACC * text.vocab * text.hidden if b < ACC else 0) + b * n_r * text.hidden
    again = ckpt or setup.offload_activations
    recompute = max(n_r * text.per_layer, vit_tokens * tower.per_block) if again else 0
    s = states or model_states(config)
    world = setup.dp * P if setup.fsdp else 1
    shard = b * s.params // world
    terms = {"params": shard, "grads": shard, "adamw": 2 * shard,
             "fsdp_unsharded": b * (2 * s.root + 2 * s.largest_block) if setup.fsdp else 0,
             "llm": llm, "vit": vit, "loss": loss, "loss_chunk": chunk, "recompute": recompute}
    return MemoryEstimate(llm_tokens=n_r, visual_on_rank=visual_r, vit_tokens=vit_tokens, targets=targets,
                          offloaded=setup.offload_activations, terms=terms)


def _torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def max_seq_len(config: Any, setup: EstimateSetup, budget: int, states: ModelStates | None = None) -> int:
    """The largest ``seq_len`` (visual tokens as in ``setup``) whose predicted peak fits ``budget`` bytes;
    0 when none does."""
    from dataclasses import replace

    s = states or model_states(config)

    def fits(L: int) -> bool:
        return estimate_memory(config, replace(setup, seq_len=L), s).peak <= budget

    lo = setup.visual_tokens + 1
    if not fits(lo):
        return 0
    hi = lo
    while fits(hi * 2) and hi < 1 << 40:
        hi *= 2
    lo, hi = hi, hi * 2  # fits(lo), not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
