"""Why a JAX fit holds more than two train_on_batch steps: the arrays alive at each batch end of a fit, beside those
after two ``train_on_batch`` steps, and the largest ``bytes_in_use`` a background thread samples during the fit.

    KERAS_BACKEND=jax XLA_PYTHON_CLIENT_PREALLOCATE=true XLA_PYTHON_CLIENT_MEM_FRACTION=0.05 \\
        python -m benchmarks.jax_fit_gap conv1d,lstm

A diagnostic (a JAX GPU; prints, writes no result file). Its one run so far: benchmarks/results/gpu_logs/
h200_jax_fit_gap_prealloc.log.
"""
import collections, json, os, sys, threading, time
os.environ.setdefault("KERAS_BACKEND", "jax")
import jax, numpy as np, keras
from benchmarks.keras_accuracy import build_case

dev = jax.devices()[0]
def live():
    c = collections.Counter()
    for a in jax.live_arrays():
        c[(tuple(a.shape), str(a.dtype))] += 1
    return c
def used(): return int(dev.memory_stats()["bytes_in_use"])
for name in (sys.argv[1] if len(sys.argv) > 1 else "conv1d,lstm").split(","):
    model, x, y, b = build_case(name)
    model.train_on_batch(x[:b], y[:b]); model.train_on_batch(x[:b], y[:b])
    base = live(); base_used = used()
    seen = {}
    class Spy(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen[batch] = (live(), used())
    steps = 4
    xs = np.concatenate([x[:b]] * steps); ys = np.concatenate([y[:b]] * steps)
    mx = [0]; stop = threading.Event()
    def samp():
        while not stop.wait(0.0005):
            mx[0] = max(mx[0], used())
    threading.Thread(target=samp, daemon=True).start()
    model.fit(xs, ys, batch_size=b, epochs=2, verbose=0, callbacks=[Spy()])
    stop.set()
    after = live()
    print(f"== {name}: after 2 train_on_batch in use {base_used/2**20:.2f} MiB; fit sampled max {mx[0]/2**20:.2f} MiB; peak_bytes_in_use {dev.memory_stats()['peak_bytes_in_use']/2**20:.2f}")
    for k, (c, u) in sorted(seen.items()):
        extra = c - base; missing = base - c
        def mib(cnt): return sum(np.prod(s) * np.dtype(d).itemsize * n for (s, d), n in cnt.items()) / 2**20
        print(f"  batch {k}: in use {u/2**20:.2f} MiB; extra arrays {mib(extra):.2f} MiB {sorted(extra.items(), key=lambda kv: -np.prod(kv[0][0]))[:6]}; missing {mib(missing):.2f} MiB {sorted(missing.items(), key=lambda kv: -np.prod(kv[0][0]))[:4]}")
    print(f"  after fit: extra {sorted((after - base).items())[:6]}")
