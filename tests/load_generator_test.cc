// tailserve-load's request endings against a real router and sim worker.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "tests/cluster.h"
#include "tools/load/load_generator.h"

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

}  // namespace
}  // namespace tailserve
