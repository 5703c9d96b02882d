// Prefix caching on the CPU engine: the logits of a sequence whose prefix comes from the cache
// equal those computed from scratch, when the prefix's owner still runs, after it ended, after
// eviction and re-population, and for a preempted sequence that comes back. Equal within the
// engine's own incremental-decode bound (relative L2 1e-5 a position), not bitwise: BLAS rounds a
// row differently with the number of rows in the GEMM, cache or not.
#include <gtest/gtest.h>

#include <vector>

#include "tests/reference_cases.h"
#include "tests/test_paths.h"
#include "worker/backends/cpu/cpu_engine.h"

namespace tailserve {
namespace {

std::unique_ptr<CpuEngine> Load(bool prefix_caching, int64_t kv_cache_bytes = int64_t{1} << 30) {
  auto e = CpuEngine::Load(testing::ReferenceDir("llama-gqa"),
                           {.threads = 1, .kv_cache_bytes = kv_cache_bytes, .prefix_caching = prefix_caching});
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? *std::move(e) : nullptr;
}

std::vector<int32_t> Prompt(int n, int32_t first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (first + 37 * i) % 1000;
  return t;
}

// Logits of every position from `from` on, for `tokens` with `from` of them already cached.
std::vector<float> LogitsFrom(CpuEngine& e, uint64_t id, const std::vector<int32_t>& tokens, int32_t from) {
  Sampling greedy;
  StepSequence s{id, &tokens, static_cast<int32_t>(tokens.size()), from, &greedy};
  std::vector<float> logits;
  EXPECT_TRUE(e.Forward({&s, 1}, /*all_positions=*/true, &logits).ok());
  return logits;
}

// Reference: the same tokens on an engine without a cache, from scratch; the rows from `from` on.
std::vector<float> Fresh(const std::vector<int32_t>& tokens, int32_t from) {
  std::unique_ptr<CpuEngine> e = Load(false);
  std::vector<float> all = LogitsFrom(*e, 1, tokens, 0);
  const size_t vocab = static_cast<size_t>(e->vocab_size());
  return std::vector<float>(all.begin() + static_cast<ptrdiff_t>(from * vocab), all.end());
}

void ExpectSameLogits(const std::vector<float>& got, const std::vector<float>& want, size_t vocab) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t p = 0; p * vocab < got.size(); ++p) {
    EXPECT_LE(testing::RelL2(got.data() + p * vocab, want.data() + p * vocab, vocab), 1e-5) << "row " << p;
  }
}

TEST(CpuPrefixCacheTest, CachedPrefixLogitsEqualComputedOnes) {
  TAILSERVE_REQUIRE_SHARED();
  std::unique_ptr<CpuEngine> e = Load(true);
  const std::vector<int32_t> owner = Prompt(70, 3);
  std::vector<int32_t> reader(owner.begin(), owner.begin() + 50);  // shares 3 blocks (48 tokens)
  for (int32_t t : Prompt(21, 500)) reader.push_back(t);
  LogitsFrom(*e, 1, owner, 0);

  // While the owner still holds its blocks.
  auto hit = e->AttachCachedPrefix(2, reader);
  ASSERT_TRUE(hit.ok()) << hit.status();
  ASSERT_EQ(*hit, 48);
  ExpectSameLogits(LogitsFrom(*e, 2, reader, *hit), Fresh(reader, 48), 1024);

  // After both ended: the blocks stay cached.
  e->Release(1);
  e->Release(2);
  EXPECT_EQ(e->stats()->kv_blocks_cached, 4 + 1) << "the owner's 4 full blocks (3 of them shared) and the reader's own full one";
  hit = e->AttachCachedPrefix(3, owner);
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(*hit, 64);
  ExpectSameLogits(LogitsFrom(*e, 3, owner, *hit), Fresh(owner, 64), 1024);
}

TEST(CpuPrefixCacheTest, APreemptedSequenceContinuesFromItsOwnBlocks) {
  TAILSERVE_REQUIRE_SHARED();
  std::unique_ptr<CpuEngine> e = Load(true);
  std::vector<int32_t> tokens = Prompt(40, 9);
  Sampling greedy;
  std::vector<int32_t> next;
  StepSequence s{1, &tokens, 40, 0, &greedy};
  ASSERT_TRUE(e->Step({&s, 1}, &next).ok());
  for (int i = 0; i < 10; ++i) {  // decode to 50 tokens
    tokens.push_back(next[0]);
    s.computed = static_cast<int32_t>(tokens.size()) - 1;
    ASSERT_TRUE(e->Step({&s, 1}, &next).ok());
  }
  e->Release(1);  // preempted: its blocks stay cached
  auto hit = e->AttachCachedPrefix(1, tokens);
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(*hit, 48);
  ExpectSameLogits(LogitsFrom(*e, 1, tokens, *hit), Fresh(tokens, 48), 1024);
}

TEST(CpuPrefixCacheTest, EvictedBlocksAreRecomputedRight) {
  TAILSERVE_REQUIRE_SHARED();
  // A cache of 12 blocks (4 layers x 2 KV heads x 32 dims x 2 x 4 bytes = 2 KiB a position).
  std::unique_ptr<CpuEngine> e = Load(true, 12 * 16 * 2048);
  ASSERT_EQ(e->stats()->kv_blocks_total, 12);
  const std::vector<int32_t> a = Prompt(65, 1), b = Prompt(130, 700);
  LogitsFrom(*e, 1, a, 0);
  e->Release(1);  // 4 full blocks cached (and its 5th, partial, freed)
  LogitsFrom(*e, 2, b, 0);  // 9 blocks: 8 free, then the least recently used cached one is evicted
  EXPECT_GE(e->stats()->kv_evictions, 1);
  e->Release(2);
  auto hit = e->AttachCachedPrefix(3, a);
  ASSERT_TRUE(hit.ok());
  EXPECT_LT(*hit, 64) << "an evicted tail block breaks the chain there";
  ExpectSameLogits(LogitsFrom(*e, 3, a, *hit), Fresh(a, *hit), 1024);
}

TEST(CpuPrefixCacheTest, OffAttachesNothing) {
  TAILSERVE_REQUIRE_SHARED();
  std::unique_ptr<CpuEngine> e = Load(false);
  const std::vector<int32_t> t = Prompt(40, 3);
  LogitsFrom(*e, 1, t, 0);
  e->Release(1);
  auto hit = e->AttachCachedPrefix(2, t);
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(*hit, 0);
  EXPECT_EQ(e->stats()->kv_blocks_cached, 0);
}

}  // namespace
}  // namespace tailserve
