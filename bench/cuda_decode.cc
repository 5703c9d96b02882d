// tailserve-bench-cuda: the CUDA backend's decode step and prefill time on a checkpoint, beside the
// roofline: a decode step must read every weight matrix once plus the batch's KV cache (bytes ÷
// the measured 4.26 TB/s copy bandwidth); a prefill must do 2·params·tokens FLOPs plus attention
// (÷ the measured 768 TFLOP/s bf16 GEMM rate; fp16 runs at the same rate). Optional soak: batch B for S seconds, reporting
// step-time quantiles and device memory per interval.
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "worker/backends/cuda/cuda_engine.h"

namespace tailserve {
namespace {

constexpr double kCopyBandwidth = 4.26e12;  // bytes/s, ../shared/gpu/README.md
constexpr double kBf16Flops = 768e12;       // FLOP/s, same

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double Quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5))];
}

// Bytes of the weight matrices one decode step reads (the embedding table is only gathered from,
// unless it doubles as the LM head).
double MatrixBytes(const ModelConfig& c) {
  const double h = c.hidden_size, f = c.intermediate_size;
  const double attn = h * (c.q_dim() + 2 * c.kv_dim()) + c.q_dim() * h;
  const double mlp = c.num_experts ? c.num_experts * 3 * h * f + c.num_experts * h : 3 * h * f;
  return 2 * (c.num_layers * (attn + mlp) + c.vocab_size * h);
}

double KvBytesPerToken(const ModelConfig& c, KvDtype d) {
  const double elem = KvElementBytes(d), scale = d == KvDtype::kFp16 ? 0 : 4;
  return c.num_layers * 2.0 * c.num_kv_heads * (c.head_dim * elem + scale);
}

std::vector<int32_t> Prompt(int n, int salt, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[i] = static_cast<int32_t>((int64_t(i) * 7919 + int64_t(salt) * 104729 + 13) % vocab);
  return t;
}

// Least-squares fit of the sim backend's cost model, step = a + b·batch + c·kv_tokens +
// p·prefill_tokens (ms), over every measured step: the constants worker.sim.* takes.
template <typename P>
void FitSimCostModel(const std::vector<P>& pts) {
  double m[4][5] = {};
  for (const P& q : pts) {
    const double x[4] = {1, q.batch, q.kv_tokens, q.prefill_tokens};
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 4; ++j) m[i][j] += x[i] * x[j];
      m[i][4] += x[i] * q.ms;
    }
  }
  for (int i = 0; i < 4; ++i) {  // Gauss-Jordan with partial pivoting
    int piv = i;
    for (int r = i + 1; r < 4; ++r) {
      if (std::fabs(m[r][i]) > std::fabs(m[piv][i])) piv = r;
    }
    std::swap(m[i], m[piv]);
    if (std::fabs(m[i][i]) < 1e-12) {
      std::printf("\nsim cost-model fit: not enough distinct batches / contexts / prefills to separate the terms\n");
      return;
    }
    for (int r = 0; r < 4; ++r) {
      if (r == i) continue;
      const double f = m[r][i] / m[i][i];
      for (int k = i; k < 5; ++k) m[r][k] -= f * m[i][k];
    }
  }
  const double a = m[0][4] / m[0][0], b = m[1][4] / m[1][1], c = m[2][4] / m[2][2], p = m[3][4] / m[3][3];
  double worst = 0;
  for (const P& q : pts) {
    worst = std::max(worst, std::fabs(a + b * q.batch + c * q.kv_tokens + p * q.prefill_tokens - q.ms) / q.ms);
  }
  std::printf("\nsim cost-model fit over %zu steps: step_base_ms %.3f, step_per_sequence_ms %.4f, step_per_kv_token_ns "
              "%.1f, step_per_prefill_token_ms %.4f (worst relative residual %.0f%%)\n",
              pts.size(), a, b, c * 1e6, p, 100 * worst);
}

