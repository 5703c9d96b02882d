#pragma once
// The modes of tailserve-bench-kernels, one function each; main.cc's table maps a flag to each.
// Every mode prints markdown tables (bench/gpu_run.sh keeps them, bench/RESULTS.md quotes them).
#include "absl/status/status.h"
#include "bench/kernels/common.h"

namespace tailserve::bench {

// gemm_bench.cc: the projections by cuBLASLt and the batch-1 Gemv.
absl::Status BenchProjections(const BenchConfig& c);  // with BenchAttention: the default mode
absl::Status BenchGemvSplits(const BenchConfig& c);
absl::Status BenchBatchedSplitK(const BenchConfig& c);
absl::Status SearchGemm(const BenchConfig& c);

// stream_gemm_bench.cc: StreamGemm against cuBLASLt, and q/k/v on two branches.
absl::Status BenchStreamGemm(const BenchConfig& c);  // its table, then the 16-row chain of four
absl::Status BenchLmHead(const BenchConfig& c);
absl::Status BenchQkvBranches(const BenchConfig& c);

// ffn_bench.cc: the MLP block's forms (one stream, two branches, StreamFfn, StreamGemm chains).
absl::Status BenchMlpBranches(const BenchConfig& c);

// attention_bench.cc: the decode attention alone, and beside o's bytes.
absl::Status BenchAttention(const BenchConfig& c);
absl::Status BenchOverlap(const BenchConfig& c);

// attention_block_bench.cc: AttentionBlock against the engine's three kernels, and its timeline.
absl::Status BenchAttentionBlock(const BenchConfig& c);

// ceilings_bench.cc: the card's stream ceilings, and what one CTA's TMA ring streams an SM.
absl::Status BenchCeilings(const BenchConfig& c);
absl::Status BenchRingProbe(const BenchConfig& c);

// cases_bench.cc: the kernel cases the GPU tests check (tests/kernel_cases/), timed.
absl::Status BenchKernelCases(const BenchConfig& c);

}  // namespace tailserve::bench
