// Prefix caching through the scheduler on the sim engine (worker/kv/kv_block_allocator.h does the
// matching; its rules are table-tested in kv_block_allocator_test.cc): admitted sequences attach
// the cached blocks their prompt begins with and prefill only the rest.
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "tests/test_sinks.h"
#include "worker/backends/sim/sim_engine.h"
#include "worker/scheduler.h"

namespace tailserve {
namespace {

using Sink = RecordingSink<v1::TokenEvent>;

v1::Sequence Seq(uint64_t id, const std::vector<int32_t>& prompt, int max_tokens) {
  v1::Sequence s;
  s.set_sequence_id(id);
  for (int32_t t : prompt) s.add_prompt_token_ids(t);
  s.set_max_tokens(max_tokens);
  s.mutable_sampling()->set_seed(id);
  return s;
}

struct CacheRun {
  double prefill_tokens = 0, queried = 0, hits = 0;
  std::map<uint64_t, std::vector<int32_t>> tokens;
};

// One slot, so the sequences run one after another, each finding what the earlier ones published.
CacheRun RunOneByOne(bool prefix_caching, const v1::Batch& batch) {
  FakeClock clock;
  SimBackendConfig c;
  c.step_base_ms = c.step_per_sequence_ms = c.step_per_kv_token_ns = c.step_per_prefill_token_ms = 0;
  c.vocab_size = 1000;
  c.kv_blocks = 100;
  SimEngine engine(c, "test", clock, nullptr, prefix_caching);
  Registry registry;
  WorkerMetrics metrics(registry, 60);
  Scheduler scheduler(engine, /*slots=*/1, metrics, clock);
  SchedulingPolicy policy;
  policy.reservation = KvReservation::kOnDemand;
  scheduler.SetPolicy(policy, /*max_waiting=*/8);
  auto sink = std::make_shared<Sink>();
  scheduler.Submit(sink, batch);
  scheduler.Start();
  EXPECT_TRUE(sink->WaitFinish().ok());
  scheduler.Stop();
  CacheRun run;
  for (const v1::TokenEvent& ev : sink->messages()) {
    for (const auto& se : ev.sequences()) {
      auto& t = run.tokens[se.sequence_id()];
      t.insert(t.end(), se.token_ids().begin(), se.token_ids().end());
    }
  }
  run.prefill_tokens = metrics.prefill_tokens.Value();
  run.queried = metrics.prefix_queried_tokens.Value();
  run.hits = metrics.prefix_hit_tokens.Value();
  return run;
}

TEST(SchedulerPrefixCacheTest, LaterSequencesPrefillOnlyWhatIsNotCached) {
  // A 40-token system prompt shared by three requests, then each its own 6 tokens: 46 tokens, of
  // which the first two 16-token blocks are shared (the third holds each one's own tokens).
  std::vector<int32_t> system(40);
  for (int i = 0; i < 40; ++i) system[i] = 7 + i;
  v1::Batch b;
  for (uint64_t id = 1; id <= 3; ++id) {
    std::vector<int32_t> prompt = system;
    for (int i = 0; i < 6; ++i) prompt.push_back(500 + static_cast<int32_t>(id) * 10 + i);
    *b.add_sequences() = Seq(id, prompt, 4);
  }
  const CacheRun off = RunOneByOne(false, b);
  const CacheRun on = RunOneByOne(true, b);
  EXPECT_EQ(off.prefill_tokens, 3 * 46);
  EXPECT_EQ(off.hits, 0);
  EXPECT_EQ(on.queried, 3 * 46);
  EXPECT_EQ(on.hits, 2 * 32) << "the second and third find the first's two full blocks";
  EXPECT_EQ(on.prefill_tokens, 46 + 2 * (46 - 32));
  EXPECT_EQ(on.tokens, off.tokens) << "what is generated does not depend on the cache";
  for (uint64_t id = 1; id <= 3; ++id) EXPECT_EQ(on.tokens.at(id).size(), 4u);
}

TEST(SchedulerPrefixCacheTest, AnIdenticalPromptComputesOnlyItsLastBlock) {
  // 33 tokens: two full blocks are attached, and the one token left goes through the model as a
  // decode step does, so the second sequence prefills nothing.
  std::vector<int32_t> prompt(33);
  for (int i = 0; i < 33; ++i) prompt[i] = 3 + i;
  v1::Batch b;
  *b.add_sequences() = Seq(1, prompt, 2);
  *b.add_sequences() = Seq(2, prompt, 2);
  const CacheRun on = RunOneByOne(true, b);
  EXPECT_EQ(on.hits, 32);
  EXPECT_EQ(on.prefill_tokens, 33) << "the first sequence's prompt alone";
}

}  // namespace
}  // namespace tailserve
