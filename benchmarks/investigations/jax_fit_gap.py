"""Question (2026-11-26): why does a JAX ``fit`` hold more than two ``train_on_batch`` steps?

The arrays alive at each batch end of a fit, beside those after two ``train_on_batch`` steps, and the largest
``bytes_in_use`` a background thread samples during the fit:

    KERAS_BACKEND=jax XLA_PYTHON_CLIENT_PREALLOCATE=true XLA_PYTHON_CLIENT_MEM_FRACTION=0.05 \\
        python -m benchmarks.investigations.jax_fit_gap conv1d,lstm

A diagnostic (a JAX GPU; prints, writes no result file). Its one run so far, on an H200:
``benchmarks/results/investigations/jax_fit_gap/h200_prealloc.log``. Answer: the batches fit's iterator has put
on the device ahead of the step, and for the LSTM about 12 MiB that no live array shows.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
from typing import Any

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Prints, for each case, the device's use after two steps, during a fit, and the arrays a fit adds."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import jax
    import keras
    import numpy as np

    from benchmarks.common.keras_cases import build_case

    argv = sys.argv[1:] if argv is None else argv
    dev = jax.devices()[0]

    def live() -> collections.Counter:
        c: collections.Counter = collections.Counter()
        for a in jax.live_arrays():
            c[(tuple(a.shape), str(a.dtype))] += 1
        return c

    def used() -> int:
        return int(dev.memory_stats()["bytes_in_use"])

    def mib(cnt: Any) -> float:
        return sum(np.prod(s) * np.dtype(d).itemsize * n for (s, d), n in cnt.items()) / 2**20

    for name in (argv[0] if argv else "conv1d,lstm").split(","):
        model, x, y, b = build_case(name)
        model.train_on_batch(x[:b], y[:b])
        model.train_on_batch(x[:b], y[:b])
        base = live()
        base_used = used()
        seen = {}

        class Spy(keras.callbacks.Callback):
            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                seen[batch] = (live(), used())

        steps = 4
        xs = np.concatenate([x[:b]] * steps)
        ys = np.concatenate([y[:b]] * steps)
        mx = [0]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.0005):
                mx[0] = max(mx[0], used())

        threading.Thread(target=sample, daemon=True).start()
        model.fit(xs, ys, batch_size=b, epochs=2, verbose=0, callbacks=[Spy()])
        stop.set()
        after = live()
        print(
            f"== {name}: after 2 train_on_batch in use {base_used / 2**20:.2f} MiB; fit sampled max {mx[0] / 2**20:.2f} MiB; "
            f"peak_bytes_in_use {dev.memory_stats()['peak_bytes_in_use'] / 2**20:.2f}"
        )
        for k, (c, u) in sorted(seen.items()):
            extra = c - base
            missing = base - c
            print(
                f"  batch {k}: in use {u / 2**20:.2f} MiB; extra arrays {mib(extra):.2f} MiB "
                f"{sorted(extra.items(), key=lambda kv: -np.prod(kv[0][0]))[:6]}; missing {mib(missing):.2f} MiB "
                f"{sorted(missing.items(), key=lambda kv: -np.prod(kv[0][0]))[:4]}"
            )
        print(f"  after fit: extra {sorted((after - base).items())[:6]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
