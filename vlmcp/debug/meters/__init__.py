"""Exact counters of what a computation holds in memory (repeatable anywhere, unlike a timer).

* :class:`SavedTensorMeter` (:mod:`.saved_tensors`): the bytes autograd saves for backward, the
  benchmarks' memory figures and what an offloading policy leaves on the device.
* :class:`AllocationMeter` (:mod:`.allocations`): every op's output watched, the largest tensor and
  the peak bytes alive at once (the chunked loss never builds ``N x V``).
"""

from vlmcp.debug.meters.allocations import AllocationMeter
from vlmcp.debug.meters.saved_tensors import SavedTensorMeter

__all__ = ["AllocationMeter", "SavedTensorMeter"]
