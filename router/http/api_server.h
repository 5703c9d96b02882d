#pragma once
// The router's OpenAI-compatible HTTP API (router.api_port): an asynchronous Boost.Beast server on
// router.api_threads threads, so a streaming response holds a socket and a small buffer, not a
// thread. Requests go through the gRPC path's validation and the same RouterCore::Submit; a
// response streams as server-sent events as the core writes tokens. A client that disconnects
// cancels its sequence (the core cancels it on the worker). Routes:
//   GET  /v1/models                 the served model
//   POST /v1/completions            prompt text or token ids
//   POST /v1/chat/completions       messages through the model's chat template
// Errors are OpenAI's JSON error shape with their HTTP status (router/http/openai_api.h).
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/config.h"
#include "common/tokenizer.h"
#include "router/auth/api_keys.h"
#include "router/http/openai_api.h"
#include "router/router_core.h"
#include "router/router_metrics.h"

namespace tailserve::http {

class ApiServer {
 public:
  // `model` (its chat template is read by every chat request) and `keys` (null: no keys) must
  // outlive the server.
  ApiServer(RouterCore& core, const RouterConfig& config, const Tokenizer& tokenizer, RouterMetrics& metrics,
            const ModelInfo& model, ApiKeys* keys = nullptr);
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  // Binds host:port (0: a free port) and starts serving; returns the bound port.
  absl::StatusOr<int> Start(const std::string& host, int port);
  // Stops accepting, closes every connection (their requests are cancelled) and joins the threads.
  void Stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tailserve::http
