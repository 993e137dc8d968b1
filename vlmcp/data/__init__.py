"""The built-in image-caption dataset, packed into rows for CP training.

Main entry points:

* :class:`ShapesConfig` -> :class:`ShapesDataset`: sample ``i`` (a :class:`Sample`) is
  an image of coloured shapes with the caption that describes it, or a text-only
  sentence; a pure function of ``(seed, i)``.
* :func:`pack_rows` / :func:`pack_row` -> :class:`PackedRow`: samples packed into rows
  of exactly ``seq_len`` tokens with ``cu_seqlens``, ``is_image``, ``labels`` and
  images; ``row.stop`` is the data position to resume from. See
  Note [vlmcp data: packing and the data position] in :mod:`vlmcp.data.packing`.
* :mod:`vlmcp.data.vocab`: the fixed word vocabulary (``VOCAB_SIZE``, special ids,
  ``encode``/``decode``).

For Hugging Face models (``vlmcp train --model``; these need transformers and are not
imported here): :mod:`vlmcp.data.conversations` reads JSONL conversations in both formats
users have, :mod:`vlmcp.data.hf_encode` turns one into processor inputs with labels on the
assistant tokens, :mod:`vlmcp.data.hf_rows` plans and packs rows and decodes them ahead of
training, :mod:`vlmcp.data.processor` loads and saves a directory's processor, and
:mod:`vlmcp.data.export` writes the built-in data as such a file (``vlmcp data shapes``).
"""

from vlmcp.data.config import MAX_SENTENCE_TOKENS, ShapesConfig
from vlmcp.data.dataset import Sample, ShapesDataset
from vlmcp.data.packing import PackedRow, pack_row, pack_rows, random_row
from vlmcp.data.vocab import BOS_ID, EOS_ID, IMAGE_ID, PAD_ID, VOCAB_SIZE, decode, encode

__all__ = [
    "BOS_ID", "EOS_ID", "IMAGE_ID", "MAX_SENTENCE_TOKENS", "PAD_ID", "VOCAB_SIZE", "PackedRow",
    "Sample", "ShapesConfig", "ShapesDataset", "decode", "encode", "pack_row", "pack_rows", "random_row",
]
