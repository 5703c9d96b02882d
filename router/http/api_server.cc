#include "router/http/api_server.h"

#include <spdlog/spdlog.h>

#include <sys/stat.h>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <ctime>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/tls.h"
#include "router/client_auth.h"
#include "router/validate.h"

namespace tailserve::http {
namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

// Posting from the core's thread into a connection must stop before the server's threads and
// io_context go away: sinks post only while the gate is open, under its lock.
struct Gate {
  std::mutex mu;
  bool open = true;
};

std::string StatusLine(int status) {
  switch (status) {
    case 200: return "200 OK";
    case 400: return "400 Bad Request";
    case 401: return "401 Unauthorized";
    case 404: return "404 Not Found";
    case 405: return "405 Method Not Allowed";
    case 413: return "413 Payload Too Large";
    case 429: return "429 Too Many Requests";
    case 503: return "503 Service Unavailable";
    case 504: return "504 Gateway Timeout";
    default: return absl::StrCat(status, status >= 500 ? " Internal Server Error" : " Error");
  }
}

std::string Chunk(const std::string& data) {
  char size[32];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  return size + data + "\r\n";
}

}  // namespace

struct ApiServer::Impl {
  Impl(RouterCore& c, const RouterConfig& cfg, const Tokenizer& t, RouterMetrics& m, const ModelInfo& mi, ApiKeys* k)
      : core(c), config(cfg), tokenizer(t), metrics(m), model(mi), keys(k), gate(std::make_shared<Gate>()) {}
  RouterCore& core;
  const RouterConfig config;
  const Tokenizer& tokenizer;
  RouterMetrics& metrics;
  const ModelInfo& model;
  ApiKeys* keys;
  std::shared_ptr<Gate> gate;
  net::io_context ioc;
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::thread> threads;
  // TLS (router.tls_cert_file): the context new connections get, rebuilt when the files change.
  bool tls_enabled = false;  // set before the threads start
  std::mutex tls_mu;
  std::shared_ptr<net::ssl::context> tls;
  int64_t tls_mtime = 0;
  std::chrono::steady_clock::time_point tls_checked{};

  void Accept();
  absl::StatusOr<std::shared_ptr<net::ssl::context>> MakeTlsContext() const;
  int64_t TlsFilesMtime() const;
  std::shared_ptr<net::ssl::context> CurrentTls();
};

int64_t ApiServer::Impl::TlsFilesMtime() const {
  int64_t newest = 0;
  for (const std::string* f : {&config.tls_cert_file, &config.tls_key_file}) {
    struct stat st {};
    if (::stat(f->c_str(), &st) == 0) newest = std::max<int64_t>(newest, st.st_mtim.tv_sec * 1'000'000'000LL + st.st_mtim.tv_nsec);
  }
  return newest;
}

absl::StatusOr<std::shared_ptr<net::ssl::context>> ApiServer::Impl::MakeTlsContext() const {
  auto ctx = std::make_shared<net::ssl::context>(net::ssl::context::tls_server);
  ctx->set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 | net::ssl::context::no_sslv3 |
                   net::ssl::context::no_tlsv1 | net::ssl::context::no_tlsv1_1);
  beast::error_code ec;
  ctx->use_certificate_chain_file(config.tls_cert_file, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("router.tls_cert_file: ", config.tls_cert_file, ": ", ec.message()));
  ctx->use_private_key_file(config.tls_key_file, net::ssl::context::pem, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("router.tls_key_file: ", config.tls_key_file, ": ", ec.message()));
  return ctx;
}

std::shared_ptr<net::ssl::context> ApiServer::Impl::CurrentTls() {
  std::lock_guard lock(tls_mu);
  const auto now = std::chrono::steady_clock::now();
  if (now - tls_checked > std::chrono::seconds(kTlsReloadSeconds)) {
    tls_checked = now;
    if (const int64_t m = TlsFilesMtime(); m != tls_mtime) {
      // A pair caught half-written fails to load: the old context stays and the next check retries.
      if (absl::StatusOr<std::shared_ptr<net::ssl::context>> fresh = MakeTlsContext(); fresh.ok()) {
        tls = *std::move(fresh);
        tls_mtime = m;
        spdlog::info("api: TLS certificate reloaded from {}", config.tls_cert_file);
      } else {
        spdlog::warn("api: TLS certificate not reloaded (the previous one stays): {}", std::string(fresh.status().message()));
      }
    }
  }
  return tls;
}

