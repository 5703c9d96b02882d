#include "common/http_server.h"

#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "common/metrics.h"

namespace tailserve {

namespace {

void Answer(const std::function<absl::Status()>& probe, const char* ok, const char* not_ok, httplib::Response& res) {
  const absl::Status s = probe ? probe() : absl::OkStatus();
  res.status = s.ok() ? 200 : 503;
  res.set_content(s.ok() ? absl::StrCat(ok, "\n") : absl::StrCat(not_ok, ": ", s.message(), "\n"), "text/plain");
}

}  // namespace

ObservabilityServer::ObservabilityServer(const Registry& registry, Probes probes)
    : registry_(registry), probes_(std::move(probes)), server_(std::make_unique<httplib::Server>()) {
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry_.Serialize(), "text/plain; version=0.0.4; charset=utf-8");
  });
  server_->Get("/healthz", [this](const httplib::Request&, httplib::Response& res) {
    Answer(probes_.live, "ok", "not live", res);
  });
  server_->Get("/readyz", [this](const httplib::Request&, httplib::Response& res) {
    Answer(probes_.ready, "ready", "not ready", res);
  });
}

ObservabilityServer::~ObservabilityServer() { Stop(); }

absl::StatusOr<int> ObservabilityServer::Start(const std::string& host, int port) {
  int bound = port;
  if (port == 0) {
    bound = server_->bind_to_any_port(host.c_str());
  } else if (!server_->bind_to_port(host.c_str(), port)) {
    bound = -1;
  }
  if (bound < 0) return absl::UnavailableError(absl::StrCat("cannot bind HTTP ", host, ":", port));
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  return bound;
}

void ObservabilityServer::Stop() {
  if (thread_.joinable()) {
    server_->stop();
    thread_.join();
  }
}

}  // namespace tailserve
