#include "common/metrics.h"

#include <gtest/gtest.h>

#include <cmath>

namespace tailserve {
namespace {

TEST(MetricsTest, CounterGaugeExposition) {
  Registry r;
  auto& c = r.AddCounter("tailserve_test_events_total", "Events.", {"kind"});
  c.Labels({"a"}).Inc();
  c.Labels({"a"}).Inc(2);
  c.Labels({"b\"x"}).Inc();
  r.AddGauge("tailserve_test_level", "Level.").Get().Set(-1.5);
  const std::string text = r.Serialize();
  EXPECT_NE(text.find("# TYPE tailserve_test_events_total counter\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tailserve_test_events_total{kind=\"a\"} 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tailserve_test_events_total{kind=\"b\\\"x\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tailserve_test_level -1.5\n"), std::string::npos) << text;
}

TEST(MetricsTest, CounterIgnoresNegative) {
  Counter c;
  c.Inc(-5);
  EXPECT_EQ(c.Value(), 0);
}

TEST(MetricsTest, HistogramBucketsAreCumulativeAndInclusive) {
  Registry r;
  auto& h = r.AddHistogram("tailserve_test_seconds", "Test.", {0.1, 1}).Get();
  h.Observe(0.1);  // le is inclusive
  h.Observe(0.5);
  h.Observe(7);
  const std::string text = r.Serialize();
  EXPECT_NE(text.find("tailserve_test_seconds_bucket{le=\"0.1\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tailserve_test_seconds_bucket{le=\"1\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tailserve_test_seconds_bucket{le=\"+Inf\"} 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tailserve_test_seconds_sum 7.6\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tailserve_test_seconds_count 3\n"), std::string::npos) << text;
}

TEST(MetricsTest, WindowQuantilesForgetOldSamples) {
  FakeClock clock;
  WindowQuantiles w(clock, 10.0);
  for (int i = 1; i <= 100; ++i) w.Observe(i);
  auto s = w.Read({0.5, 0.95, 0.99});
  EXPECT_DOUBLE_EQ(s.quantiles[0], 50.5);
  EXPECT_NEAR(s.quantiles[1], 95.05, 1e-9);
  EXPECT_EQ(s.count, 100u);
  clock.Advance(std::chrono::seconds(11));
  w.Observe(1000);
  s = w.Read({0.5});
  EXPECT_EQ(s.count, 1u);
  EXPECT_EQ(s.quantiles[0], 1000);
  clock.Advance(std::chrono::seconds(11));
  s = w.Read({0.5});
  EXPECT_EQ(s.count, 0u);
  EXPECT_TRUE(std::isnan(s.quantiles[0]));
}

TEST(MetricsTest, SummaryExposition) {
  FakeClock clock;
  Registry r(clock);
  r.AddWindowQuantiles("tailserve_test_window_seconds", "W.", 60).Get().Observe(2);
  const std::string text = r.Serialize();
  EXPECT_NE(text.find("# TYPE tailserve_test_window_seconds summary\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tailserve_test_window_seconds{quantile=\"0.95\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tailserve_test_window_seconds_count 1\n"), std::string::npos) << text;
}

TEST(MetricsTest, FormatValue) {
  EXPECT_EQ(FormatMetricValue(0.1), "0.1");
  EXPECT_EQ(FormatMetricValue(3), "3");
  EXPECT_EQ(FormatMetricValue(INFINITY), "+Inf");
  EXPECT_EQ(FormatMetricValue(NAN), "NaN");
}

TEST(MetricsDeathTest, CounterWithoutTotalSuffixIsRefused) {
  Registry r;
  EXPECT_DEATH(r.AddCounter("tailserve_bad", "x"), "invalid metric name");
  EXPECT_DEATH(r.AddGauge("tailserve_bad_total", "x"), "invalid metric name");
}

}  // namespace
}  // namespace tailserve
