"""Training data, in two pipelines, one subpackage each.

* :mod:`vlmcp.data.builtin`: the reference VLM's built-in image-caption dataset, packed
  into rows for CP training (re-exported here):

  * :class:`ShapesConfig` -> :class:`ShapesDataset`: sample ``i`` (a :class:`Sample`) is
    an image of coloured shapes with the caption that describes it, or a text-only
    sentence; a pure function of ``(seed, i)``.
  * :func:`pack_rows` / :func:`pack_row` -> :class:`PackedRow`: samples packed into rows
    of exactly ``seq_len`` tokens with ``cu_seqlens``, ``is_image``, ``labels`` and
    images; ``row.stop`` is the data position to resume from. See
    Note [vlmcp data: packing and the data position] in :mod:`vlmcp.data.builtin.packing`.
  * :mod:`vlmcp.data.builtin.vocab`: the fixed word vocabulary (``VOCAB_SIZE``, special
    ids, ``encode``/``decode``).

* :mod:`vlmcp.data.hf`: conversations files for Hugging Face models (``vlmcp train
  --model``; needs transformers, not imported here): reading every supported format,
  encoding with labels on the trained turns, packing rows and decoding them ahead of
  training.
"""

from vlmcp.data.builtin.config import MAX_SENTENCE_TOKENS, ShapesConfig
from vlmcp.data.builtin.dataset import Sample, ShapesDataset
from vlmcp.data.builtin.packing import PackedRow, pack_row, pack_rows, random_row
from vlmcp.data.builtin.vocab import BOS_ID, EOS_ID, IMAGE_ID, PAD_ID, VOCAB_SIZE, decode, encode

__all__ = [
    "BOS_ID", "EOS_ID", "IMAGE_ID", "MAX_SENTENCE_TOKENS", "PAD_ID", "VOCAB_SIZE", "PackedRow",
    "Sample", "ShapesConfig", "ShapesDataset", "decode", "encode", "pack_row", "pack_rows", "random_row",
]
