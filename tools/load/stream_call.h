#pragma once
// One streamed Generate call of the load generator, on gRPC's callback API: fills a RequestResult
// as responses arrive and calls `done` once the call is over (after freeing itself).
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tailserve/v1/generation.grpc.pb.h"
#include "tools/load/load_generator.h"

namespace tailserve {

// A Generation stub for the load generator's calls (responses up to 64 MiB).
std::unique_ptr<v1::Generation::Stub> LoadStub(const std::string& target);

// Sets the request's max_tokens, sampling seed and (sim_eos) stop token so that it ends after the
// planned `length` tokens the way `options` asks: the sim's stop token, the client hanging up, or
// max_tokens itself.
void SetPlannedLength(const LoadOptions& options, int32_t length, std::mt19937_64& rng, v1::GenerateRequest* req);

// stop_after > 0: the client hangs up once it holds that many tokens (LoadOptions::client_stop),
// a success ending there. tokens_out (optional): the generated token ids, as streamed.
void StartStreamingCall(v1::Generation::Stub* stub, v1::GenerateRequest req, double timeout_s, int32_t stop_after,
                        RequestResult* out, std::vector<int32_t>* tokens_out, std::function<void()> done);

}  // namespace tailserve
