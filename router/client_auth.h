#pragma once
// API-key admission shared by the gRPC and HTTP client APIs: counts each outcome per key and keeps
// the key's concurrent-stream lease until the request finishes.
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "router/auth/api_keys.h"
#include "router/router_core.h"
#include "router/router_metrics.h"

namespace tailserve {

// Null keys: no authentication (a null lease).
inline absl::StatusOr<std::unique_ptr<ApiKeys::Lease>> AdmitClient(ApiKeys* keys, std::string_view authorization,
                                                                  RouterMetrics& metrics) {
  if (keys == nullptr) return std::unique_ptr<ApiKeys::Lease>();
  std::string name;
  absl::StatusOr<std::unique_ptr<ApiKeys::Lease>> lease = keys->Admit(authorization, &name);
  metrics.api_key_requests
      .Labels({name, lease.ok() ? "admitted" : absl::IsUnauthenticated(lease.status()) ? "unauthenticated" : "rate_limited"})
      .Inc();
  return lease;
}

// The core's sink for a request, holding its key's lease until the request finishes.
class LeasedSink final : public ClientSink {
 public:
  LeasedSink(std::shared_ptr<ClientSink> inner, std::unique_ptr<ApiKeys::Lease> lease)
      : inner_(std::move(inner)), lease_(std::move(lease)) {}
  void Write(v1::GenerateResponse msg) override { inner_->Write(std::move(msg)); }
  void Finish(grpc::Status status) override {
    inner_->Finish(std::move(status));
    lease_.reset();
  }

 private:
  std::shared_ptr<ClientSink> inner_;
  std::unique_ptr<ApiKeys::Lease> lease_;
};

}  // namespace tailserve
