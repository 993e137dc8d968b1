"""Packing samples into rows of exactly ``seq_len`` tokens.

Note [vlmcp data: packing and the data position]
------------------------------------------------
Samples are taken in stream order and never cut: an image and its caption stay whole
in one row. When the next sample does not fit, the rest of the row becomes one
*filler* sample of ``PAD_ID`` text tokens whose labels are ignored, and that sample
opens the next row::

    seq_len = 16, samples of 7, 5 and 6 tokens
    row 0:  [ s0: I I I b t t e | s1: b t t t e | filler: p p p p ]   start=0, stop=2
    row 1:  [ s2: I I I I b e   | s3 ...                          ]   start=2, ...

The *data position* is the index of the next sample not yet packed: a row covers
samples ``[row.start, row.stop)``, so continuing from ``row.stop`` gives exactly the
rows an uninterrupted run would see. A checkpoint stores that one integer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlmcp.data.dataset import ShapesDataset
from vlmcp.data.vocab import IMAGE_ID, PAD_ID, VOCAB_SIZE
from vlmcp.layout.labels import IGNORE_INDEX, shift_labels

__all__ = ["PackedRow", "pack_row", "pack_rows", "random_row"]


@dataclass(frozen=True, eq=False)
class PackedRow:
    """One packed row, ready for :func:`vlmcp.plan_cp`.

    Attributes:
        input_ids: ``LongTensor[L]``; image slots hold ``IMAGE_ID``, filler ``PAD_ID``.
        is_image: ``BoolTensor[L]``; each sample's image tokens are its prefix.
        cu_seqlens: ``LongTensor[S+1]``, sample boundaries (the filler is a sample).
        labels: ``LongTensor[L]``, next-token targets shifted on the global row by
            :func:`vlmcp.shift_labels`, with ``IGNORE_INDEX`` on the filler.
        images: ``FloatTensor[3, H, W]`` of the images opening each sample, in row order.
        image_grid_thw: ``LongTensor[len(images), 3]``, ``(1, H // p, W // p)`` per image
            (the input of :func:`vlmcp.mrope_position_ids`).
        start: data position of the row's first sample.
        stop: data position after the row (the next row's ``start``).
        filler_len: tokens of the filler sample at the end, 0 when the row is full.
    """

    input_ids: torch.Tensor
    is_image: torch.Tensor
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


def _check_args(dataset: ShapesDataset, seq_len: int, position: int) -> None:
    if not isinstance(dataset, ShapesDataset):
        raise TypeError(f"dataset must be a ShapesDataset, got {type(dataset).__name__}")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int):
        raise ValueError(f"seq_len must be an int, got {seq_len!r}")
    cfg = dataset.config
    if seq_len < dataset.max_sample_len:
        raise ValueError(
            f"seq_len={seq_len} is too short for one sample: the dataset's longest sample has "
            f"{dataset.max_sample_len} tokens ({cfg.max_image_tokens} image tokens of a "
            f"{cfg.max_image_size}x{cfg.max_image_size} image at patch_size={cfg.patch_size}, plus "
            f"{cfg.max_caption_tokens} caption tokens); use seq_len >= {dataset.max_sample_len} "
            "or lower max_image_size / max_objects")
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
    is_image = torch.cat([torch.arange(len(s)) < s.image_tokens for s in samples] +
                         [torch.zeros(filler_len, dtype=torch.bool)])
    labels = shift_labels(input_ids, is_image, cu_seqlens)
    # PAD -> PAD targets would be free loss; the filler must not teach anything.
    labels[used:] = IGNORE_INDEX
    with_image = [s for s in samples if s.image is not None]
    grid_thw = torch.tensor([[1, *s.grid_hw] for s in with_image], dtype=torch.long).view(-1, 3)
    return PackedRow(input_ids=input_ids, is_image=is_image, cu_seqlens=cu_seqlens, labels=labels,
                     images=[s.image for s in with_image], image_grid_thw=grid_thw,
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
        samples: ``[(image_sizes, text_tokens), ...]``, one entry per sample;
            ``image_sizes`` lists the ``(H, W)`` of the images that open the sample
            (empty for a text-only sample).
        patch_size: p; an H x W image fills ``(H/p) * (W/p)`` image slots.
        generator: draws each sample's pixels, then its text ids, in sample order.
    """
    ids, is_image, images, grids, lens = [], [], [], [], []
    for sizes, text in samples:
        n_img = 0
        for h, w in sizes:
            images.append(torch.rand(3, h, w, generator=generator))
            grids.append([1, h // patch_size, w // patch_size])
            n_img += (h // patch_size) * (w // patch_size)
        ids += [IMAGE_ID] * n_img + torch.randint(4, VOCAB_SIZE, (text,), generator=generator).tolist()
        is_image += [True] * n_img + [False] * text
        lens.append(n_img + text)
    input_ids, is_image = torch.tensor(ids), torch.tensor(is_image)
    cu = torch.tensor([0] + lens).cumsum(0)
    return PackedRow(input_ids=input_ids, is_image=is_image, cu_seqlens=cu,
                     labels=shift_labels(input_ids, is_image, cu), images=images,
                     image_grid_thw=torch.tensor(grids, dtype=torch.long).reshape(-1, 3), start=0,
                     stop=len(samples), filler_len=0)

