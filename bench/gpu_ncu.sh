#!/usr/bin/env bash
# Nsight Compute on one decode step's first attention launch (8B shape, batch 64, 2048 tokens of
# context): the benchmark brackets its first timed decode step with cudaProfilerStart/Stop.
# Run after bench/gpu_run.sh (it makes the checkpoints). Usage: bash bench/gpu_ncu.sh [kernel regex]
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}"
[ -n "$NCU" ] || exit 0
KERNEL=${1:-AttentionSplit}
.gpu/run "$NCU" --profile-from-start off --kernel-name "regex:$KERNEL" --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats --section SourceCounters \
  .gpu/bin/tailserve-bench-cuda --model ${MODEL:-/tmp/ckpt/l8b} --batches 64 --contexts 2048 --prefills 16 --steps 2 > "$OUT/ncu_$KERNEL.txt" 2>&1
grep -vE "^\s*$|----" "$OUT/ncu_$KERNEL.txt" | grep -E "Duration|Throughput|Registers|Occupancy|Warp Cycles|Stall|Block Size|Grid Size|Achieved|Theoretical|Memory \[|L1|L2|DRAM|Issued|Eligible|Active Warps|Executed Ipc" | head -60
grep -iE "stall|warp state|cycles per" "$OUT/ncu_$KERNEL.txt" | head -40
