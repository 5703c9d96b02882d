#!/usr/bin/env bash
# Nsight Compute on the decode attention kernel (1B shape, batch 64), when ncu is on the device.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/ckpt
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}"
[ -n "$NCU" ] || exit 0
[ -d /tmp/ckpt/l1b ] || .gpu/run tailserve-make-checkpoint --preset llama-3.2-1b --vocab 128256 --out /tmp/ckpt/l1b >/dev/null
.gpu/run "$NCU" --kernel-name regex:AttentionSplit --launch-skip ${SKIP:-384} --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats --section SourceCounters \
  .gpu/bin/tailserve-bench-cuda --model /tmp/ckpt/l1b --batches 64 --prefills 16 --steps 5 > "$OUT/ncu_attention.txt" 2>&1
grep -vE "^\s*$|----" "$OUT/ncu_attention.txt" | grep -E "Duration|Throughput|Registers|Occupancy|Warp Cycles|Stall|Block Size|Grid Size|Achieved|Theoretical|Memory \[|L1|L2|DRAM|Issued|Eligible|Active Warps" | head -80; grep -E "Grid Size|smsp__pcsamp|Stall|stall" "$OUT/ncu_attention.txt" | head -40
