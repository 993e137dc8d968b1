"""The reference vision encoder: a small ViT and an MLP projector to the LLM width.

Images have different sizes, so the ViT runs one image at a time (full attention
inside an image, none across images) and the projector runs on all image tokens
at once. Image i of size ``(C, H, W)`` gives ``(H/p) * (W/p)`` tokens, patches in
row-major order; the output rows are the images concatenated in list order.

With no placement (or a CP group of one) :class:`VisionEncoder` is an ordinary
module; :func:`vlmcp.vision.place_vision` spreads its work over a CP group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["Projector", "VisionConfig", "VisionEncoder", "VisionTower", "image_token_counts", "image_tokens"]


@dataclass(frozen=True, kw_only=True)
class VisionConfig:
    """Shape of the reference ViT and projector."""

    out_dim: int
    """Width of the image embeddings: the LLM's hidden size."""
    patch_size: int = 4
    """Square patch side p in pixels; image sides must be multiples of it."""
    channels: int = 3
    """Input channels C."""
    width: int = 32
    """ViT width; a multiple of 4 (2-D sin-cos positions) and of ``heads``."""
    depth: int = 2
    """ViT blocks."""
    heads: int = 2
    """Attention heads per ViT block."""
    mlp_hidden: int = 64
    """Inner width of each ViT block's MLP."""
    projector_hidden: int = 64
    """Inner width of the projector (Linear-GELU-Linear)."""
    norm_eps: float = 1e-6
    """LayerNorm epsilon."""

    def __post_init__(self):
        for name in ("out_dim", "patch_size", "channels", "width", "depth", "heads", "mlp_hidden",
                     "projector_hidden"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"VisionConfig.{name} must be an int >= 1, got {value!r}")
        if self.width % 4 or self.width % self.heads:
            raise ValueError(
                f"VisionConfig.width={self.width} must be divisible by 4 and by heads={self.heads}")


def image_tokens(image: torch.Tensor, patch_size: int) -> int:
    """Tokens of one ``(C, H, W)`` image: ``(H/p) * (W/p)`` (no validation)."""
    return (image.shape[-2] // patch_size) * (image.shape[-1] // patch_size)


def image_token_counts(images: Sequence[torch.Tensor], patch_size: int, channels: int = 3) -> list[int]:
    """Validate a list of ``(C, H, W)`` float images and return each one's token count.

    Pure (no communication), so every rank raises the same error for the same batch.
    """
    if isinstance(images, torch.Tensor) or not isinstance(images, Sequence):
        raise TypeError(f"images must be a list of (C, H, W) tensors, got {type(images).__name__}")
    tokens = []
    for i, img in enumerate(images):
        if not isinstance(img, torch.Tensor) or img.dim() != 3 or img.shape[0] != channels:
            shape = tuple(img.shape) if isinstance(img, torch.Tensor) else type(img).__name__
            raise ValueError(f"image {i} must be a ({channels}, H, W) tensor, got {shape}")
        if not img.is_floating_point():
            raise TypeError(f"image {i} must be a floating-point tensor, got {img.dtype}")
        h, w = img.shape[1:]
        if h < patch_size or w < patch_size or h % patch_size or w % patch_size:
            raise ValueError(
                f"image {i} has size {h}x{w}, not a multiple of patch_size={patch_size} "
                f"(both sides must be positive multiples of patch_size={patch_size})")
        tokens.append(image_tokens(img, patch_size))
    return tokens


def _sincos_2d(h: int, w: int, width: int, dtype, device) -> torch.Tensor:
    """Fixed 2-D sin-cos positions ``(h*w, width)``: no table to resize for new image sizes."""
    quarter = width // 4
    freq = 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float64, device=device) / quarter)
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float64, device=device),
                            torch.arange(w, dtype=torch.float64, device=device), indexing="ij")
    ay, ax = ys.reshape(-1, 1) * freq, xs.reshape(-1, 1) * freq
    return torch.cat([ay.sin(), ay.cos(), ax.sin(), ax.cos()], dim=1).to(dtype)


