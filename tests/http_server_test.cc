#include "common/http_server.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "common/metrics.h"

namespace tailserve {
namespace {

// Status code and body of GET path on the loopback port (-1: no answer).
std::pair<int, std::string> Get(int port, const char* path) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(2);
  client.set_read_timeout(5);
  auto res = client.Get(path);
  if (!res) return {-1, ""};
  return {res->status, res->body};
}

TEST(ObservabilityServerTest, ProbesAnswerWhatTheirFunctionsSay) {
  Registry registry;
  std::atomic<bool> warm{false}, broken{false};
  ObservabilityServer server(registry, {.ready = [&]() -> absl::Status {
                                          return warm ? absl::OkStatus() : absl::UnavailableError("warming up");
                                        },
                                        .live = [&]() -> absl::Status {
                                          return broken ? absl::InternalError("device fault") : absl::OkStatus();
                                        }});
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_EQ(Get(*port, "/healthz"), std::make_pair(200, std::string("ok\n")));
  EXPECT_EQ(Get(*port, "/readyz"), std::make_pair(503, std::string("not ready: warming up\n")));
  warm = true;
  EXPECT_EQ(Get(*port, "/readyz"), std::make_pair(200, std::string("ready\n")));
  broken = true;
  EXPECT_EQ(Get(*port, "/healthz"), std::make_pair(503, std::string("not live: device fault\n")));
  server.Stop();
}

TEST(ObservabilityServerTest, EmptyProbesAreAlwaysOk) {
  Registry registry;
  ObservabilityServer server(registry, {});
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_EQ(Get(*port, "/healthz").first, 200);
  EXPECT_EQ(Get(*port, "/readyz").first, 200);
  server.Stop();
}

// Slowloris: connections that send a request a line at a time, or nothing, hold neither a thread
// nor the probes: /healthz answers at once beside them, and each is closed at its deadline.
TEST(ObservabilityServerTest, SlowClientsDoNotHoldTheProbes) {
  Registry registry;
  ObservabilityServer server(registry, {});
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  std::vector<int> slow;
  for (int i = 0; i < 64; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(*port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    const std::string partial = "GET /healthz HTTP/1.1\r\nHost: x\r\n";  // never finished
    if (i % 2 == 0) ASSERT_GT(::send(fd, partial.data(), partial.size(), 0), 0);
    slow.push_back(fd);
  }
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) EXPECT_EQ(Get(*port, "/healthz").first, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4)) << "probes waited on the slow clients";
  // Each slow connection is closed by the server once its request deadline passes.
  for (const int fd : slow) {
    timeval tv{.tv_sec = ObservabilityServer::kRequestDeadline.count() + 5, .tv_usec = 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char byte;
    EXPECT_EQ(::recv(fd, &byte, 1, 0), 0) << "still open past the deadline";
    ::close(fd);
  }
  server.Stop();
}

TEST(ObservabilityServerTest, UnknownPathsAndMethods) {
  Registry registry;
  ObservabilityServer server(registry, {});
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_EQ(Get(*port, "/nothing").first, 404);
  EXPECT_EQ(Get(*port, "/metrics?x=1").first, 200);
  httplib::Client client("127.0.0.1", *port);
  auto res = client.Post("/healthz", "", "text/plain");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 405);
  server.Stop();
}

}  // namespace
}  // namespace tailserve
