"""TensorFlow's CPU allocator events from a ``tf.profiler.experimental`` trace, and the marker that opens a window.

A benchmark allocates a marker tensor of :data:`MARKER_ELEMENTS` float32 elements right before the window it
measures, so the window's first event is found by its requested size (``4 * MARKER_ELEMENTS`` bytes). Used by
:mod:`benchmarks.suites.tf_allocator_fidelity` and :mod:`benchmarks.investigations.tf_memory_events`.

Example:
    >>> 4 * MARKER_ELEMENTS  # the marker's request, in bytes
    49380
"""

from __future__ import annotations

import glob
import os
from typing import Any

__all__ = ["MARKER_ELEMENTS", "memory_events"]

#: The request size of the marker tensor allocated right before the window (12345 float32 elements).
MARKER_ELEMENTS = 12345


def _event_stats(plane: Any, event: Any) -> dict[str, Any]:
    out = {}
    for stat in event.stats:
        name = plane.stat_metadata[stat.metadata_id].name
        which = stat.WhichOneof("value")
        value = getattr(stat, which) if which else None
        if which == "ref_value":
            value = plane.stat_metadata[stat.ref_value].name
        out[name] = value
    return out


def memory_events(logdir: str) -> list[dict[str, Any]]:
    """The allocator's memory events of the profile in ``logdir``, in time order."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    events = []
    for path in glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True):
        space = xplane_pb2.XSpace()
        with open(path, "rb") as handle:
            space.ParseFromString(handle.read())
        for plane in space.planes:
            for line in plane.lines:
                for event in line.events:
                    name = plane.event_metadata[event.metadata_id].name
                    if name not in ("MemoryAllocation", "MemoryDeallocation"):
                        continue
                    row = _event_stats(plane, event)
                    row["kind"] = name
                    row["time"] = line.timestamp_ns * 1000 + event.offset_ps
                    events.append(row)
    events.sort(key=lambda r: r["time"])
    return events
