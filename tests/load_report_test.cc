// The load generator's summary (time per output token, SLO attainment and goodput, from given
// request results; no network) and its trace reading.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>

#include "tools/load/load_generator.h"

namespace tailserve {
namespace {

TEST(LoadReportTest, TpotAttainmentAndGoodput) {
  LoadReport r;
  r.wall_s = 10;
  r.ttft_slo_s = 1.0, r.tpot_slo_s = 0.05;
  // ok: TTFT 0.5 s, 11 tokens over 1.5 s: TPOT 0.1 s (misses the TPOT SLO).
  r.results.push_back({.code = 0, .ttft_s = 0.5, .e2e_s = 1.5, .tokens = 11});
  // ok: TTFT 0.2 s, 21 tokens over 0.8 s: TPOT 0.03 s (meets both).
  r.results.push_back({.code = 0, .ttft_s = 0.2, .e2e_s = 0.8, .tokens = 21});
  // ok: TTFT 2 s (misses), one token: no TPOT.
  r.results.push_back({.code = 0, .ttft_s = 2.0, .e2e_s = 2.0, .tokens = 1});
  // failed: counts against attainment.
  r.results.push_back({.code = 8, .ttft_s = 0, .e2e_s = 0.1, .tokens = 0});
  EXPECT_DOUBLE_EQ(r.results[0].tpot_s(), 0.1);
  EXPECT_DOUBLE_EQ(r.results[2].tpot_s(), 0.0);
  const nlohmann::json j = nlohmann::json::parse(r.Json());
  EXPECT_EQ(j["ok"], 3);
  EXPECT_DOUBLE_EQ(j["slo_attainment"].get<double>(), 0.25);  // 1 of 4 requests
  EXPECT_DOUBLE_EQ(j["goodput_rps"].get<double>(), 0.1);
  EXPECT_NEAR(j["tpot_s"]["p50"].get<double>(), 0.065, 1e-12);  // of 0.03 and 0.1
  EXPECT_NEAR(j["e2e_mean_s"].get<double>(), (1.5 + 0.8 + 2.0) / 3, 1e-12);
  EXPECT_NE(r.Table().find("met by 25.0%"), std::string::npos) << r.Table();
}

}  // namespace
}  // namespace tailserve

namespace tailserve {
namespace {

TEST(LoadTraceTest, MooncakeHashIdsGiveSharedPrefixesEqualTokens) {
  const std::string path = ::testing::TempDir() + "/mooncake.jsonl";
  {
    std::ofstream out(path);
    out << R"({"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [7, 8, 9]})" << "\n"
        << R"({"timestamp": 1000, "input_length": 700, "output_length": 3, "hash_ids": [7, 11]})" << "\n";
  }
  absl::StatusOr<std::vector<PlannedRequest>> plan = LoadTrace(path, 1.0, {}, 100000);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 2u);
  EXPECT_EQ((*plan)[0].hash_ids, (std::vector<int64_t>{7, 8, 9}));
  EXPECT_DOUBLE_EQ((*plan)[1].arrival_s, 1.0);
  const std::vector<int32_t> a = HashIdPromptTokens((*plan)[0], 32000, 1);
  const std::vector<int32_t> b = HashIdPromptTokens((*plan)[1], 32000, 1);
  ASSERT_EQ(a.size(), 1100u);
  ASSERT_EQ(b.size(), 700u);
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 512, b.begin())) << "block id 7 in both";
  EXPECT_FALSE(std::equal(a.begin() + 512, a.begin() + 700, b.begin() + 512)) << "ids 8 and 11 differ";
  EXPECT_NE(HashIdPromptTokens((*plan)[0], 32000, 2), a) << "another seed, other tokens";

  std::ofstream(path) << R"({"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": "x"})" << "\n";
  const absl::Status bad = LoadTrace(path, 1.0, {}, 100000).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("hash_ids"), std::string::npos) << bad;
}

}  // namespace
}  // namespace tailserve

namespace tailserve {
namespace {

TEST(LoadPromptSetTest, ReadsPromptsWithTheirSamplingAndRefusesBadLinesByField) {
  const std::string path = ::testing::TempDir() + "/prompts.jsonl";
  {
    std::ofstream out(path);
    out << R"({"prompt": "The history of the", "max_tokens": 40, "temperature": 0})" << "\n"
        << "\n"
        << R"({"prompt": "Once upon a time", "top_p": 0.9})" << "\n"
        << R"({"prompt": "third"})" << "\n";
  }
  absl::StatusOr<std::vector<PlannedRequest>> plan = LoadPromptSet(path, 4.0, 64, 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 3u);
  EXPECT_EQ((*plan)[0].prompt_text, "The history of the");
  EXPECT_EQ((*plan)[0].max_tokens, 40);
  EXPECT_EQ((*plan)[0].temperature, 0.0f);
  EXPECT_EQ((*plan)[1].max_tokens, 64) << "the default";
  EXPECT_EQ((*plan)[1].temperature, 1.0f);
  EXPECT_FLOAT_EQ((*plan)[1].top_p, 0.9f);
  EXPECT_DOUBLE_EQ((*plan)[2].arrival_s, 0.5) << "4 per second, evenly spaced";
  EXPECT_EQ(LoadPromptSet(path, 4.0, 64, 2)->size(), 2u);

  const std::pair<const char*, const char*> bad[] = {
      {R"({"max_tokens": 3})", "prompt"},
      {R"({"prompt": ""})", "prompt"},
      {R"({"prompt": "x", "max_tokens": 0})", "max_tokens"},
      {R"({"prompt": "x", "max_tokens": "9"})", "max_tokens"},
      {R"({"prompt": "x", "temperature": -1})", "temperature"},
      {R"({"prompt": "x", "top_p": "high"})", "top_p"},
      {R"(["x"])", "JSON object"},
  };
  for (const auto& [line, field] : bad) {
    std::ofstream(path) << R"({"prompt": "fine"})" << "\n" << line << "\n";
    const absl::Status s = LoadPromptSet(path, 1.0, 8, 0).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << line;
    EXPECT_NE(s.message().find(field), std::string::npos) << s;
    EXPECT_NE(s.message().find(":2:"), std::string::npos) << "names the line: " << s;
  }
  EXPECT_EQ(LoadPromptSet(path + ".missing", 1.0, 8, 0).status().code(), absl::StatusCode::kNotFound);
}

TEST(LoadReportTest, OutputLengthsAndEndings) {
  LoadReport r;
  r.wall_s = 1;
  for (int n : {10, 20, 30, 40}) r.results.push_back({.code = 0, .ttft_s = 0.1, .e2e_s = 0.5, .tokens = n});
  r.results[0].finish_reason = r.results[1].finish_reason = r.results[2].finish_reason = 1;  // STOP
  r.results[3].finish_reason = 2;                                                           // LENGTH
  const nlohmann::json j = nlohmann::json::parse(r.Json());
  EXPECT_DOUBLE_EQ(j["output_tokens"]["p50"].get<double>(), 25);
  EXPECT_DOUBLE_EQ(j["output_tokens"]["max"].get<double>(), 40);
  EXPECT_DOUBLE_EQ(j["ended_by_stop"].get<double>(), 0.75);
  EXPECT_NE(r.Table().find("ended by EOS or a stop 75.0%"), std::string::npos) << r.Table();
}

}  // namespace
}  // namespace tailserve
