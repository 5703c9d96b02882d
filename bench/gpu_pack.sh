#!/usr/bin/env bash
# Packs what bench/gpu_run.sh runs on the lent GPU into .gpu/ (../shared/gpu/README.md): the GPU
# tests, the CUDA benchmarks, the checkpoint maker, their libraries and the reference checkpoints.
# A device run carries 64 MiB at most, so the libraries (OpenBLAS alone is 36 MB, linked by the
# tests for the CPU reference) and the large programs travel xz-compressed; gpu_run.sh unpacks them.
# SERVE=1 also packs what bench/gpu_serve.sh runs: the worker, the router, the load generator, the
# length predictor trained on the conversation trace's first 80% and the trace itself.
set -euo pipefail
cd "$(dirname "$0")/.."
serve=()
[ "${SERVE:-0}" = 1 ] && serve=(build/bin/tailserve-worker build/bin/tailserve-router build/bin/tailserve-load)
ninja -C build tailserve_cuda_tests tailserve-bench-cuda tailserve-bench-kernels tailserve-make-checkpoint \
  tailserve_cupti_trace tailserve-bench-kv-layout ${serve[@]+"${serve[@]#build/bin/}"} tailserve-train
../shared/gpu/pack --data ../shared/reference build/bin/tailserve_cuda_tests build/bin/tailserve-bench-cuda \
  build/bin/tailserve-bench-kernels build/bin/tailserve-make-checkpoint build/bin/tailserve-bench-kv-layout \
  ${serve[@]+"${serve[@]}"}
strip .gpu/bin/*
if [ "${SERVE:-0}" = 1 ]; then
  mkdir -p .gpu/serve
  cp ../shared/traces/AzureLLMInferenceTrace_conv.csv .gpu/serve/conv.csv
  build/bin/tailserve-train --trace .gpu/serve/conv.csv --model mlp --holdout 0.2 --out .gpu/serve/model_conv.onnx \
    > .gpu/serve/train.md
fi
# gpu_run.sh trace: the CUPTI injection library and CUPTI itself (xz-compressed below).
cp build/bench/libtailserve_cupti_trace.so .gpu/lib/
cp -L /usr/local/cuda/lib64/libcupti.so.13 .gpu/lib/ 2>/dev/null || echo "no libcupti.so.13: gpu_run.sh trace will not run"
for f in .gpu/lib/*.so* .gpu/bin/tailserve-bench-* .gpu/bin/tailserve_cuda_tests .gpu/bin/tailserve-worker \
  .gpu/bin/tailserve-router .gpu/bin/tailserve-load; do
  [ -f "$f" ] && [ "${f%.xz}" = "$f" ] && xz -T2 -6 -f "$f"
done
echo "after compression (what a device run carries): $(du -sh .gpu | cut -f1)"
