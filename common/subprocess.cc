#include "common/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"

namespace tailserve {

Subprocess::~Subprocess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

absl::Status Subprocess::Start(const std::vector<std::string>& argv, const std::string& log_path) {
  if (argv.empty()) return absl::InvalidArgumentError("empty argv");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    if (!log_path.empty()) {
      const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        ::close(fd);
      }
    }
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  pid_ = pid;
  return absl::OkStatus();
}

bool Subprocess::running() {
  if (pid_ <= 0) return false;
  int status;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

void Subprocess::Signal(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

absl::StatusOr<int> Subprocess::Wait(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("not running");
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (true) {
    int status;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      return status;
    }
    if (std::chrono::steady_clock::now() > end) return absl::DeadlineExceededError("process still running");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void Subprocess::Stop(std::chrono::milliseconds grace) {
  if (pid_ <= 0) return;
  Signal(SIGTERM);
  if (!Wait(grace).ok()) {
    Signal(SIGKILL);
    (void)Wait(std::chrono::milliseconds(5000));
  }
}

absl::StatusOr<int> WaitForPort(const std::string& ports_file, const std::string& key,
                                std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    std::ifstream in(ports_file);
    std::string line;
    while (in && std::getline(in, line)) {
      if (line.rfind(key + "=", 0) == 0) return std::stoi(line.substr(key.size() + 1));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(ports_file, ": no ", key, " within the timeout"));
}

absl::Status WritePortsFile(const std::string& path, int grpc_port, int http_port) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << "grpc_port=" << grpc_port << "\nhttp_port=" << http_port << "\n";
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return absl::InternalError(absl::StrCat("cannot rename to ", path));
  return absl::OkStatus();
}

}  // namespace tailserve
