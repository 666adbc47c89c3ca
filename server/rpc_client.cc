#include "server/rpc_client.h"

#include <boost/asio.hpp>

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
  const uint64_t id = impl_->next_id;
  auto first = Call(std::move(request));
  bool cancelled = false;
  for (absl::StatusOr<kvmesh::v1::Frame> f = std::move(first);; f = Receive()) {
    if (!f.ok()) return f.status();
    if (f->request_id() != id) continue;
    if (f->has_done()) return f->done();
    if (f->has_token() && !cancelled && on_token && !on_token(f->token())) {
      cancelled = true;
      kvmesh::v1::Frame c;
      c.set_request_id(id);
      c.mutable_cancel();
      const std::string bytes = EncodeFrame(c);
      boost::system::error_code ec;
      asio::write(impl_->sock, asio::buffer(bytes), ec);
      if (ec) return absl::UnavailableError("send failed");
    }
  }
}

}  // namespace kvmesh::server
