#include "server/rpc_client.h"

#include <boost/asio.hpp>
#include <optional>

#include "server/rpc_frame.h"
#include "util/str_cat.h"

namespace kvmesh::server {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

struct RpcClient::Impl {
  asio::io_context io;
  tcp::socket sock{io};
  FrameDecoder decoder;
  uint64_t next_id = 1;
};

RpcClient::RpcClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RpcClient::~RpcClient() = default;

absl::StatusOr<std::unique_ptr<RpcClient>> RpcClient::Connect(const std::string& host,
                                                              uint16_t port,
                                                              const std::string& api_key) {
  auto impl = std::make_unique<Impl>();
  boost::system::error_code ec;
  tcp::resolver resolver(impl->io);
  auto eps = resolver.resolve(host, std::to_string(port), ec);
  if (!ec) asio::connect(impl->sock, eps, ec);
  if (ec)
    return absl::UnavailableError(
        StrCat("cannot connect to ", host, ":", port, ": ", ec.message()));
  std::unique_ptr<RpcClient> c(new RpcClient(std::move(impl)));
  if (!api_key.empty()) {
    kvmesh::v1::Frame f;
    f.mutable_auth()->set_api_key(api_key);
    const std::string bytes = EncodeFrame(f);
    asio::write(c->impl_->sock, asio::buffer(bytes), ec);
    if (ec) return absl::UnavailableError(StrCat("cannot send to ", host, ":", port));
  }
  return c;
}

absl::StatusOr<kvmesh::v1::Frame> RpcClient::Receive() {
  for (;;) {
    auto f = impl_->decoder.Next();
    if (!f.ok()) return f.status();
    if (f->has_value()) {
      if ((*f)->has_error()) {
        return absl::Status(static_cast<absl::StatusCode>((*f)->error().code()),
                            (*f)->error().message());
      }
      return std::move(**f);
    }
    char buf[16 << 10];
    boost::system::error_code ec;
    const size_t n = impl_->sock.read_some(asio::buffer(buf), ec);
    if (ec) return absl::UnavailableError(StrCat("connection closed: ", ec.message()));
    impl_->decoder.Feed(buf, n);
  }
}

absl::StatusOr<kvmesh::v1::Frame> RpcClient::Call(kvmesh::v1::Frame request) {
  request.set_request_id(impl_->next_id++);
  const std::string bytes = EncodeFrame(request);
  boost::system::error_code ec;
  asio::write(impl_->sock, asio::buffer(bytes), ec);
  if (ec) return absl::UnavailableError(StrCat("send failed: ", ec.message()));
  return Receive();
}

absl::StatusOr<kvmesh::v1::Done> RpcClient::Stream(
    kvmesh::v1::Frame request, const std::function<bool(const kvmesh::v1::Token&)>& on_token) {
  std::vector<kvmesh::v1::Frame> one;
  one.push_back(std::move(request));
  auto done = StreamAll(
      std::move(one), [&](size_t, const kvmesh::v1::Token& t) { return !on_token || on_token(t); });
  if (!done.ok()) return done.status();
  return std::move(done->front());
}

absl::StatusOr<std::vector<kvmesh::v1::Done>> RpcClient::StreamAll(
    std::vector<kvmesh::v1::Frame> requests,
    const std::function<bool(size_t, const kvmesh::v1::Token&)>& on_token) {
  const uint64_t first = impl_->next_id;
  std::string bytes;
  for (kvmesh::v1::Frame& r : requests) {
    r.set_request_id(impl_->next_id++);
    bytes += EncodeFrame(r);
  }
  boost::system::error_code ec;
  asio::write(impl_->sock, asio::buffer(bytes), ec);
  if (ec) return absl::UnavailableError(StrCat("send failed: ", ec.message()));
  std::vector<std::optional<kvmesh::v1::Done>> done(requests.size());
  std::vector<bool> cancelled(requests.size(), false);
  for (size_t left = requests.size(); left > 0;) {
    auto f = Receive();
    if (!f.ok()) return f.status();
    if (f->request_id() < first || f->request_id() >= first + requests.size()) continue;
    const size_t i = f->request_id() - first;
    if (f->has_done() && !done[i]) {
      done[i] = f->done();
      --left;
    } else if (f->has_token() && !cancelled[i] && on_token && !on_token(i, f->token())) {
      cancelled[i] = true;
      kvmesh::v1::Frame c;
      c.set_request_id(f->request_id());
      c.mutable_cancel();
      const std::string cancel = EncodeFrame(c);
      asio::write(impl_->sock, asio::buffer(cancel), ec);
      if (ec) return absl::UnavailableError("send failed");
    }
  }
  std::vector<kvmesh::v1::Done> out;
  for (auto& d : done) out.push_back(std::move(*d));
  return out;
}

}  // namespace kvmesh::server
