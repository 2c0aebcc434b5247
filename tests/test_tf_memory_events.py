"""The allocator-event readers of benchmarks/tf_memory_events.py, on made-up events (no TensorFlow)."""

from __future__ import annotations

from benchmarks.tf_memory_events import large_allocations, live_at_peak

MiB = 2**20


def _alloc(addr: int, requested: int, charged: int, in_use: int, op: str) -> dict:
    return {"kind": "MemoryAllocation", "addr": addr, "requested_bytes": requested, "allocation_bytes": charged,
            "bytes_allocated": in_use, "tf_op": op}


def _free(addr: int, in_use: int) -> dict:
    return {"kind": "MemoryDeallocation", "addr": addr, "bytes_allocated": in_use}


EVENTS = [
    _alloc(1, 2 * MiB, 2 * MiB, 2 * MiB, "act"),
    _alloc(2, 20 * MiB, 20 * MiB, 22 * MiB, "grad/Conv2DBackpropInput"),
    _alloc(3, 20 * MiB, 37 * MiB, 59 * MiB, "grad/Conv2DBackpropFilter"),  # a whole free chunk, not split
    _free(2, 39 * MiB),
    _free(3, 2 * MiB),
    _alloc(4, 1 * MiB, 1 * MiB, 3 * MiB, "small"),
]


def test_live_at_peak_counts_charged_bytes_and_lists_what_is_live() -> None:
    peak, live = live_at_peak(EVENTS)
    assert peak == 59 * MiB
    assert sorted(row["addr"] for row in live) == [1, 2, 3]


def test_large_allocations_keep_order_and_show_the_charge_over_the_request() -> None:
    rows = large_allocations(EVENTS, 4 * MiB)
    assert [row["op"] for row in rows] == ["grad/Conv2DBackpropInput", "grad/Conv2DBackpropFilter"]
    assert rows[0]["charged_over_requested"] == 1.0
    assert rows[1]["charged_over_requested"] == 37 / 20
    assert rows[1]["in_use_after"] == 59 * MiB
    assert large_allocations(EVENTS, 64 * MiB) == []
