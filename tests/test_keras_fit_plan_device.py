"""``fit_plan(device=...)``: a size needs no device, a GPU model gives its memory, a bad name is a clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from nnmem_callbacks.adapters.keras.planning import budget_capacity
from nnmem_callbacks.hardware.gpus import find_gpu

pytestmark = pytest.mark.keras


def test_a_named_gpu_gives_its_memory():
    # the total CUDA reports for the card, not nvidia-smi's larger one (a whole-card budget would run out)
    total = find_gpu("A100 80GB").capacity_bytes
    assert budget_capacity("a100-80gb", 0.5) == (total, total)
    assert budget_capacity("NVIDIA H100", None)[0] == 85_017_493_504 < find_gpu("h100").memory_bytes
    assert budget_capacity("cuda:a100-80gb", 0.5) == (total, total)  # the torch estimator's spelling


@pytest.mark.parametrize("device", ["cuda", "cuda:3", "gpu", "a100-80gb", "cpu"])
def test_a_size_needs_no_device(device):
    # no GPU is queried (this host may have none) and no framework is imported for it
    assert budget_capacity(device, "1GiB") == (0, 0)
    assert budget_capacity(device, 1 << 30) == (0, 0)


@pytest.mark.parametrize("device", ["bogus", "a100", "tpu"])
def test_an_unknown_device_names_the_valid_ones(device):
    with pytest.raises(ValueError, match="Valid devices: 'cpu', 'cuda'") as raised:
        budget_capacity(device, "1GiB")
    assert repr(device) in str(raised.value)


SCRIPT = textwrap.dedent(
    """
    import json, sys
    import keras
    from nnmem_callbacks.keras import fit_plan
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(5)])
    model.compile("adam", "mse")
    out = {}
    for device, budget in (("cuda", "1GiB"), ("cuda", 0.5), ("cuda:0", None), ("gpu", 0.5), ("a100-80gb", 0.5)):
        try:
            out[f"{device} {budget}"] = fit_plan(model, budget=budget, batch_size=32, device=device).budget_bytes
        except Exception as error:
            out[f"{device} {budget}"] = f"{type(error).__name__}: {error}"
    out["torch_imported"] = "torch" in sys.modules
    print("RESULT " + json.dumps(out))
    """
)


def test_jax_without_a_gpu(tmp_path):
    pytest.importorskip("jax")
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", NNMEM_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stderr[-4000:]
    out = json.loads(lines[0][len("RESULT ") :])
    assert out["cuda 1GiB"] == 1 << 30
    assert out["a100-80gb 0.5"] == find_gpu("a100-80gb").capacity_bytes // 2
    for key in ("cuda 0.5", "cuda:0 None", "gpu 0.5"):
        assert out[key].startswith("ValueError: fit_plan: device=") and "jax backend sees no GPU" in out[key], key
        assert "A100 80GB" in out[key] and "budget='10GiB'" in out[key]
    assert not out["torch_imported"]
