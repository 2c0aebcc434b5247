"""The best-fit-with-coalescing (BFC) allocator of TensorFlow and XLA, replayed.

TensorFlow's CPU allocator (``TF_CPU_ALLOCATOR_USE_BFC=true``, or oneDNN's large
allocations) and XLA's GPU allocator behind JAX (``peak_bytes_in_use``) are the same
``tsl`` ``BFCAllocator`` (``xla/tsl/framework/bfc_allocator.cc``). What its statistics
count is not the bytes requested but the *chunks* handed out: a request takes the
smallest free chunk that fits and splits it only when the chunk is at least twice the
request or the rest is at least 128 MiB, so a request can be charged up to ~2x its size.
When no free chunk fits, an allocator that grows on demand (``allow_growth``: TensorFlow's
CPU allocator; JAX with ``XLA_PYTHON_CLIENT_PREALLOCATE=false``) opens a new region of
the next size in its doubling sequence (2 MiB, 4 MiB, ...), at least the request; a 17 MiB
buffer then lands in a fresh 32 MiB region and is charged all of it. A preallocated
allocator (JAX's default) has one region of most of the device and splits every chunk.

:class:`BFCSimulator` replays that policy: 256-byte rounding, 21 power-of-two bins ordered
by (size, address), the split rule, coalescing of free neighbours within a region, regions
of 2 MiB doubling with each extension, or one preallocated region.

Known limitations:
    * Not modelled: the allocator's garbage collection (freeing idle regions when an
      allocation fails) and its back-off to smaller regions near the device's limit.
    * What else the process allocated before (other models, data pipelines) decides
      where later chunks land; callers start it from what they know is allocated.
"""

from __future__ import annotations

__all__ = [
    "BFC_INITIAL_REGION",
    "BFC_MAX_INTERNAL_FRAGMENTATION",
    "BFC_MIN_ALLOCATION",
    "BFC_NUM_BINS",
    "BFCSimulator",
]

#: BFC constants (``bfc_allocator.{h,cc}``).
BFC_MIN_ALLOCATION = 256
BFC_NUM_BINS = 21
BFC_MAX_INTERNAL_FRAGMENTATION = 128 << 20
#: ``allow_growth``: the first region is 2 MiB, each later region doubles.
BFC_INITIAL_REGION = 2 << 20


