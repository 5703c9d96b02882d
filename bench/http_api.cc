// The HTTP API's cost on this machine (issue 70's measurements), against zero-cost sim workers:
//   1. latency of a 1-token request sent one at a time, through gRPC Generate, HTTP
//      /v1/completions (one keep-alive connection) and the same streamed (SSE), interleaved so
//      machine drift hits all three alike;
//   2. concurrent SSE streams one router holds: N streaming requests open at once against slow sim
//      workers (a token every --step-ms), the router's resident memory sampled as they open, then
//      all closed by the client (each close cancels its request).
//
//   tailserve-bench-http [--requests 2000] [--streams 2000] [--step-ms 1000]
#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/subprocess.h"
#include "tailserve/v1/generation.grpc.pb.h"
#include "tools/load/load_generator.h"

namespace tailserve {
namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// Resident memory of a process, KiB.
long RssKib(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

std::string Body(int i, bool stream, int max_tokens) {
  std::string ids;
  for (int k = 0; k < 16; ++k) absl::StrAppend(&ids, k ? "," : "", (k * 13 + i) % 256);
  return absl::StrCat(R"({"model":"sim","prompt":[)", ids, R"(],"max_tokens":)", max_tokens, R"(,"seed":)", i,
                      R"(,"stream":)", stream ? "true" : "false", "}");
}

struct Cluster {
  std::string dir;
  std::vector<std::unique_ptr<Subprocess>> procs;
  int grpc = 0, api = 0, router_pid = 0;
};

absl::Status StartCluster(Cluster* c, const std::string& bin, const std::string& dir, double step_ms, int slots,
                          const std::vector<std::string>& router_flags = {}) {
  c->dir = dir;
  std::filesystem::create_directories(dir);
  std::string targets;
  for (int i = 0; i < 2; ++i) {
    auto w = std::make_unique<Subprocess>();
    TAILSERVE_RETURN_IF_ERROR(w->Start(
        {bin + "/tailserve-worker", "--grpc-port", "0", "--http-port", "0", "--listen-host", "127.0.0.1", "--log-level",
         "warn", "--ports-file", absl::StrCat(dir, "/w", i), "--slots", std::to_string(slots), "--set",
         absl::StrCat("worker.sim.step_base_ms=", step_ms), "--set", "worker.sim.step_per_sequence_ms=0", "--set",
         "worker.sim.step_per_kv_token_ns=0", "--set", "worker.sim.step_per_prefill_token_ms=0", "--set",
         "worker.max_waiting=4096", "--set", absl::StrCat("worker.step_token_budget=", slots + 4096)},
        absl::StrCat(dir, "/w", i, ".log")));
    TAILSERVE_ASSIGN_OR_RETURN(int port, WaitForPort(absl::StrCat(dir, "/w", i), "grpc_port", std::chrono::seconds(10)));
    absl::StrAppend(&targets, i ? "," : "", "127.0.0.1:", port);
    c->procs.push_back(std::move(w));
  }
  auto r = std::make_unique<Subprocess>();
  std::vector<std::string> argv = {bin + "/tailserve-router", "--grpc-port", "0", "--http-port", "0", "--listen-host",
                                   "127.0.0.1", "--log-level", "warn", "--ports-file", dir + "/r", "--workers", targets,
                                   "--set", "router.timeout_ms=0", "--set", "batching.min_batch_size=1", "--set",
                                   "router.max_queue_size=100000", "--set", "router.slo_reject_waiting=0", "--set",
                                   "router.api_port=0", "--set", "router.health_check_interval_ms=100"};
  argv.insert(argv.end(), router_flags.begin(), router_flags.end());
  TAILSERVE_RETURN_IF_ERROR(r->Start(argv, dir + "/r.log"));
  c->router_pid = r->pid();
  c->procs.push_back(std::move(r));
  TAILSERVE_ASSIGN_OR_RETURN(c->grpc, WaitForPort(dir + "/r", "grpc_port", std::chrono::seconds(10)));
  TAILSERVE_ASSIGN_OR_RETURN(c->api, WaitForPort(dir + "/r", "api_port", std::chrono::seconds(10)));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // first health polls
  return absl::OkStatus();
}

void StopCluster(Cluster* c) {
  for (auto it = c->procs.rbegin(); it != c->procs.rend(); ++it) (*it)->Stop();
  c->procs.clear();
  if (std::getenv("KEEP")) return;  // KEEP=1: leave the logs for a look
  std::filesystem::remove_all(c->dir);
}

// One streaming request that stays open until the client closes it.
struct Stream : std::enable_shared_from_this<Stream> {
  explicit Stream(net::io_context& ioc) : socket(ioc) {}
  tcp::socket socket;
  std::string request;
  std::array<char, 4096> buf{};
  bool got_event = false, failed = false;
  std::string head;
  void Start(const tcp::endpoint& ep, std::atomic<int>* ready, std::atomic<int>* failures) {
    socket.async_connect(ep, [self = shared_from_this(), ready, failures](beast::error_code ec) {
      if (ec) return self->Fail(failures);
      net::async_write(self->socket, net::buffer(self->request),
                       [self, ready, failures](beast::error_code ec2, size_t) {
                         if (ec2) return self->Fail(failures);
                         self->Read(ready, failures);
                       });
    });
  }
  void Read(std::atomic<int>* ready, std::atomic<int>* failures) {
    socket.async_read_some(net::buffer(buf), [self = shared_from_this(), ready, failures](beast::error_code ec, size_t n) {
      if (ec) return;  // closed by us, or by the server
      if (!self->got_event) {
        self->head.append(self->buf.data(), n);
        if (self->head.rfind("HTTP/1.1 200", 0) != 0 && self->head.size() >= 12) return self->Fail(failures);
        if (self->head.find("data: ") != std::string::npos) {
          self->got_event = true;
          ++*ready;
          self->head.clear();
        }
      }
      self->Read(ready, failures);
    });
  }
  void Fail(std::atomic<int>* failures) {
    if (!failed) failed = true, ++*failures;
  }
};

int Main(int argc, char** argv) {
  CLI::App app{"tailserve HTTP API benchmark"};
  int requests = 2000, streams = 2000;
  double step_ms = 1000;
  std::string bin = TAILSERVE_BIN_DIR;
  app.add_option("--requests", requests, "sequential requests per path for the latency table");
  app.add_option("--streams", streams, "concurrent SSE streams (0: skip)");
  app.add_option("--step-ms", step_ms, "the slow sim workers' step time while the streams are open");
  app.add_option("--bin-dir", bin, "where tailserve-router and tailserve-worker are");
  CLI11_PARSE(app, argc, argv);
  const std::string dir = std::filesystem::temp_directory_path() / ("tailserve-bench-http-" + std::to_string(::getpid()));

  // 1. Latency.
  Cluster c;
  if (absl::Status s = StartCluster(&c, bin, dir + "/fast", 0, 512); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  auto stub = v1::Generation::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", c.grpc), grpc::InsecureChannelCredentials()));
  net::io_context ioc;
  beast::tcp_stream http(ioc);
  http.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<uint16_t>(c.api)));
  http.socket().set_option(tcp::no_delay(true));
  beast::flat_buffer buffer;
  auto grpc_call = [&](int i) {
    v1::GenerateRequest r;
    for (int k = 0; k < 16; ++k) r.add_prompt_token_ids((k * 13 + i) % 256);
    r.set_max_tokens(1);
    r.mutable_sampling()->set_seed(i);
    grpc::ClientContext ctx;
    const auto t0 = Clock::now();
    auto reader = stub->Generate(&ctx, r);
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
    }
    return reader->Finish().ok() ? Ms(Clock::now() - t0) : -1.0;
  };
  auto http_call = [&](int i, bool stream) {
    bhttp::request<bhttp::string_body> req{bhttp::verb::post, "/v1/completions", 11};
    req.set(bhttp::field::host, "127.0.0.1");
    req.set(bhttp::field::content_type, "application/json");
    req.body() = Body(i, stream, 1);
    req.prepare_payload();
    const auto t0 = Clock::now();
    bhttp::response<bhttp::string_body> resp;
    beast::error_code ec;
    bhttp::write(http, req, ec);
    if (!ec) bhttp::read(http, buffer, resp, ec);
    if (ec) {
      std::fprintf(stderr, "HTTP request %d (stream %d): %s\n", i, stream, ec.message().c_str());
      return -1.0;
    }
    const bool ok = resp.result_int() == 200 && (!stream || resp.body().find("[DONE]") != std::string::npos);
    return ok ? Ms(Clock::now() - t0) : -1.0;
  };
  for (int i = 0; i < 200; ++i) grpc_call(i), http_call(i, false), http_call(i, true);
  std::vector<double> g, h, hs;
  for (int i = 0; i < requests; ++i) {
    const double a = grpc_call(i), b = http_call(i, false), d = http_call(i, true);
    if (a < 0 || b < 0 || d < 0) {
      std::fprintf(stderr, "request %d failed (grpc %.1f, http %.1f, sse %.1f)\n", i, a, b, d);
      return 1;
    }
    g.push_back(a), h.push_back(b), hs.push_back(d);
  }
  std::printf("## 1-token requests one at a time, zero-cost sim workers (n=%d each, interleaved)\n\n", requests);
  std::printf("| path | P50 ms | P90 ms | P99 ms |\n|---|---:|---:|---:|\n");
  for (const auto& [name, v] : {std::pair{"gRPC Generate", &g}, std::pair{"HTTP /v1/completions", &h},
                                std::pair{"HTTP /v1/completions, stream (SSE)", &hs}}) {
    std::printf("| %s | %.3f | %.3f | %.3f |\n", name, Percentile(*v, .5), Percentile(*v, .9), Percentile(*v, .99));
  }
  std::printf("| HTTP added over gRPC | %+.0f us | %+.0f us | %+.0f us |\n\n", 1e3 * (Percentile(h, .5) - Percentile(g, .5)),
              1e3 * (Percentile(h, .9) - Percentile(g, .9)), 1e3 * (Percentile(h, .99) - Percentile(g, .99)));
  std::fflush(stdout);

