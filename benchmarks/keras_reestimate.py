"""Re-estimate the Keras accuracy cases and compare with the committed measured runs (no new measurement).

    TF_ENABLE_ONEDNN_OPTS=1 python -m benchmarks.keras_reestimate [--cases mlp,gru_text]
    TF_ENABLE_ONEDNN_OPTS=0 TF_CPU_ALLOCATOR_USE_BFC=true python -m benchmarks.keras_reestimate

A quick check of an estimator change on the same host: each case of
:mod:`benchmarks.keras_accuracy` is estimated in this process (TensorFlow backend,
kernel probes from the host's cache) and compared with the measured runs stored in
``benchmarks/results/keras_tensorflow_cpu_onednn{0,1}.json`` for this process's
oneDNN mode. It is no substitute for ``python -m benchmarks.keras_accuracy``: the
truth is the committed runs, taken on the host and at the commit their header names.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="")
    parser.add_argument("--results", default="benchmarks/results")
    args = parser.parse_args(argv)
    from benchmarks.keras_accuracy import CASES, build_case
    from nnmem_callbacks.keras import estimate_training
    from nnmem_callbacks.keras.tf_trace import onednn_enabled

    mode = "1" if onednn_enabled() else "0"
    path = os.path.join(args.results, f"keras_tensorflow_cpu_onednn{mode}.json")
    with open(path, encoding="utf-8") as handle:
        rows = {r["case"]: r for r in json.load(handle)["rows"]}
    errors = []
    for name in [c for c in args.cases.split(",") if c] or list(CASES):
        model, x, y, batch = build_case(name)
        estimate = estimate_training(model, batch, x=x, y=y)
        runs = rows[name]["measured_runs"]
        truth = statistics.median(runs)
        predicted = estimate.extra["tf_allocator_peak_bytes"]
        upper = estimate.extra["tf_allocator_peak_upper_bytes"]
        errors.append(abs(predicted - truth) / truth)
        print(
            f"{name:18s} pred {predicted / 2**20:7.1f} MiB  meas {truth / 2**20:7.1f} "
            f"[{min(runs) / 2**20:.1f}-{max(runs) / 2**20:.1f}]  error {100 * (predicted - truth) / truth:+6.1f}%  "
            f"upper {upper / 2**20:7.1f} {'covers' if upper >= max(runs) else 'SHORT'}  "
            f"(committed pred {rows[name]['predicted_bytes'] / 2**20:.1f})",
            flush=True,
        )
    print(f"oneDNN {mode}: median {100 * statistics.median(errors):.1f}%, worst {100 * max(errors):.1f}% over {len(errors)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
