#!/usr/bin/env bash
# Keras on a GPU: the JAX (both allocator modes) and torch accuracy benchmarks and the callback check, side by side.
# On one H100 with 16 cores: the JAX cases took about 2 min per 9 models at 9 jobs; budget about 7 min in all.
#
# Run on a machine with a CUDA GPU, JAX with CUDA and torch with CUDA, from the repository root. Keras and the
# package's pure-Python needs may come as wheels in .whl/ (the GPU machines here have no registry). Writes the
# results' JSON and the logs to $OUT (default /tmp/nnmem-gpu-out); the Markdown is rendered from the JSON with
#   python -m benchmarks.suites.keras_accuracy --render --backend jax --device gpu --host-tag TAG_prealloc (and TAG_growth)
#   python -m benchmarks.suites.jax_allocator_offline --measured benchmarks/results/keras_jax_gpu/TAG_growth.json
#   python -m benchmarks.suites.keras_callback_device --render benchmarks/results/keras_callback_jax_gpu/TAG_growth.json
# (the results keep their folders under $OUT: $OUT/benchmarks/results/<suite>/<host>.json)
set -u
OUT=${OUT:-/tmp/nnmem-gpu-out}
mkdir -p "$OUT"
. benchmarks/suites/device_env.sh  # wheels, PYTHONPATH, logging, tag
limit=${LIMIT_S:-400}
note=${NOTE:-}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; KERAS_BACKEND=jax python3 -c "import keras, jax, torch; print('keras', keras.__version__, 'jax', jax.__version__, 'torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"; } >"$OUT/jax.log" 2>&1
jax_cases=${JAX_CASES:-mlp,conv1d,audio_cnn,unet_small,vgg16,mobilenet_v1,transformer,lstm,mha,vit_tiny,gru_text,mobilenetv2}
# JAX's default allocator (preallocated; a small share per process, since several run at once) ...
XLA_PYTHON_CLIENT_PREALLOCATE=true XLA_PYTHON_CLIENT_MEM_FRACTION=0.05 timeout "$limit" python3 -m benchmarks.suites.keras_accuracy \
  --backend jax --device gpu --jobs "${JAX_JOBS:-8}" --repeats 3 --host-tag "${tag}_prealloc" --note "$note" \
  --cases "$jax_cases" >>"$OUT/jax.log" 2>&1 &
# ... and allocating on demand (XLA_PYTHON_CLIENT_PREALLOCATE=false), where the allocator charges whole regions
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "$limit" python3 -m benchmarks.suites.keras_accuracy --backend jax --device gpu \
  --jobs "${JAX_JOBS:-8}" --repeats 3 --host-tag "${tag}_growth" --note "$note" --cases "$jax_cases" \
  >"$OUT/jax_growth.log" 2>&1 &
timeout "$limit" python3 -m benchmarks.suites.keras_accuracy --backend torch --device gpu --jobs "${TORCH_JOBS:-3}" --repeats 3 \
  --host-tag "$tag" --note "$note" --cases "${TORCH_CASES:-lstm,gru_text,stacked_lstm,conv1d,transformer,cnn_bilstm_text,unet_small}" \
  >"$OUT/torch.log" 2>&1 &
KERAS_BACKEND=jax XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "$limit" python3 -m benchmarks.suites.keras_callback_device \
  --cases "${CALLBACK_CASES:-unet_small,conv1d,transformer}" --epochs 3 --host-tag "${tag}_growth" >"$OUT/callback.log" 2>&1 &
wait
cp --parents benchmarks/results/keras_jax_gpu/"$tag"_prealloc.json benchmarks/results/keras_jax_gpu/"$tag"_growth.json \
  benchmarks/results/keras_torch_gpu/"$tag".json benchmarks/results/keras_callback_jax_gpu/"$tag"_growth.json "$OUT"/ 2>/dev/null
ls -la "$OUT"
