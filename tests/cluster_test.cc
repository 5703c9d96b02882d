// Integration tests: a real router and real sim workers on loopback ports chosen at run time.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tailserve/v1/generation.grpc.pb.h"
#include "tailserve/v1/worker.grpc.pb.h"
#include "tests/cluster.h"
#include "tests/generate_stream.h"
#include "tests/reflection_probe.pb.h"
#include "worker/backends/sim/sim_engine.h"

namespace tailserve {
namespace {


v1::GenerateRequest Request(int max_tokens, uint64_t seed, int prompt_tokens = 16) {
  v1::GenerateRequest r;
  for (int i = 0; i < prompt_tokens; ++i) r.add_prompt_token_ids((i * 7 + 3) % 256);
  r.set_max_tokens(max_tokens);
  r.mutable_sampling()->set_seed(seed);
  return r;
}

std::vector<int32_t> ExpectedSimTokens(uint64_t seed, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(SimToken(seed, i, 256));
  return out;
}

std::unique_ptr<v1::Generation::Stub> GenerationStub(const std::string& target) {
  return v1::Generation::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
}

// Sim step ~1-2 ms so streams overlap without making the tests slow.
const std::vector<std::string> kFastSim = {"--set", "worker.sim.step_base_ms=1", "--set",
                                           "worker.sim.step_per_prefill_token_ms=0.001"};

TEST(ClusterTest, TwoHundredConcurrentStreamsComplete) {
  Cluster cluster({2, kFastSim, {}});
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = GenerationStub(cluster.router_target());
  std::vector<std::unique_ptr<Stream>> streams;
  for (int i = 0; i < 200; ++i) streams.push_back(std::make_unique<Stream>(stub.get(), Request(1 + i % 40, 1000 + i)));
  for (int i = 0; i < 200; ++i) {
    const grpc::Status s = streams[i]->Wait();
    ASSERT_TRUE(s.ok()) << i << ": " << s.error_message();
    EXPECT_EQ(streams[i]->tokens(), ExpectedSimTokens(1000 + i, 1 + i % 40)) << i;
    EXPECT_EQ(streams[i]->last().finish_reason(), v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(streams[i]->last().usage().completion_tokens(), 1 + i % 40);
    EXPECT_TRUE(streams[i]->last().simulated());
  }
}

TEST(ClusterTest, TextPromptStreamsDecodedText) {
  Cluster cluster({1, kFastSim, {}});
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = GenerationStub(cluster.router_target());
  grpc::ClientContext ctx;
  v1::GenerateRequest req;
  req.set_prompt("Hello, tailserve");
  req.set_max_tokens(12);
  req.set_request_id("my-id");
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse resp;
  int tokens = 0, messages = 0;
  std::string last_reason;
  while (reader->Read(&resp)) {
    ++messages;
    tokens += resp.token_ids_size();
    EXPECT_EQ(resp.request_id(), "my-id");
    if (resp.finish_reason()) last_reason = v1::FinishReason_Name(resp.finish_reason());
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(tokens, 12);
  EXPECT_GT(messages, 1);  // streamed, not one blob
  EXPECT_EQ(last_reason, "FINISH_REASON_LENGTH");
}

TEST(ClusterTest, CancelledStreamFreesItsWorkerSlot) {
  Cluster cluster({1, {"--slots", "4", "--set", "worker.sim.step_base_ms=2"}, {}});
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = GenerationStub(cluster.router_target());
  auto worker = v1::Worker::NewStub(grpc::CreateChannel(cluster.worker_target(0), grpc::InsecureChannelCredentials()));
  auto status = [&] {
    grpc::ClientContext ctx;
    v1::WorkerStatus s;
    EXPECT_TRUE(worker->Status(&ctx, {}, &s).ok());
    return s;
  };
  Stream stream(stub.get(), Request(4000, 5));
  ASSERT_TRUE(stream.WaitTokens(3));
  EXPECT_EQ(status().free_slots(), 3);
  stream.Cancel();
  EXPECT_EQ(stream.Wait().error_code(), grpc::StatusCode::CANCELLED);
  v1::WorkerStatus s;
  for (int i = 0; i < 200; ++i) {
    s = status();
    if (s.free_slots() == 4) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(s.free_slots(), 4);
  EXPECT_EQ(s.running_sequences(), 0);
  std::string metrics;
  ASSERT_EQ(HttpGet(cluster.router_http(), "/metrics", &metrics), 200);
  EXPECT_EQ(MetricValue(metrics, "tailserve_router_requests_total{outcome=\"cancelled\"}"), 1);
}

// A client that stops reading its stream: the router queues at most ServerStream's bound behind
// it, then cancels the request (freeing its worker slot) instead of buffering the whole output.
TEST(ClusterTest, AClientThatStopsReadingIsCancelled) {
  Cluster cluster({1, {"--slots", "4", "--set", "worker.sim.step_base_ms=0"}, {"--set", "router.max_tokens_limit=200000"}});
  ASSERT_TRUE(cluster.Start().ok());
  // A small receive window, as a client that does not read ends up with: what does not fit it
  // waits in the router (a large window holds it in the client's memory instead).
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 16 * 1024);
  auto stub = v1::Generation::NewStub(
      grpc::CreateCustomChannel(cluster.router_target(), grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, Request(200000, 5));
  v1::GenerateResponse first;
  ASSERT_TRUE(reader->Read(&first));  // then never reads again
  std::string metrics;
  double cancelled = 0;
  for (int i = 0; i < 300 && !(cancelled >= 1); ++i) {  // NaN until the series exists
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_EQ(HttpGet(cluster.router_http(), "/metrics", &metrics), 200);
    cancelled = MetricValue(metrics, "tailserve_router_requests_total{outcome=\"cancelled\"}");
  }
  EXPECT_EQ(cancelled, 1) << "the router kept buffering for a client that does not read; output tokens "
                          << MetricValue(metrics, "tailserve_router_output_tokens_total");
  EXPECT_LT(MetricValue(metrics, "tailserve_router_output_tokens_total"), 200000);
  ctx.TryCancel();
}

TEST(ClusterTest, ClientDeadlineIsHonoured) {
  Cluster cluster({1, {"--set", "worker.sim.step_base_ms=2"}, {}});
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = GenerationStub(cluster.router_target());
  Stream stream(stub.get(), Request(4000, 5), /*timeout_s=*/0.5);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(stream.Wait().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_GT(stream.tokens().size(), 0u);  // it was running when the deadline hit
  std::string metrics;
  for (int i = 0; i < 100; ++i) {
    HttpGet(cluster.router_http(), "/metrics", &metrics);
    if (MetricValue(metrics, "tailserve_router_requests_total{outcome=\"deadline_exceeded\"}") == 1 &&
        MetricValue(metrics, "tailserve_router_inflight_requests") == 0) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(MetricValue(metrics, "tailserve_router_requests_total{outcome=\"deadline_exceeded\"}"), 1);
  EXPECT_EQ(MetricValue(metrics, "tailserve_router_inflight_requests"), 0);
}

// A repeated prompt is placed where its prefix is cached and served from it: usage reports the
// cached prompt tokens (whole 16-token blocks, never the last token), and the output is unchanged.
// 1,100 tokens take three 512-token prefill steps where nothing is cached and one where 1,088 are,
// so the placement is not a tie (which the rotation would break the other way).
TEST(ClusterTest, ARepeatedPromptIsServedFromThePrefixCache) {
  std::vector<std::string> workers = kFastSim;
  workers.insert(workers.end(), {"--set", "worker.sim.kv_blocks=1000"});
  Cluster cluster({2, workers, {}});
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = GenerationStub(cluster.router_target());
  Stream first(stub.get(), Request(4, 1, /*prompt_tokens=*/1100));
  ASSERT_TRUE(first.Wait().ok());
  EXPECT_EQ(first.last().usage().cached_prompt_tokens(), 0);
  Stream again(stub.get(), Request(4, 2, /*prompt_tokens=*/1100));
  ASSERT_TRUE(again.Wait().ok());
  EXPECT_EQ(again.last().usage().prompt_tokens(), 1100);
  EXPECT_EQ(again.last().usage().cached_prompt_tokens(), 1088);
  EXPECT_EQ(again.tokens(), ExpectedSimTokens(2, 4));
}

// The router follows the workers' cache events: long after its own placement has stopped counting
// (two health-check intervals), it still places a repeated prompt where the worker's events say
// the prefix is, and the worker's Status answers a snapshot, then only what changed.
TEST(ClusterTest, PlacementFollowsTheWorkersCacheEvents) {
  std::vector<std::string> workers = kFastSim;
  workers.insert(workers.end(), {"--set", "worker.sim.kv_blocks=1000"});
  Cluster cluster({2, workers, {"--set", "router.health_check_interval_ms=50"}});
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = GenerationStub(cluster.router_target());
  Stream first(stub.get(), Request(4, 1, /*prompt_tokens=*/1100));
  ASSERT_TRUE(first.Wait().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  Stream again(stub.get(), Request(4, 2, /*prompt_tokens=*/1100));
  ASSERT_TRUE(again.Wait().ok());
  EXPECT_EQ(again.last().usage().cached_prompt_tokens(), 1088);

  size_t stored = 0;
  for (size_t w = 0; w < 2; ++w) {
    auto worker = v1::Worker::NewStub(grpc::CreateChannel(cluster.worker_target(w), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::StatusRequest req;
    v1::WorkerStatus status;
    ASSERT_TRUE(worker->Status(&ctx, req, &status).ok());
    ASSERT_TRUE(status.has_kv_events());
    EXPECT_TRUE(status.kv_events().snapshot());
    EXPECT_EQ(status.kv_events().block_size(), 16);
    stored += status.kv_events().stored_size();
    grpc::ClientContext ctx2;
    req.set_kv_events_since(status.kv_events().next());
    req.set_kv_events_epoch(status.kv_events().epoch());
    ASSERT_TRUE(worker->Status(&ctx2, req, &status).ok());
    EXPECT_FALSE(status.kv_events().snapshot());
    EXPECT_EQ(status.kv_events().stored_size(), 0) << "nothing changed since";
  }
  EXPECT_EQ(stored, 1100u / 16) << "the prompt's full blocks, cached once";
  std::string metrics;
  ASSERT_EQ(HttpGet(cluster.router_http(), "/metrics", &metrics), 200);
  EXPECT_EQ(MetricValue(metrics, "tailserve_router_prefix_cache_event_workers"), 2);
}

TEST(ClusterTest, FullQueueAnswersResourceExhausted) {
  // One slot per worker, no worker queue and room for two waiting requests in the router's: the
  // fifth concurrent request is refused.
  Cluster cluster({2, {"--slots", "1", "--set", "worker.sim.step_base_ms=2", "--set", "worker.max_waiting=0"},
                   {"--set", "router.max_queue_size=2", "--set", "batching.min_batch_size=1", "--set",
                    "batching.mode=fifo"}});
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = GenerationStub(cluster.router_target());
  std::vector<std::unique_ptr<Stream>> running;
  for (int i = 0; i < 2; ++i) {
    running.push_back(std::make_unique<Stream>(stub.get(), Request(4000, i)));
    ASSERT_TRUE(running.back()->WaitTokens(1));
  }
  for (int i = 0; i < 2; ++i) running.push_back(std::make_unique<Stream>(stub.get(), Request(4000, 10 + i)));
  // Until both wait in the router's queue (a fixed 300 ms sleep lost the race once on a loaded
  // 2-core machine).
  std::string queued;
  for (int tries = 0; tries < 200; ++tries) {
    ASSERT_EQ(HttpGet(cluster.router_http(), "/metrics", &queued), 200);
    if (MetricValue(queued, "tailserve_router_queue_length") == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Stream refused(stub.get(), Request(10, 99));
  const grpc::Status s = refused.Wait();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(), "queue full: 2 requests waiting (router.max_queue_size)");
  std::string metrics;
  ASSERT_EQ(HttpGet(cluster.router_http(), "/metrics", &metrics), 200);
  EXPECT_EQ(MetricValue(metrics, "tailserve_router_queue_length"), 2);
  for (auto& r : running) r->Cancel();
  for (auto& r : running) EXPECT_EQ(r->Wait().error_code(), grpc::StatusCode::CANCELLED);
}

TEST(ClusterTest, KillingAWorkerMidRunLosesNoRequest) {
  Cluster cluster({2, {"--set", "worker.sim.step_base_ms=3"}, {}});
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = GenerationStub(cluster.router_target());
  std::vector<std::unique_ptr<Stream>> streams;
  for (int i = 0; i < 60; ++i) streams.push_back(std::make_unique<Stream>(stub.get(), Request(150, 500 + i)));
  // Kill worker 0 once every stream is under way.
  for (auto& s : streams) ASSERT_TRUE(s->WaitTokens(5));
  cluster.worker(0).Signal(SIGKILL);
  for (int i = 0; i < 60; ++i) {
    const grpc::Status s = streams[i]->Wait();
    ASSERT_TRUE(s.ok()) << i << ": " << s.error_message();
    // Exactly the sequence the simulator defines: nothing duplicated, nothing lost.
    EXPECT_EQ(streams[i]->tokens(), ExpectedSimTokens(500 + i, 150)) << i;
  }
  std::string metrics;
  ASSERT_EQ(HttpGet(cluster.router_http(), "/metrics", &metrics), 200);
  EXPECT_GT(MetricValue(metrics, "tailserve_router_redispatches_total{reason=\"worker_failure\"}"), 0);
  EXPECT_EQ(MetricValue(metrics, "tailserve_router_workers_healthy"), 1);
}

// A worker whose engine fails (a device fault) hands its sequences back and leaves rotation: the
// router continues them on the other worker, so no client sees the fault; the failed worker says
// not ready and not live (Kubernetes restarts it) and gRPC health NOT_SERVING.
TEST(ClusterTest, FailedEngineHandsItsSequencesToAnotherWorker) {
  Cluster cluster({2, kFastSim, {}});
  // The warm-up takes 4 steps; the 41st step fails, with streams under way on this worker.
  cluster.AddWorkerArgs(0, {"--set", "worker.sim.fail_after_steps=40"});
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = GenerationStub(cluster.router_target());
  std::vector<std::unique_ptr<Stream>> streams;
  for (int i = 0; i < 40; ++i) streams.push_back(std::make_unique<Stream>(stub.get(), Request(80, 700 + i)));
  for (int i = 0; i < 40; ++i) {
    const grpc::Status s = streams[i]->Wait();
    ASSERT_TRUE(s.ok()) << i << ": " << s.error_message();
    EXPECT_EQ(streams[i]->tokens(), ExpectedSimTokens(700 + i, 80)) << i;  // nothing lost or repeated
  }
  ASSERT_TRUE(cluster.WaitHealthyWorkers(1).ok());
  std::string body;
  EXPECT_EQ(HttpGet(cluster.worker_http(0), "/readyz", &body), 503);
  EXPECT_EQ(body, "not ready: sim: injected device fault (worker.sim.fail_after_steps)\n");
  EXPECT_EQ(HttpGet(cluster.worker_http(0), "/healthz", &body), 503);
  EXPECT_EQ(body, "not live: sim: injected device fault (worker.sim.fail_after_steps)\n");
  EXPECT_EQ(HttpGet(cluster.worker_http(1), "/healthz"), 200);
  HttpGet(cluster.worker_http(0), "/metrics", &body);
  EXPECT_EQ(MetricValue(body, "tailserve_worker_ready"), 0);
  EXPECT_GT(MetricValue(body, "tailserve_worker_sequences_total{reason=\"error\"}"), 0);
  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(cluster.worker_target(0), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(health->Check(&ctx, {}, &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  HttpGet(cluster.router_http(), "/metrics", &body);
  EXPECT_GT(MetricValue(body, "tailserve_router_redispatches_total{reason=\"worker_failure\"}"), 0);
  // New traffic runs on the healthy worker.
  Stream after(stub.get(), Request(20, 9));
  ASSERT_TRUE(after.Wait().ok());
  EXPECT_EQ(after.tokens(), ExpectedSimTokens(9, 20));
}

// A batch larger than gRPC's 4 MB default message (here one 2.5M-token sequence) is taken.
TEST(ClusterTest, WorkerTakesBatchesLargerThanGrpcsDefaultMessage) {
  Cluster cluster({1, {"--set", "worker.sim.step_base_ms=0", "--set", "worker.sim.step_per_prefill_token_ms=0",
                       "--set", "worker.sim.step_per_kv_token_ns=0"}, {}});
  ASSERT_TRUE(cluster.Start().ok());
  auto worker = v1::Worker::NewStub(grpc::CreateChannel(cluster.worker_target(0), grpc::InsecureChannelCredentials()));
  v1::Batch batch;
  batch.set_batch_id("big");
  v1::Sequence* seq = batch.add_sequences();
  seq->set_sequence_id(5);
  for (int i = 0; i < 2'500'000; ++i) seq->add_prompt_token_ids(200 + i % 50);  // 2 bytes each
  seq->set_max_tokens(2);
  ASSERT_GT(batch.ByteSizeLong(), size_t{4} << 20);
  grpc::ClientContext ctx;
  auto reader = worker->Execute(&ctx, batch);
  v1::TokenEvent ev;
  int tokens = 0;
  while (reader->Read(&ev)) {
    for (const auto& s : ev.sequences()) tokens += s.token_ids_size();
  }
  const grpc::Status s = reader->Finish();
  EXPECT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
  EXPECT_EQ(tokens, 2);
}

TEST(ClusterTest, StoppedWorkerLeavesRotationAndComesBack) {
  Cluster cluster({2, kFastSim, {"--set", "router.health_check_timeout_ms=200"}});
  ASSERT_TRUE(cluster.Start().ok());
  cluster.worker(1).Signal(SIGSTOP);
  ASSERT_TRUE(cluster.WaitHealthyWorkers(1).ok());
  EXPECT_EQ(HttpGet(cluster.router_http(), "/readyz"), 200);  // one worker is enough
  std::string metrics;
  HttpGet(cluster.router_http(), "/metrics", &metrics);
  EXPECT_EQ(MetricValue(metrics, absl::StrCat("tailserve_router_worker_up{worker=\"", cluster.worker_target(1), "\"}")), 0);
  // Traffic keeps flowing through the other worker.
  auto stub = GenerationStub(cluster.router_target());
  Stream s(stub.get(), Request(20, 3));
  ASSERT_TRUE(s.Wait().ok());
  EXPECT_EQ(s.tokens(), ExpectedSimTokens(3, 20));
  cluster.worker(1).Signal(SIGCONT);
  ASSERT_TRUE(cluster.WaitHealthyWorkers(2).ok());
}

TEST(ClusterTest, ReadinessFollowsWorkers) {
  Cluster cluster({1, kFastSim, {}});
  ASSERT_TRUE(cluster.Start().ok());
  EXPECT_EQ(HttpGet(cluster.router_http(), "/healthz"), 200);
  EXPECT_EQ(HttpGet(cluster.router_http(), "/readyz"), 200);
  EXPECT_EQ(HttpGet(cluster.worker_http(0), "/healthz"), 200);
  EXPECT_EQ(HttpGet(cluster.worker_http(0), "/readyz"), 200);  // warm-up generation done
  std::string metrics;
  HttpGet(cluster.worker_http(0), "/metrics", &metrics);
  EXPECT_EQ(MetricValue(metrics, "tailserve_worker_ready"), 1);
  cluster.worker(0).Signal(SIGKILL);
  ASSERT_TRUE(cluster.WaitHealthyWorkers(0).ok());
  std::string body;
  EXPECT_EQ(HttpGet(cluster.router_http(), "/readyz", &body), 503);
  EXPECT_EQ(body, "not ready: no healthy worker\n");
  EXPECT_EQ(HttpGet(cluster.router_http(), "/healthz"), 200);  // alive, just not ready
  // gRPC health (what a Kubernetes gRPC probe asks) agrees with /readyz.
  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(cluster.router_target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(health->Check(&ctx, {}, &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
}

TEST(ClusterTest, MalformedRequestsGetTheDocumentedStatus) {
  Cluster cluster({1, kFastSim, {"--set", "router.max_tokens_limit=100", "--set", "router.max_prompt_tokens=32"}});
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = GenerationStub(cluster.router_target());
  struct Case {
    std::function<void(v1::GenerateRequest&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](auto& r) { r.clear_prompt_token_ids(); }, "prompt: must not be empty"},
      {[](auto& r) { r.set_prompt("x"); }, "prompt: set either prompt or prompt_token_ids, not both"},
      {[](auto& r) { r.set_max_tokens(0); }, "max_tokens: must be > 0, got 0"},
      {[](auto& r) { r.set_max_tokens(-5); }, "max_tokens: must be > 0, got -5"},
      {[](auto& r) { r.set_max_tokens(101); }, "max_tokens: 101 exceeds the limit of 100"},
      {[](auto& r) { r.set_priority(static_cast<v1::Priority>(9)); }, "priority: unknown value 9"},
      {[](auto& r) { for (int i = 0; i < 40; ++i) r.add_prompt_token_ids(1); },
       "prompt: 56 tokens exceeds the limit of 32"},
      {[](auto& r) { r.set_prompt_token_ids(0, 70000); },
       "prompt_token_ids[0]: token id 70000 outside the vocabulary [0, 256)"},
      {[](auto& r) { r.mutable_sampling()->set_top_p(2); }, "sampling.top_p: must be in [0, 1] (0 means 1), got 2"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest req = Request(10, 1);
    c.edit(req);
    Stream s(stub.get(), req);
    const grpc::Status st = s.Wait();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.message;
    EXPECT_EQ(st.error_message(), c.message);
  }
  // Bytes protobuf cannot parse as a GenerateRequest: invalid UTF-8 in a string field (named), and
  // truncated or garbage bytes, sent raw.
  grpc::GenericStub raw(grpc::CreateChannel(cluster.router_target(), grpc::InsecureChannelCredentials()));
  auto send_raw = [&](const std::string& bytes) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::ClientContext ctx;
    std::promise<grpc::Status> done;
    raw.UnaryCall(&ctx, "/tailserve.v1.Generation/Generate", grpc::StubOptions(), &request, &response,
                  [&](grpc::Status st) { done.set_value(std::move(st)); });
    return done.get_future().get();
  };
  auto with = [](std::function<void(v1::GenerateRequest&)> edit) {
    v1::GenerateRequest r = Request(10, 1);
    r.clear_prompt_token_ids();
    r.set_prompt("ok");
    edit(r);
    return r;
  };
  // Serialized with valid text, then its marker byte ('Z': no tag or length of these requests)
  // replaced by 0xff, which no UTF-8 text contains.
  auto corrupt = [](v1::GenerateRequest r, const std::string& marker) {
    std::string bytes = r.SerializeAsString();
    bytes[bytes.find(marker)] = '\xff';
    return bytes;
  };
  const std::vector<std::pair<std::string, std::string>> raw_cases = {
      {corrupt(with([](auto& r) { r.set_prompt("hello Z"); }), "Z"), "prompt: not valid UTF-8"},
      {corrupt(with([](auto& r) { r.add_stop("stZp"); }), "Z"), "stop: not valid UTF-8"},
      {corrupt(with([](auto& r) { r.set_request_id("id-Z"); }), "Z"), "request_id: not valid UTF-8"},
      {std::string("\x12\x02\xff\xfe\x20\x04", 6), "prompt: not valid UTF-8"},  // the bytes
      {std::string("\x12\x09\x41", 3), "the request's 3 bytes are not a valid tailserve.v1.GenerateRequest"},
      {std::string("\xff\xff\xff\xff", 4), "the request's 4 bytes are not a valid tailserve.v1.GenerateRequest"},
  };
  for (const auto& [bytes, message] : raw_cases) {
    const grpc::Status st = send_raw(bytes);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << message;
    EXPECT_EQ(st.error_message(), message);
  }
  // The router still serves after all that.
  Stream ok(stub.get(), Request(5, 2));
  EXPECT_TRUE(ok.Wait().ok());
  std::string metrics;
  HttpGet(cluster.router_http(), "/metrics", &metrics);
  EXPECT_EQ(MetricValue(metrics, "tailserve_router_requests_total{outcome=\"invalid_argument\"}"),
            cases.size() + raw_cases.size());
}

TEST(ClusterTest, StepBudgetOverrunIsRedispatchedSeamlessly) {
  // Budget = ceil(5 * 1.0) = 5 steps per dispatch, doubling: 5 + 10 + 20 > 30 tokens (ladb: slo
  // sends no budget).
  Cluster cluster({2, kFastSim,
                   {"--set", "batching.mode=ladb", "--set", "predictor.steps_per_prompt_token=0", "--set", "predictor.base_steps=5", "--set",
                    "predictor.step_budget_margin=0", "--set", "predictor.min_step_budget=1"}});
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = GenerationStub(cluster.router_target());
  Stream s(stub.get(), Request(30, 77));
  ASSERT_TRUE(s.Wait().ok());
  EXPECT_EQ(s.tokens(), ExpectedSimTokens(77, 30));
  EXPECT_EQ(s.last().timings().dispatches(), 3);
}

TEST(ClusterTest, HealthAndReflectionServeStandardClients) {
  Cluster cluster({1, kFastSim, {}});
  ASSERT_TRUE(cluster.Start().ok());
  for (const std::string& target : {cluster.router_target(), cluster.worker_target(0)}) {
    auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
    auto health = grpc::health::v1::Health::NewStub(channel);
    grpc::ClientContext hctx;
    grpc::health::v1::HealthCheckResponse hresp;
    ASSERT_TRUE(health->Check(&hctx, {}, &hresp).ok()) << target;
    EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::SERVING) << target;

    // What grpcurl's "list" sends.
    grpc::ClientContext rctx;
    const grpc::internal::RpcMethod method("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                           grpc::internal::RpcMethod::BIDI_STREAMING);
    std::unique_ptr<grpc::ClientReaderWriter<testing::ReflectionRequest, testing::ReflectionResponse>> rw(
        grpc::internal::ClientReaderWriterFactory<testing::ReflectionRequest, testing::ReflectionResponse>::Create(
            channel.get(), method, &rctx));
    testing::ReflectionRequest rreq;
    rreq.set_list_services("*");
    ASSERT_TRUE(rw->Write(rreq));
    rw->WritesDone();
    testing::ReflectionResponse rresp;
    ASSERT_TRUE(rw->Read(&rresp)) << target;
    std::vector<std::string> names;
    for (const auto& s : rresp.list_services_response().service()) names.push_back(s.name());
    EXPECT_TRUE(rw->Finish().ok());
    const std::string expected = target == cluster.router_target() ? "tailserve.v1.Generation" : "tailserve.v1.Worker";
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << target;
    EXPECT_NE(std::find(names.begin(), names.end(), "grpc.health.v1.Health"), names.end()) << target;
  }
}

TEST(ClusterTest, FeedbackLogRetrainsThePredictor) {
  char tmpl[] = "/tmp/tailserve-feedback-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const std::string log = dir + "/feedback.jsonl", model = dir + "/model.onnx";
  {
    Cluster cluster({1, kFastSim, {"--set", "predictor.feedback_log=" + log, "--set",
                                   "predictor.update_interval_ms=50"}});
    ASSERT_TRUE(cluster.Start().ok());
    auto stub = GenerationStub(cluster.router_target());
    std::vector<std::unique_ptr<Stream>> streams;
    for (int i = 0; i < 40; ++i) streams.push_back(std::make_unique<Stream>(stub.get(), Request(2 + i % 20, i, 4 + i)));
    for (auto& s : streams) ASSERT_TRUE(s->Wait().ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the log is flushed every update interval
  }
  std::ifstream in(log);
  int lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  EXPECT_EQ(lines, 40);
  // The trainer fits it, writes ONNX, and checks the file against the router's own evaluator.
  Subprocess train;
  ASSERT_TRUE(train.Start({std::string(TAILSERVE_BIN_DIR) + "/tailserve-train", "--feedback", log, "--out", model},
                          dir + "/train.log")
                  .ok());
  absl::StatusOr<int> st = train.Wait(std::chrono::seconds(60));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(WEXITSTATUS(*st), 0);
  // And a router starts with it.
  Cluster cluster({1, kFastSim, {"--set", "predictor.model_path=" + model}});
  EXPECT_TRUE(cluster.Start().ok());
  std::filesystem::remove_all(dir);
}

TEST(ClusterTest, UnusableModelRefusesToStart) {
  const std::string bad = "/tmp/tailserve-bad-model-" + std::to_string(::getpid()) + ".onnx";
  std::ofstream(bad) << "not a model";
  Subprocess p;
  const std::string log = bad + ".log";
  ASSERT_TRUE(p.Start({std::string(TAILSERVE_BIN_DIR) + "/tailserve-router", "--workers", "127.0.0.1:1", "--set",
                       "predictor.model_path=" + bad},
                      log)
                  .ok());
  absl::StatusOr<int> st = p.Wait(std::chrono::seconds(10));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(WEXITSTATUS(*st), 2);
  std::ifstream in(log);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(text.find("predictor.model_path: " + bad + ": not an ONNX model"), std::string::npos) << text;
  std::remove(bad.c_str());
  std::remove(log.c_str());
}

TEST(ClusterTest, InvalidConfigRefusesToStart) {
  Subprocess p;
  const std::string log = "/tmp/tailserve-badconfig-" + std::to_string(::getpid()) + ".log";
  ASSERT_TRUE(p.Start({std::string(TAILSERVE_BIN_DIR) + "/tailserve-router", "--config",
                       std::string(TAILSERVE_SOURCE_DIR) + "/ladb_config.yaml", "--workers", "127.0.0.1:1", "--set",
                       "router.timeout_ms=soon"},
                      log)
                  .ok());
  absl::StatusOr<int> st = p.Wait(std::chrono::seconds(10));
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(WIFEXITED(*st));
  EXPECT_EQ(WEXITSTATUS(*st), 2);
  std::ifstream in(log);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(text.find("router.timeout_ms: expected an integer, got 'soon'"), std::string::npos) << text;
  std::remove(log.c_str());
}

}  // namespace
}  // namespace tailserve
