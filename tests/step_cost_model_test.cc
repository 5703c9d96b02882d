#include "worker/step_cost_model.h"

#include <gtest/gtest.h>

#include <random>

namespace tailserve {
namespace {

// The sim's cost model (ladb_traces.sh's constants): 4 ms + 0.02 ms a sequence + 15 ns a KV token
// + 0.03 ms a prefill token.
double Cost(int n, int64_t kv, int64_t prefill) { return 4e-3 + 2e-5 * n + 15e-9 * kv + 3e-5 * prefill; }

// Steps as a worker runs them: 1..64 sequences, a few hundred to a few thousand tokens each,
// every third step with a prefill chunk of up to 512 tokens.
void Feed(StepCostModel& m, int steps, double noise, std::mt19937& rng) {
  std::uniform_int_distribution<int> seqs(1, 64), per(200, 3000), chunk(1, 512);
  std::normal_distribution<double> jitter(0, noise);
  for (int i = 0; i < steps; ++i) {
    const int n = seqs(rng);
    const int64_t kv = static_cast<int64_t>(n) * per(rng);
    const int64_t prefill = i % 3 == 0 ? chunk(rng) : 0;
    m.Observe(n, kv, prefill, Cost(n, kv, prefill) * (1 + jitter(rng)));
  }
}

TEST(StepCostModelTest, RecoversTheCostTerms) {
  std::mt19937 rng(11);
  StepCostModel m;
  Feed(m, 500, 0.0, rng);
  const auto f = m.fit();
  ASSERT_TRUE(f.has_value());
  EXPECT_NEAR(f->a, 4e-3, 1e-9);
  EXPECT_NEAR(f->b, 2e-5, 1e-10);
  EXPECT_NEAR(f->c, 15e-9, 1e-13);
  EXPECT_NEAR(f->p, 3e-5, 1e-10);
}

TEST(StepCostModelTest, NotReadyUntilItHasSeenStepsWithAndWithoutPrefill) {
  StepCostModel m;
  for (int i = 0; i < 100; ++i) m.Observe(8, 8000, 0, Cost(8, 8000, 0));  // decodes only
  EXPECT_FALSE(m.fit().has_value());
  EXPECT_FALSE(m.PrefillTokensWithin(0.05, 8, 8000).has_value());
  std::mt19937 rng(3);
  Feed(m, 60, 0.0, rng);
  EXPECT_TRUE(m.fit().has_value());
}

TEST(StepCostModelTest, PrefillTokensWithinATarget) {
  std::mt19937 rng(5);
  StepCostModel m;
  Feed(m, 400, 0.02, rng);  // 2% noise
  struct Case {
    double target;
    int sequences;
    int64_t kv;
    int64_t want;  // from the true cost: (target - a - b·n - c·kv) / (p + c)
  } cases[] = {
      {0.040, 65, 64 * 1500, 1108},
      {0.020, 65, 64 * 1500, 441},
      {0.050, 9, 8 * 500, 1524},
      {0.005, 65, 64 * 1500, 0},  // the decodes alone take longer
  };
  for (const Case& c : cases) {
    const auto got = m.PrefillTokensWithin(c.target, c.sequences, c.kv);
    ASSERT_TRUE(got.has_value());
    EXPECT_NEAR(static_cast<double>(*got), static_cast<double>(c.want), 0.03 * c.want + 2) << c.target;
  }
}

TEST(StepCostModelTest, ForgettingFollowsAChangedMachine) {
  std::mt19937 rng(7);
  StepCostModel m(0.99);
  Feed(m, 300, 0.0, rng);
  // Prefill tokens get twice as dear (say, another model): the fit moves to it.
  std::uniform_int_distribution<int> seqs(1, 64), chunk(1, 512);
  for (int i = 0; i < 1500; ++i) {
    const int n = seqs(rng);
    const int64_t kv = n * 1000, prefill = i % 3 == 0 ? chunk(rng) : 0;
    m.Observe(n, kv, prefill, Cost(n, kv, prefill) + 3e-5 * prefill);
  }
  ASSERT_TRUE(m.fit().has_value());
  EXPECT_NEAR(m.fit()->p, 6e-5, 1e-7);
}

}  // namespace
}  // namespace tailserve
