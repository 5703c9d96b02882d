#include "common/http_server.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>

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

}  // namespace
}  // namespace tailserve
