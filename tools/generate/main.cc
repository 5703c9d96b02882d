// tailserve-generate: one streamed request, printed as it arrives (the demo's sample request).
#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <optional>

#include "common/tls.h"
#include "tailserve/v1/generation.grpc.pb.h"

int main(int argc, char** argv) {
  CLI::App app{"Send one Generate request and print the streamed completion"};
  std::string target = "127.0.0.1:50051", prompt;
  int max_tokens = 32;
  double temperature = 0, timeout_s = 60;
  std::optional<uint64_t> seed;
  std::string ca_file, api_key;
  app.add_option("--target", target, "router host:port");
  app.add_option("--prompt", prompt, "prompt text")->required();
  app.add_option("--max-tokens", max_tokens, "tokens to generate");
  app.add_option("--temperature", temperature, "0: greedy");
  app.add_option("--seed", seed, "sampling seed");
  app.add_option("--timeout-s", timeout_s, "deadline in seconds");
  app.add_option("--ca-file", ca_file, "TLS: the CA the router's certificate chains to (default: plaintext)");
  app.add_option("--api-key", api_key, "sent as authorization: Bearer <key> (router.api_keys_file)");
  CLI11_PARSE(app, argc, argv);

  auto credentials = grpc::InsecureChannelCredentials();
  if (!ca_file.empty()) {
    auto files = tailserve::GrpcChannelCredentials({.cert_file = "", .key_file = "", .ca_file = ca_file}, "--");
    if (!files.ok()) {
      std::fprintf(stderr, "%s\n", std::string(files.status().message()).c_str());
      return 2;
    }
    credentials = *files;
  }
  auto stub = tailserve::v1::Generation::NewStub(grpc::CreateChannel(target, credentials));
  grpc::ClientContext ctx;
  if (!api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + api_key);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1e3)));
  tailserve::v1::GenerateRequest req;
  req.set_prompt(prompt);
  req.set_max_tokens(max_tokens);
  req.mutable_sampling()->set_temperature(static_cast<float>(temperature));
  if (seed) req.mutable_sampling()->set_seed(*seed);
  auto reader = stub->Generate(&ctx, req);
  tailserve::v1::GenerateResponse resp;
  int tokens = 0;
  bool simulated = false;
  while (reader->Read(&resp)) {
    tokens += resp.token_ids_size();
    simulated |= resp.simulated();
    std::fwrite(resp.text().data(), 1, resp.text().size(), stdout);
    std::fflush(stdout);
    if (resp.finish_reason() != tailserve::v1::FINISH_REASON_UNSPECIFIED) {
      std::printf("\n[%s] finish=%s tokens=%d queue=%.1fms ttft=%.1fms total=%.1fms%s\n", resp.request_id().c_str(),
                  tailserve::v1::FinishReason_Name(resp.finish_reason()).c_str(), tokens,
                  1e3 * resp.timings().queue_seconds(), 1e3 * resp.timings().ttft_seconds(),
                  1e3 * resp.timings().total_seconds(), simulated ? " (simulated tokens: sim backend)" : "");
    }
  }
  const grpc::Status s = reader->Finish();
  if (!s.ok()) {
    std::fprintf(stderr, "error: %d %s\n", s.error_code(), s.error_message().c_str());
    return 1;
  }
  return 0;
}
