#include "common/listener_watch.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tailserve {

absl::Status CheckListenerAnswers(const std::string& host, int port, std::chrono::milliseconds timeout) {
  const std::string target = host.empty() || host == "0.0.0.0" ? "127.0.0.1" : host == "::" ? "::1" : host;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(target.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || found == nullptr) {
    return absl::UnavailableError(absl::StrCat("listener ", target, ":", port, ": cannot resolve"));
  }
  const int fd = ::socket(found->ai_family, found->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    freeaddrinfo(found);
    return absl::UnavailableError(absl::StrCat("listener check: socket: ", std::strerror(errno)));
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto wait = [&](short events) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd, events, 0};
    return left.count() > 0 && ::poll(&p, 1, static_cast<int>(left.count())) == 1 ? p.revents : 0;
  };
  absl::Status result = absl::UnavailableError(
      absl::StrCat("the listener on ", target, ":", port, " did not answer within ", timeout.count(), " ms"));
  const int connected = ::connect(fd, found->ai_addr, found->ai_addrlen);
  freeaddrinfo(found);
  if (connected == 0 || (errno == EINPROGRESS && (wait(POLLOUT) & POLLOUT))) {
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      result = absl::UnavailableError(absl::StrCat("listener ", target, ":", port, ": ", std::strerror(err)));
    } else {
      // The HTTP/2 client preface: a gRPC server that accepted answers with its SETTINGS; one
      // serving TLS answers with an alert or closes. A connection nobody accepted stays silent.
      static constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
      if (::send(fd, kPreface, sizeof(kPreface) - 1, MSG_NOSIGNAL) > 0 && (wait(POLLIN) & (POLLIN | POLLHUP | POLLERR))) {
        result = absl::OkStatus();
      }
    }
  }
  ::close(fd);
  return result;
}

ListenerWatch::ListenerWatch(std::string host, int port, std::chrono::milliseconds period,
                             std::chrono::milliseconds timeout, int failures)
    : host_(std::move(host)), port_(port), period_(period), timeout_(timeout), failures_(failures) {
  thread_ = std::thread([this] { Run(); });
}

ListenerWatch::~ListenerWatch() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

absl::Status ListenerWatch::Status() const {
  if (failed_in_a_row_.load() < failures_) return absl::OkStatus();
  std::lock_guard lock(mu_);
  return absl::UnavailableError(absl::StrCat(last_error_, " (", failed_in_a_row_.load(), " checks in a row)"));
}

void ListenerWatch::Run() {
  std::unique_lock lock(mu_);
  while (!cv_.wait_for(lock, period_, [this] { return stop_; })) {
    lock.unlock();
    const absl::Status s = CheckListenerAnswers(host_, port_, timeout_);
    lock.lock();
    if (s.ok()) {
      failed_in_a_row_ = 0;
    } else {
      last_error_ = std::string(s.message());
      ++failed_in_a_row_;
    }
  }
}

}  // namespace tailserve
