#pragma once
// Watches that a server's own listening port still accepts connections: a listener that stopped
// accepting (gRPC's, after accept4 failed with EMFILE: grpc/grpc#20418) leaves connections in the
// kernel's backlog unanswered while the process otherwise looks healthy. Every `period` a
// background thread connects to the port over loopback and sends the HTTP/2 client preface: a
// listener that accepted answers (SETTINGS, a TLS alert or a close) within `timeout`. `Status()`
// turns UNAVAILABLE after `failures` checks in a row went unanswered, so a liveness probe can
// restart the process.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"

namespace tailserve {

// One check: OK when a connection to host:port is answered (any bytes, or an orderly close)
// within `timeout`. host "0.0.0.0" / "::" / "" mean loopback.
absl::Status CheckListenerAnswers(const std::string& host, int port, std::chrono::milliseconds timeout);

class ListenerWatch {
 public:
  ListenerWatch(std::string host, int port, std::chrono::milliseconds period = std::chrono::seconds(5),
                std::chrono::milliseconds timeout = std::chrono::seconds(2), int failures = 3);
  ~ListenerWatch();
  ListenerWatch(const ListenerWatch&) = delete;
  ListenerWatch& operator=(const ListenerWatch&) = delete;

  absl::Status Status() const;

 private:
  void Run();

  const std::string host_;
  const int port_;
  const std::chrono::milliseconds period_, timeout_;
  const int failures_;
  std::atomic<int> failed_in_a_row_{0};
  mutable std::mutex mu_;
  std::string last_error_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tailserve