namespace {

// Stream: beast::tcp_stream (plaintext) or beast::ssl_stream<beast::tcp_stream> (TLS).
template <class Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
  using std::enable_shared_from_this<Session<Stream>>::shared_from_this;
  using std::enable_shared_from_this<Session<Stream>>::weak_from_this;
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

 public:
  Session(tcp::socket socket, ApiServer::Impl& srv) : stream_(std::move(socket)), srv_(srv) {}
  // TLS: the context the connection was accepted with stays alive with it across a reload.
  Session(tcp::socket socket, std::shared_ptr<net::ssl::context> tls, ApiServer::Impl& srv)
      : tls_(std::move(tls)), stream_(std::move(socket), *tls_), srv_(srv) {}
  ~Session() {
    if (active_) srv_.core.Cancel(key_, /*deadline=*/false);
  }

  void Start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      if constexpr (kTls) {
        self->Lowest().expires_after(std::chrono::seconds(30));
        self->stream_.async_handshake(net::ssl::stream_base::server, [self](beast::error_code ec) {
          if (ec) return self->Close();  // not TLS, or a certificate the client refused
          self->Read();
        });
      } else {
        self->Read();
      }
    });
  }

  // From the core's thread, through HttpSink.
  void PostToken(v1::GenerateResponse resp) {
    net::post(stream_.get_executor(), [self = shared_from_this(), r = std::move(resp)]() mutable { self->OnToken(r); });
  }
  void PostFinish(grpc::Status status) {
    net::post(stream_.get_executor(), [self = shared_from_this(), s = std::move(status)] { self->OnFinish(s); });
  }

 private:
  void Read() {
    parser_.emplace();
    parser_->body_limit(static_cast<uint64_t>(srv_.config.api_max_body_bytes));
    parser_->header_limit(64 * 1024);
    Lowest().expires_after(std::chrono::seconds(60));
    bhttp::async_read(stream_, buffer_, *parser_,
                      [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    if (ec == bhttp::error::body_limit) {
      keep_alive_ = false;
      return SendError(ApiError::Make(413, absl::StrCat("the request body exceeds ", srv_.config.api_max_body_bytes, " bytes"),
                                      "invalid_request_error", "", "request_too_large"));
    }
    if (ec) {
      if (ec != bhttp::error::end_of_stream) spdlog::debug("api: read: {}", ec.message());
      return Close();
    }
    Lowest().expires_never();
    Handle(parser_->release());
  }

  void Handle(bhttp::request<bhttp::string_body> req) {
    keep_alive_ = req.keep_alive();
    std::string path(req.target());
    if (const size_t q = path.find('?'); q != std::string::npos) path.resize(q);
    const auto authorization = req[bhttp::field::authorization];
    absl::StatusOr<std::unique_ptr<ApiKeys::Lease>> lease =
        AdmitClient(srv_.keys, std::string_view(authorization.data(), authorization.size()), srv_.metrics);
    if (!lease.ok()) return SendError(ErrorFromStatus(lease.status()));
    if (path == "/v1/models") {
      if (req.method() != bhttp::verb::get) return SendError(ApiError::Make(405, "use GET /v1/models"));
      nlohmann::ordered_json m = {{"object", "list"},
                                  {"data", {{{"id", srv_.model.name}, {"object", "model"}, {"created", 0}, {"owned_by", "tailserve"}}}}};
      return SendResponse(200, "application/json", m.dump());
    }
    const bool chat = path == "/v1/chat/completions";
    if (!chat && path != "/v1/completions") {
      return SendError(ApiError::Make(404, absl::StrCat("no route ", path), "invalid_request_error", "", "not_found"));
    }
    if (req.method() != bhttp::verb::post) return SendError(ApiError::Make(405, absl::StrCat("use POST ", path)));
    const SteadyTime arrival = SystemClock::Get().Now();
    ApiError error;
    absl::StatusOr<ApiRequest> api = ParseRequest(req.body(), chat, srv_.model, &error);
    if (!api.ok()) {
      srv_.metrics.requests.Labels({"invalid_argument"}).Inc();
      return SendError(error);
    }
    if (chat) {
      // The template placed the special tokens it wants (a BOS among them): tokenized as they
      // stand, as transformers tokenizes a rendered chat (add_special_tokens=False).
      for (int32_t id : srv_.tokenizer.Encode(api->generate.prompt())) api->generate.add_prompt_token_ids(id);
      api->generate.clear_prompt();
    }
    absl::StatusOr<ParsedRequest> parsed = ValidateRequest(api->generate, srv_.config, srv_.tokenizer);
    if (!parsed.ok()) {
      srv_.metrics.requests.Labels({"invalid_argument"}).Inc();
      return SendError(ErrorFromStatus(parsed.status()));
    }
    req_ = *std::move(api);
    if (req_.logprobs) logprobs_.emplace(chat, srv_.tokenizer);
    lease_ = *std::move(lease);
    key_ = srv_.core.NewKey();
    id_ = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", key_);
    created_ = static_cast<int64_t>(std::time(nullptr));
    if (parsed->request_id.empty()) parsed->request_id = id_;
    active_ = true;
    WatchPeer();
    srv_.core.Submit(key_, *std::move(parsed), std::make_shared<HttpSink>(weak_from_this(), srv_.gate), arrival);
  }

  // The core's sink for one request: posts onto the connection's executor, never blocks.
  class HttpSink final : public MessageSink<v1::GenerateResponse> {
   public:
    HttpSink(std::weak_ptr<Session> s, std::shared_ptr<Gate> gate) : session_(std::move(s)), gate_(std::move(gate)) {}
    void Write(v1::GenerateResponse msg) override {
      std::lock_guard lock(gate_->mu);
      if (auto s = session_.lock(); s && gate_->open) s->PostToken(std::move(msg));
    }
    void Finish(grpc::Status status) override {
      std::lock_guard lock(gate_->mu);
      if (auto s = session_.lock(); s && gate_->open) s->PostFinish(std::move(status));
    }

   private:
    std::weak_ptr<Session> session_;
    std::shared_ptr<Gate> gate_;
  };

  // A client that goes away while its request runs cancels it. The wait consumes nothing, so bytes
  // a client pipelines stay for the next request.
  void WatchPeer() {
    watching_ = true;
    Lowest().socket().async_wait(tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
      self->watching_ = false;
      if (self->read_after_watch_) {
        self->read_after_watch_ = false;
        return self->Read();
      }
      if (ec || !self->active_) return;
      // Readable: the client closed (recv sees 0), sent more (kept for the next request; stop
      // watching), or the wake was spurious (EAGAIN: watch again).
      char c;
      // Under TLS the bytes are records, a close_notify among them: only the socket's own close
      // is seen here, and a stream's next write failing catches the rest.
      const ssize_t n = ::recv(self->Lowest().socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return self->WatchPeer();
      if (n > 0) return;
      spdlog::debug("api: the client of {} went away", self->id_);
      self->srv_.core.Cancel(self->key_, /*deadline=*/false);
      self->active_ = false;
      self->Close();
    });
  }

  void OnToken(const v1::GenerateResponse& r) {
    if (!active_) return;
    if (r.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) finish_ = r.finish_reason();
    if (r.has_usage()) usage_ = r.usage();
    if (logprobs_) logprobs_->Add(r);
    if (!req_.stream) {
      text_ += r.text();
      return;
    }
    if (!header_sent_) StartStream();
    // Tokens whose text is held back (a possible stop string) still send their logprobs.
    if (!r.text().empty() || (logprobs_ && logprobs_->pending())) {
      Enqueue(Chunk(ChunkEvent(req_, id_, created_, r.text(), !role_sent_, std::nullopt, TakeLogprobs())));
      role_sent_ = true;
    }
  }

  void OnFinish(const grpc::Status& status) {
    if (!active_) return;
    active_ = false;
    lease_.reset();
    if (!status.ok()) {
      const ApiError e = ErrorFromStatus(FromGrpcStatus(status));
      if (!header_sent_) return SendError(e);
      Enqueue(Chunk("data: " + e.Json() + "\n\n"));
      Enqueue(Chunk(kDoneEvent));
      return EndStream();
    }
    if (!req_.stream) {
      return SendResponse(200, "application/json",
                          CompletionJson(req_, id_, created_, text_, finish_, usage_,
                                         logprobs_ ? logprobs_->Take() : nlohmann::ordered_json()));
    }
    if (!header_sent_) StartStream();
    Enqueue(Chunk(ChunkEvent(req_, id_, created_, "", !role_sent_, finish_, TakeLogprobs())));
    if (req_.include_usage) Enqueue(Chunk(UsageEvent(req_, id_, created_, usage_)));
    Enqueue(Chunk(kDoneEvent));
    EndStream();
  }

  // A chunk's logprobs: null when it carries no tokens (as OpenAI's last chunk).
  nlohmann::ordered_json TakeLogprobs() {
    return logprobs_ && logprobs_->pending() ? logprobs_->Take() : nlohmann::ordered_json();
  }

  void StartStream() {
    header_sent_ = true;
    Enqueue(absl::StrCat("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n",
                         "Transfer-Encoding: chunked\r\nConnection: ", keep_alive_ ? "keep-alive" : "close", "\r\n\r\n"));
  }
  void EndStream() {
    Enqueue("0\r\n\r\n");
    response_done_ = true;
  }

  void SendError(const ApiError& e) {
    std::string extra;
    if (e.retry_after_s > 0) extra = absl::StrCat("Retry-After: ", static_cast<int64_t>(std::ceil(e.retry_after_s)), "\r\n");
    SendResponse(e.status, "application/json", e.Json(), extra);
  }

  void SendResponse(int status, const char* type, const std::string& body, const std::string& extra = "") {
    header_sent_ = true;
    Enqueue(absl::StrCat("HTTP/1.1 ", StatusLine(status), "\r\nContent-Type: ", type, "\r\nContent-Length: ", body.size(),
                         "\r\n", extra, "Connection: ", keep_alive_ ? "keep-alive" : "close", "\r\n\r\n", body));
    response_done_ = true;
  }

  // A client that stops reading its stream cannot make the router buffer without bound: past
  // kMaxQueuedChunks chunks waiting behind the socket, its request is cancelled and the connection
  // closed.
  static constexpr size_t kMaxQueuedChunks = 1024;
  void Enqueue(std::string bytes) {
    if (out_.size() >= kMaxQueuedChunks) {
      spdlog::warn("api: {} does not read its stream; cancelling it", id_);
      if (active_) srv_.core.Cancel(key_, /*deadline=*/false), active_ = false;
      lease_.reset();
      out_.erase(out_.begin() + 1, out_.end());  // the front is being written
      return Close();
    }
    out_.push_back(std::move(bytes));
    if (!writing_) DoWrite();
  }

  void DoWrite() {
    writing_ = true;
    net::async_write(stream_, net::buffer(out_.front()), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->OnWrite(ec);
    });
  }

  void OnWrite(beast::error_code ec) {
    out_.pop_front();
    writing_ = false;
    if (ec) {
      spdlog::debug("api: write: {}", ec.message());
      if (active_) srv_.core.Cancel(key_, /*deadline=*/false), active_ = false;
      return Close();
    }
    if (!out_.empty()) return DoWrite();
    if (!response_done_) return;
    if (!keep_alive_) return Close();
    // The next request on this connection.
    response_done_ = header_sent_ = role_sent_ = false;
    text_.clear();
    usage_.Clear();
    logprobs_.reset();
    finish_ = v1::FINISH_REASON_UNSPECIFIED;
    if (watching_) {
      read_after_watch_ = true;
      beast::error_code ignored;
      Lowest().socket().cancel(ignored);
      return;
    }
    Read();
  }

  void Close() {
    beast::error_code ignored;
    Lowest().socket().shutdown(tcp::socket::shutdown_both, ignored);
    Lowest().socket().close(ignored);
  }

  beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }

  std::shared_ptr<net::ssl::context> tls_;
  Stream stream_;
  ApiServer::Impl& srv_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::deque<std::string> out_;
  bool writing_ = false, keep_alive_ = true, response_done_ = false;
  bool watching_ = false, read_after_watch_ = false;
  // The request being served.
  bool active_ = false, header_sent_ = false, role_sent_ = false;
  uint64_t key_ = 0;
  std::unique_ptr<ApiKeys::Lease> lease_;  // the API key's stream, held while the request runs
  ApiRequest req_;
  std::string id_, text_;
  int64_t created_ = 0;
  v1::FinishReason finish_ = v1::FINISH_REASON_UNSPECIFIED;
  v1::Usage usage_;
  std::optional<LogprobsBuilder> logprobs_;  // when the request asked for logprobs
};

}  // namespace

