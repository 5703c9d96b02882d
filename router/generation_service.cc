#include "router/generation_service.h"

#include "common/grpc_status.h"
#include "common/server_stream.h"
#include "router/validate.h"

namespace tailserve {

grpc::ServerWriteReactor<v1::GenerateResponse>* GenerationService::Generate(grpc::CallbackServerContext* ctx,
                                                                            const v1::GenerateRequest* req) {
  const SteadyTime arrival = clock_.Now();
  const uint64_t key = core_.NewKey();
  const auto deadline = ctx->deadline();
  auto* stream = new ServerStream<v1::GenerateResponse>([this, key, deadline] {
    // The client's own deadline timer may reset the stream a little before ours fires: a cancel
    // that close to the deadline is counted as the deadline.
    core_.Cancel(key, std::chrono::system_clock::now() + std::chrono::milliseconds(250) >= deadline);
  });
  absl::StatusOr<ParsedRequest> parsed = ValidateRequest(*req, limits_, tokenizer_);
  if (!parsed.ok()) {
    metrics_.requests.Labels({"invalid_argument"}).Inc();
    stream->handle()->Finish(ToGrpcStatus(parsed.status()));
    return stream;
  }
  if (parsed->request_id.empty()) parsed->request_id = "req-" + std::to_string(key);
  core_.Submit(key, *std::move(parsed), stream->handle(), arrival);
  return stream;
}

}  // namespace tailserve
