#include "router/generation_service.h"

#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/unknown_field_set.h>
#include <grpcpp/support/proto_buffer_writer.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/server_stream.h"
#include "router/client_auth.h"
#include "router/validate.h"

namespace tailserve {

namespace {

// The core writes GenerateResponses; the raw stream carries their bytes.
class SerializingSink final : public ClientSink {
 public:
  explicit SerializingSink(std::shared_ptr<MessageSink<grpc::ByteBuffer>> out) : out_(std::move(out)) {}
  void Write(v1::GenerateResponse msg) override {
    grpc::ByteBuffer buffer;
    bool own = false;
    if (grpc::GenericSerialize<grpc::ProtoBufferWriter, v1::GenerateResponse>(msg, &buffer, &own).ok()) {
      out_->Write(std::move(buffer));
    }
  }
  void Finish(grpc::Status status) override { out_->Finish(std::move(status)); }

 private:
  std::shared_ptr<MessageSink<grpc::ByteBuffer>> out_;
};

std::string ByteBufferToString(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

}  // namespace

absl::StatusOr<v1::GenerateRequest> ParseGenerateRequest(const std::string& bytes) {
  v1::GenerateRequest req;
  {
    // Protobuf logs each string field's invalid UTF-8 as an error: a hostile client would fill the
    // log. The status below says it instead.
    google::protobuf::LogSilencer silence;
    if (req.ParseFromString(bytes)) return req;
  }
  // Well-formed wire bytes whose strict parse failed: a string field holds invalid UTF-8. Name it.
  google::protobuf::UnknownFieldSet fields;
  if (fields.ParseFromString(bytes)) {
    const google::protobuf::Descriptor* d = v1::GenerateRequest::descriptor();
    for (int i = 0; i < fields.field_count(); ++i) {
      const google::protobuf::UnknownField& f = fields.field(i);
      const google::protobuf::FieldDescriptor* fd = d->FindFieldByNumber(f.number());
      if (fd != nullptr && fd->type() == google::protobuf::FieldDescriptor::TYPE_STRING &&
          f.type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED && !IsValidUtf8(f.length_delimited())) {
        return absl::InvalidArgumentError(absl::StrCat(fd->name(), ": not valid UTF-8"));
      }
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("the request's ", bytes.size(),
                                                 " bytes are not a valid tailserve.v1.GenerateRequest"));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerationService::Generate(grpc::CallbackServerContext* ctx,
                                                                        const grpc::ByteBuffer* request) {
  const SteadyTime arrival = clock_.Now();
  const uint64_t key = core_.NewKey();
  const auto deadline = ctx->deadline();
  auto* stream = new ServerStream<grpc::ByteBuffer>([this, key, deadline] {
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
  absl::StatusOr<v1::GenerateRequest> req = ParseGenerateRequest(ByteBufferToString(*request));
  absl::StatusOr<ParsedRequest> parsed =
      req.ok() ? ValidateRequest(*req, limits_, tokenizer_) : absl::StatusOr<ParsedRequest>(req.status());
  if (!parsed.ok()) {
    metrics_.requests.Labels({"invalid_argument"}).Inc();
    stream->handle()->Finish(ToGrpcStatus(parsed.status()));
    return stream;
  }
  if (parsed->request_id.empty()) parsed->request_id = "req-" + std::to_string(key);
  std::shared_ptr<ClientSink> sink = std::make_shared<SerializingSink>(stream->handle());
  if (*lease) sink = std::make_shared<LeasedSink>(std::move(sink), *std::move(lease));
  core_.Submit(key, *std::move(parsed), std::move(sink), arrival);
  return stream;
}

}  // namespace tailserve
