#include "server/http_server.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <cctype>
#include <chrono>
#include <ctime>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "server/auth.h"
#include "server/listener.h"
#include "server/max_tokens.h"
#include "server/metrics_text.h"
#include "server/openai_api.h"
#include "util/str_cat.h"
#include "util/utf8.h"

namespace kvmesh::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {
// A completion's finish_reason as the API names it (the scheduler's "eos" is OpenAI's "stop").
std::string FinishReason(const serving::Completion& c) {
  return c.stop_reason == "eos" ? "stop" : c.stop_reason;
}
}  // namespace

struct HttpServer::Impl {
  HttpOptions opts;
  EngineLoop& loop;
  const worker::Engine& engine;
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  asio::signal_set signals{io, SIGTERM, SIGINT};
  std::function<void()> on_signal;
  std::thread thread;
  // Prompts are tokenised here, off the io thread: a 2 MB prompt takes seconds, and every
  // connection would wait meanwhile. (Declared after io: destroyed, and joined, first.)
  asio::thread_pool tokenizing{2};
  std::atomic<uint64_t> next_id{1};
  std::mutex sessions_mu;
  std::set<std::shared_ptr<struct Session>> sessions;  // guarded by sessions_mu (io thread)
  bool shutting_down = false;                          // io thread
  // Responses sent, by status code (kvmesh:http_responses_total). Only the io thread writes
  // them; relaxed atomics so that a reader elsewhere (a test, a debugger) reads whole values.
  std::array<std::atomic<int64_t>, 600> responses{};

  Impl(const HttpOptions& o, EngineLoop& l, const worker::Engine& e)
      : opts(o), loop(l), engine(e) {}
  void Accept();
  void CountResponse(http::status status) {
    const auto code = static_cast<size_t>(status);
    if (code < responses.size()) responses[code].fetch_add(1, std::memory_order_relaxed);
  }
  ResponseCounts Responses() const {
    ResponseCounts counts;
    for (size_t code = 0; code < responses.size(); ++code) {
      const int64_t n = responses[code].load(std::memory_order_relaxed);
      if (n > 0) counts.emplace_back(static_cast<int>(code), n);
    }
    return counts;
  }
};

struct Session : std::enable_shared_from_this<Session> {
  HttpServer::Impl& srv;
  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  std::optional<http::request_parser<http::string_body>> parser;
  bool reading = false;
  // The generations in flight (owned by this connection): one per choice not yet ended.
  std::vector<serving::RequestId> requests;
  bool cancelled = false;
  // Raw writes (server-sent events): queued, one in flight.
  std::deque<std::string> out;
  bool writing = false, close_after_writes = false;
  bool closed_ = false;
  bool watching_ = false;  // a hang-up watch is pending (WatchForHangUp)

  Session(HttpServer::Impl& s, tcp::socket sock) : srv(s), stream(std::move(sock)) {}

  void Read() {
    if (srv.shutting_down) return Close();
    parser.emplace();
    parser->body_limit(srv.opts.max_body_bytes);
    parser->header_limit(static_cast<std::uint32_t>(srv.opts.max_header_bytes));
    stream.expires_after(srv.opts.timeout);
    reading = true;
    // The header first: a client that sent "Expect: 100-continue" waits for the interim reply
    // before it sends the body (curl does for bodies over 1 MB: ~1 s lost otherwise).
    http::async_read_header(
        stream, buffer, *parser, [self = shared_from_this()](beast::error_code ec, size_t) {
          if (ec) return self->OnRead(ec);
          const auto& h = self->parser->get();
          if (beast::iequals(h[http::field::expect], "100-continue") && !self->parser->is_done()) {
            auto cont = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
            return asio::async_write(self->stream, asio::buffer(*cont),
                                     [self, cont](beast::error_code e, size_t) {
                                       if (e) return self->OnRead(e);
                                       self->ReadBody();
                                     });
          }
          self->ReadBody();
        });
  }
  void ReadBody() {
    http::async_read(
        stream, buffer, *parser,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    reading = false;
    if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted || ec == asio::error::connection_reset) {
      return Close();
    }
    if (ec == http::error::body_limit) {
      return Reply(
          http::status::payload_too_large,
          ErrorJson(413, StrCat("request body exceeds ", srv.opts.max_body_bytes, " bytes")),
          false);
    }
    if (ec == http::error::header_limit) {
      return Reply(http::status::request_header_fields_too_large,
                   ErrorJson(431, "request headers too large"), false);
    }
    if (ec)
      return Reply(http::status::bad_request, ErrorJson(400, "malformed HTTP request"), false);
    stream.expires_never();
    Handle(parser->release());
  }