  // 2. What TLS costs: a second router serving the same API over TLS (a self-signed P-256
  // certificate made here), against HTTP on the first, interleaved.
  const std::string certs = dir + "/certs";
  std::filesystem::create_directories(certs);
  const std::string make_cert = absl::StrCat(
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=localhost ",
      "-addext subjectAltName=IP:127.0.0.1 -keyout ", certs, "/key.pem -out ", certs, "/cert.pem 2>/dev/null");
  Cluster t;
  if (std::system(make_cert.c_str()) != 0 ||
      !StartCluster(&t, bin, dir + "/tls", 0, 512,
                    {"--set", absl::StrCat("router.tls_cert_file=", certs, "/cert.pem"), "--set",
                     absl::StrCat("router.tls_key_file=", certs, "/key.pem")})
           .ok()) {
    std::fprintf(stderr, "cannot start the TLS router (openssl on PATH?)\n");
    return 1;
  }
  net::ssl::context tls_ctx(net::ssl::context::tls_client);
  tls_ctx.load_verify_file(certs + "/cert.pem");
  tls_ctx.set_verify_mode(net::ssl::verify_peer);
  const tcp::endpoint tls_ep(net::ip::make_address("127.0.0.1"), static_cast<uint16_t>(t.api));
  auto https_connect = [&](beast::ssl_stream<beast::tcp_stream>& s) {
    beast::get_lowest_layer(s).connect(tls_ep);
    beast::get_lowest_layer(s).socket().set_option(tcp::no_delay(true));
    s.handshake(net::ssl::stream_base::client);
  };
  auto https_request = [&](beast::ssl_stream<beast::tcp_stream>& s, beast::flat_buffer& b, int i) {
    bhttp::request<bhttp::string_body> req{bhttp::verb::post, "/v1/completions", 11};
    req.set(bhttp::field::host, "127.0.0.1");
    req.set(bhttp::field::content_type, "application/json");
    req.body() = Body(i, false, 1);
    req.prepare_payload();
    bhttp::write(s, req);
    bhttp::response<bhttp::string_body> resp;
    bhttp::read(s, b, resp);
    return resp.result_int() == 200;
  };
  beast::ssl_stream<beast::tcp_stream> kept(ioc, tls_ctx);
  beast::flat_buffer kept_buffer;
  std::vector<double> plain, tls_kept, tls_new;
  try {
    https_connect(kept);
    for (int i = 0; i < requests + 100; ++i) {
      const double a = http_call(i, false);
      auto t0 = Clock::now();
      const bool ok1 = https_request(kept, kept_buffer, i);
      const double b = Ms(Clock::now() - t0);
      t0 = Clock::now();
      beast::ssl_stream<beast::tcp_stream> fresh(ioc, tls_ctx);
      beast::flat_buffer fresh_buffer;
      https_connect(fresh);
      const bool ok2 = https_request(fresh, fresh_buffer, i);
      const double c2 = Ms(Clock::now() - t0);
      beast::error_code e;
      beast::get_lowest_layer(fresh).socket().close(e);
      if (a < 0 || !ok1 || !ok2) {
        std::fprintf(stderr, "TLS request %d failed\n", i);
        return 1;
      }
      if (i < 100) continue;  // warm-up
      plain.push_back(a), tls_kept.push_back(b), tls_new.push_back(c2);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "TLS: %s\n", e.what());
    return 1;
  }
  std::printf("## What TLS costs a 1-token request (n=%d each, interleaved; TLS 1.3, P-256 certificate)\n\n", requests);
  std::printf("| path | P50 ms | P90 ms | P99 ms |\n|---|---:|---:|---:|\n");
  for (const auto& [name, v] : {std::pair{"HTTP, kept-alive connection", &plain}, std::pair{"HTTPS, kept-alive connection", &tls_kept},
                                std::pair{"HTTPS, a new connection each (handshake included)", &tls_new}}) {
    std::printf("| %s | %.3f | %.3f | %.3f |\n", name, Percentile(*v, .5), Percentile(*v, .9), Percentile(*v, .99));
  }
  std::printf("| TLS on a kept connection | %+.0f us | %+.0f us | %+.0f us |\n\n",
              1e3 * (Percentile(tls_kept, .5) - Percentile(plain, .5)), 1e3 * (Percentile(tls_kept, .9) - Percentile(plain, .9)),
              1e3 * (Percentile(tls_kept, .99) - Percentile(plain, .99)));
  std::fflush(stdout);
  StopCluster(&t);
  beast::error_code ignored;
  http.socket().shutdown(tcp::socket::shutdown_both, ignored);
  StopCluster(&c);
  if (streams <= 0) return 0;