class _Block(nn.Module):
    """Pre-norm transformer block with full (bidirectional) attention over one image."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.heads = cfg.heads
        self.norm1 = nn.LayerNorm(cfg.width, eps=cfg.norm_eps)
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)
        self.norm2 = nn.LayerNorm(cfg.width, eps=cfg.norm_eps)
        self.fc1 = nn.Linear(cfg.width, cfg.mlp_hidden)
        self.fc2 = nn.Linear(cfg.mlp_hidden, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: ``(n, width)`` tokens of one image -> ``(n, width)``."""
        n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(n, 3, self.heads, d // self.heads).permute(1, 2, 0, 3)
        attn = F.scaled_dot_product_attention(q, k, v)  # (heads, n, head_dim), no mask
        x = x + self.proj(attn.transpose(0, 1).reshape(n, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class VisionTower(nn.Module):
    """A small ViT: patch embedding, 2-D sin-cos positions, pre-norm blocks, final norm."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.cfg = cfg
        p = cfg.patch_size
        self.patch_embed = nn.Linear(cfg.channels * p * p, cfg.width)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.depth))
        self.norm = nn.LayerNorm(cfg.width, eps=cfg.norm_eps)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        """image: ``(C, H, W)`` -> ``(H/p * W/p, width)`` patch features, row-major."""
        c, p = self.cfg.channels, self.cfg.patch_size
        h, w = image.shape[1] // p, image.shape[2] // p
        patches = image.reshape(c, h, p, w, p).permute(1, 3, 0, 2, 4).reshape(h * w, c * p * p)
        x = self.patch_embed(patches)
        x = x + _sincos_2d(h, w, self.cfg.width, x.dtype, x.device)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


class Projector(nn.Module):
    """Linear-GELU-Linear from the ViT width to the LLM hidden size.

    ``fc2`` is the layer ``hidden_shard`` splits by output columns.
    """

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.width, cfg.projector_hidden)
        self.fc2 = nn.Linear(cfg.projector_hidden, cfg.out_dim)

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, width)`` -> ``(N, projector_hidden)``: everything before ``fc2``."""
        return F.gelu(self.fc1(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, width)`` -> ``(N, fc2.out_features)``."""
        return self.fc2(self.hidden(x))


class VisionEncoder(nn.Module):
    """ViT + projector: a list of images -> their embeddings ``(sum of tokens, out_dim)``.

    ``forward(images)`` runs the whole encoder locally, or, once
    :func:`vlmcp.vision.place_vision` has placed it on a CP group, returns the
    complete embeddings on every rank of that group by the placement's mode.
    """

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.cfg = cfg
        self.tower = VisionTower(cfg)
        self.projector = Projector(cfg)
        self.placement = None  # set by place_vision

    @property
    def out_dim(self) -> int:
        return self.cfg.out_dim

    def check_images(self, images: Sequence[torch.Tensor]) -> list[int]:
        """Validate ``images`` (pure, no communication) and return tokens per image."""
        return image_token_counts(images, self.cfg.patch_size, self.cfg.channels)

    def features(self, images: Sequence[torch.Tensor]) -> torch.Tensor:
        """ViT and the projector up to ``fc2``: ``(sum of tokens, projector_hidden)``.

        An empty list gives ``(0, projector_hidden)`` still attached to the projector's
        parameters, so a rank with no image joins the backward like the others.
        """
        ref = self.projector.fc1.weight
        feats = [self.tower(img.to(device=ref.device, dtype=ref.dtype)) for img in images]
        x = torch.cat(feats) if feats else ref.new_zeros(0, self.cfg.width)
        return self.projector.hidden(x)

    def encode(self, images: Sequence[torch.Tensor]) -> torch.Tensor:
        """Run ViT + projector here on ``images``: ``(sum of tokens, fc2.out_features)``."""
        return self.projector.fc2(self.features(images))

    def forward(self, images: Sequence[torch.Tensor]) -> torch.Tensor:
        """Image embeddings ``(sum of tokens, out_dim)``, images concatenated in order.

        Args:
            images: ``(C, H, W)`` float tensors, sides multiples of ``patch_size``;
                identical (at least in shape) on every rank of a placed encoder.
        """
        tokens = self.check_images(images)
        if self.placement is None:
            return self.encode(images)
        return self.placement.embed(self, images, tokens)

    def extra_repr(self) -> str:
        mode = None if self.placement is None else self.placement.mode
        return f"out_dim={self.out_dim}, patch_size={self.cfg.patch_size}, placement={mode}"

