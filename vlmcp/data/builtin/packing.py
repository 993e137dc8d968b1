"""Packing samples into rows of exactly ``seq_len`` tokens.

Note [vlmcp data: packing and the data position]
------------------------------------------------
Samples are taken in stream order and never cut: an image and its caption stay whole
in one row. When the next sample does not fit, the rest of the row becomes one
*filler* sample of ``PAD_ID`` text tokens whose labels are ignored, and that sample
opens the next row::

    seq_len = 16, samples of 7, 5 and 6 tokens
    row 0:  [ s0: b t I I I t e | s1: b t t t e | filler: p p p p ]   start=0, stop=2
    row 1:  [ s2: b t I I J J e | s3 ...                          ]   start=2, ...

The *data position* is the index of the next sample not yet packed: a row covers
samples ``[row.start, row.stop)``, so continuing from ``row.stop`` gives exactly the
rows an uninterrupted run would see. A checkpoint stores that one integer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlmcp.data.builtin.dataset import ShapesDataset
from vlmcp.data.builtin.vocab import IMAGE_ID, PAD_ID, VOCAB_SIZE
from vlmcp.layout.choose import plan_cp
from vlmcp.layout.labels import IGNORE_INDEX, shift_labels
from vlmcp.layout.plan import CPPlan

__all__ = ["PackedRow", "pack_row", "pack_rows", "random_row"]


@dataclass(frozen=True, eq=False)
class PackedRow:
    """One packed row, ready for :func:`vlmcp.plan_cp`.

    Attributes:
        input_ids: ``LongTensor[L]``; image slots hold ``IMAGE_ID``, filler ``PAD_ID``.
        is_image: ``BoolTensor[L]``; images sit anywhere in their samples.
        image_ids: ``LongTensor[L]``, each image slot's image (0, 1, ... in row order),
            -1 at text: what tells back-to-back images apart (pass it to ``plan_cp``).
        cu_seqlens: ``LongTensor[S+1]``, sample boundaries (the filler is a sample).
        labels: ``LongTensor[L]``, next-token targets shifted on the global row by
            :func:`vlmcp.shift_labels`, with ``IGNORE_INDEX`` on the filler.
        images: ``FloatTensor[3, H, W]`` of every image, in row order.
        image_grid_thw: ``LongTensor[len(images), 3]``, ``(1, H // p, W // p)`` per image
            (the input of :func:`vlmcp.mrope_position_ids`).
        start: data position of the row's first sample.
        stop: data position after the row (the next row's ``start``).
        filler_len: tokens of the filler sample at the end, 0 when the row is full.
    """

    input_ids: torch.Tensor
    is_image: torch.Tensor
    image_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    labels: torch.Tensor
    images: list[torch.Tensor]
    image_grid_thw: torch.Tensor
    start: int
    stop: int
    filler_len: int

    @property
    def seq_len(self) -> int:
        return self.input_ids.numel()

    @property
    def num_samples(self) -> int:
        """Samples in the row, the filler included."""
        return self.cu_seqlens.numel() - 1

    @property
    def num_targets(self) -> int:
        """Positions with a label (the token count a loss is normalised by)."""
        return int((self.labels != IGNORE_INDEX).sum())

    def plan(self, cp_size: int, **kwargs) -> CPPlan:
        """:func:`vlmcp.plan_cp` of this row (its image ids included); ``kwargs`` go to ``plan_cp``."""
        return plan_cp(self.is_image, cp_size, self.cu_seqlens, image_ids=self.image_ids, **kwargs)


def _check_args(dataset: ShapesDataset, seq_len: int, position: int) -> None:
    if not isinstance(dataset, ShapesDataset):
        raise TypeError(f"dataset must be a ShapesDataset, got {type(dataset).__name__}")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int):
        raise ValueError(f"seq_len must be an int, got {seq_len!r}")
    cfg = dataset.config
    if seq_len < dataset.max_sample_len:
        raise ValueError(
            f"seq_len={seq_len} is too short for one sample: the dataset's longest sample has "
            f"{dataset.max_sample_len} tokens (a prompt, images of up to {cfg.max_image_tokens} tokens "
            f"({cfg.max_image_size}x{cfg.max_image_size} at patch_size={cfg.patch_size}), two in a "
            f"comparison and {cfg.video_frames} in a video, and captions of up to "
            f"{cfg.max_caption_tokens} tokens); use seq_len >= {dataset.max_sample_len} or lower "
            "max_image_size / max_objects / video_frames")
    if isinstance(position, bool) or not isinstance(position, int) or position < 0:
        raise ValueError(f"position must be an int >= 0, got {position!r}")


def pack_row(dataset: ShapesDataset, seq_len: int, position: int = 0) -> PackedRow:
    """Pack samples ``position, position + 1, ...`` into one row of ``seq_len`` tokens.

    See Note [vlmcp data: packing and the data position].

    Args:
        dataset: the sample stream.
        seq_len: L, tokens per row; at least ``dataset.max_sample_len``.
        position: data position (index of the first sample to pack).

    Returns:
        A :class:`PackedRow`; ``row.stop`` is the position to continue from.

    Raises:
        ValueError: for a ``seq_len`` shorter than the longest possible sample, or a
            negative ``position`` (the message names the value).
    """
    _check_args(dataset, seq_len, position)
    samples, used, index = [], 0, position
    while True:
        sample = dataset[index]
        if used + len(sample) > seq_len:
            break
        samples.append(sample)
        used += len(sample)
        index += 1
    filler_len = seq_len - used
    lens = [len(s) for s in samples] + ([filler_len] if filler_len else [])
    cu_seqlens = torch.zeros(len(lens) + 1, dtype=torch.long)
    torch.cumsum(torch.tensor(lens), 0, out=cu_seqlens[1:])
    input_ids = torch.cat([s.input_ids for s in samples] +
                          [torch.full((filler_len,), PAD_ID, dtype=torch.long)])
    image_ids, images, grids, first = [], [], [], 0
    for sample in samples:  # renumber each sample's images in row order
        image_ids.append(torch.where(sample.is_image, sample.image_ids + first, -1))
        images += sample.images
        grids += [[1, h, w] for h, w in sample.grids]
        first += len(sample.images)
    image_ids = torch.cat(image_ids + [torch.full((filler_len,), -1, dtype=torch.long)])
    is_image = image_ids >= 0
    labels = shift_labels(input_ids, is_image, cu_seqlens)
    # PAD -> PAD targets would be free loss; the filler must not teach anything.
    labels[used:] = IGNORE_INDEX
    return PackedRow(input_ids=input_ids, is_image=is_image, image_ids=image_ids, cu_seqlens=cu_seqlens,
                     labels=labels, images=images,
                     image_grid_thw=torch.tensor(grids, dtype=torch.long).view(-1, 3),
                     start=position, stop=index, filler_len=filler_len)


def pack_rows(dataset: ShapesDataset, seq_len: int, position: int = 0,
              num_rows: int = 1) -> list[PackedRow]:
    """Pack ``num_rows`` consecutive rows starting at data position ``position``.

    A step of a data-parallel run packs the same global rows on every rank (cheap:
    images are tiny) and each DP rank takes ``rows[dp_rank]``; then the data position
    ``rows[-1].stop`` is identical on all ranks and does not depend on the CP size.

    Returns:
        ``num_rows`` rows; ``rows[i].stop == rows[i + 1].start``.
    """
    if isinstance(num_rows, bool) or not isinstance(num_rows, int) or num_rows < 1:
        raise ValueError(f"num_rows must be an int >= 1, got {num_rows!r}")
    rows = []
    for _ in range(num_rows):
        rows.append(pack_row(dataset, seq_len, position))
        position = rows[-1].stop
    return rows


def random_row(samples, patch_size: int, generator: torch.Generator) -> PackedRow:
    """A packed row of random pixels and token ids, for parity checks and benchmarks.

    Args:
        samples: one list per sample of its pieces in order: an int is that many text
            tokens, an ``(H, W)`` tuple an image of ``(H/p) * (W/p)`` tokens. Images may
            sit anywhere, back to back too (``image_ids`` tells them apart).
        patch_size: p.
        generator: draws each sample's pixels and text ids, piece by piece in order.
    """
    ids, image_ids, images, grids, lens = [], [], [], [], []
    for pieces in samples:
        n = 0
        for piece in pieces:
            if isinstance(piece, int):
                ids += torch.randint(4, VOCAB_SIZE, (piece,), generator=generator).tolist()
                image_ids += [-1] * piece
                n += piece
                continue
            h, w = piece
            images.append(torch.rand(3, h, w, generator=generator))
            grids.append([1, h // patch_size, w // patch_size])
            tokens = (h // patch_size) * (w // patch_size)
            ids += [IMAGE_ID] * tokens
            image_ids += [len(images) - 1] * tokens
            n += tokens
        lens.append(n)
    input_ids, image_ids = torch.tensor(ids), torch.tensor(image_ids)
    is_image = image_ids >= 0
    cu = torch.tensor([0] + lens).cumsum(0)
    return PackedRow(input_ids=input_ids, is_image=is_image, image_ids=image_ids, cu_seqlens=cu,
                     labels=shift_labels(input_ids, is_image, cu), images=images,
                     image_grid_thw=torch.tensor(grids, dtype=torch.long).reshape(-1, 3), start=0,
                     stop=len(samples), filler_len=0)