int Main(int argc, char** argv) {
  CLI::App app{"tailserve-bench-cuda: decode step and prefill time beside the roofline"};
  std::string model, kv = "fp8_e4m3", batches = "1,16,64", prefills = "512,2048";
  std::string contexts = "512";
  int steps = 50;
  double soak_s = 0;
  int soak_batch = 64;
  cuda::DecodeTuning tuning;  // its defaults: the worker's path
  app.add_option("--model", model, "checkpoint directory")->required();
  app.add_option("--kv", kv, "KV cache dtype")->capture_default_str();
  app.add_option("--batches", batches, "decode batch sizes")->capture_default_str();
  app.add_option("--contexts", contexts, "tokens each sequence holds when decoding starts (a list: the sim fit needs two)")
      ->capture_default_str();
  app.add_option("--steps", steps, "timed decode steps per batch size")->capture_default_str();
  app.add_option("--prefills", prefills, "prompt lengths to time prefill for")->capture_default_str();
  app.add_option("--soak-seconds", soak_s, "run a soak of this length after the table")->capture_default_str();
  app.add_option("--soak-batch", soak_batch, "batch of the soak")->capture_default_str();
  app.add_option("--attention-splits", tuning.attention_splits,
                 "most splits of a row's keys the engine may choose (its split model picks)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--ffn-halves-min-bytes", tuning.ffn_halves_min_bytes,
                 "smallest FFN (bytes) run as two halves on two graph branches above batch 1 on cuBLASLt")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--stream-min-rows", tuning.stream_min_rows,
                 "the fewest decode rows that take StreamGemm's q/k/v and StreamFfn")
      ->check(CLI::Range(2, 16))
      ->capture_default_str();
  app.add_option("--stream-ffn-chunks", tuning.stream_ffn_chunks,
                 "StreamFfn's down k chunks (0: cuBLASLt's FFN instead)")
      ->check(CLI::Range(0, 4))
      ->capture_default_str();
  app.add_option("--stream-qkv-chunks", tuning.stream_qkv_chunks,
                 "StreamGemm's q/k/v k chunks (0: cuBLASLt's split-K instead)")
      ->check(CLI::Range(0, 4))
      ->capture_default_str();
  app.add_option("--in-situ-candidates", tuning.in_situ_candidates,
                 "cuBLASLt candidates a shape tries inside the captured step (1: the pick timed alone)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  app.add_option("--attention-block", tuning.attention_block,
                 "decode at --attention-block-min-rows to 16 rows: the attention and o in one AttentionBlock launch "
                 "(0: PagedAttention, then cuBLASLt's o)")
      ->capture_default_str();
  app.add_option("--attention-block-min-rows", tuning.attention_block_min_rows,
                 "the fewest decode rows (a bucket) that take the block")
      ->check(CLI::Range(2, 16))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  std::vector<int> context_list;
  for (const auto& x : absl::StrSplit(contexts, ',')) context_list.push_back(std::stoi(std::string(x)));
  const int context = context_list.front();
  struct Point {
    double batch, kv_tokens, prefill_tokens, ms;
  };
  std::vector<Point> points;  // for the sim cost-model fit

  absl::StatusOr<KvDtype> dtype = ParseKvDtype(kv);
  if (!dtype.ok()) return std::fprintf(stderr, "%s\n", std::string(dtype.status().message()).c_str()), 2;
  const double t0 = Now();
  auto engine = CudaEngine::Load(model, {.kv_dtype = *dtype, .max_sequences = 256, .tuning = tuning});
  if (!engine.ok()) return std::fprintf(stderr, "%s\n", std::string(engine.status().message()).c_str()), 1;
  const ModelConfig& c = (*engine)->config();
  const double wbytes = MatrixBytes(c), kv_tok = KvBytesPerToken(c, *dtype);
  std::printf("model %s: %lld layers, hidden %lld, heads %lld/%lld, head_dim %lld, ffn %lld, vocab %lld; kv %s; "
              "loaded + graphs captured in %.1f s; weight matrices %.2f GB\n",
              model.c_str(), (long long)c.num_layers, (long long)c.hidden_size, (long long)c.num_heads,
              (long long)c.num_kv_heads, (long long)c.head_dim, (long long)c.intermediate_size, (long long)c.vocab_size,
              kv.c_str(), Now() - t0, wbytes / 1e9);
  for (const auto& [what, bytes] : (*engine)->memory()) std::printf("  device memory %s: %.2f GiB\n", what.c_str(), bytes / 1073741824.0);
  for (const auto& b : absl::StrSplit(batches, ',')) {
    std::printf("  %s\n", (*engine)->DescribeDecodePlan(std::stoi(std::string(b))).c_str());
  }
  Sampling greedy;
  uint64_t next_id = 1;

  std::printf("\n| prefill tokens | time ms | FLOP floor ms | floor / time |\n|---:|---:|---:|---:|\n");
  for (const auto& p : absl::StrSplit(prefills, ',')) {
    const int n = std::stoi(std::string(p));
    std::vector<double> times;
    for (int rep = 0; rep < 4; ++rep) {
      std::vector<int32_t> t = Prompt(n, rep, c.vocab_size);
      StepSequence s{next_id++, &t, n, 0, &greedy};
      std::vector<int32_t> out;
      const double a = Now();
      if (absl::Status st = (*engine)->Step({&s, 1}, &out); !st.ok()) return std::fprintf(stderr, "%s\n", st.ToString().c_str()), 1;
      if (rep > 0) times.push_back(Now() - a);  // the first is warm-up
      (*engine)->Release(s.id);
    }
    const double flops = 2.0 * (wbytes / 2 - c.vocab_size * c.hidden_size) * n + 2.0 * c.vocab_size * c.hidden_size +
                         2.0 * 2 * (double(n) * n / 2) * c.num_heads * c.head_dim * c.num_layers;
    const double m = Quantile(times, 0.5), floor = flops / kBf16Flops;
    std::printf("| %d | %.2f | %.2f | %.0f%% |\n", n, m * 1e3, floor * 1e3, 100 * floor / m);
    points.push_back({1, static_cast<double>(n), static_cast<double>(n - 1), m * 1e3});
  }

  std::vector<std::string> breakdowns;
  std::printf("\n| batch | context | step ms (P50) | P99 ms | tokens/s | bytes/step GB | roofline ms | roofline / P50 |\n"
              "|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const int context : context_list) {
  for (const auto& b : absl::StrSplit(batches, ',')) {
    const int batch = std::stoi(std::string(b));
    std::vector<std::vector<int32_t>> seqs;
    std::vector<StepSequence> step;
    for (int i = 0; i < batch; ++i) seqs.push_back(Prompt(context, i, c.vocab_size));
    for (int i = 0; i < batch; ++i) step.push_back({next_id++, &seqs[i], context, 0, &greedy});
    std::vector<int32_t> out;
    std::vector<double> times;
    for (int k = -3; k < steps; ++k) {  // the first step prefills; two more warm the graph
      const double a = Now();
      if (k == 0) cudaProfilerStart();  // what `ncu --profile-from-start off` sees: one decode step
      if (absl::Status st = (*engine)->Step(step, &out); !st.ok()) return std::fprintf(stderr, "%s\n", st.ToString().c_str()), 1;
      if (k == 0) cudaProfilerStop();
      if (k >= 0) times.push_back(Now() - a);
      for (int i = 0; i < batch; ++i) {
        seqs[i].push_back(out[i]);
        step[i].computed = static_cast<int32_t>(seqs[i].size()) - 1;
      }
    }
    const double p50 = Quantile(times, 0.5), p99 = Quantile(times, 0.99);
    // The graph alone, replayed back to back: what the host's round trip between steps costs;
    // launched on an idle GPU and waited for, one at a time: how much of that is the launch from
    // idle and how much Step()'s own host work.
    absl::StatusOr<double> replay = (*engine)->ReplayMilliseconds(batch, 20);
    absl::StatusOr<double> idle = (*engine)->ReplayMilliseconds(batch, 21, /*from_idle=*/true);
    if (replay.ok() && idle.ok()) {
      breakdowns.push_back(absl::StrCat(
          "batch ", batch, " context ", context, " graph replayed back to back ", absl::SixDigits(*replay),
          " ms a step; launched from idle and waited for (median) ", absl::SixDigits(*idle), " ms; Step() P50 ",
          absl::SixDigits(p50 * 1e3), " ms: ", absl::SixDigits((p50 * 1e3 - *replay) * 1e3),
          " us between graphs, of which ", absl::SixDigits((*idle - *replay) * 1e3), " us launch from idle and ",
          absl::SixDigits((p50 * 1e3 - *idle) * 1e3), " us Step()'s host work"));
    }
    // Where a step's time goes: one eager forward of the same rows, an event after every op.
    auto profile = (*engine)->ProfileDecode(batch);
    if (profile.ok()) {
      double total = 0;
      for (const auto& [what, ms] : *profile) total += ms;
      std::string line;
      for (const auto& [what, ms] : *profile) line += absl::StrCat(what, " ", absl::SixDigits(ms), " ms (", static_cast<int>(100 * ms / total + 0.5), "%), ");
      breakdowns.push_back(absl::StrCat("batch ", batch, " context ", context, " graph-profiled forward ",
                                        absl::SixDigits(total), " ms: ", line));
    }
    for (const StepSequence& s : step) (*engine)->Release(s.id);
    const double bytes = wbytes + kv_tok * batch * (context + 3 + steps / 2.0);
    const double roof = bytes / kCopyBandwidth;
    std::printf("| %d | %d | %.3f | %.3f | %.0f | %.2f | %.3f | %.0f%% |\n", batch, context, p50 * 1e3, p99 * 1e3,
                batch / p50, bytes / 1e9, roof * 1e3, 100 * roof / p50);
    points.push_back({static_cast<double>(batch), batch * (context + 3 + steps / 2.0), 0, p50 * 1e3});
  }
  }
  FitSimCostModel(points);

  std::printf("\n");
  for (const std::string& b : breakdowns) std::printf("%s\n", b.c_str());

  if (soak_s > 0) {
    // Steady batch: when a sequence has decoded 512 tokens it is released and replaced by a fresh
    // prompt, one sequence at a time (staggered, so the batch's KV size stays level). The
    // replacement's prefill runs as its own Step and is not counted as a decode step.
    std::printf("\n| soak interval s | steps | P50 ms | P99 ms | P99/P50 | device free GiB |\n|---:|---:|---:|---:|---:|---:|\n");
    std::vector<std::vector<int32_t>> seqs;
    std::vector<StepSequence> step;
    for (int i = 0; i < soak_batch; ++i) seqs.push_back(Prompt(context + (i * 512) / soak_batch, i, c.vocab_size));
    for (int i = 0; i < soak_batch; ++i) step.push_back({next_id++, &seqs[i], int32_t(seqs[i].size()), 0, &greedy});
    std::vector<int32_t> out;
    if (!(*engine)->Step(step, &out).ok()) return 1;
    std::vector<double> window, all;
    const double start = Now();
    double mark = start;
    int replaced = 0;
    while (Now() - start < soak_s) {
      for (int i = 0; i < soak_batch; ++i) {
        seqs[i].push_back(out[i]);
        step[i].computed = static_cast<int32_t>(seqs[i].size()) - 1;
      }
      // Replace at most one finished sequence per step.
      for (int i = 0; i < soak_batch; ++i) {
        if (static_cast<int>(seqs[i].size()) < context + 512) continue;
        (*engine)->Release(step[i].id);
        seqs[i] = Prompt(context, replaced++, c.vocab_size);
        step[i] = {next_id++, &seqs[i], context, 0, &greedy};
        std::vector<int32_t> one;
        if (!(*engine)->Step({&step[i], 1}, &one).ok()) return 1;
        seqs[i].push_back(one[0]);
        step[i].computed = static_cast<int32_t>(seqs[i].size()) - 1;
        break;
      }
      const double a = Now();
      if (absl::Status st = (*engine)->Step(step, &out); !st.ok()) return std::fprintf(stderr, "%s\n", st.ToString().c_str()), 1;
      window.push_back(Now() - a);
      all.push_back(window.back());
      if (Now() - mark >= 30 || Now() - start >= soak_s) {
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        std::printf("| %.0f | %zu | %.3f | %.3f | %.3f | %.3f |\n", Now() - start, window.size(), Quantile(window, 0.5) * 1e3,
                    Quantile(window, 0.99) * 1e3, Quantile(window, 0.99) / Quantile(window, 0.5), free_b / 1073741824.0);
        std::fflush(stdout);
        window.clear();
        mark = Now();
      }
    }
    std::printf("soak total: %zu steps, P50 %.3f ms, P99 %.3f ms (P99/P50 %.3f), %d sequences replaced\n", all.size(),
                Quantile(all, 0.5) * 1e3, Quantile(all, 0.99) * 1e3, Quantile(all, 0.99) / Quantile(all, 0.5), replaced);
  }
  return 0;
}

}  // namespace
}  // namespace tailserve

int main(int argc, char** argv) { return tailserve::Main(argc, argv); }