class BFCSimulator:
    """A model of the BFC allocator: what its ``bytes_in_use`` and ``peak_bytes_in_use`` count.

    TensorFlow's CPU allocator with oneDNN (``MklCPUAllocator``) sends allocations below
    256 KiB to ``malloc`` and the larger ones to a BFC allocator that grows on demand;
    ``TF_CPU_ALLOCATOR_USE_BFC=true`` sends all of them; XLA's GPU allocator behind JAX is
    the same allocator, grown on demand or preallocated. Checked against TensorFlow 2.21's
    allocator events (``allocation_bytes`` vs ``requested_bytes``) and against JAX 0.11's
    ``peak_bytes_in_use`` on an H100 (``benchmarks/results/keras_jax_gpu_h100_growth.md``).

    Args:
        preallocated_bytes: One region of this size opened at start (JAX's default
            preallocation) instead of regions that grow on demand; a request it cannot
            hold raises ``MemoryError``.

    Example:
        >>> bfc = BFCSimulator()
        >>> a = bfc.alloc(1_605_632)   # 1.53 MiB in a fresh 2 MiB region: no split
        >>> bfc.in_use
        2097152
        >>> bfc.free(a); bfc.in_use
        0
        >>> b = bfc.alloc(17 << 20)   # no free chunk fits: a 32 MiB region, not split (32 < 2 x 17)
        >>> bfc.in_use >> 20, bfc.reserved >> 20
        (32, 34)
        >>> pooled = BFCSimulator(preallocated_bytes=1 << 30)
        >>> c = pooled.alloc(17 << 20)   # carved out of the preallocated region
        >>> pooled.in_use >> 20, pooled.reserved >> 20
        (17, 1024)
    """

    def __init__(self, preallocated_bytes: int | None = None) -> None:
        self.region_bytes = BFC_INITIAL_REGION
        self.next_address = 0
        # chunk id -> [address, size, in_use, prev_id, next_id]
        self.chunks: dict[int, list] = {}
        self.free_chunks: dict[int, set[int]] = {b: set() for b in range(BFC_NUM_BINS)}
        self.in_use = 0
        self.peak = 0
        self._ids = 0
        self.preallocated = preallocated_bytes is not None
        if preallocated_bytes is not None:
            self.region_bytes = int(preallocated_bytes)
            self._extend(self.region_bytes)

    @property
    def reserved(self) -> int:
        """Bytes of all regions opened so far (what the allocator holds from the device)."""
        return sum(chunk[1] for chunk in self.chunks.values())

    @staticmethod
    def rounded(num_bytes: int) -> int:
        return max(BFC_MIN_ALLOCATION, -(-int(num_bytes) // BFC_MIN_ALLOCATION) * BFC_MIN_ALLOCATION)

    @staticmethod
    def bin_for(size: int) -> int:
        return min(max((size >> 8).bit_length() - 1, 0), BFC_NUM_BINS - 1)

    def _new_chunk(self, address: int, size: int, prev: int | None, nxt: int | None) -> int:
        self._ids += 1
        self.chunks[self._ids] = [address, size, False, prev, nxt]
        return self._ids

    def _insert_free(self, cid: int) -> None:
        self.free_chunks[self.bin_for(self.chunks[cid][1])].add(cid)

    def _remove_free(self, cid: int) -> None:
        self.free_chunks[self.bin_for(self.chunks[cid][1])].discard(cid)

    def _find(self, rounded: int) -> int | None:
        for b in range(self.bin_for(rounded), BFC_NUM_BINS):
            best = None
            for cid in self.free_chunks[b]:
                address, size = self.chunks[cid][0], self.chunks[cid][1]
                if size >= rounded and (best is None or (size, address) < best[0]):
                    best = ((size, address), cid)
            if best is not None:
                cid = best[1]
                self._remove_free(cid)
                chunk = self.chunks[cid]
                if chunk[1] >= 2 * rounded or chunk[1] - rounded >= BFC_MAX_INTERNAL_FRAGMENTATION:
                    rest = self._new_chunk(chunk[0] + rounded, chunk[1] - rounded, cid, chunk[4])
                    if chunk[4] is not None:
                        self.chunks[chunk[4]][3] = rest
                    chunk[4] = rest
                    chunk[1] = rounded
                    self._insert_free(rest)
                chunk[2] = True
                self.in_use += chunk[1]
                self.peak = max(self.peak, self.in_use)
                return cid
        return None

    def _extend(self, rounded: int) -> None:
        increased = False
        while rounded > self.region_bytes:
            self.region_bytes *= 2
            increased = True
        size = self.region_bytes
        cid = self._new_chunk(self.next_address, size, None, None)
        self.next_address += size + (1 << 40)  # regions are never adjacent
        self._insert_free(cid)
        if not increased:
            self.region_bytes *= 2

    def alloc(self, num_bytes: int) -> int:
        """Allocates; returns a chunk id (its charged size is ``self.chunks[id][1]``)."""
        rounded = self.rounded(num_bytes)
        cid = self._find(rounded)
        if cid is None:
            if self.preallocated:
                raise MemoryError(f"a request of {rounded} bytes does not fit the preallocated region")
            self._extend(rounded)
            cid = self._find(rounded)
        return cid  # type: ignore[return-value]

    def free(self, cid: int) -> None:
        chunk = self.chunks[cid]
        chunk[2] = False
        self.in_use -= chunk[1]
        nxt = chunk[4]
        if nxt is not None and not self.chunks[nxt][2]:
            self._remove_free(nxt)
            self._merge(cid, nxt)
        prev = chunk[3]
        if prev is not None and not self.chunks[prev][2]:
            self._remove_free(prev)
            self._merge(prev, cid)
            cid = prev
        self._insert_free(cid)

    def _merge(self, first: int, second: int) -> None:
        a, b = self.chunks[first], self.chunks.pop(second)
        a[1] += b[1]
        a[4] = b[4]
        if b[4] is not None:
            self.chunks[b[4]][3] = first