  void Reply(http::status status, std::string body, bool keep_alive,
             const char* type = "application/json") {
    srv.CountResponse(status);
    auto res = std::make_shared<http::response<http::string_body>>(status, 11);
    res->set(http::field::server, "kvmesh");
    res->set(http::field::content_type, type);
    res->keep_alive(keep_alive && !srv.shutting_down);
    res->body() = std::move(body);
    res->prepare_payload();
    stream.expires_after(srv.opts.timeout);
    http::async_write(stream, *res, [self = shared_from_this(), res](beast::error_code ec, size_t) {
      if (ec || !res->keep_alive()) return self->Close();
      self->Read();
    });
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream.socket().close(ignored);
    if (!cancelled) {
      for (serving::RequestId r : requests) srv.loop.Cancel(r);
    }
    cancelled = true;  // a submission still in flight is cancelled when its id arrives
    std::lock_guard<std::mutex> lock(srv.sessions_mu);
    srv.sessions.erase(shared_from_this());
  }

  // One watch at a time: a watch that outlives its request (it kept a pipelined request's
  // bytes, which the next read then parsed from the buffer) watches for the next request too;
  // two would race for the same bytes, and the loser would take "nothing to read" for a
  // hang-up.
  void WatchForHangUp() {
    if (watching_) return;
    watching_ = true;
    stream.socket().async_wait(
        tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
          self->watching_ = false;
          if (ec || self->closed_ || self->requests.empty()) return;
          beast::error_code e2;
          const size_t n = self->stream.socket().available(e2);
          // Readable with nothing to read: the peer closed.
          if (n == 0 || e2) return self->Close();
          // Bytes sent ahead (a pipelined request): kept for the next read, and the watch goes
          // on, up to a request's worth (beyond that the next read refuses them anyway).
          if (self->buffer.size() + n >
              self->srv.opts.max_header_bytes + self->srv.opts.max_body_bytes) {
            return;
          }
          const size_t got = self->stream.socket().read_some(self->buffer.prepare(n), e2);
          if (e2) return self->Close();
          self->buffer.commit(got);
          self->WatchForHangUp();
        });
  }

  // Raw bytes for a streamed response; the connection closes after the last one when asked.
  void Send(std::string data) {
    out.push_back(std::move(data));
    if (!writing) WriteNext();
  }
  // A stream's end: the [DONE] event, then the connection closes once it is written.
  void EndStream() {
    Send("data: [DONE]\n\n");
    close_after_writes = true;
    if (!writing) Close();
  }
  void WriteNext() {
    if (out.empty()) {
      writing = false;
      if (close_after_writes) Close();
      return;
    }
    writing = true;
    // Each write has its deadline; between writes (waiting for tokens) there is none.
    stream.expires_after(srv.opts.timeout);
    asio::async_write(stream, asio::buffer(out.front()),
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        // The client went away, or did not take this write within the timeout:
                        // stop generating for it.
                        if (ec) {
                          self->out.clear();
                          self->writing = false;
                          return self->Close();
                        }
                        self->stream.expires_never();
                        self->out.pop_front();
                        self->WriteNext();
                      });
  }

  void Handle(http::request<http::string_body> req) {
    std::string target(req.target());
    if (auto q = target.find('?'); q != std::string::npos) target.resize(q);
    const bool keep = req.keep_alive();
    if (target == "/health") {
      if (req.method() != http::verb::get) {
        return Reply(http::status::method_not_allowed, ErrorJson(405, "use GET"), keep);
      }
      return Reply(http::status::ok,
                   srv.loop.Snapshot().stopping ? R"({"status":"stopping"})" : R"({"status":"ok"})",
                   keep);
    }
    if (!srv.opts.api_key.empty()) {
      const auto field = req[http::field::authorization];
      std::string_view auth(field.data(), field.size());
      // The scheme is case-insensitive (RFC 9110 11.1); the key is compared in constant time.
      const bool bearer = auth.size() >= 7 &&
                          std::equal(auth.begin(), auth.begin() + 7, "bearer ", [](char a, char b) {
                            return std::tolower(static_cast<unsigned char>(a)) == b;
                          });
      if (!bearer || !ConstantTimeEquals(auth.substr(7), srv.opts.api_key)) {
        return Reply(http::status::unauthorized, ErrorJson(401, "missing or wrong API key"), keep);
      }
    }
    const std::string_view kModel = "/v1/models/";
    if (target == "/metrics" || target == "/v1/models" || target.starts_with(kModel)) {
      if (req.method() != http::verb::get) {
        return Reply(http::status::method_not_allowed, ErrorJson(405, "use GET"), keep);
      }
      if (target == "/metrics") {
        return Reply(http::status::ok,
                     PrometheusText(srv.loop.Snapshot(), srv.opts.model_name, srv.Responses()),
                     keep, "text/plain; version=0.0.4; charset=utf-8");
      }
      if (target != "/v1/models" && target.substr(kModel.size()) != srv.opts.model_name) {
        return Reply(http::status::not_found, ModelNotFound(target.substr(kModel.size())), keep);
      }
      return Reply(http::status::ok,
                   ModelsJson(srv.opts.model_name, srv.engine.ctx_size(), target == "/v1/models"),
                   keep);
    }
    if (target == "/v1/completions" || target == "/v1/chat/completions") {
      if (req.method() != http::verb::post) {
        return Reply(http::status::method_not_allowed, ErrorJson(405, "use POST"), keep);
      }
      return Generate(req.body(), target == "/v1/chat/completions", keep);
    }
    return Reply(http::status::not_found, ErrorJson(404, StrCat("no route ", target)), keep);
  }

  // vLLM's answer for a model this server does not serve.
  std::string ModelNotFound(std::string_view model) const {
    return ErrorJson(404, StrCat("The model `", model, "` does not exist."), "model");
  }

  void Generate(const std::string& body, bool chat, bool keep) {
    auto parsed = ParseApiRequest(
        body, chat,
        {.vocab_size = srv.engine.tokenizer().vocab_size(), .max_choices = srv.opts.max_choices});
    if (!parsed.ok()) {
      return Reply(http::status::bad_request,
                   ErrorJson(400, StatusText(parsed.status()), ParamOf(parsed.status())), false);
    }
    auto api = std::make_shared<ApiRequest>(std::move(*parsed));
    // No model, or the one served; responses name the one served.
    if (!api->model.empty() && api->model != srv.opts.model_name) {
      return Reply(http::status::not_found, ModelNotFound(api->model), keep);
    }
    api->model = srv.opts.model_name;
    const model::ChatTemplate* tmpl = srv.engine.chat_template();
    if (chat && tmpl == nullptr) {
      return Reply(http::status::bad_request, ErrorJson(400, "the model has no chat template"),
                   keep);
    }
    asio::post(srv.tokenizing, [self = shared_from_this(), api, chat, keep, tmpl] {
      const auto& tok = self->srv.engine.tokenizer();
      auto prompt = std::make_shared<std::vector<int32_t>>(
          chat ? tok.Encode(tmpl->Render(api->messages, true), /*parse_special=*/true)
          : api->prompt_ids.empty() ? tok.Encode(api->prompt, /*parse_special=*/true)
                                    : api->prompt_ids);
      asio::post(self->srv.io, [self, api, chat, keep, prompt] {
        if (!self->closed_) self->Start(api, std::move(*prompt), chat, keep);
      });
    });
  }

  void Start(std::shared_ptr<ApiRequest> api, std::vector<int32_t> prompt, bool chat, bool keep) {
    // In vLLM's words, which clients match to trim a conversation.
    const int64_t ctx = srv.engine.ctx_size(), prompt_len = static_cast<int64_t>(prompt.size());
    const int64_t room = ctx - prompt_len;
    const char* input = chat ? "messages" : "prompt";
    if (room <= 0) {
      return Reply(http::status::bad_request,
                   ErrorJson(400, ContextError(ctx, prompt_len, 0, input), input), false);
    }
    // Not given: what the context and the KV pool leave (a pool smaller than one context would
    // otherwise refuse every such request).
    const int64_t max_tokens = api->max_tokens.value_or(DefaultMaxTokens(srv.engine, prompt_len));
    if (max_tokens > room) {
      return Reply(http::status::bad_request,
                   ErrorJson(400, ContextError(ctx, prompt_len, max_tokens, input), input), false);
    }
    const std::string id = StrCat(chat ? "chatcmpl-" : "cmpl-", srv.next_id++);
    const int64_t created = static_cast<int64_t>(std::time(nullptr));
    const int choices = api->n;

    // One choice's state, touched only on this connection's (io) thread.
    struct Gen {
      std::string text, pending;
      bool first = true;
      std::vector<ApiLogprob> lps, pending_lps;  // all tokens' / not yet streamed
      // Stop sequences: text[0, sent) is streamed; the rest is held while it could still be
      // the start of one. stopped: one was found (text ends before it; the request finished
      // early).
      size_t sent = 0;
      bool stopped = false;
      int64_t tokens = 0;   // received so far; after a stop, those up to the one completing it
      size_t lp_chars = 0;  // characters of the tokens whose logprobs were streamed
      std::optional<serving::RequestId> request;  // accepted and not yet ended
      std::optional<serving::Completion> done;
      // A stream chunk of `delta` with the logprobs not yet streamed (text_offset counted on).
      std::string Chunk(const ApiRequest& api, const std::string& id, int64_t created,
                        const std::string& delta, const std::string& finish, int index) {
        const size_t at = lp_chars;
        for (const ApiLogprob& lp : pending_lps)
          lp_chars += TextOffsetOf(lp.text.value_or(lp.token));
        std::string out = StreamChunk(api, id, created, delta, finish, first,
                                      api.logprobs ? &pending_lps : nullptr, at, index);
        pending_lps.clear();
        first = false;
        return out;
      }
    };
    // The request's state: its choices, and how their submissions went. Choice 0 is submitted
    // first and the others once it is accepted, onto its replica (whose prefix cache will hold
    // the prompt); until then they wait in `queued`. A stream's chunks wait in `held` until
    // every choice is accepted (the response starts then: a choice refused before that is
    // answered with the refusal alone).
    struct Job {
      std::vector<Gen> gens;
      std::vector<std::pair<serving::Request, serving::Callbacks>> queued;
      int accepted = 0, ended = 0;
      bool refused = false, failed = false, started = false;
      std::vector<std::string> held;
    };
    auto job = std::make_shared<Job>();
    job->gens.resize(static_cast<size_t>(choices));
    auto self = shared_from_this();
    auto& io = srv.io;
    const auto& tok = srv.engine.tokenizer();
    auto send = [self, job](std::string chunk) {
      if (self->cancelled || job->refused || job->failed) return;
      if (job->started) {
        self->Send(std::move(chunk));
      } else {
        job->held.push_back(std::move(chunk));
      }
    };
    // Every choice has ended: the response, or the stream's last chunks.
    auto finish_all = [self, job, api, id, created, keep] {
      ApiUsage usage;
      std::vector<ApiChoice> out;
      for (Gen& g : job->gens) {
        const serving::Completion& c = *g.done;
        if (&g == &job->gens.front()) {  // the prompt counts once
          usage.prompt_tokens = c.prompt_tokens;
          usage.cached_tokens = c.cached_tokens;
        }
        usage.completion_tokens += static_cast<int64_t>(c.tokens.size());
        if (!c.tokens.empty() && (usage.engine_ttft_ms < 0 || c.ttft_ms < usage.engine_ttft_ms)) {
          usage.engine_ttft_ms = c.ttft_ms;  // the first token of any choice
        }
        out.push_back({g.text, FinishReason(c), api->logprobs ? &g.lps : nullptr});
      }
      if (api->stream) {
        if (api->include_usage) self->Send(StreamUsageChunk(*api, id, created, usage));
        return self->EndStream();
      }
      self->Reply(http::status::ok, CompletionJson(*api, id, created, out, usage), keep);
    };

    // A choice's submission result: false when the request is over for it (refused, failed,
    // the client gone), true when it runs on.
    auto accept = [self, job, api](int i, absl::StatusOr<serving::RequestId> got) {
      Gen& g = job->gens[i];
      if (!got.ok()) {
        ++job->ended;
        if (job->refused || job->failed) return false;
        job->refused = true;
        // The refusal closes the connection, and Close cancels the choices already running.
        const int code = absl::IsResourceExhausted(got.status()) ? 429
                         : absl::IsUnavailable(got.status())     ? 503
                                                                 : 400;
        self->Reply(static_cast<http::status>(code), ErrorJson(code, StatusText(got.status())),
                    false);
        return false;
      }
      g.request = *got;
      self->requests.push_back(*got);
      if (self->cancelled || job->refused || job->failed) {
        self->srv.loop.Cancel(*got);
        return false;
      }
      if (++job->accepted < static_cast<int>(job->gens.size())) return true;
      job->started = true;
      // No read is pending while a response is generated: watch the socket so a client that
      // hangs up stops its generation (and frees its KV blocks).
      self->WatchForHangUp();
      if (!api->stream) return true;
      self->srv.CountResponse(http::status::ok);
      self->Send(
          "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
          "Cache-Control: no-cache\r\nServer: kvmesh\r\n"
          "Connection: close\r\n\r\n");
      for (std::string& chunk : job->held) self->Send(std::move(chunk));
      job->held.clear();
      return true;
    };

    job->queued.resize(static_cast<size_t>(choices));
    for (int i = 0; i < choices; ++i) {
      serving::Request& r = job->queued[i].first;
      r.prompt = i + 1 < choices ? prompt : std::move(prompt);
      r.max_tokens = static_cast<int32_t>(max_tokens);
      r.sampling = api->sampling;
      r.sampling.seed += static_cast<uint64_t>(i);  // choices differ, and repeat with the seed
      r.ignore_eos = api->ignore_eos;
      r.session_id = api->session_id;
      r.logprobs = api->logprobs ? std::max(api->top_logprobs, 1) : 0;
      serving::Callbacks cb;
      if (api->logprobs) {
        cb.on_logprobs = [job, i, &io, &tok](serving::RequestId, const serving::TokenLogprobs& l) {
          ApiLogprob a{tok.TokenBytes(l.token, true), l.logprob, {}, tok.TokenBytes(l.token)};
          for (const auto& [t, lp] : l.top) a.top.emplace_back(tok.TokenBytes(t, true), lp);
          asio::post(io, [job, i, a = std::move(a)] {
            Gen& g = job->gens[i];
            if (g.stopped) return;  // a token after the stop sequence's
            g.lps.push_back(a);
            g.pending_lps.push_back(a);
          });
        };
      }
      cb.on_token = [self, job, api, id, created, i, send, &io, &tok](serving::RequestId,
                                                                      int32_t t) {
        std::string bytes = tok.TokenBytes(t);
        asio::post(io, [self, job, api, id, created, i, send, bytes = std::move(bytes)] {
          Gen& g = job->gens[i];
          if (g.stopped) return;
          ++g.tokens;
          g.pending += bytes;
          const size_t n = CompleteUtf8Prefix(g.pending);
          if (n == 0) return;
          g.text += g.pending.substr(0, n);
          g.pending.erase(0, n);
          size_t ready = g.text.size();  // what may be streamed now
          if (!api->stop.empty()) {
            // The earliest stop sequence in the text (it may begin in text already held back).
            size_t at = std::string::npos, longest = 0;
            for (const std::string& s : api->stop) {
              longest = std::max(longest, s.size());
              const size_t from = g.sent >= s.size() ? g.sent - s.size() + 1 : 0;
              at = std::min(at, g.text.find(s, from));
            }
            if (at != std::string::npos) {
              g.text.resize(at);
              g.pending.clear();
              g.stopped = true;
              ready = at;
              // Finished, not cancelled: counted as a success, the session recorded.
              if (g.request) self->srv.loop.FinishEarly(*g.request);
            } else {
              // Hold back what could begin a stop sequence, cut at a character boundary.
              ready = g.text.size() > longest - 1 ? g.text.size() - (longest - 1) : 0;
              ready =
                  std::max(g.sent, CompleteUtf8Prefix(std::string_view(g.text).substr(0, ready)));
            }
          }
          if (api->stream && ready > g.sent) {
            send(g.Chunk(*api, id, created, g.text.substr(g.sent, ready - g.sent), "", i));
          }
          g.sent = std::max(g.sent, ready);
        });
      };
      cb.on_done = [self, job, api, id, created, i, send, finish_all,
                    &io](const serving::Completion& c) {
        asio::post(io, [self, job, api, id, created, i, send, finish_all, c = c]() mutable {
          Gen& g = job->gens[i];
          if (g.request) std::erase(self->requests, *g.request);
          g.request.reset();
          ++job->ended;
          if (job->refused || job->failed || self->cancelled) return;
          if (g.stopped) {
            // Ended by a stop sequence: FinishEarly's OK completion, or a natural end that came
            // first; the tokens generated after the stop's are not the answer's.
            // Its answer is whole: an end that came after the stop (a cancel, the drain's
            // deadline) does not undo it.
            if (absl::IsCancelled(c.status) || absl::IsUnavailable(c.status)) {
              c.status = absl::OkStatus();
            }
            c.stop_reason = "eos";
            c.tokens.resize(std::min<size_t>(c.tokens.size(), static_cast<size_t>(g.tokens)));
          } else {
            g.text += g.pending;
          }
          if (!c.status.ok()) {
            job->failed = true;
            // A stream that has started reports the failure in it; before that (a choice
            // still waiting for its submission) the response is the error alone. Either
            // closes the connection, and Close cancels the other choices.
            // Cut off by the shutdown's deadline: 503, as a request refused while shutting down.
            const int code = absl::IsUnavailable(c.status) ? 503 : 500;
            if (!api->stream || !job->started) {
              return self->Reply(static_cast<http::status>(code),
                                 ErrorJson(code, StatusText(c.status)), false);
            }
            self->Send("data: " + ErrorJson(code, StatusText(c.status)) + "\n\n");
            return self->EndStream();
          }
          const std::string held = g.text.substr(std::min(g.sent, g.text.size()));
          const std::string finish = FinishReason(c);
          if (api->stream) send(g.Chunk(*api, id, created, held, finish, i));
          g.done = std::move(c);
          if (job->ended == static_cast<int>(job->gens.size())) {
            // A stream's last chunk waits for the start (every choice accepted).
            if (!api->stream || job->started) finish_all();
          }
        });
      };
      job->queued[i].second = std::move(cb);
    }
    // Choice 0 now; once it is accepted, the others beside it. (Until they are submitted their
    // callbacks, which hold the job, wait in it: cleared on every path that does not submit them.)
    auto [r0, cb0] = std::move(job->queued[0]);
    srv.loop.Submit(std::move(r0), std::move(cb0),
                    [self, job, accept, &io](absl::StatusOr<serving::RequestId> got) {
                      asio::post(io, [self, job, accept, &io, got] {
                        if (!accept(0, got)) {
                          job->queued.clear();
                          return;
                        }
                        for (size_t i = 1; i < job->queued.size(); ++i) {
                          auto [r, cb] = std::move(job->queued[i]);
                          r.replica_of = *got;
                          self->srv.loop.Submit(
                              std::move(r), std::move(cb),
                              [accept, i, &io](absl::StatusOr<serving::RequestId> got_i) {
                                asio::post(
                                    io, [accept, i, got_i] { accept(static_cast<int>(i), got_i); });
                              });
                        }
                        job->queued.clear();
                      });
                    });
  }
};

