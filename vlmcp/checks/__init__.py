"""Tools that check vlmcp against a single-process reference; the runtime never imports them.

* :mod:`.parity` — one training step of the reference VLM under CP against one process
  (``vlmcp verify``).
* :mod:`.seed_table` — the seed's table: one step in four layouts, measured (``vlmcp compare``).
* :mod:`.saved_tensors` — :class:`SavedTensorMeter`, the exact count of bytes autograd saves for
  backward (the benchmarks' memory figures), and what an offloading policy leaves on the device.
* :mod:`.allocations` — :class:`AllocationMeter`, every op's output watched: the largest tensor and the
  peak bytes alive at once (the chunked loss never builds ``N x V``).

The Hugging Face side of the same tooling is :mod:`vlmcp.hf.debug`.
"""
