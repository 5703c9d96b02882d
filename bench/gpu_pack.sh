#!/usr/bin/env bash
# Packs what bench/gpu_run.sh runs on the lent GPU into .gpu/ (../shared/gpu/README.md): the GPU
# tests, the CUDA benchmarks, the checkpoint maker, their libraries and the reference checkpoints.
# A device run carries 64 MiB at most, so OpenBLAS (36 MB, linked by the tests for the CPU
# reference) travels xz-compressed; gpu_run.sh unpacks it.
set -euo pipefail
cd "$(dirname "$0")/.."
ninja -C build tailserve_cuda_tests tailserve-bench-cuda tailserve-bench-kernels tailserve-make-checkpoint
../shared/gpu/pack --data ../shared/reference build/bin/tailserve_cuda_tests build/bin/tailserve-bench-cuda \
  build/bin/tailserve-bench-kernels build/bin/tailserve-make-checkpoint
strip .gpu/bin/*
for lib in .gpu/lib/libopenblas.so.*; do
  [ -f "$lib" ] && xz -T2 -6 -f "$lib"
done
du -sh .gpu