void HttpServer::Impl::Accept() {
  AcceptLoop(
      acceptor, [this] { return shutting_down; },
      [this](tcp::socket sock) {
        auto s = std::make_shared<Session>(*this, std::move(sock));
        {
          std::lock_guard<std::mutex> lock(sessions_mu);
          sessions.insert(s);
        }
        s->Read();
      });
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpOptions& opts,
                                                              EngineLoop& loop,
                                                              const worker::Engine& engine) {
  auto impl = std::make_unique<Impl>(opts, loop, engine);
  if (auto s = Listen(impl->acceptor, opts.host, opts.port, ""); !s.ok()) return s;
  Impl* p = impl.get();
  p->signals.async_wait([p](beast::error_code e, int) {
    if (!e && p->on_signal) p->on_signal();
  });
  p->Accept();
  p->thread = std::thread([p] { p->io.run(); });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

uint16_t HttpServer::port() const { return impl_->acceptor.local_endpoint().port(); }

void HttpServer::OnSignal(std::function<void()> fn) {
  asio::post(impl_->io, [p = impl_.get(), fn = std::move(fn)] { p->on_signal = fn; });
}

void HttpServer::Shutdown() {
  Impl* p = impl_.get();
  if (!p->thread.joinable()) return;
  asio::post(p->io, [p] {
    p->shutting_down = true;
    beast::error_code ignored;
    p->acceptor.close(ignored);
    p->signals.cancel(ignored);
    std::vector<std::shared_ptr<Session>> idle;
    {
      std::lock_guard<std::mutex> lock(p->sessions_mu);
      for (const auto& s : p->sessions) {
        if (s->reading) idle.push_back(s);
      }
    }
    for (auto& s : idle) s->Close();
  });
  // In-flight responses finish on their own (their sessions then close); wait for them, but not
  // forever.
  WaitUntil(
      [p] {
        std::lock_guard<std::mutex> lock(p->sessions_mu);
        return p->sessions.empty();
      },
      std::chrono::seconds(5));
  p->io.stop();
  p->thread.join();
}

HttpServer::~HttpServer() {
  if (impl_ && impl_->thread.joinable()) Shutdown();
}

}  // namespace kvmesh::server
