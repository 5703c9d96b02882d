// tailserve-bench-cpu: the CPU backend's prefill and decode speed on a checkpoint. Prints a
// markdown table: prefill time per prompt length, decode step time and tokens/s per batch size
// (every sequence holding `--context` tokens), beside the bytes a step must read (weights + KV)
// and the bandwidth that implies.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>

#include "absl/strings/str_split.h"
#include "worker/backends/cpu/cpu_engine.h"

namespace tailserve {
namespace {

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Main(int argc, char** argv) {
  CLI::App app{"tailserve-bench-cpu: CPU backend prefill and decode speed"};
  std::string model, batches = "1,4,16,64", prompts = "128,512";
  int context = 128, steps = 10, threads = 0;
  app.add_option("--model", model, "checkpoint directory")->required();
  app.add_option("--batches", batches, "decode batch sizes")->capture_default_str();
  app.add_option("--prompts", prompts, "prefill lengths")->capture_default_str();
  app.add_option("--context", context, "tokens each decoding sequence already holds")->capture_default_str();
  app.add_option("--steps", steps, "timed decode steps per batch size (median reported)")->capture_default_str();
  app.add_option("--threads", threads, "BLAS threads (0: library default)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  auto engine = CpuEngine::Load(model, {.threads = threads, .kv_emulation = std::nullopt});
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", std::string(engine.status().message()).c_str());
    return 1;
  }
  const ModelConfig& c = (*engine)->config();
  // fp32 weights the CPU reads per step (the embedding table is only gathered from, unless tied).
  double weight_bytes = 0;
  {
    const double h = c.hidden_size, f = c.intermediate_size;
    const double attn = h * (c.q_dim() + 2 * c.kv_dim()) + c.q_dim() * h;
    const double mlp = 3 * h * f * (c.num_experts ? c.experts_per_token : 1);
    weight_bytes = 4 * (c.num_layers * (attn + mlp) + c.vocab_size * h);
  }
  std::printf("model %s: %lld layers, hidden %lld, vocab %lld; fp32 weights read per step %.1f MB\n\n", model.c_str(),
              static_cast<long long>(c.num_layers), static_cast<long long>(c.hidden_size),
              static_cast<long long>(c.vocab_size), weight_bytes / 1e6);
  Sampling greedy;
  uint64_t next_id = 1;
  auto tokens_of = [&](int n, int salt) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 7919 + salt * 104729) % c.vocab_size);
    return t;
  };

  std::printf("| prefill tokens | time ms | tokens/s |\n|---:|---:|---:|\n");
  for (const auto& p : absl::StrSplit(prompts, ',')) {
    const int n = std::stoi(std::string(p));
    std::vector<double> times;
    for (int rep = 0; rep < 3; ++rep) {
      std::vector<int32_t> t = tokens_of(n, rep);
      StepSequence s{next_id++, &t, n, 0, &greedy};
      std::vector<int32_t> out;
      const double t0 = Now();
      if (!(*engine)->Step({&s, 1}, &out).ok()) return 1;
      times.push_back(Now() - t0);
      (*engine)->Release(s.id);
    }
    const double m = Median(times);
    std::printf("| %d | %.1f | %.0f |\n", n, m * 1e3, n / m);
  }

  std::printf("\n| batch | context | step ms | tokens/s | bytes/step MB | GB/s |\n|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& b : absl::StrSplit(batches, ',')) {
    const int batch = std::stoi(std::string(b));
    std::vector<std::vector<int32_t>> seqs;
    std::vector<StepSequence> step;
    for (int i = 0; i < batch; ++i) seqs.push_back(tokens_of(context, i));
    for (int i = 0; i < batch; ++i) step.push_back({next_id++, &seqs[i], context, 0, &greedy});
    std::vector<int32_t> out;
    if (!(*engine)->Step(step, &out).ok()) return 1;  // prefill, untimed
    std::vector<double> times;
    for (int k = 0; k < steps; ++k) {
      for (int i = 0; i < batch; ++i) {
        seqs[i].push_back(out[i]);
        step[i].computed = static_cast<int32_t>(seqs[i].size()) - 1;
      }
      const double t0 = Now();
      if (!(*engine)->Step(step, &out).ok()) return 1;
      times.push_back(Now() - t0);
    }
    for (const StepSequence& s : step) (*engine)->Release(s.id);
    const double m = Median(times);
    const double kv = 2.0 * 4 * c.num_layers * c.kv_dim() * (context + steps / 2.0) * batch;
    const double bytes = weight_bytes + kv;
    std::printf("| %d | %d | %.2f | %.0f | %.1f | %.1f |\n", batch, context, m * 1e3, batch / m, bytes / 1e6,
                bytes / m / 1e9);
  }
  return 0;
}

}  // namespace
}  // namespace tailserve

int main(int argc, char** argv) { return tailserve::Main(argc, argv); }
