#include "router/generation_service.h"

#include "common/grpc_status.h"
#include "common/server_stream.h"
#include "router/client_auth.h"
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
  }, ctx);
  std::string_view authorization;
  if (auto it = ctx->client_metadata().find("authorization"); it != ctx->client_metadata().end()) {
    authorization = std::string_view(it->second.data(), it->second.size());
  }
  absl::StatusOr<std::unique_ptr<ApiKeys::Lease>> lease = AdmitClient(keys_, authorization, metrics_);
  if (!lease.ok()) {
    stream->handle()->Finish(ToGrpcStatus(lease.status()));
    return stream;
  }
  absl::StatusOr<ParsedRequest> parsed = ValidateRequest(*req, limits_, tokenizer_);
  if (!parsed.ok()) {
    metrics_.requests.Labels({"invalid_argument"}).Inc();
    stream->handle()->Finish(ToGrpcStatus(parsed.status()));
    return stream;
  }
  if (parsed->request_id.empty()) parsed->request_id = "req-" + std::to_string(key);
  std::shared_ptr<ClientSink> sink = stream->handle();
  if (*lease) sink = std::make_shared<LeasedSink>(std::move(sink), *std::move(lease));
  core_.Submit(key, *std::move(parsed), std::move(sink), arrival);
  return stream;
}

}  // namespace tailserve
