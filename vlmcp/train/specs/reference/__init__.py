"""The built-in reference VLM as a training spec (``vlmcp train`` without ``--model``).

* :mod:`.config` — :class:`ReferenceTrainConfig`: the loop's fields with the reference VLM's
  defaults (``make demo``'s numbers), and its model's size;
* :mod:`.spec` — :class:`ReferenceSpec`, the rank side: the model, the packed built-in rows, the loss;
* :mod:`.step` — the forward (and backward) of a packed row on one CP rank, which ``vlmcp verify``
  and ``vlmcp compare`` share;
* :mod:`.launch` — the launcher's side: the spawning line and the summary.
"""
