"""The allocator-fidelity benchmark's arithmetic (benchmarks.tf_allocator_fidelity), on synthetic events."""

from __future__ import annotations

from benchmarks.tf_allocator_fidelity import _feed, to_markdown
from nnmem_callbacks.keras.tf_allocator import BFCSimulator

MIB = 1 << 20


def _event(kind, address, requested=0):
    return {"kind": kind, "addr": address, "requested_bytes": requested}


def test_feeding_events_charges_whole_chunks_and_frees_by_address():
    simulator = BFCSimulator()
    events = [
        _event("MemoryAllocation", "a", 3 * MIB // 2),  # a fresh 2 MiB region, not split: charged whole
        _event("MemoryDeallocation", "a"),
        _event("MemoryAllocation", "b", MIB // 2),  # split off the free 2 MiB chunk
        _event("MemoryDeallocation", "unknown"),  # freed memory allocated before the events is ignored
    ]
    live: dict = {}
    assert _feed(simulator, events, live) == 2 * MIB
    assert simulator.in_use == MIB // 2 and list(live) == ["b"]
    # a second window starts from what the first left: its peak is measured above that
    assert _feed(simulator, [_event("MemoryDeallocation", "b"), _event("MemoryAllocation", "c", MIB)], live) == MIB // 2


def test_the_report_gives_each_models_error_and_the_median():
    rows = [
        {"case": "a", "batch_size": 8, "real_bytes": 100 * MIB, "full_history_bytes": 101 * MIB, "state_only_bytes": 90 * MIB},
        {"case": "b", "error_text": "timeout after 900s"},
    ]
    text = to_markdown(rows, {"commit": "abc"})
    assert "| a | 8 | 100.00 | 101.00 | +1.00% | 90.00 | -10.00% |" in text
    assert "failed: timeout after 900s" in text
    assert "full history: median |error| 1.00%, worst 1.00% over 1 cases" in text
