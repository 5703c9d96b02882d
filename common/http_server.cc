#include "common/http_server.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/metrics.h"

namespace tailserve {
namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

}  // namespace

struct ObservabilityServer::Impl {
  Impl(const Registry& r, Probes p) : registry(r), probes(std::move(p)) {}
  const Registry& registry;
  const Probes probes;
  std::atomic<int> connections{0};  // before ioc: the sessions it still holds at destruction count down
  net::io_context ioc;
  std::optional<tcp::acceptor> acceptor;
  std::thread thread;

  void Accept();
  bhttp::response<bhttp::string_body> Answer(const bhttp::request<bhttp::empty_body>& req) const;
};

namespace {

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, ObservabilityServer::Impl& srv) : stream_(std::move(socket)), srv_(srv) {
    ++srv_.connections;
  }
  ~Session() { --srv_.connections; }

  void Read() {
    parser_.emplace();
    parser_->header_limit(8 * 1024);
    parser_->body_limit(0);  // GETs only
    // The whole request within the deadline, however slowly its bytes come.
    stream_.expires_after(ObservabilityServer::kRequestDeadline);
    bhttp::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->Close();
      self->Respond(self->parser_->release());
    });
  }

 private:
  void Respond(const bhttp::request<bhttp::empty_body>& req) {
    response_ = srv_.Answer(req);
    response_.keep_alive(req.keep_alive());
    response_.prepare_payload();
    stream_.expires_after(ObservabilityServer::kRequestDeadline);
    bhttp::async_write(stream_, response_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec || !self->response_.keep_alive()) return self->Close();
      self->Read();
    });
  }
  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  beast::tcp_stream stream_;
  ObservabilityServer::Impl& srv_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::empty_body>> parser_;
  bhttp::response<bhttp::string_body> response_;
};

}  // namespace

bhttp::response<bhttp::string_body> ObservabilityServer::Impl::Answer(const bhttp::request<bhttp::empty_body>& req) const {
  bhttp::response<bhttp::string_body> res;
  res.version(req.version());
  res.set(bhttp::field::content_type, "text/plain");
  std::string path(req.target());
  if (const size_t q = path.find('?'); q != std::string::npos) path.resize(q);
  auto probe = [&](const std::function<absl::Status()>& fn, const char* ok, const char* not_ok) {
    const absl::Status s = fn ? fn() : absl::OkStatus();
    res.result(s.ok() ? bhttp::status::ok : bhttp::status::service_unavailable);
    res.body() = s.ok() ? absl::StrCat(ok, "\n") : absl::StrCat(not_ok, ": ", s.message(), "\n");
  };
  if (req.method() != bhttp::verb::get) {
    res.result(bhttp::status::method_not_allowed);
    res.body() = "use GET\n";
  } else if (path == "/metrics") {
    res.result(bhttp::status::ok);
    res.set(bhttp::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
    res.body() = registry.Serialize();
  } else if (path == "/healthz") {
    probe(probes.live, "ok", "not live");
  } else if (path == "/readyz") {
    probe(probes.ready, "ready", "not ready");
  } else {
    res.result(bhttp::status::not_found);
    res.body() = "not found\n";
  }
  return res;
}

void ObservabilityServer::Impl::Accept() {
  acceptor->async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted) return;
    if (!ec) {
      if (connections.load() >= kMaxConnections) {
        beast::error_code ignored;
        socket.close(ignored);
      } else {
        std::make_shared<Session>(std::move(socket), *this)->Read();
      }
    } else {
      // Out of descriptors (EMFILE) and the like: keep accepting after a pause rather than stop for good.
      spdlog::warn("http: accept: {}", ec.message());
      auto timer = std::make_shared<net::steady_timer>(ioc, std::chrono::milliseconds(100));
      timer->async_wait([this, timer](beast::error_code) { Accept(); });
      return;
    }
    Accept();
  });
}

ObservabilityServer::ObservabilityServer(const Registry& registry, Probes probes)
    : impl_(std::make_unique<Impl>(registry, std::move(probes))) {}

ObservabilityServer::~ObservabilityServer() { Stop(); }

absl::StatusOr<int> ObservabilityServer::Start(const std::string& host, int port) {
  beast::error_code ec;
  const net::ip::address address = net::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("cannot bind HTTP ", host, ":", port, ": ", ec.message()));
  Impl& i = *impl_;
  i.acceptor.emplace(i.ioc);
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(port));
  i.acceptor->open(endpoint.protocol(), ec);
  if (!ec) i.acceptor->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) i.acceptor->bind(endpoint, ec);
  if (!ec) i.acceptor->listen(net::socket_base::max_listen_connections, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot bind HTTP ", host, ":", port, ": ", ec.message()));
  const int bound = i.acceptor->local_endpoint().port();
  i.Accept();
  i.thread = std::thread([&i] { i.ioc.run(); });
  return bound;
}

void ObservabilityServer::Stop() {
  if (!impl_->thread.joinable()) return;
  impl_->ioc.stop();
  impl_->thread.join();
}

}  // namespace tailserve
