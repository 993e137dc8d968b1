"""Conversations files for Hugging Face models (``vlmcp train --model``; needs transformers).

The pipeline, one module per step:

* :mod:`~vlmcp.data.hf.reader`: read and check ``--data`` files into
  :class:`~vlmcp.data.hf.schema.Conversation` objects (the data model), one
  format per file in :mod:`~vlmcp.data.hf.formats`, images and videos by
  :mod:`~vlmcp.data.hf.media`;
* :mod:`~vlmcp.data.hf.template`: one conversation through the model's chat template,
  with the tokens of its trained messages (and a template that drops a message refused);
* :mod:`~vlmcp.data.hf.video`: which frames of a video, at what size, from its header
  (each model's own processor's rules, one module per family), their decoding with PyAV,
  and the model's video inputs without torchvision; :mod:`~vlmcp.data.hf.video_processor`:
  the processor's own text expansion and call with those inputs;
* :mod:`~vlmcp.data.hf.image_text` and :mod:`~vlmcp.data.hf.expand`: each image's text from
  its size, and the placeholders expanded by the processor's own code (planning writes what
  the processor writes, whichever transformers version);
* :mod:`~vlmcp.data.hf.encode`: one conversation -> processor inputs with labels on the
  trained turns; a bad image or video is a ``MediaError`` naming ``file:line``;
* :mod:`~vlmcp.data.hf.rows`: plan and pack rows, decode them ahead of training (a
  conversation whose image or video fails is skipped, never trained wrongly);
  :mod:`~vlmcp.data.hf.planned`: the first conversation of each kind encoded at planning and
  held to its plan;
* :mod:`~vlmcp.data.hf.show`: what one conversation trains (``vlmcp data show``);
* :mod:`~vlmcp.data.hf.processor`: load and save a model directory's processor;
* :mod:`~vlmcp.data.hf.export`: the built-in data written as such a file, with
  moving-shapes videos (``vlmcp data shapes [--videos N]``).

Nothing here imports transformers at import time.
"""
