#!/usr/bin/env bash
# The Keras callback on a GPU, beside the truth from fresh processes in the same run:
#   - JAX in both allocator modes: the callback (its meter samples bytes_in_use every millisecond on a background
#     thread) and keras_accuracy's fresh-process peak for the same cases;
#   - torch: the callback (CUDA meter), and keras_accuracy for the two cases the CUDA workspace model misses, with
#     the C++ frames of the blocks alive at the peak (NNMEM_BENCH_SNAPSHOT=cpp).
# Budget about 5 min on one H100/H200 with 16 cores.
#
# Run from the repository root on a machine with a CUDA GPU, JAX with CUDA and torch with CUDA; Keras may come as
# wheels in .whl/. Writes the JSON and logs into one $OUT/results.tgz (default $OUT: /tmp/nnmem-gpu-out; the device
# tool returns only a few files per call, so one archive). Render the Markdown with
#   python -m benchmarks.suites.keras_callback_device --render benchmarks/results/keras_callback_jax_gpu/TAG_growth.json \
#       --truth benchmarks/results/keras_jax_gpu/TAG_cbtruth_growth.json   (and _prealloc; torch: keras_torch_gpu/TAG_cbtruth)
# (the archive keeps the results' folders: benchmarks/results/<suite>/<host>.json)
set -u
OUT=${OUT:-/tmp/nnmem-gpu-out}
tag=gpu  # set from the GPU below; the archive at exit needs a value even if the run stops before
LOGS=$(mktemp -d)
mkdir -p "$OUT"
trap 'cp --parents benchmarks/results/keras_callback_*_gpu/"$tag"*.json benchmarks/results/keras_*_gpu/"$tag"_cbtruth*.json "$LOGS"/ 2>/dev/null; tar czf "$OUT/results.tgz" -C "$LOGS" .' EXIT
. benchmarks/suites/device_env.sh  # wheels, PYTHONPATH, logging, tag
limit=${LIMIT_S:-280}
cases=${CASES:-unet_small,conv1d,transformer,lstm}
torch_cases=${TORCH_CASES:-lstm,conv1d,unet_small,cnn_bilstm_text}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; KERAS_BACKEND=jax python3 -c "import keras, jax, torch; print('keras', keras.__version__, 'jax', jax.__version__, 'torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"; } >"$LOGS/env.log" 2>&1
for mode in growth prealloc; do
  if [ "$mode" = growth ]; then alloc="XLA_PYTHON_CLIENT_PREALLOCATE=false"; else alloc="XLA_PYTHON_CLIENT_PREALLOCATE=true XLA_PYTHON_CLIENT_MEM_FRACTION=0.05"; fi
  env $alloc KERAS_BACKEND=jax timeout "$limit" python3 -m benchmarks.suites.keras_callback_device --cases "$cases" --epochs 3 \
    --host-tag "${tag}_$mode" >"$LOGS/callback_jax_$mode.log" 2>&1 &
  env $alloc timeout "$limit" python3 -m benchmarks.suites.keras_accuracy --backend jax --device gpu --jobs 4 --repeats 2 \
    --host-tag "${tag}_cbtruth_$mode" --cases "$cases" \
    --note "truth for the callback run beside it (benchmarks/suites/device_keras_gpu_callback.sh)" >"$LOGS/truth_jax_$mode.log" 2>&1 &
done
KERAS_BACKEND=torch timeout "$limit" python3 -m benchmarks.suites.keras_callback_device --cases "$torch_cases" --epochs 3 \
  --host-tag "$tag" >"$LOGS/callback_torch.log" 2>&1 &
NNMEM_BENCH_SNAPSHOT=cpp timeout "$limit" python3 -m benchmarks.suites.keras_accuracy --backend torch --device gpu --jobs 2 \
  --repeats 1 --host-tag "${tag}_cbtruth" --cases "$torch_cases" \
  --note "truth for the callback run beside it, with the C++ frames of the blocks alive at the peak" >"$LOGS/truth_torch.log" 2>&1 &
wait
