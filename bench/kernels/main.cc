// tailserve-bench-kernels: the decode projections and paged attention alone, at a model's shapes
// (default Llama-3.1-8B), on constant data: no checkpoint to make or load, so a kernel change costs
// seconds of device time instead of minutes. Each row is the mean of `reps` launches captured in
// one CUDA graph (so launch overhead is not counted), timed with CUDA events, beside the bytes the
// launch must read ÷ 4.26 TB/s. Projections run as the engine runs them: the Gemv with its
// epilogue for 1 row, cuBLASLt (algorithm timed first) above, where the RMSNorm and SwiGLU are
// separate kernels the tables do not include. One mode a run, chosen by a flag (kModes);
// bench/gpu_run.sh kernels runs it on a lent GPU, docs/cuda-decode.md section 6 says how to read it.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/kernels/common.h"
#include "bench/kernels/modes.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_resources.h"

namespace tailserve::bench {
namespace {

// A mode: its flag, what it measures (the --help line), and the function that runs it.
struct Mode {
  const char* flag;
  const char* help;
  absl::Status (*run)(const BenchConfig&);
};

absl::Status ProjectionsThenAttention(const BenchConfig& c) {
  TAILSERVE_RETURN_IF_ERROR(BenchProjections(c));
  return BenchAttention(c);
}

// Without a mode flag.
constexpr Mode kDefaultMode = {
    nullptr,
    "each projection (Gemv at 1 row, cuBLASLt above) at --rows, then the decode attention at --rows × --contexts",
    ProjectionsThenAttention};

constexpr Mode kModes[] = {
    {"--gemv-splits", "the batch-1 Gemv of each projection at every k split, plain, chained and preloading",
     BenchGemvSplits},
    {"--ksplit", "each projection as a strided-batched GEMM over k chunks into fp32 partials", BenchBatchedSplitK},
    {"--gemm-search", "cuBLASLt's whole configuration space per projection against GemmRunner's pick", SearchGemm},
    {"--stream-gemm",
     "StreamGemm's k-chunk partials against cuBLASLt's RunSplitK at 2-16 rows (each --stream-gemm-rings), then a "
     "layer's four projections chained at 16 rows",
     BenchStreamGemm},
    {"--lm-head", "the LM head at 1-16 rows, cuBLASLt against StreamGemm", BenchLmHead},
    {"--qkv-branches", "q/k/v as one cuBLASLt launch against two column parts on graph branches", BenchQkvBranches},
    {"--mlp-branches",
     "the MLP block on one stream, as two halves on graph branches, and (2-16 rows) as one StreamFfn launch or "
     "StreamGemm chains, with StreamFfn's timeline",
     BenchMlpBranches},
    {"--overlap", "the batch-16 attention beside a DRAM read of o's bytes and beside cuBLASLt's o", BenchOverlap},
    {"--attention-block",
     "cuBLASLt q/k/v + attention + o as the engine runs them at 2-16 rows against cuBLASLt q/k/v + AttentionBlock, "
     "and the block's timeline",
     BenchAttentionBlock},
    {"--ceilings", "this GPU's copy bandwidth and a pure DRAM read of each decode op's bytes", BenchCeilings},
    {"--ring-probe", "what StreamFfn's TMA ring streams an SM bare, then with each of its pieces added",
     BenchRingProbe},
    {"--cases", "the kernel cases the GPU tests check (tests/kernel_cases/), each checked once, then timed",
     BenchKernelCases},
};

absl::StatusOr<std::vector<int>> Ints(const std::string& csv, const char* what) {
  std::vector<int> v;
  for (absl::string_view s : absl::StrSplit(csv, ',', absl::SkipEmpty())) {
    int i = 0;
    if (!absl::SimpleAtoi(s, &i)) return absl::InvalidArgumentError(absl::StrCat(what, ": not an integer: ", s));
    v.push_back(i);
  }
  if (v.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": empty"));
  return v;
}

int Run(int argc, char** argv) {
  CLI::App app{"tailserve-bench-kernels: decode projections and paged attention alone, on constant data"};
  BenchConfig c;
  c.m = {4096, 14336, 32, 8, 128};  // Llama-3.1-8B
  std::string rows = "1,16,64", contexts = "512,2048", kv = "fp8_e4m3", rings_kb = "0";
  app.add_option("--hidden", c.m.hidden, "hidden size");
  app.add_option("--ffn", c.m.ffn, "FFN (intermediate) size");
  app.add_option("--heads", c.m.heads, "query heads");
  app.add_option("--kv-heads", c.m.kv_heads, "KV heads");
  app.add_option("--head-dim", c.m.head_dim, "head dimension");
  app.add_option("--rows", rows, "rows (batch sizes), comma-separated");
  app.add_option("--contexts", contexts, "attention context lengths, comma-separated");
  app.add_option("--kv", kv, "KV cache dtype: fp8_e4m3, fp8_e5m2, fp16");
  app.add_option("--reps", c.reps, "launches per timed graph");
  app.add_flag("--l2-hot", c.l2_hot,
               "projections and attention read one weight / KV copy, so it stays in L2 where it fits (50 MB)");
  app.add_option("--vocab", c.vocab, "the LM head's rows (--lm-head, --ceilings)");
  app.add_option("--stream-gemm-rings", rings_kb, "--stream-gemm: ring sizes in KB, 0 the whole shared memory")
      ->capture_default_str();
  bool chosen[std::size(kModes)] = {};
  const std::string group = absl::StrCat("Modes (one a run; none: ", kDefaultMode.help, ")");
  for (size_t i = 0; i < std::size(kModes); ++i) app.add_flag(kModes[i].flag, chosen[i], kModes[i].help)->group(group);
  CLI11_PARSE(app, argc, argv);

  const Mode* mode = &kDefaultMode;
  for (size_t i = 0; i < std::size(kModes); ++i) {
    if (!chosen[i]) continue;
    if (mode != &kDefaultMode) {
      std::fprintf(stderr, "one mode a run: both %s and %s given\n", mode->flag, kModes[i].flag);
      return 2;
    }
    mode = &kModes[i];
  }
  absl::StatusOr<KvDtype> dtype = ParseKvDtype(kv);
  absl::StatusOr<std::vector<int>> rows_list = Ints(rows, "--rows"), context_list = Ints(contexts, "--contexts"),
                                   rings = Ints(rings_kb, "--stream-gemm-rings");
  for (const absl::Status& st : {dtype.status(), rows_list.status(), context_list.status(), rings.status()}) {
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
      return 2;
    }
  }
  c.kv = *dtype, c.rows = *rows_list, c.contexts = *context_list, c.rings_kb = *rings;
  absl::StatusOr<CudaStream> stream = MakeStream();
  if (!stream.ok()) {
    std::fprintf(stderr, "no GPU: %s\n", std::string(stream.status().message()).c_str());
    return 1;
  }
  c.stream = stream->get();
  std::printf("shape: hidden %d, ffn %d, heads %d/%d, head_dim %d; %d launches a timed graph\n\n", c.m.hidden, c.m.ffn,
              c.m.heads, c.m.kv_heads, c.m.head_dim, c.reps);
  if (absl::Status st = mode->run(c); !st.ok()) {
    std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tailserve::bench

int main(int argc, char** argv) { return tailserve::bench::Run(argc, argv); }
