"""JAX's GPU allocator view: the mode read from JAX's environment, the BFC replay, the callback's comparison."""

from __future__ import annotations

import pytest

from nnmem_callbacks.allocators.bfc import BFCSimulator
from nnmem_callbacks.estimators.keras.jax_xla import allocator_peak, xla_allocator_mode

MiB = 1 << 20


@pytest.mark.parametrize(
    ("environment", "mode"),
    [
        ({}, "bfc-preallocated"),
        ({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, "bfc-growth"),
        ({"XLA_PYTHON_CLIENT_PREALLOCATE": "0"}, "bfc-growth"),
        ({"XLA_PYTHON_CLIENT_PREALLOCATE": "true"}, "bfc-preallocated"),
        ({"XLA_PYTHON_CLIENT_ALLOCATOR": "platform", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, "platform"),
        ({"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async"}, "cuda_async"),
    ],
)
def test_the_allocator_mode_is_read_from_the_environment_jax_reads(monkeypatch, environment, mode):
    for name in ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_ALLOCATOR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert xla_allocator_mode("gpu") == mode
    assert xla_allocator_mode("cpu") == "none"  # JAX keeps no CPU allocator statistics


def test_growing_regions_charge_a_buffer_the_whole_region_it_cannot_split():
    # a 17 MiB temporary after 3 MiB of state: the allocator opens a 32 MiB region and hands all of it over
    charged, reserved = allocator_peak([1 * MiB, 2 * MiB], [17 * MiB], "bfc-growth")
    assert charged == 3 * MiB + 32 * MiB
    assert reserved >= charged
    # a buffer of more than half the next region is charged the region: the charge stays under twice the buffer
    for size in (5 * MiB, 33 * MiB, 100 * MiB):
        charged, _ = allocator_peak([], [size], "bfc-growth")
        assert size <= charged < 2 * size


def test_a_preallocated_pool_charges_the_buffers_rounded():
    sizes = [3 * MiB + 7, 17 * MiB, 1000]
    charged, reserved = allocator_peak(sizes[:1], sizes[1:], "bfc-preallocated", pool_bytes=1 << 30)
    assert charged == sum(BFCSimulator.rounded(s) for s in sizes)
    assert reserved == 1 << 30
    # without a BFC allocator the prediction is the buffers themselves
    assert allocator_peak(sizes[:1], sizes[1:], "cuda_async") == (sum(sizes), sum(sizes))


def test_the_growing_allocator_replay_matches_a_freed_and_reused_region():
    bfc = BFCSimulator()
    temp = bfc.alloc(17 * MiB)
    assert bfc.in_use == 32 * MiB
    bfc.free(temp)
    again = bfc.alloc(17 * MiB)  # the next step reuses the region: no new one
    assert bfc.in_use == 32 * MiB and bfc.reserved == 32 * MiB
    bfc.free(again)
