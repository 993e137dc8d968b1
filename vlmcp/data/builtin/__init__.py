"""The reference VLM's built-in data: coloured shapes with captions, packed into rows.

* :mod:`~vlmcp.data.builtin.config` (:class:`ShapesConfig`) and
  :mod:`~vlmcp.data.builtin.dataset` (:class:`ShapesDataset`): sample ``i`` is a pure
  function of ``(seed, i)``; :mod:`~vlmcp.data.builtin.shapes` draws and describes the
  scenes.
* :mod:`~vlmcp.data.builtin.packing`: samples packed into rows with ``cu_seqlens``.
* :mod:`~vlmcp.data.builtin.vocab`: the fixed word vocabulary.
"""
