# Sourced by the device scripts (benchmarks/suites/device_keras_gpu*.sh), from the repository root: installs Keras and the
# package's pure-Python needs from wheels in .whl/ when there are any (the GPU machines here have no registry), sets
# PYTHONPATH and the logging variables, and sets `tag` to the GPU's short name (h100, h200, a100, ...; else gpu).
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
tag=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i 'h[0-9]\+\|a[0-9]\+\|l[0-9]\+' | head -1 | tr A-Z a-z)
tag=${tag:-gpu}
