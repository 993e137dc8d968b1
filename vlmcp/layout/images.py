"""Image identity on the global row: which tokens form which image.

An image is a contiguous run of image tokens inside one sample. With
``image_ids=None`` every maximal run of image tokens within a sample is one image
(two images placed back to back then look like one: pass ``image_ids``). With
``image_ids`` (``LongTensor[L]``, ``-1`` at text, the image's index at its tokens)
images are numbered ``0, 1, 2, ...`` in row order and each one's tokens are one run.

Image identity decides which tokens see each other under bidirectional image
attention, which M-RoPE grid a token takes, and which embedding rows fill which
span. Every check here reads only metadata, so a bad row raises the same error on
every rank before any collective.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["RowImages", "row_images"]


@dataclass(frozen=True, eq=False)
class RowImages:
    """The images of one (packed) row.

    Attributes:
        image_ids: ``LongTensor[L]``, the image index of each token, ``-1`` at text.
        spans: ``LongTensor[n, 2]``, global ``[start, end)`` of image i, in row order.
        samples: ``LongTensor[n]``, the sample that holds image i.
        sample_ids: ``LongTensor[L]``, the sample of each token.
        offsets: ``LongTensor[L]``, each token's offset within its sample.
    """

    image_ids: torch.Tensor
    spans: torch.Tensor
    samples: torch.Tensor
    sample_ids: torch.Tensor
    offsets: torch.Tensor

    @property
    def num_images(self) -> int:
        return self.spans.shape[0]

    @property
    def lens(self) -> torch.Tensor:
        """``LongTensor[n]``: tokens of each image."""
        return self.spans[:, 1] - self.spans[:, 0]

    def keys_per_query(self, image_attention: str = "causal") -> torch.Tensor:
        """``LongTensor[L]``: keys each token attends to: its offset + 1, or under
        ``"bidirectional"`` attention, for an image token, every key before its image's end."""
        keys = self.offsets + 1
        if image_attention == "bidirectional":
            keys = torch.where(self.image_ids >= 0, self.span_end_offsets(), keys)
        return keys

    def span_end_offsets(self) -> torch.Tensor:
        """``LongTensor[L]``: for an image token, the sample offset one past its image's end; else -1."""
        if not self.num_images:
            return torch.full_like(self.image_ids, -1)
        end = self.offsets[self.spans[:, 0]] + self.lens
        return torch.where(self.image_ids >= 0, end[self.image_ids.clamp(min=0)], -1)


def row_images(is_image: torch.Tensor, cu: torch.Tensor, image_ids: torch.Tensor | None = None) -> RowImages:
    """Validate and describe the images of a row.

    Args:
        is_image: ``BoolTensor[L]`` on the CPU (checked by the caller).
        cu: validated ``LongTensor[S+1]`` sample boundaries.
        image_ids: optional ``LongTensor[L]``: ``-1`` at text tokens, the image index at
            image tokens, images numbered from 0 in row order, each one contiguous.

    Raises:
        ValueError, TypeError: ``image_ids`` of the wrong shape or dtype, disagreeing with
            ``is_image``, numbered out of order, split into pieces, or crossing a sample
            boundary (the message names the token or image).
    """
    L = is_image.numel()
    seqlens = cu[1:] - cu[:-1]
    sid = torch.repeat_interleave(torch.arange(seqlens.numel()), seqlens, output_size=L)
    offsets = torch.arange(L) - cu[:-1][sid]
    if image_ids is None:
        # a new image starts at every image token whose predecessor is text or in another sample
        start = is_image & ((offsets == 0) | ~torch.cat([is_image.new_zeros(1), is_image[:-1]]))
        ids = torch.cumsum(start.long(), 0) - 1
        ids = torch.where(is_image, ids, -1)
    else:
        ids = _check_image_ids(image_ids, is_image)
    image_pos = torch.nonzero(ids >= 0).flatten()
    n = int(ids[image_pos[-1]]) + 1 if image_pos.numel() else 0
    counts = torch.bincount(ids[image_pos], minlength=n)
    first = torch.zeros(n, dtype=torch.long)
    if n:
        first[1:] = torch.cumsum(counts, 0)[:-1]
        first = image_pos[first]
    spans = torch.stack([first, first + counts], dim=1) if n else torch.zeros(0, 2, dtype=torch.long)
    if n and image_ids is not None:
        # ids rise 0, 1, 2, ... in row order, so image i is contiguous iff no text sits inside it
        last = image_pos[torch.cumsum(counts, 0) - 1]
        gap = torch.nonzero(last - first + 1 != counts).flatten()
        if gap.numel():
            i = int(gap[0])
            inside = int(first[i]) + int(torch.nonzero(ids[first[i]:last[i] + 1] != i)[0])
            raise ValueError(
                f"image_ids: image {i} (tokens {int(first[i])}..{int(last[i])}) is not contiguous: "
                f"token {inside} inside it is text; every image must be one run of tokens")
        crosses = sid[spans[:, 0]] != sid[spans[:, 1] - 1]
        if bool(crosses.any()):
            i = int(torch.nonzero(crosses)[0])
            a, b = int(spans[i, 0]), int(spans[i, 1])
            raise ValueError(
                f"image {i} (tokens {a}..{b - 1}) crosses a sample boundary: it starts in sample "
                f"{int(sid[a])} and ends in sample {int(sid[b - 1])} (cu_seqlens={cu.tolist()})")
    samples = sid[spans[:, 0]] if n else torch.zeros(0, dtype=torch.long)
    return RowImages(image_ids=ids, spans=spans, samples=samples, sample_ids=sid, offsets=offsets)


def _check_image_ids(image_ids, is_image: torch.Tensor) -> torch.Tensor:
    if not isinstance(image_ids, torch.Tensor):
        raise TypeError(f"image_ids must be a torch.Tensor (LongTensor[L]), got {type(image_ids).__name__}")
    if image_ids.dim() != 1 or image_ids.dtype.is_floating_point or image_ids.dtype == torch.bool:
        raise ValueError(f"image_ids must be a 1-D integer tensor, got shape {tuple(image_ids.shape)} "
                         f"dtype {image_ids.dtype}")
    if image_ids.numel() != is_image.numel():
        raise ValueError(f"image_ids has {image_ids.numel()} entries but is_image has {is_image.numel()}")
    ids = image_ids.to(device="cpu", dtype=torch.long)
    wrong = (ids >= 0) != is_image
    if bool(wrong.any()):
        t = int(torch.nonzero(wrong)[0])
        raise ValueError(
            f"image_ids disagrees with is_image at token {t}: image_ids[{t}]={int(ids[t])}, "
            f"is_image[{t}]={bool(is_image[t])} (image tokens need an id >= 0, text tokens -1)")
    if bool((ids < -1).any()):
        t = int(torch.nonzero(ids < -1)[0])
        raise ValueError(f"image_ids[{t}]={int(ids[t])}: ids are -1 (text) or an image index >= 0")
    seq = ids[ids >= 0]
    if seq.numel():
        step = seq[1:] - seq[:-1]
        bad = torch.nonzero((step != 0) & (step != 1)).flatten()
        if int(seq[0]) != 0 or bad.numel():
            where = "the first image is numbered " + str(int(seq[0])) if int(seq[0]) != 0 else (
                f"image {int(seq[bad[0]])} is followed by image {int(seq[bad[0] + 1])}")
            raise ValueError(f"image_ids must number images 0, 1, 2, ... in row order, but {where}")
    return ids
