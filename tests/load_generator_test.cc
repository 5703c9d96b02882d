// tailserve-load's request endings against a real router and sim worker.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "tests/cluster.h"
#include "tools/load/load_generator.h"
#include "tools/load/multi_turn.h"

namespace tailserve {
namespace {

// --client-stop: the client asks for far more tokens than it plans, hangs up at the planned length
// and counts that as a success ending there; the router sees a cancellation, never the length.
TEST(LoadGeneratorTest, ClientStopHangsUpAtThePlannedLength) {
  Cluster cluster({1, {"--set", "worker.sim.step_base_ms=2"}, {}});
  ASSERT_TRUE(cluster.Start().ok());
  LoadOptions o;
  o.target = cluster.router_target();
  o.client_stop = true;
  o.max_tokens_cap = 4000;
  const LoadReport r = RunLoad(o, FixedRatePlan(6, 100, 16, 5));
  ASSERT_EQ(r.results.size(), 6u);
  for (const RequestResult& x : r.results) {
    EXPECT_EQ(x.code, 0);
    EXPECT_EQ(x.tokens, 5);
    EXPECT_GT(x.e2e_s, 0);
    EXPECT_GE(x.e2e_s, x.ttft_s);
  }
  // The hang-ups reach the router after the client has moved on: wait for them.
  std::string router;
  for (int tries = 0; tries < 200; ++tries) {
    ASSERT_EQ(HttpGet(cluster.router_http(), "/metrics", &router), 200);
    if (MetricValue(router, "tailserve_router_requests_total{outcome=\"cancelled\"}") == 6) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_EQ(MetricValue(router, "tailserve_router_requests_total{outcome=\"cancelled\"}"), 6);
  const double by_length = MetricValue(router, "tailserve_router_requests_total{outcome=\"length\"}");
  EXPECT_TRUE(std::isnan(by_length) || by_length == 0) << by_length;
}

// The multi-turn chat workload against sim workers with a prefix cache: every turn of every
// conversation is served, each later turn finds its conversation so far cached (whole blocks of
// the system prompt, earlier messages and answers), and the unbounded cache's count is what the
// structure implies.
TEST(LoadGeneratorTest, MultiTurnChatResendsEachConversationAndFindsItCached) {
  Cluster cluster({2, {"--set", "worker.sim.step_base_ms=1", "--set", "worker.sim.kv_blocks=4000"}, {}});
  ASSERT_TRUE(cluster.Start().ok());
  LoadOptions o;
  o.target = cluster.router_target();
  o.sim_eos = true;
  o.max_tokens_cap = 400;
  MultiTurnSpec chat;
  chat.users = 6;
  chat.turns = 3;
  chat.user_rate = 50;
  chat.system_tokens = 256;
  chat.user_tokens = 32;
  chat.answer_tokens = 24;
  chat.think_s = 0.05;
  const LoadReport r = RunMultiTurn(o, chat);
  ASSERT_EQ(r.results.size(), 18u);
  int64_t prompt = 0, cached = 0;
  int later = 0, found_previous = 0;  // later turns; those that found their previous prompt cached
  for (size_t i = 0; i < r.results.size(); ++i) {
    const RequestResult& x = r.results[i];
    ASSERT_EQ(x.code, 0) << i;
    EXPECT_EQ(x.tokens, x.expected_tokens) << "the sim ends each answer at its planned length";
    prompt += x.prompt_tokens;
    cached += x.cached_prompt_tokens;
    if (i % 3 > 0) {  // a later turn re-sends the previous prompt, its answer and a new message
      EXPECT_GE(x.prompt_tokens, r.results[i - 1].prompt_tokens + r.results[i - 1].tokens + 16) << i;
      ++later;
      found_previous += x.cached_prompt_tokens >= r.results[i - 1].prompt_tokens / 16 * 16 - 16;
    }
  }
  // Placement may send a turn elsewhere when its conversation's worker is a step busier.
  EXPECT_GE(found_previous, later * 3 / 4) << "of " << later;
  EXPECT_EQ(r.oracle_prompt_tokens, prompt) << "every prompt was served";
  // The unbounded cache misses only the first conversation's system prompt, each new message and
  // the partial block at each answer's end: most of it.
  EXPECT_GT(r.oracle_cached_tokens, prompt / 2);
  EXPECT_LE(cached, r.oracle_cached_tokens) << "no real cache beats the unbounded one";
  EXPECT_GT(cached, r.oracle_cached_tokens / 2);
}

}  // namespace
}  // namespace tailserve
