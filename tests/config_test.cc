#include "common/config.h"

#include <gtest/gtest.h>

#include <fstream>

namespace tailserve {
namespace {

TEST(ConfigTest, DefaultsWhenEmpty) {
  auto c = ParseConfig("");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->batching.max_batch_size, 32);
  EXPECT_EQ(c->router.timeout_ms, 200);
  EXPECT_EQ(c->worker.backend, "sim");
}

TEST(ConfigTest, ShippedFileIsValidAndMatchesDefaults) {
  auto c = LoadConfigFile(std::string(TAILSERVE_SOURCE_DIR) + "/ladb_config.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  auto d = ParseConfig("");
  EXPECT_EQ(c->batching.min_batch_size, d->batching.min_batch_size);
  EXPECT_EQ(c->router.max_queue_size, d->router.max_queue_size);
  EXPECT_EQ(c->worker.sim.step_base_ms, d->worker.sim.step_base_ms);
  EXPECT_EQ(c->predictor.steps_per_prompt_token, d->predictor.steps_per_prompt_token);
}

TEST(ConfigTest, UnknownKeyIsNamed) {
  auto c = ParseConfig("router:\n  timeout_msec: 5\n", {}, "f.yaml");
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(), "f.yaml: router.timeout_msec: unknown key");
}

// A key that is itself a list or a mapping (found by the config fuzzer: it threw from a destructor
// and aborted the process) is an error naming where it is.
TEST(ConfigTest, NonStringKeysAreErrorsNotCrashes) {
  auto nested = ParseConfig("router:\n  ? [a, b]\n  : 1\n", {}, "f.yaml");
  ASSERT_FALSE(nested.ok());
  EXPECT_NE(nested.status().message().find("router: keys must be strings, got a list"), std::string::npos)
      << nested.status();
  auto top = ParseConfig("? {x: 1}\n: 2\n", {}, "f.yaml");
  ASSERT_FALSE(top.ok());
  EXPECT_NE(top.status().message().find("(top level): keys must be strings, got a mapping"), std::string::npos)
      << top.status();
}

TEST(ConfigTest, UnknownSectionIsNamed) {
  auto c = ParseConfig("routr:\n  timeout_ms: 5\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("routr: unknown key"), std::string::npos) << c.status();
}

TEST(ConfigTest, WrongTypeIsNamed) {
  auto c = ParseConfig("batching:\n  max_batch_size: lots\n");
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("batching.max_batch_size: expected an integer, got 'lots'"), std::string::npos)
      << c.status();
  EXPECT_FALSE(ParseConfig("router:\n  workers: localhost:1\n").ok());
  EXPECT_FALSE(ParseConfig("batching:\n  max_batch_size: 1.5\n").ok());
  EXPECT_FALSE(ParseConfig("batching: 3\n").ok());
}

TEST(ConfigTest, OutOfRangeIsNamed) {
  auto c = ParseConfig("router:\n  max_queue_size: 0\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("router.max_queue_size: must be in [1, 10000000], got 0"), std::string::npos)
      << c.status();
  EXPECT_FALSE(ParseConfig("batching:\n  variance_tolerance: -0.1\n").ok());
  EXPECT_FALSE(ParseConfig("worker:\n  grpc_port: 70000\n").ok());
  EXPECT_FALSE(ParseConfig("batching:\n  mode: random\n").ok());
  EXPECT_FALSE(ParseConfig("batching:\n  min_batch_size: 64\n  max_batch_size: 8\n").ok());
}

TEST(ConfigTest, AllErrorsReportedTogether) {
  auto c = ParseConfig("router:\n  timeout_ms: x\n  bogus: 1\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("router.timeout_ms"), std::string::npos);
  EXPECT_NE(c.status().message().find("router.bogus"), std::string::npos);
}

TEST(ConfigTest, OverridesApplyWithTheSameChecks) {
  auto c = ParseConfig("router:\n  timeout_ms: 5\n", {"router.timeout_ms=50", "worker.sim.step_base_ms=0",
                                                       "router.workers=[\"a:1\",\"b:2\"]"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->router.timeout_ms, 50);
  EXPECT_EQ(c->worker.sim.step_base_ms, 0);
  EXPECT_EQ(c->router.workers, (std::vector<std::string>{"a:1", "b:2"}));
  EXPECT_FALSE(ParseConfig("", {"router.timeout_ms=-1"}).ok());
  EXPECT_FALSE(ParseConfig("", {"router.nope=1"}).ok());
  EXPECT_FALSE(ParseConfig("", {"timeout_ms=1"}).ok());
  EXPECT_FALSE(ParseConfig("", {"router.timeout_ms"}).ok());
}

TEST(ConfigTest, MissingFileAndBadYaml) {
  EXPECT_EQ(LoadConfigFile("/nonexistent/x.yaml").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ParseConfig("router: [unclosed").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tailserve
