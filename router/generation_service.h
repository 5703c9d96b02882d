#pragma once
// tailserve.v1.Generation (callback API): validates at the edge, hands the request to the core.
#include <grpcpp/support/byte_buffer.h>

#include "absl/status/statusor.h"
#include "common/config.h"
#include "common/tokenizer.h"
#include "router/auth/api_keys.h"
#include "router/router_core.h"
#include "router/router_metrics.h"
#include "tailserve/v1/generation.grpc.pb.h"

namespace tailserve {

// The request arrives as bytes (a raw method) and is parsed here, so a body protobuf cannot parse
// gets INVALID_ARGUMENT naming what is wrong (a string field's invalid UTF-8, or malformed bytes)
// rather than gRPC's empty UNIMPLEMENTED.
class GenerationService final
    : public v1::Generation::WithRawCallbackMethod_Generate<v1::Generation::CallbackService> {
 public:
  // `keys`: null, or the API keys every call must present ("authorization: Bearer <key>").
  GenerationService(RouterCore& core, const RouterConfig& limits, const Tokenizer& tokenizer, RouterMetrics& metrics,
                    const Clock& clock = SystemClock::Get(), ApiKeys* keys = nullptr)
      : core_(core), limits_(limits), tokenizer_(tokenizer), metrics_(metrics), clock_(clock), keys_(keys) {}

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* request) override;

 private:
  RouterCore& core_;
  const RouterConfig limits_;
  const Tokenizer& tokenizer_;
  RouterMetrics& metrics_;
  const Clock& clock_;
  ApiKeys* keys_;
};

// A GenerateRequest from its wire bytes: INVALID_ARGUMENT naming the field whose text is not
// UTF-8, or saying the bytes are not a GenerateRequest at all.
absl::StatusOr<v1::GenerateRequest> ParseGenerateRequest(const std::string& bytes);

}  // namespace tailserve
