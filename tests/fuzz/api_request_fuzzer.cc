// libFuzzer target: bytes from a client as the HTTP server reads them — Beast's request parser
// with the server's limits, then the OpenAI request body parser, then the response builders
// with whatever text came in. Must never crash, hang or trip a sanitizer.
#include <boost/beast/http.hpp>
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/openai_api.h"

namespace http = boost::beast::http;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  http::request_parser<http::string_body> parser;
  parser.body_limit(64 << 10);
  parser.header_limit(8 << 10);
  boost::beast::error_code ec;
  size_t used = 0;
  while (used < size && !parser.is_done()) {
    const size_t n = parser.put(boost::asio::buffer(data + used, size - used), ec);
    if (ec == http::error::need_more) break;
    if (ec) return 0;
    if (n == 0) break;
    used += n;
  }
  if (!parser.is_done()) {
    parser.put_eof(ec);
    if (ec || !parser.is_done()) return 0;
  }
  const auto& req = parser.get();
  const bool chat = req.target().find("chat") != boost::beast::string_view::npos;
  auto r = kvmesh::server::ParseApiRequest(req.body(), chat, {});
  if (!r.ok()) return 0;
  const std::string text = chat && !r->messages.empty() ? r->messages.back().content : r->prompt;
  const std::vector<kvmesh::server::ApiChoice> choices(r->n, {text, "stop"});
  (void)kvmesh::server::CompletionJson(*r, "id", 0, choices, {1, 2, 3});
  (void)kvmesh::server::StreamChunk(*r, "id", 0, text, "", true, nullptr, 0, r->n - 1);
  (void)kvmesh::server::ErrorJson(400, text);
  return 0;
}
