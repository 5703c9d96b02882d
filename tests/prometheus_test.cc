// The metrics endpoints against Prometheus' own tools: promtool's linter, and a real Prometheus
// server scraping the router and answering histogram_quantile over the TTFT histogram.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/cluster.h"
#include "tools/load/load_generator.h"

namespace tailserve {
namespace {

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Runs a command, returns its exit code and output.
int RunCommand(const std::string& cmd, std::string* out) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  return WEXITSTATUS(::pclose(p));
}

void SendTraffic(const Cluster& cluster, size_t n) {
  LoadOptions o;
  o.target = cluster.router_target();
  const LoadReport r = RunLoad(o, FixedRatePlan(n, 200, 32, 8));
  for (const auto& x : r.results) ASSERT_EQ(x.code, 0);
}

const std::vector<std::string> kFastSim = {"--set", "worker.sim.step_base_ms=1"};

TEST(PrometheusTest, MetricsPassPromtoolCheck) {
  ASSERT_TRUE(std::filesystem::exists("/usr/bin/promtool")) << "promtool missing: run scripts/install-deps.sh";
  Cluster cluster({2, kFastSim, {}});
  ASSERT_TRUE(cluster.Start().ok());
  SendTraffic(cluster, 50);
  for (int port : {cluster.router_http(), cluster.worker_http(0), cluster.worker_http(1)}) {
    std::string body;
    ASSERT_EQ(HttpGet(port, "/metrics", &body), 200);
    const std::string file = cluster.dir() + "/metrics.txt";
    std::ofstream(file) << body;
    std::string out;
    EXPECT_EQ(RunCommand("promtool check metrics < " + file, &out), 0) << out << "\n--- metrics ---\n" << body;
  }
  std::string router;
  HttpGet(cluster.router_http(), "/metrics", &router);
  EXPECT_EQ(MetricValue(router, "tailserve_router_ttft_seconds_count"), 50);
  EXPECT_EQ(MetricValue(router, "tailserve_router_requests_total{outcome=\"length\"}"), 50);
  EXPECT_GT(MetricValue(router, "tailserve_router_e2e_latency_window_seconds{quantile=\"0.95\"}"), 0);
  EXPECT_EQ(MetricValue(router, "tailserve_router_output_tokens_total"), 400);
}

TEST(PrometheusTest, RealPrometheusScrapesAndComputesTtftP95) {
  ASSERT_TRUE(std::filesystem::exists("/usr/bin/prometheus")) << "prometheus missing: run scripts/install-deps.sh";
  Cluster cluster({2, kFastSim, {}});
  ASSERT_TRUE(cluster.Start().ok());
  SendTraffic(cluster, 40);

  const int port = FreePort();
  const std::string config = cluster.dir() + "/prometheus.yml";
  std::ofstream(config) << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                        << "scrape_configs:\n  - job_name: tailserve-router\n    static_configs:\n"
                        << "      - targets: ['127.0.0.1:" << cluster.router_http() << "']\n";
  Subprocess prom;
  ASSERT_TRUE(prom.Start({"/usr/bin/prometheus", "--config.file=" + config,
                          "--storage.tsdb.path=" + cluster.dir() + "/tsdb",
                          "--web.listen-address=127.0.0.1:" + std::to_string(port)},
                         cluster.dir() + "/prometheus.log")
                  .ok());
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(5);
  const std::string query = "histogram_quantile(0.95, sum by (le) (tailserve_router_ttft_seconds_bucket))";
  double p95 = std::nan("");
  std::string last;
  for (int i = 0; i < 120 && std::isnan(p95); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    auto res = client.Get("/api/v1/query", httplib::Params{{"query", query}}, httplib::Headers{});
    if (!res || res->status != 200) continue;
    last = res->body;
    const auto j = nlohmann::json::parse(res->body, nullptr, false);
    if (j.is_discarded() || j["status"] != "success" || j["data"]["result"].empty()) continue;
    p95 = std::stod(j["data"]["result"][0]["value"][1].get<std::string>());
  }
  ASSERT_FALSE(std::isnan(p95)) << "no answer from Prometheus; last response: " << last;
  EXPECT_GT(p95, 0);
  EXPECT_LT(p95, 60);
  // The router's own window P95 is computed from the same requests: same order of magnitude.
  std::string metrics;
  HttpGet(cluster.router_http(), "/metrics", &metrics);
  const double window = MetricValue(metrics, "tailserve_router_ttft_window_seconds{quantile=\"0.95\"}");
  std::printf("TTFT P95: Prometheus histogram_quantile %.4f s, router window %.4f s\n", p95, window);
  prom.Stop();
}

}  // namespace
}  // namespace tailserve
