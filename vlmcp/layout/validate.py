"""Input checks shared by the layout modules (planner, cost model, labels, positions).

Every check runs on the global row's metadata before anything is planned or
communicated, and its message names the bad value.
"""

from __future__ import annotations

import torch

__all__ = ["check_cp_size", "check_cu_seqlens", "check_is_image"]


def check_is_image(is_image) -> None:
    """Raise unless ``is_image`` is a non-empty 1-D bool tensor."""
    if not isinstance(is_image, torch.Tensor):
        raise TypeError(f"is_image must be a torch.Tensor, got {type(is_image).__name__}")
    if is_image.dim() != 1 or is_image.dtype != torch.bool:
        raise ValueError(
            f"is_image must be a 1-D bool tensor, got shape {tuple(is_image.shape)} "
            f"dtype {is_image.dtype}")
    if is_image.numel() == 0:
        raise ValueError("is_image is empty: the row has no tokens")


def check_cp_size(cp_size) -> None:
    """Raise unless ``cp_size`` is an int >= 1."""
    if isinstance(cp_size, bool) or not isinstance(cp_size, int) or cp_size < 1:
        raise ValueError(f"cp_size must be an int >= 1, got {cp_size!r}")


def check_cu_seqlens(cu_seqlens, seq_len: int) -> torch.Tensor:
    """Validated sample boundaries as a CPU ``LongTensor[S+1]`` (one sample if None)."""
    if cu_seqlens is None:
        return torch.tensor([0, seq_len], dtype=torch.long)
    if not isinstance(cu_seqlens, torch.Tensor):
        cu_seqlens = torch.as_tensor(cu_seqlens)
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype == torch.bool:
        raise ValueError(
            f"cu_seqlens must be a 1-D integer tensor, got shape {tuple(cu_seqlens.shape)} "
            f"dtype {cu_seqlens.dtype}")
    cu = cu_seqlens.to(device="cpu", dtype=torch.long)
    if cu.numel() < 2:
        raise ValueError(f"cu_seqlens needs at least 2 entries, got {cu.tolist()}")
    if int(cu[0]) != 0:
        raise ValueError(f"cu_seqlens must start at 0, got cu_seqlens[0]={int(cu[0])}")
    steps = cu[1:] - cu[:-1]
    if bool((steps <= 0).any()):
        i = int(torch.nonzero(steps <= 0)[0])
        raise ValueError(
            f"cu_seqlens must be strictly increasing, but cu_seqlens[{i}]={int(cu[i])} "
            f">= cu_seqlens[{i + 1}]={int(cu[i + 1])} (sample {i} is empty)")
    if int(cu[-1]) != seq_len:
        raise ValueError(f"cu_seqlens must end at L={seq_len}, got cu_seqlens[-1]={int(cu[-1])}")
    return cu