void ApiServer::Impl::Accept() {
  acceptor->async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted) return;
    if (!ec) {
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      // A fixed 256 KiB send buffer (no autotuning up to tcp_wmem's 4 MiB): a client that stops
      // reading fills it and then the session's bounded queue within seconds, and costs the
      // kernel 256 KiB rather than megabytes meanwhile. Plenty for server-sent events.
      socket.set_option(net::socket_base::send_buffer_size(256 * 1024), ignored);
      if (tls_enabled) {
        std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(std::move(socket), CurrentTls(), *this)->Start();
      } else {
        std::make_shared<Session<beast::tcp_stream>>(std::move(socket), *this)->Start();
      }
    } else {
      spdlog::warn("api: accept failed: {}", ec.message());
    }
    Accept();
  });
}

ApiServer::ApiServer(RouterCore& core, const RouterConfig& config, const Tokenizer& tokenizer, RouterMetrics& metrics,
                     const ModelInfo& model, ApiKeys* keys)
    : impl_(std::make_unique<Impl>(core, config, tokenizer, metrics, model, keys)) {}

ApiServer::~ApiServer() { Stop(); }

absl::StatusOr<int> ApiServer::Start(const std::string& host, int port) {
  beast::error_code ec;
  const net::ip::address address = net::ip::make_address(host, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("router.listen_host: ", host, ": ", ec.message()));
  Impl& i = *impl_;
  if (!i.config.tls_cert_file.empty()) {
    absl::StatusOr<std::shared_ptr<net::ssl::context>> tls = i.MakeTlsContext();
    if (!tls.ok()) return tls.status();
    i.tls = *std::move(tls);
    i.tls_enabled = true;
    i.tls_mtime = i.TlsFilesMtime();
    i.tls_checked = std::chrono::steady_clock::now();
  }
  i.acceptor.emplace(i.ioc);
  const tcp::endpoint endpoint(address, static_cast<uint16_t>(port));
  if (i.acceptor->open(endpoint.protocol(), ec); ec) return absl::InternalError(absl::StrCat("api: open: ", ec.message()));
  i.acceptor->set_option(net::socket_base::reuse_address(true), ec);
  if (i.acceptor->bind(endpoint, ec); ec) {
    return absl::UnavailableError(absl::StrCat("router.api_port: cannot bind ", host, ":", port, ": ", ec.message()));
  }
  if (i.acceptor->listen(net::socket_base::max_listen_connections, ec); ec) {
    return absl::InternalError(absl::StrCat("api: listen: ", ec.message()));
  }
  const int bound = i.acceptor->local_endpoint().port();
  i.Accept();
  for (int t = 0; t < i.config.api_threads; ++t) i.threads.emplace_back([&i] { i.ioc.run(); });
  return bound;
}

void ApiServer::Stop() {
  Impl& i = *impl_;
  {
    std::lock_guard lock(i.gate->mu);
    i.gate->open = false;
  }
  if (i.acceptor) {
    beast::error_code ignored;
    i.acceptor->close(ignored);
  }
  i.ioc.stop();
  for (std::thread& t : i.threads) {
    if (t.joinable()) t.join();
  }
  i.threads.clear();
}

}  // namespace tailserve::http
