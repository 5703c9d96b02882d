#pragma once
// Child processes for integration tests, benchmarks and the demo: start a binary, read the ports it
// announces, signal it, reap it. Killed (SIGKILL) on destruction so a failed test leaves nothing.
#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tailserve {

class Subprocess {
 public:
  Subprocess() = default;
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  // Starts argv[0] with its stdout/stderr appended to `log_path` (empty: inherited).
  absl::Status Start(const std::vector<std::string>& argv, const std::string& log_path = "");
  pid_t pid() const { return pid_; }
  bool running();
  void Signal(int sig);
  // Waits for exit up to `timeout`; returns the exit status (as from waitpid) or DEADLINE_EXCEEDED.
  absl::StatusOr<int> Wait(std::chrono::milliseconds timeout);
  // SIGTERM, then SIGKILL after `grace`.
  void Stop(std::chrono::milliseconds grace = std::chrono::milliseconds(3000));

 private:
  pid_t pid_ = -1;
};

// Reads "key=value" lines from a file a process writes once it is listening (--ports-file), waiting
// up to `timeout` for the file to name `key`.
absl::StatusOr<int> WaitForPort(const std::string& ports_file, const std::string& key,
                                std::chrono::milliseconds timeout);

// Writes the ports file atomically (write to a temp name, then rename).
absl::Status WritePortsFile(const std::string& path, int grpc_port, int http_port);

}  // namespace tailserve
