#pragma once
// A gRPC load generator for tailserve.v1.Generation: sends requests at planned arrival times
// (a fixed rate or a replayed trace), streams every response, and summarises latency.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tailserve {

struct PlannedRequest {
  double arrival_s = 0;  // from the start of the run
  int32_t prompt_tokens = 0;
  int32_t max_tokens = 0;
  // Mooncake traces: one id per 512-token block of the prompt; equal ids are equal blocks. The
  // prompt's tokens are drawn from them, so requests that share a prefix in the trace share it here.
  std::vector<int64_t> hash_ids;
  // A prompt set (LoadPromptSet): the request sends this text, with its own sampling, instead of
  // token ids drawn at random.
  std::string prompt_text;
  float temperature = 1.0f;
  float top_p = 1.0f;
};
constexpr int32_t kTraceHashBlockTokens = 512;

// Trace rows as planned requests: Azure CSV (TIMESTAMP,ContextTokens,GeneratedTokens) or Mooncake
// JSONL (timestamp ms, input_length, output_length). Only rows in the window [from_s, from_s +
// duration_s) of trace time (seconds after the first row; duration 0: to the end) are kept, at
// most `limit` (0: all); arrivals are relative to the window's start and divided by `speed`;
// prompts are clipped to `max_prompt_tokens`.
struct TraceWindow {
  double from_s = 0;
  double duration_s = 0;
  size_t limit = 0;
};
absl::StatusOr<std::vector<PlannedRequest>> LoadTrace(const std::string& path, double speed, const TraceWindow& window,
                                                      int32_t max_prompt_tokens);
// A prompt set as planned requests, one per JSON line: {"prompt": text, "max_tokens": n,
// "temperature": t, "top_p": p} (all but prompt optional: default_max_tokens, 1.0, 1.0), at `rate`
// per second (0: all at once), evenly spaced, at most `limit` (0: all). A bad line is refused
// naming its line and field.
absl::StatusOr<std::vector<PlannedRequest>> LoadPromptSet(const std::string& path, double rate,
                                                          int32_t default_max_tokens, size_t limit);
// N requests at `rate` per second (0: all at once), evenly spaced.
std::vector<PlannedRequest> FixedRatePlan(size_t n, double rate, int32_t prompt_tokens, int32_t max_tokens);

struct LoadOptions {
  std::string target;
  // When set: each request's status, timings and streamed token ids, one JSON line a request in
  // plan order (the chaos bench compares them with a fault-free run's).
  std::string tokens_out;
  double timeout_s = 600;   // per-request deadline
  int32_t vocab = 256;      // prompt token ids are drawn from [0, vocab)
  uint64_t seed = 1;
  int priority = 0;
  // Against sim workers: each request asks for up to max_tokens_cap tokens and carries a stop
  // token chosen (through its seed) so the simulated model ends it after exactly the planned
  // output length, the way a real model ends with EOS. Without it, max_tokens is the planned
  // length itself (the usual benchmark convention, which hands the length to the router).
  bool sim_eos = false;
  // Against real engines whose weights never emit EOS (random or untrained): each request asks for
  // up to max_tokens_cap tokens and the client hangs up (cancels) once it holds the planned
  // length, which it reports as a success ending there. The server learns the length only from
  // the hang-up, as with sim_eos.
  bool client_stop = false;
  int32_t max_tokens_cap = 4096;
  // The service-level objective the report's attainment and goodput count against: a request
  // meets it when it succeeds with its first token within ttft_slo_s and every later one, on
  // average, within tpot_slo_s.
  double ttft_slo_s = 1.0;
  double tpot_slo_s = 0.05;
};

// The prompt of a request with hash_ids: each token a function of its block's id and its place in
// the block (and the seed), so equal ids give equal blocks.
std::vector<int32_t> HashIdPromptTokens(const PlannedRequest& r, int32_t vocab, uint64_t seed);

// A seed and stop token with which a simulated sequence ends after exactly `length` tokens: the
// token at position length-1 appears nowhere before it.
std::pair<uint64_t, int32_t> SimEosSeed(uint64_t start_seed, int32_t length, int32_t vocab);

struct RequestResult {
  int code = 0;  // grpc status code
  double queue_s = 0, ttft_s = 0, e2e_s = 0;
  int32_t tokens = 0;
  int32_t expected_tokens = 0;
  int finish_reason = 0;  // tailserve.v1.FinishReason of the last response (0: none came)
  int32_t prompt_tokens = 0, cached_prompt_tokens = 0;  // the final response's usage
  int dispatches = 0;
  // Time per output token after the first, (e2e − ttft) / (tokens − 1); 0 with fewer than two.
  double tpot_s() const { return tokens > 1 ? (e2e_s - ttft_s) / (tokens - 1) : 0.0; }
};

struct LoadReport {
  double wall_s = 0;
  // Prompt tokens one unbounded prefix cache would have held (16-token blocks), where the
  // workload knows (RunMultiTurn); -1 otherwise. The served share is the results' own usage.
  int64_t oracle_cached_tokens = -1, oracle_prompt_tokens = 0;
  double ttft_slo_s = 1.0, tpot_slo_s = 0.05;  // LoadOptions'
  std::vector<RequestResult> results;
  std::string Table() const;  // human-readable summary
  std::string Json() const;   // the same, machine-readable
};

LoadReport RunLoad(const LoadOptions& options, const std::vector<PlannedRequest>& plan);

// Linear interpolation between closest ranks (numpy's default); NaN for no data.
double Percentile(std::vector<double> values, double q);

}  // namespace tailserve
