#!/usr/bin/env bash
# Packs what bench/gpu_run.sh runs on the lent GPU into .gpu/ (../shared/gpu/README.md): the GPU
# tests, the CUDA benchmarks, the checkpoint maker, their libraries and the reference checkpoints.
# A device run carries 64 MiB at most, so OpenBLAS (36 MB, linked by the tests for the CPU
# reference), CUPTI and the large programs travel xz-compressed; gpu_run.sh unpacks them.
set -euo pipefail
cd "$(dirname "$0")/.."
ninja -C build tailserve_cuda_tests tailserve-bench-cuda tailserve-bench-kernels tailserve-make-checkpoint \
  tailserve_cupti_trace tailserve-bench-kv-layout
../shared/gpu/pack --data ../shared/reference build/bin/tailserve_cuda_tests build/bin/tailserve-bench-cuda \
  build/bin/tailserve-bench-kernels build/bin/tailserve-make-checkpoint build/bin/tailserve-bench-kv-layout
strip .gpu/bin/*
# gpu_run.sh trace: the CUPTI injection library and CUPTI itself (xz-compressed below).
cp build/bench/libtailserve_cupti_trace.so .gpu/lib/
cp -L /usr/local/cuda/lib64/libcupti.so.13 .gpu/lib/ 2>/dev/null || echo "no libcupti.so.13: gpu_run.sh trace will not run"
for f in .gpu/lib/libopenblas.so.* .gpu/lib/libcupti.so.* .gpu/bin/tailserve-bench-* .gpu/bin/tailserve_cuda_tests; do
  [ -f "$f" ] && xz -T2 -6 -f "$f"
done
echo "after compression (what a device run carries): $(du -sh .gpu | cut -f1)"
