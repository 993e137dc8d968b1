"""vlmcp inside other people's trainers (``pip install 'vlmcp[trainer]'``); nothing here is imported eagerly.

* :mod:`vlmcp.integrations.transformers`: :class:`~vlmcp.integrations.transformers.CPTrainer`, a
  ``transformers.Trainer`` with ``cp_size``, and :class:`~vlmcp.integrations.transformers.CPTrainerMixin`
  for trainers that subclass ``Trainer`` (TRL's ``SFTTrainer``, LLaMA-Factory's, ms-swift's);
* :mod:`vlmcp.integrations.conversations`: ``vlmcp train``'s data files as a dataset, and the
  collator that packs a batch of conversations into one row with ``cu_seqlens``.

docs/trainers.md is the guide.
"""
