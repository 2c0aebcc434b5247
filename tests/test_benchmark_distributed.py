"""The distributed benchmark's ground truth (benchmarks.suites.distributed.rank_peak) on made-up profiler events."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

from torch._C._profiler import _EventType  # noqa: E402

from benchmarks.suites.distributed import rank_peak  # noqa: E402


def _node(tag, name="", start=0, end=0, parent=None, size=0, ptr=0):
    extra = SimpleNamespace(device=SimpleNamespace(type="cpu"), alloc_size=size, ptr=ptr)
    node = SimpleNamespace(
        tag=tag, name=name, start_time_ns=start, end_time_ns=end, parent=parent, children=[], extra_fields=extra
    )
    if parent is not None:
        parent.children.append(node)
    return node


def _profile(*roots):
    tree = SimpleNamespace(experimental_event_tree=lambda: list(roots))
    return SimpleNamespace(profiler=SimpleNamespace(kineto_results=tree))


def _step(start=0, end=1000):
    return _node(_EventType.TorchOp, "nnmem_gt/step1/backward", start, end)


def test_an_unrecorded_free_whose_address_comes_back_is_counted_before_the_reuse_with_nothing_left_open():
    step = _step()
    collective = _node(_EventType.TorchOp, "c10d::allreduce_", 10, 20, parent=step)
    _node(_EventType.Allocation, start=11, parent=collective, size=100, ptr=1)  # its free is never recorded
    _node(_EventType.Allocation, start=30, parent=step, size=100, ptr=1)  # the address comes back
    _node(_EventType.Allocation, start=40, parent=step, size=-100, ptr=1)
    result = rank_peak(_profile(step), baseline=0)
    # with no block left open the repair once sat after every allocation, unsorted: the peak read 200
    assert result["peak_bytes"] == 100
    assert result["repaired_frees"] == 1


def test_a_collectives_temporary_still_open_at_the_end_is_freed_when_the_collective_ends():
    step = _step()
    collective = _node(_EventType.TorchOp, "c10d::_reduce_scatter_base_", 10, 20, parent=step)
    _node(_EventType.Allocation, start=11, parent=collective, size=100, ptr=1)  # never freed, address never reused
    _node(_EventType.Allocation, start=30, parent=step, size=50, ptr=2)  # alive at the end: a real allocation
    result = rank_peak(_profile(step), baseline=7)
    assert result["peak_bytes"] == 7 + 100
    assert result["repaired_frees"] == 1
    step = _step()
    _node(_EventType.Allocation, start=11, parent=step, size=100, ptr=1)  # outside any collective: kept
    _node(_EventType.Allocation, start=30, parent=step, size=50, ptr=2)
    result = rank_peak(_profile(step), baseline=7)
    assert result["peak_bytes"] == 7 + 150 and result["repaired_frees"] == 0
