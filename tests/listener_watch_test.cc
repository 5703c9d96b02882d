// The gRPC listener's liveness check (common/listener_watch.h): a server that accepts answers; a
// socket that listens but never accepts (what gRPC's listener becomes after EMFILE) and a closed
// port do not, and the watch turns its status unavailable after the configured failures in a row.
#include "common/listener_watch.h"

#include <arpa/inet.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace tailserve {
namespace {

using namespace std::chrono_literals;

// A loopback socket that listens and never accepts: connects complete into its backlog, unanswered.
int ListenWithoutAccepting(int* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(::listen(fd, 64), 0);
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

TEST(ListenerWatchTest, AnAcceptingGrpcServerAnswers) {
  grpc::CallbackGenericService service;  // a server needs a service to start
  grpc::ServerBuilder builder;
  builder.RegisterCallbackGenericService(&service);
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(port, 0);
  EXPECT_TRUE(CheckListenerAnswers("127.0.0.1", port, 2s).ok());
  EXPECT_TRUE(CheckListenerAnswers("0.0.0.0", port, 2s).ok());  // a wildcard host is checked over loopback
  server->Shutdown();
}

TEST(ListenerWatchTest, ASilentOrClosedListenerDoesNotAnswer) {
  int port = 0;
  const int fd = ListenWithoutAccepting(&port);
  const absl::Status silent = CheckListenerAnswers("127.0.0.1", port, 300ms);
  EXPECT_EQ(silent.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(silent.message().find("did not answer within 300 ms"), std::string::npos) << silent;
  ::close(fd);
  EXPECT_EQ(CheckListenerAnswers("127.0.0.1", port, 300ms).code(), absl::StatusCode::kUnavailable);  // refused
}

TEST(ListenerWatchTest, TurnsUnavailableAfterFailuresInARow) {
  int port = 0;
  const int fd = ListenWithoutAccepting(&port);
  ListenerWatch watch("127.0.0.1", port, /*period=*/50ms, /*timeout=*/50ms, /*failures=*/3);
  EXPECT_TRUE(watch.Status().ok());  // not yet checked
  absl::Status s;
  for (int i = 0; i < 100 && s.ok(); ++i) {
    std::this_thread::sleep_for(50ms);
    s = watch.Status();
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("checks in a row"), std::string::npos) << s;
  ::close(fd);
}

}  // namespace
}  // namespace tailserve
