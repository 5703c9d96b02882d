#pragma once
// tailserve.v1.Generation (callback API): validates at the edge, hands the request to the core.
#include "common/config.h"
#include "common/tokenizer.h"
#include "router/auth/api_keys.h"
#include "router/router_core.h"
#include "router/router_metrics.h"
#include "tailserve/v1/generation.grpc.pb.h"

namespace tailserve {

class GenerationService final : public v1::Generation::CallbackService {
 public:
  // `keys`: null, or the API keys every call must present ("authorization: Bearer <key>").
  GenerationService(RouterCore& core, const RouterConfig& limits, const Tokenizer& tokenizer, RouterMetrics& metrics,
                    const Clock& clock = SystemClock::Get(), ApiKeys* keys = nullptr)
      : core_(core), limits_(limits), tokenizer_(tokenizer), metrics_(metrics), clock_(clock), keys_(keys) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext* ctx,
                                                           const v1::GenerateRequest* req) override;

 private:
  RouterCore& core_;
  const RouterConfig limits_;
  const Tokenizer& tokenizer_;
  RouterMetrics& metrics_;
  const Clock& clock_;
  ApiKeys* keys_;
};

}  // namespace tailserve
