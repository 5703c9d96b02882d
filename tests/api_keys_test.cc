// API keys (router/auth/api_keys.h): the file format and its errors, hashed lookup, the per-key
// token bucket and concurrent-stream limit with an injected clock, and reloads that keep a kept
// key's counters.
#include "router/auth/api_keys.h"

#include <gtest/gtest.h>

#include <chrono>

namespace tailserve {
namespace {

std::string Line(const std::string& name, const std::string& key, const std::string& limits = "") {
  return name + " sha256:" + ApiKeys::Sha256Hex(key) + (limits.empty() ? "" : " " + limits) + "\n";
}

TEST(ApiKeysTest, HashIsSha256Hex) {
  EXPECT_EQ(ApiKeys::Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(ApiKeysTest, AdmitsKnownKeysOnly) {
  ApiKeys keys;
  ASSERT_TRUE(keys.Load("# comment\n\n" + Line("alice", "k-alice")).ok());
  std::string name;
  auto ok = keys.Admit("Bearer k-alice", &name);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(name, "alice");
  EXPECT_EQ((*ok)->name(), "alice");
  EXPECT_TRUE(keys.Admit("k-alice").ok());         // the key alone
  EXPECT_TRUE(keys.Admit("bearer  k-alice ").ok()); // any case, spaces
  EXPECT_EQ(keys.Admit("Bearer k-bob").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(keys.Admit("").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(keys.Admit("Bearer ").status().code(), absl::StatusCode::kUnauthenticated);
}

TEST(ApiKeysTest, FileErrorsNameTheLineAndKeepTheOldKeys) {
  ApiKeys keys;
  ASSERT_TRUE(keys.Load(Line("a", "ka")).ok());
  struct Case {
    std::string text;
    const char* message;
  };
  for (const Case& c : std::initializer_list<Case>{
           {"\nbad", "router.api_keys_file line 2: expected <name> sha256:<hex> [rate=N] [burst=N] [streams=N]"},
           {"a sha256:abc", "router.api_keys_file line 1: the hash must be 64 hex digits (printf %s \"$KEY\" | sha256sum)"},
           {Line("a", "x", "rate=-1"), "router.api_keys_file line 1: 'rate=-1': expected rate=, burst= or streams= with a number >= 0"},
           {Line("a", "x", "speed=3"), "router.api_keys_file line 1: unknown limit 'speed'"},
           {Line("a", "x") + Line("b", "x"), "router.api_keys_file line 2: the same key twice"},
       }) {
    const absl::Status s = keys.Load(c.text);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_EQ(s.message(), c.message) << c.text;
  }
  EXPECT_TRUE(keys.Admit("ka").ok());
}

TEST(ApiKeysTest, RateLimitRefillsWithTime) {
  FakeClock clock;
  ApiKeys keys(clock);
  ASSERT_TRUE(keys.Load(Line("r", "kr", "rate=2 burst=3")).ok());
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(keys.Admit("kr").ok()) << i;  // the burst
  auto refused = keys.Admit("kr");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.status().message(), "API key 'r': over its rate of 2 requests a second; retry after 0.500 s");
  clock.Advance(std::chrono::milliseconds(250));  // half a token
  EXPECT_EQ(keys.Admit("kr").status().code(), absl::StatusCode::kResourceExhausted);
  clock.Advance(std::chrono::milliseconds(250));
  EXPECT_TRUE(keys.Admit("kr").ok());
  clock.Advance(std::chrono::seconds(100));  // refills to the burst, no further
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(keys.Admit("kr").ok()) << i;
  EXPECT_FALSE(keys.Admit("kr").ok());
}

TEST(ApiKeysTest, ConcurrentStreamsAreHeldByLeases) {
  ApiKeys keys;
  ASSERT_TRUE(keys.Load(Line("s", "ks", "streams=2")).ok());
  auto a = keys.Admit("ks");
  auto b = keys.Admit("ks");
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = keys.Admit("ks");
  ASSERT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(c.status().message(), "API key 's': 2 requests running, its limit; retry after 1 s");
  a->reset();  // a request finished
  EXPECT_TRUE(keys.Admit("ks").ok());
}

TEST(ApiKeysTest, ReloadKeepsAKeptKeysCountersAndDropsRemovedKeys) {
  FakeClock clock;
  ApiKeys keys(clock);
  ASSERT_TRUE(keys.Load(Line("a", "ka", "rate=1 streams=1") + Line("b", "kb")).ok());
  auto held = keys.Admit("ka");
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(keys.Load(Line("a", "ka", "rate=1 streams=1") + Line("c", "kc")).ok());
  EXPECT_EQ(keys.Admit("ka").status().code(), absl::StatusCode::kResourceExhausted);  // still one running
  EXPECT_EQ(keys.Admit("kb").status().code(), absl::StatusCode::kUnauthenticated);    // removed
  EXPECT_TRUE(keys.Admit("kc").ok());                                                  // added
  EXPECT_EQ(keys.size(), 2u);
}

}  // namespace
}  // namespace tailserve
