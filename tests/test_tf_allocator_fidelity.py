"""The allocator-fidelity benchmark's arithmetic (benchmarks.suites.tf_allocator_fidelity), on synthetic events."""

from __future__ import annotations

from benchmarks.suites.tf_allocator_fidelity import feed_events, start_from_build, to_markdown
from nnmem_callbacks.allocators.bfc import BFCSimulator

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
    assert feed_events(simulator, events, live) == 2 * MIB
    assert simulator.in_use == MIB // 2 and list(live) == ["b"]
    # a second window starts from what the first left: its peak is measured above that
    assert (
        feed_events(simulator, [_event("MemoryDeallocation", "b"), _event("MemoryAllocation", "c", MIB)], live)
        == MIB // 2
    )


def test_the_report_gives_each_models_error_and_the_median():
    rows = [
        {
            "case": "a",
            "batch_size": 8,
            "real_bytes": 100 * MIB,
            "full_history_bytes": 101 * MIB,
            "live_only_bytes": 90 * MIB,
            "replay_start_bytes": 100 * MIB,
        },
        {"case": "b", "error_text": "timeout after 900s"},
    ]
    text = to_markdown(rows, {"commit": "abc"})
    assert "| a | 8 | 100.00 | 101.00 | +1.00% | 90.00 | -10.00% | 100.00 | +0.00% |" in text
    assert "failed: timeout after 900s" in text
    assert "full history: median |error| 1.00%, worst 1.00% over 1 cases" in text
    assert "live buffers only: median |error| 10.00%" in text


def test_the_replays_start_takes_the_real_variables_by_order_and_size_and_frees_them_with_the_window():
    # two variables, the first randomly initialized; the real process also holds a handle and the batch
    live = {
        "w1": {"requested_bytes": MIB // 4},
        "handle": {"requested_bytes": 200},
        "w2": {"requested_bytes": MIB // 4},
        "x": {"requested_bytes": MIB},
    }
    simulator, chunks = start_from_build([(MIB // 4, True), (MIB // 4, False)], live)
    assert set(chunks) == set(live)
    # w1 behind its initializer's two freed temporaries, w2 in the hole they left
    assert simulator.chunks[chunks["w2"]][0] < simulator.chunks[chunks["w1"]][0]
    # the window replaces w1's buffer: freeing it by address frees the mapped chunk
    in_use = simulator.in_use
    feed_events(simulator, [_event("MemoryDeallocation", "w1")], chunks)
    assert simulator.in_use == in_use - MIB // 4


def test_a_real_buffer_of_another_size_does_not_take_a_variables_chunk():
    live = {"x": {"requested_bytes": 3 * MIB}, "w": {"requested_bytes": MIB // 4}}
    simulator, chunks = start_from_build([(MIB // 4, False)], live)
    assert simulator.chunks[chunks["w"]][1] == MIB // 4
    assert simulator.chunks[chunks["x"]][1] >= 3 * MIB  # allocated after, in a region of its own
