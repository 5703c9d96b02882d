// tailserve-load: sends N requests at a rate, or replays a trace, against a router; prints
// throughput and P50/P95/P99 of queue time, TTFT and end-to-end latency.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>

#include "tools/load/load_generator.h"
#include "tools/load/multi_turn.h"

int main(int argc, char** argv) {
  CLI::App app{"tailserve load generator"};
  tailserve::LoadOptions o;
  o.target = "127.0.0.1:50051";
  size_t requests = 100;
  tailserve::TraceWindow window;
  double rate = 10, speed = 1;
  int32_t prompt_tokens = 128, max_tokens = 64, max_prompt_tokens = 8192;
  std::string trace, prompts, json_out;
  app.add_option("--target", o.target, "router host:port");
  app.add_option("--requests", requests, "requests to send (without --trace; with --prompts at most this many, 0: all)");
  app.add_option("--rate", rate, "requests per second (0: all at once)");
  app.add_option("--prompt-tokens", prompt_tokens, "prompt length (without --trace)");
  app.add_option("--max-tokens", max_tokens, "output tokens per request (without --trace)");
  app.add_option("--trace", trace, "replay a trace: Azure CSV or Mooncake JSONL");
  app.add_option("--prompts", prompts, "send a prompt set: JSON lines of prompt text (+ max_tokens, temperature, "
                 "top_p), at --rate, at most --requests of them (0: all)");
  app.add_option("--speed", speed, "trace time divided by this (2 = twice as fast)");
  app.add_option("--limit", window.limit, "replay at most this many trace rows (0: all)");
  app.add_option("--from-s", window.from_s, "start the replay this many seconds into the trace");
  app.add_option("--duration-s", window.duration_s, "replay this many seconds of trace time (0: to the end)");
  auto* sim_eos = app.add_flag("--sim-eos", o.sim_eos, "sim workers: end each request at its planned length by a stop token, "
               "with max_tokens = --max-tokens-cap (so the length is not handed to the router)");
  auto* client_stop = app.add_flag("--client-stop", o.client_stop, "real engines: ask for --max-tokens-cap tokens and hang up at the "
               "planned length, counted as a success ending there (the length is not handed to the router)");
  client_stop->excludes(sim_eos);
  app.add_option("--max-tokens-cap", o.max_tokens_cap, "max_tokens sent with --sim-eos or --client-stop");
  app.add_option("--max-prompt-tokens", max_prompt_tokens, "clip trace prompts to this many tokens");
  app.add_option("--timeout-s", o.timeout_s, "per-request deadline in seconds");
  app.add_option("--vocab", o.vocab, "prompt token ids are drawn from [0, vocab)");
  app.add_option("--priority", o.priority, "priority enum value (1 interactive, 2 standard, 3 batch)");
  app.add_option("--seed", o.seed, "seed for prompts and sampling seeds");
  app.add_option("--json", json_out, "also write the summary as JSON here");
  app.add_option("--tokens-out", o.tokens_out, "write each request's status, timings and streamed token ids here (JSON lines)");
  tailserve::MultiTurnSpec chat;
  chat.users = 0;
  app.add_option("--chat-users", chat.users, "multi-turn chat workload: this many conversations (0: off)");
  app.add_option("--chat-turns", chat.turns, "... requests per conversation, each re-sending it whole")->capture_default_str();
  app.add_option("--chat-rate", chat.user_rate, "... conversations started per second")->capture_default_str();
  app.add_option("--chat-system-tokens", chat.system_tokens, "... system prompt shared by all")->capture_default_str();
  app.add_option("--chat-user-tokens", chat.user_tokens, "... mean new user message")->capture_default_str();
  app.add_option("--chat-answer-tokens", chat.answer_tokens, "... mean answer")->capture_default_str();
  app.add_option("--chat-think-s", chat.think_s, "... seconds from an answer to the next turn")->capture_default_str();
  double ttft_slo_ms = 1000, tpot_slo_ms = 50;
  app.add_option("--ttft-slo-ms", ttft_slo_ms, "SLO attainment and goodput: the largest TTFT (ms) that meets it")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--tpot-slo-ms", tpot_slo_ms, "... and the largest mean time per output token after the first (ms)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  o.ttft_slo_s = ttft_slo_ms / 1000.0, o.tpot_slo_s = tpot_slo_ms / 1000.0;

  std::vector<tailserve::PlannedRequest> plan;
  if (!trace.empty() + !prompts.empty() + (chat.users > 0) > 1) {
    std::fprintf(stderr, "give one of --trace, --prompts and --chat-users\n");
    return 2;
  }
  if (chat.users > 0) {
    const tailserve::LoadReport report = tailserve::RunMultiTurn(o, chat);
    std::printf("%s", report.Table().c_str());
    if (!json_out.empty()) std::ofstream(json_out) << report.Json() << "\n";
    size_t ok = 0;
    for (const auto& r : report.results) ok += r.code == 0;
    return ok == report.results.size() ? 0 : 1;
  }
  if (!prompts.empty() || !trace.empty()) {
    auto t = !prompts.empty() ? tailserve::LoadPromptSet(prompts, rate, max_tokens, requests)
                              : tailserve::LoadTrace(trace, speed, window, max_prompt_tokens);
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", std::string(t.status().message()).c_str());
      return 2;
    }
    plan = *std::move(t);
  } else {
    plan = tailserve::FixedRatePlan(requests, rate, prompt_tokens, max_tokens);
  }
  const tailserve::LoadReport report = tailserve::RunLoad(o, plan);
  std::printf("%s", report.Table().c_str());
  if (!json_out.empty()) std::ofstream(json_out) << report.Json() << "\n";
  size_t ok = 0;
  for (const auto& r : report.results) ok += r.code == 0;
  return ok == report.results.size() ? 0 : 1;
}
