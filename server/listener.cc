#include "server/listener.h"

#include <boost/asio/steady_timer.hpp>
#include <memory>
#include <thread>

#include "util/str_cat.h"

namespace kvmesh::server {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

absl::Status Listen(tcp::acceptor& acceptor, const std::string& host, uint16_t port,
                    std::string_view what) {
  boost::system::error_code ec;
  const auto addr = asio::ip::make_address(host, ec);
  if (ec) return absl::InvalidArgumentError(StrCat("--host '", host, "' is not an IP address"));
  const tcp::endpoint ep(addr, port);
  acceptor.open(ep.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(ep, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(
        StrCat("cannot listen on ", host, ":", port, what, ": ", ec.message()));
  }
  return absl::OkStatus();
}

void AcceptLoop(tcp::acceptor& acceptor, std::function<bool()> stopping,
                std::function<void(tcp::socket)> on_conn) {
  acceptor.async_accept([&acceptor, stopping = std::move(stopping), on_conn = std::move(on_conn)](
                            boost::system::error_code ec, tcp::socket sock) mutable {
    if (ec) {
      if (ec == asio::error::operation_aborted || stopping()) return;
      auto t = std::make_shared<asio::steady_timer>(acceptor.get_executor(),
                                                    std::chrono::milliseconds(100));
      t->async_wait([&acceptor, t, stopping, on_conn](boost::system::error_code) mutable {
        AcceptLoop(acceptor, std::move(stopping), std::move(on_conn));
      });
      return;
    }
    on_conn(std::move(sock));
    AcceptLoop(acceptor, std::move(stopping), std::move(on_conn));
  });
}

void WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace kvmesh::server
