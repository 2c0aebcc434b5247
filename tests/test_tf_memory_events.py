"""The allocator-event readers of benchmarks/investigations/tf_memory_events.py, on made-up events (no TensorFlow)."""

from __future__ import annotations

from benchmarks.investigations.tf_memory_events import large_allocations, live_at_peak, whole_chunk_regions

MiB = 2**20


def _alloc(addr: int, requested: int, charged: int, in_use: int, op: str) -> dict:
    return {
        "kind": "MemoryAllocation",
        "addr": addr,
        "requested_bytes": requested,
        "allocation_bytes": charged,
        "bytes_allocated": in_use,
        "tf_op": op,
    }


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


def _request(addr: int, requested: int, op: str) -> dict:
    return {"kind": "MemoryAllocation", "addr": addr, "requested_bytes": requested, "tf_op": op}


def test_whole_chunk_regions_names_the_small_buffer_that_made_the_second_scratch_whole() -> None:
    # a 64 MiB region: free, the pair of 20 MiB scratch buffers splits it; with 4 MiB held at its front,
    # the second buffer finds 40 MiB, under twice its size, and is handed all of it
    events = [
        _request(1, 2 * MiB, "variable"),  # a 2 MiB region
        _request(2, 4 * MiB, "warm-up"),  # a 4 MiB region
        _request(3, 60 * MiB, "opens 64 MiB"),  # a 64 MiB region (4 left)
        _free(3, 0),
        _request(4, 20 * MiB, "first/Conv2DBackpropInput"),
        _request(5, 20 * MiB, "first/Conv2DBackpropFilter"),
        _free(4, 0),
        _free(5, 0),
        _free(2, 0),
        _request(6, 4 * MiB, "held/Mul"),  # the 4 MiB region is free again: best fit puts it there
        _request(7, 5 * MiB, "held/Relu"),  # no fit but the 64 MiB region: at its front
        _request(8, 20 * MiB, "second/Conv2DBackpropInput"),
        _request(9, 20 * MiB, "second/Conv2DBackpropFilter"),
    ]
    rows = whole_chunk_regions(events, 8 * MiB)
    assert [row["op"] for row in rows] == ["second/Conv2DBackpropFilter"]
    row = rows[0]
    assert row["requested"] == 20 * MiB and row["charged"] == 64 * MiB - 5 * MiB - 20 * MiB
    assert [(size // MiB, op) for size, op, _ in row["region"]] == [
        (5, "held/Relu"),
        (20, "second/Conv2DBackpropInput"),
        (39, "second/Conv2DBackpropFilter"),
    ]
    assert [at for _, _, at in row["region"]] == [10, 11, 12]
    # requests before the window, or under the size asked for, are not listed
    assert whole_chunk_regions(events, 8 * MiB, first=13) == []
    assert whole_chunk_regions(events, 32 * MiB) == []


def test_whole_chunk_regions_also_lists_a_request_the_real_allocator_charged_whole() -> None:
    # the simulator splits (it saw a 64 MiB chunk), the allocator's event says it handed out 40 MiB: listed, both shown
    events = [
        _request(1, 60 * MiB, "opens 64 MiB"),
        _free(1, 0),
        {**_request(2, 20 * MiB, "grad/Conv2DBackpropFilter"), "allocation_bytes": 40 * MiB},
    ]
    rows = whole_chunk_regions(events, 8 * MiB)
    assert [(row["charged"] // MiB, row["real_charged"] // MiB) for row in rows] == [(20, 40)]
    assert whole_chunk_regions(events[:2] + [_request(2, 20 * MiB, "grad/Conv2DBackpropFilter")], 8 * MiB) == []
