// What the HTTP and RPC servers share about their listening socket: opening it, the accept loop
// and waiting for open connections to drain at shutdown.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace kvmesh::server {

// Opens `acceptor` on host:port (address reuse on) and listens. InvalidArgument if host is not
// an IP address; Unavailable ("cannot listen on host:port<what>: ...") if the port is taken.
absl::Status Listen(boost::asio::ip::tcp::acceptor& acceptor, const std::string& host,
                    uint16_t port, std::string_view what);

// Accepts connections on the acceptor's executor, handing each socket to on_conn, until the
// acceptor is closed or stopping() is true. A failed accept (out of descriptors) is retried
// after 100 ms instead of spinning.
void AcceptLoop(boost::asio::ip::tcp::acceptor& acceptor, std::function<bool()> stopping,
                std::function<void(boost::asio::ip::tcp::socket)> on_conn);

// Polls done() every 10 ms until it is true or `limit` has passed.
void WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds limit);

}  // namespace kvmesh::server