  // 2. Concurrent SSE streams.
  Cluster slow;
  if (absl::Status s = StartCluster(&slow, bin, dir + "/slow", step_ms, (streams + 1) / 2 + 16); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  net::io_context sioc;
  auto work = net::make_work_guard(sioc);
  std::thread io([&] { sioc.run(); });
  const tcp::endpoint ep(net::ip::make_address("127.0.0.1"), static_cast<uint16_t>(slow.api));
  std::atomic<int> ready{0}, failures{0};
  std::vector<std::shared_ptr<Stream>> open;
  std::printf("## Concurrent SSE streams held by one router (sim workers: a token every %.0f ms)\n\n", step_ms);
  std::printf("| streams open | router RSS MiB | KiB a stream (from 0) |\n|---:|---:|---:|\n");
  const long rss0 = RssKib(slow.router_pid);
  std::printf("| 0 | %.1f | |\n", rss0 / 1024.0);
  // Two rounds of opening every stream and closing them all: memory the first round's peak left
  // with the allocator is reused by the second, so a leak shows as growth between the rounds.
  for (int round = 1; round <= 2; ++round) {
    open.clear();
    ready = 0;
    for (int target : {streams / 4, streams / 2, streams}) {
      if (round == 2 && target != streams) continue;
      while (static_cast<int>(open.size()) < target) {
        auto s = std::make_shared<Stream>(sioc);
        const int i = static_cast<int>(open.size());
        s->request = absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n",
                                  "Content-Length: ", Body(i, true, 4096).size(), "\r\n\r\n", Body(i, true, 4096));
        net::post(sioc, [s, ep, &ready, &failures] { s->Start(ep, &ready, &failures); });
        open.push_back(std::move(s));
      }
      const auto deadline = Clock::now() + std::chrono::seconds(120);
      while (ready.load() + failures.load() < target && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      std::this_thread::sleep_for(std::chrono::seconds(2));  // a few tokens on every stream
      const long rss = RssKib(slow.router_pid);
      std::printf("| round %d: %d (%d streaming, %d failed) | %.1f | %.1f |\n", round, target, ready.load(), failures.load(),
                  rss / 1024.0, static_cast<double>(rss - rss0) / std::max(1, ready.load()));
      std::fflush(stdout);
    }
    std::promise<void> closed;
    net::post(sioc, [&] {
      for (auto& s : open) {
        beast::error_code e;
        s->socket.close(e);
      }
      closed.set_value();
    });
    closed.get_future().wait();
    std::this_thread::sleep_for(std::chrono::seconds(5));
    std::printf("| round %d: all closed by the client, 5 s later | %.1f | |\n", round, RssKib(slow.router_pid) / 1024.0);
    std::fflush(stdout);
  }
  std::printf("\n");
  work.reset();
  sioc.stop();
  io.join();
  StopCluster(&slow);
  std::filesystem::remove_all(dir);
  return failures.load() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace tailserve

int main(int argc, char** argv) { return tailserve::Main(argc, argv); }
