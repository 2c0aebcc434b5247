"""JAX's GPU allocator replayed on a machine without a GPU, against committed GPU measurements.

    KERAS_BACKEND=jax python -m benchmarks.suites.jax_allocator_offline \\
        --measured benchmarks/results/keras_jax_gpu/h100_growth.json --mode bfc-growth

For every case of a committed ``keras_accuracy --device gpu`` result, the model is built
here (CPU) for its arrays' sizes and creation order; XLA's buffer sizes on the GPU
(arguments, outputs, aliases, temporaries) come from the committed row, which the GPU
estimate recorded. :func:`nnmem_callbacks.estimators.keras.jax_xla.allocator_peak` then predicts
``peak_bytes_in_use`` under the result's allocator mode, and the table compares it with
the measured peak and with XLA's buffers alone (the estimate's tensor peak).

Writes ``benchmarks/results/jax_allocator_offline/<host>.{json,md}``, named as the measured result.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

from benchmarks.common.paths import result_dir
from benchmarks.tools.provenance import commit_stamp, write_result

__all__ = ["replay_case", "to_markdown", "main"]


def replay_case(row: dict[str, Any], mode: str) -> dict[str, Any]:
    """The allocator's predicted peak for one committed GPU row (the model rebuilt here for its arrays)."""
    from benchmarks.common.keras_cases import build_case
    from nnmem_callbacks.estimators.keras.jax_xla import allocator_peak, state_array_bytes

    model, x, y, batch = build_case(row["case"])
    model.optimizer.build(model.trainable_variables)
    resident = state_array_bytes(model) + [int(x.nbytes), int(y.nbytes)]
    extra = row["estimate_extra"]
    outputs = max(int(extra["output_bytes"]) - int(extra["alias_bytes"]), 0)
    predicted, reserved = allocator_peak(resident, [outputs, int(extra["temp_bytes"])], mode)
    measured = int(row["measured_bytes"])
    return {
        "case": row["case"],
        "batch_size": batch,
        "buffers_bytes": int(row["predicted_bytes"]),
        "allocator_predicted_bytes": int(predicted),
        "allocator_reserved_bytes": int(reserved),
        "measured_bytes": measured,
        "error_buffers": (int(row["predicted_bytes"]) - measured) / measured,
        "error_allocator": (predicted - measured) / measured,
    }


def to_markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = ["# JAX's GPU allocator replayed offline", ""] + [f"- {k}: {v}" for k, v in meta.items()] + [""]
    lines += [
        "| case | batch | XLA buffers MiB | allocator replay MiB | measured MiB | error, buffers | error, allocator replay |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['batch_size']} | {r['buffers_bytes'] / 2**20:.1f} | "
            f"{r['allocator_predicted_bytes'] / 2**20:.1f} | {r['measured_bytes'] / 2**20:.1f} | "
            f"{r['error_buffers'] * 100:+.1f}% | {r['error_allocator'] * 100:+.1f}% |"
        )
    for key, label in (("error_buffers", "XLA buffers alone"), ("error_allocator", "allocator replay")):
        values = [abs(r[key]) for r in rows]
        lines.append("")
        lines.append(
            f"{label}: median {statistics.median(values):.1%}, worst {max(values):.1%} over {len(values)} models."
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measured", required=True, help="a committed keras_jax_gpu/<host>.json")
    parser.add_argument("--mode", default="bfc-growth", choices=("bfc-growth", "bfc-preallocated"))
    parser.add_argument("--out", default=str(result_dir("jax_allocator_offline")), help="where <host>.{json,md} go")
    args = parser.parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "jax")
    with open(args.measured, encoding="utf-8") as handle:
        measured = json.load(handle)
    rows = [replay_case(row, args.mode) for row in measured["rows"] if "error_text" not in row]
    tag = os.path.splitext(os.path.basename(args.measured))[0]  # the measured result's host (and allocator mode)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "measured": f"{args.measured} ({measured['meta'].get('device')}, {measured['meta'].get('date')})",
        "mode": args.mode,
        "commit": commit_stamp(),
    }
    write_result(args.out, tag, {"meta": meta, "rows": rows}, to_markdown(rows, meta))
    print(to_markdown(rows, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
