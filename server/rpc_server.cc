#include "server/rpc_server.h"

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "model/shard.h"
#include "server/auth.h"
#include "server/listener.h"
#include "server/max_tokens.h"
#include "server/rpc_frame.h"
#include "server/rpc_sampling.h"
#include "util/str_cat.h"
#include "util/utf8.h"

namespace kvmesh::server {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
namespace v1 = kvmesh::v1;

struct RpcConn;
constexpr size_t kMaxQueuedBytes = 8 << 20;  // per connection, before reading pauses
constexpr size_t kMaxSessions = 1024;
// Before authentication only small frames (an Auth frame is tens of bytes): a client without the
// key cannot make the server hold megabytes.
constexpr size_t kMaxFrameBytesBeforeAuth = 64 << 10;

struct RpcServer::Impl {
  RpcOptions opts;
  EngineLoop& loop;
  const worker::Engine& engine;
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  std::thread thread;
  // Prompts are tokenised here, off the io thread (a 4 MiB prompt takes seconds; the io thread
  // keeps serving every connection meanwhile). Declared after io: joined before io goes.
  asio::thread_pool tokenizing{2};
  std::mutex conns_mu;
  std::set<std::shared_ptr<RpcConn>> conns;  // guarded by conns_mu
  bool shutting_down = false;                // io thread
  // Server-side sessions: their conversations (io thread only). `opened` numbers each
  // session_open, so a turn finishing after its session was reopened (or closed) does not join
  // the new conversation; `last_use` orders them for eviction when the table is full.
  struct Session {
    std::vector<model::ChatMessage> messages;
    uint64_t opened = 0, last_use = 0;
  };
  std::map<std::string, Session> sessions;
  uint64_t session_clock = 0;
  std::set<std::string> busy_sessions;  // with a turn in flight (io thread)

  Impl(const RpcOptions& o, EngineLoop& l, const worker::Engine& e) : opts(o), loop(l), engine(e) {}
  void Accept();
  v1::ClusterStatus Status() const;
};

struct RpcConn : std::enable_shared_from_this<RpcConn> {
  RpcServer::Impl& srv;
  tcp::socket sock;
  FrameDecoder decoder;
  char rbuf[16 << 10];
  bool authed;
  bool closed = false;
  std::deque<std::string> out;
  bool writing = false, close_after_writes = false;
  // Client request id -> engine request id (0 until the engine accepted it).
  std::map<uint64_t, serving::RequestId> live;
  std::set<uint64_t> cancel_pending;  // cancelled before the engine accepted them
  size_t out_bytes = 0;               // queued, not yet written
  bool read_paused = false;           // the client is not reading its replies
  asio::steady_timer frame_deadline;  // armed while a frame is partly received
  asio::steady_timer auth_deadline;   // with a key: the Auth frame must come within the timeout
  asio::steady_timer write_deadline;  // armed while a write is pending
  uint64_t writes = 0;                // writes begun (which one the write deadline is for)
  bool deadline_armed = false;
  uint64_t frames_in = 0;  // complete frames received
  int tokenize_jobs = 0;   // tokenize requests not yet answered

  RpcConn(RpcServer::Impl& s, tcp::socket k)
      : srv(s),
        sock(std::move(k)),
        decoder(s.opts.api_key.empty()
                    ? s.opts.max_frame_bytes
                    : std::min(s.opts.max_frame_bytes, kMaxFrameBytesBeforeAuth)),
        authed(s.opts.api_key.empty()),
        frame_deadline(s.io),
        auth_deadline(s.io),
        write_deadline(s.io) {}

  // Starts reading; with an API key, a client that has sent nothing within the frame timeout is
  // failed and closed (an idle connection would otherwise be held forever, at no cost to it).
  void Start() {
    if (!authed) {
      auth_deadline.expires_after(srv.opts.frame_timeout);
      auth_deadline.async_wait([self = shared_from_this()](boost::system::error_code ec) {
        // A frame partly received is the frame deadline's (the first complete frame either
        // authenticates or fails the connection).
        if (ec || self->closed || self->authed || self->decoder.buffered() > 0) return;
        self->Fail(0, absl::UnauthenticatedError(StrCat(
                          "no Auth frame within ", self->srv.opts.frame_timeout.count(), " s")));
      });
    }
    Read();
  }

  // Fails the connection if, when it fires, a frame is still partly received and no frame has
  // completed since it was armed (while reading is paused for back-pressure, it waits again).
  void ArmFrameDeadline() {
    deadline_armed = true;
    frame_deadline.expires_after(srv.opts.frame_timeout);
    frame_deadline.async_wait(
        [self = shared_from_this(), seen = frames_in](boost::system::error_code ec) {
          self->deadline_armed = false;
          if (ec || self->closed || self->decoder.buffered() == 0) return;
          if (self->read_paused || self->frames_in != seen) return self->ArmFrameDeadline();
          self->Fail(
              0, absl::DeadlineExceededError(StrCat("a frame was not completed within ",
                                                    self->srv.opts.frame_timeout.count(), " s")));
          // The error goes out after the replies queued before it; a client that reads none of
          // them would keep the connection (and its partial frame): closed after 5 s regardless.
          if (self->closed) return;
          self->frame_deadline.expires_after(std::chrono::seconds(5));
          self->frame_deadline.async_wait([self](boost::system::error_code e) {
            if (!e) self->Close();
          });
        });
  }

  void Read() {
    sock.async_read_some(asio::buffer(rbuf),
                         [self = shared_from_this()](boost::system::error_code ec, size_t n) {
                           self->OnRead(ec, n);
                         });
  }
  void OnRead(boost::system::error_code ec, size_t n) {
    if (ec) return Close();
    if (close_after_writes) return;  // failed: nothing more is read (or re-armed)
    decoder.Feed(rbuf, n);
    for (;;) {
      auto f = decoder.Next();
      if (!f.ok()) return Fail(0, f.status());
      if (!f->has_value()) break;
      ++frames_in;
      Handle(**f);
      if (closed || close_after_writes) return;
    }
    if (decoder.buffered() > 0 && !deadline_armed) ArmFrameDeadline();
    // Back-pressure: a client that does not read its replies stops being read.
    if (out_bytes > kMaxQueuedBytes) {
      read_paused = true;
      return;
    }
    Read();
  }

  void Send(const v1::Frame& f) {
    if (closed) return;
    out.push_back(EncodeFrame(f));
    out_bytes += out.back().size();
    if (!writing) WriteNext();
  }
  void WriteNext() {
    if (out.empty()) {
      writing = false;
      if (close_after_writes || (srv.shutting_down && live.empty())) Close();
      return;
    }
    writing = true;
    // A client that has not taken a frame within the frame timeout is gone: the connection
    // closes and its requests are cancelled (else they ran on, their replies queued for good).
    const uint64_t write = ++writes;
    write_deadline.expires_after(srv.opts.frame_timeout);
    write_deadline.async_wait([self = shared_from_this(), write](boost::system::error_code ec) {
      if (!ec && self->writing && self->writes == write) self->Close();
    });
    asio::async_write(sock, asio::buffer(out.front()),
                      [self = shared_from_this()](boost::system::error_code ec, size_t) {
                        self->write_deadline.cancel();
                        if (ec) return self->Close();
                        self->out_bytes -= self->out.front().size();
                        self->out.pop_front();
                        if (self->read_paused && self->out_bytes < kMaxQueuedBytes / 4) {
                          self->read_paused = false;
                          self->Read();
                        }
                        self->WriteNext();
                      });
  }

  void Error(uint64_t id, const absl::Status& s) {
    v1::Frame f;
    f.set_request_id(id);
    f.mutable_error()->set_code(static_cast<int>(s.code()));
    f.mutable_error()->set_message(StatusText(s));
    Send(f);
  }
  // A protocol error: say why, then close.
  void Fail(uint64_t id, const absl::Status& s) {
    Error(id, s);
    close_after_writes = true;
    if (!writing) Close();
  }

  void Close() {
    if (closed) return;
    closed = true;
    frame_deadline.cancel();
    auth_deadline.cancel();
    write_deadline.cancel();
    boost::system::error_code ignored;
    sock.shutdown(tcp::socket::shutdown_both, ignored);
    sock.close(ignored);
    for (const auto& [cid, eid] : live) {
      if (eid != 0) srv.loop.Cancel(eid);
    }
    std::lock_guard<std::mutex> lock(srv.conns_mu);
    srv.conns.erase(shared_from_this());
  }

  void Handle(const v1::Frame& f) {
    const uint64_t id = f.request_id();
    if (!authed) {
      if (f.has_auth() && ConstantTimeEquals(f.auth().api_key(), srv.opts.api_key)) {
        authed = true;
        decoder.set_max_frame_bytes(srv.opts.max_frame_bytes);
        return;
      }
      return Fail(id, absl::UnauthenticatedError("the first frame must be Auth with the API key"));
    }
    v1::Frame r;
    r.set_request_id(id);
    switch (f.body_case()) {
      case v1::Frame::kAuth:
        return;  // already authenticated (or no key): ignore
      case v1::Frame::kHealth:
        r.mutable_healthy()->set_status(srv.loop.Snapshot().stopping ? "stopping" : "ok");
        return Send(r);
      case v1::Frame::kTokenize: {  // off the io thread, as a prompt
        // Counted with the generations: unbounded, a client pipelining 4 MiB texts held their
        // copies without limit and queued every connection's prompts behind them.
        if (Busy()) return Error(id, TooBusy());
        ++tokenize_jobs;
        asio::post(srv.tokenizing,
                   [self = shared_from_this(), r = std::move(r), text = f.tokenize().text(),
                    special = f.tokenize().parse_special()]() mutable {
                     for (int32_t t : self->srv.engine.tokenizer().Encode(text, special)) {
                       r.mutable_tokenized()->add_ids(t);
                     }
                     asio::post(self->srv.io, [self, r = std::move(r)] {
                       --self->tokenize_jobs;
                       self->Send(r);
                     });
                   });
        return;
      }
      case v1::Frame::kClusterStatus:
        *r.mutable_cluster() = srv.Status();
        return Send(r);
      case v1::Frame::kCacheStats: {
        const auto st = srv.loop.Snapshot().stats;
        v1::CacheStats* c = r.mutable_cache();
        c->set_prefix_query_tokens(st.prefix_query_tokens);
        c->set_prefix_hit_tokens(st.prefix_hit_tokens);
        c->set_blocks_total(st.blocks_total);
        c->set_blocks_used(st.blocks_used);
        c->set_blocks_cached(st.blocks_cached);
        c->set_blocks_free(st.blocks_free);
        c->set_evictions(st.evictions);
        c->set_preemptions(st.preemptions);
        c->set_running(st.running);
        c->set_waiting(st.waiting);
        c->set_sessions(st.sessions);
        c->set_generated_tokens(st.generated_tokens);
        return Send(r);
      }
      case v1::Frame::kCancel: {
        auto it = live.find(id);
        if (it == live.end()) return;
        if (it->second != 0) {
          srv.loop.Cancel(it->second);
        } else {
          cancel_pending.insert(id);  // cancelled when the engine's id arrives
        }
        return;
      }
      case v1::Frame::kSessionOpen: {
        const auto& o = f.session_open();
        if (o.session_id().empty())
          return Error(id, absl::InvalidArgumentError("session_id is empty"));
        if (!srv.sessions.count(o.session_id()) && srv.sessions.size() >= kMaxSessions) {
          // Full: the least recently used session without a turn in flight goes (as the
          // engine keeps its sessions), so clients that never close cannot lock others out.
          auto lru = srv.sessions.end();
          for (auto j = srv.sessions.begin(); j != srv.sessions.end(); ++j) {
            if (!srv.busy_sessions.count(j->first) &&
                (lru == srv.sessions.end() || j->second.last_use < lru->second.last_use)) {
              lru = j;
            }
          }
          if (lru == srv.sessions.end()) {
            return Error(
                id, absl::ResourceExhaustedError(StrCat("too many open sessions (", kMaxSessions,
                                                        "), all with a turn in flight")));
          }
          srv.loop.DropSession(lru->first);
          srv.sessions.erase(lru);
        }
        auto& ss = srv.sessions[o.session_id()];
        ss.opened = ss.last_use = ++srv.session_clock;
        auto& msgs = ss.messages;
        msgs.clear();
        if (!o.system().empty()) msgs.push_back({"system", o.system()});
        r.mutable_session()->set_session_id(o.session_id());
        r.mutable_session()->set_messages(static_cast<int32_t>(msgs.size()));
        return Send(r);
      }
      case v1::Frame::kSessionClose: {
        const std::string sid = f.session_close().session_id();
        if (srv.sessions.erase(sid) == 0) {
          return Error(id, absl::NotFoundError(StrCat("no session '", sid, "'")));
        }
        srv.loop.DropSession(sid);
        r.mutable_session()->set_session_id(sid);
        return Send(r);
      }
      case v1::Frame::kSessionAppend: {
        const auto& a = f.session_append();
        auto it = srv.sessions.find(a.session_id());
        if (it == srv.sessions.end()) {
          return Error(
              id, absl::NotFoundError(StrCat("no session '", a.session_id(), "' (open it first)")));
        }
        if (srv.busy_sessions.count(a.session_id())) {
          return Error(id, absl::FailedPreconditionError(StrCat("session '", a.session_id(),
                                                                "' already has a turn in flight")));
        }
        // The turn joins the conversation only once it has completed (see Generate).
        it->second.last_use = ++srv.session_clock;
        v1::GenerateRequest g;
        for (const auto& m : it->second.messages) {
          auto* cm = g.add_messages();
          cm->set_role(m.role);
          cm->set_content(m.content);
        }
        auto* um = g.add_messages();
        um->set_role("user");
        um->set_content(a.user());
        g.set_max_tokens(a.max_tokens());
        *g.mutable_sampling() = a.sampling();
        g.set_session_id(a.session_id());
        return Generate(id, g, a.session_id(), it->second.opened);
      }
      case v1::Frame::kGenerate:
        return Generate(id, f.generate(), "", 0);
      case v1::Frame::BODY_NOT_SET:  // also a body this server does not know (a newer client's)
        return Error(id, absl::UnimplementedError("frame has no request body this server knows"));
      default:  // a reply body (token, done, ...) sent by a client: answered, the connection kept
        return Error(id, absl::InvalidArgumentError("unexpected frame type from a client"));
    }
  }

  // Streams Token frames, then Done; `session` (non-empty) gets the answer appended if it is
  // still the conversation opened as `opened`.
  void Generate(uint64_t id, const v1::GenerateRequest& g, const std::string& session,
                uint64_t opened) {
    if (live.count(id))
      return Error(id, absl::InvalidArgumentError(StrCat("request id ", id, " is in flight")));
    if (Busy()) return Error(id, TooBusy());
    const model::ChatTemplate* tmpl = nullptr;
    std::vector<model::ChatMessage> msgs;
    if (g.messages_size() > 0) {
      tmpl = srv.engine.chat_template();
      if (tmpl == nullptr)
        return Error(id, absl::InvalidArgumentError("the model has no chat template"));
      for (const auto& m : g.messages()) {
        if (m.role() != "system" && m.role() != "user" && m.role() != "assistant") {
          return Error(id, absl::InvalidArgumentError(
                               StrCat("role '", m.role(), "' is not system, user or assistant")));
        }
        msgs.push_back({m.role(), m.content()});
      }
    }
    if (g.max_tokens() < 0) {
      return Error(
          id, absl::InvalidArgumentError(StrCat(
                  "max_tokens must be >= 0 (0: what the context leaves), not ", g.max_tokens())));
    }
    auto sampling = SamplingFromProto(g.sampling());
    if (!sampling.ok()) return Error(id, sampling.status());
    // The id (and the session's turn) are taken while the prompt is tokenised; a cancel meanwhile
    // waits in cancel_pending like one before the engine's id arrives.
    live[id] = 0;
    if (!session.empty()) srv.busy_sessions.insert(session);
    serving::Request req;
    req.sampling = *sampling;
    req.session_id = g.session_id();
    req.ignore_eos = g.ignore_eos();
    const std::string user_turn = session.empty() || g.messages_size() == 0
                                      ? ""
                                      : g.messages(g.messages_size() - 1).content();
    std::string prompt = g.messages_size() > 0 ? "" : g.prompt();
    const int32_t max_tokens = g.max_tokens();
    asio::post(srv.tokenizing, [self = shared_from_this(), id, tmpl, msgs = std::move(msgs),
                                prompt = std::move(prompt), max_tokens, session, opened, user_turn,
                                req = std::move(req)]() mutable {
      const auto& tok = self->srv.engine.tokenizer();
      req.prompt =
          tmpl != nullptr ? tok.Encode(tmpl->Render(msgs, true), true) : tok.Encode(prompt, true);
      const bool chat = tmpl != nullptr;
      asio::post(self->srv.io, [self, id, max_tokens, session, opened, user_turn, chat,
                                req = std::move(req)]() mutable {
        self->Submit(id, std::move(req), max_tokens, session, opened, user_turn, chat);
      });
    });
  }

  // Generations and tokenize requests in flight on this connection are at most max_in_flight.
  bool Busy() const {
    return static_cast<int>(live.size()) + tokenize_jobs >= srv.opts.max_in_flight;
  }
  absl::Status TooBusy() const {
    return absl::ResourceExhaustedError(
        StrCat("more than ", srv.opts.max_in_flight, " requests in flight on this connection"));
  }

  // Frees what Generate took for request `id`: its id, and its session's turn.
  void Release(uint64_t id, const std::string& session) {
    live.erase(id);
    cancel_pending.erase(id);
    if (!session.empty()) srv.busy_sessions.erase(session);
  }

  // Generate's second half, on the io thread once the prompt is tokenised: the context check,
  // then the engine.
  void Submit(uint64_t id, serving::Request req, int32_t max_tokens, const std::string& session,
              uint64_t opened, const std::string& user_turn, bool chat) {
    if (closed) return Release(id, session);
    const int64_t n = static_cast<int64_t>(req.prompt.size());
    if (cancel_pending.count(id)) {  // cancelled while its prompt was tokenised: never submitted
      Release(id, session);
      v1::Frame f;
      f.set_request_id(id);
      f.mutable_done()->set_finish_reason("cancelled");
      f.mutable_done()->set_prompt_tokens(n);
      return Send(f);
    }
    // A session closed (or reopened) while its turn was tokenised: the turn runs as a plain
    // request, or the engine would keep the closed session's KV again when it finished.
    if (!session.empty()) {
      auto it = srv.sessions.find(session);
      if (it == srv.sessions.end() || it->second.opened != opened) req.session_id.clear();
    }
    const auto& tok = srv.engine.tokenizer();
    const int64_t room = srv.engine.ctx_size() - n;
    req.max_tokens =
        max_tokens > 0 ? max_tokens : static_cast<int32_t>(DefaultMaxTokens(srv.engine, n));
    if (room <= 0 || req.max_tokens > room) {
      Release(id, session);
      return Error(id,
                   absl::InvalidArgumentError(ContextError(srv.engine.ctx_size(), n, req.max_tokens,
                                                           chat ? "messages" : "prompt")));
    }
    auto self = shared_from_this();
    auto pending = std::make_shared<std::string>();
    auto text = std::make_shared<std::string>();
    auto& io = srv.io;
    serving::Callbacks cb;
    cb.on_token = [self, id, pending, text, &io, &tok](serving::RequestId, int32_t t) {
      std::string bytes = tok.TokenBytes(t);
      asio::post(io, [self, id, t, pending, text, bytes = std::move(bytes)] {
        *pending += bytes;
        const size_t n = CompleteUtf8Prefix(*pending);
        v1::Frame f;
        f.set_request_id(id);
        f.mutable_token()->set_id(t);
        f.mutable_token()->set_text(ValidUtf8(pending->substr(0, n)));
        *text += pending->substr(0, n);
        pending->erase(0, n);
        self->Send(f);
      });
    };
    cb.on_done = [self, id, pending, text, session, opened, user_turn,
                  &io](const serving::Completion& c) {
      asio::post(io, [self, id, pending, text, session, opened, user_turn, c] {
        self->Release(id, session);
        if (!c.status.ok() && !absl::IsCancelled(c.status)) return self->Error(id, c.status);
        *text += *pending;
        if (!session.empty() && c.status.ok()) {
          auto it = self->srv.sessions.find(session);
          if (it != self->srv.sessions.end() && it->second.opened == opened) {
            it->second.messages.push_back({"user", user_turn});
            it->second.messages.push_back({"assistant", *text});
          }
        }
        v1::Frame f;
        f.set_request_id(id);
        v1::Done* d = f.mutable_done();
        d->set_finish_reason(absl::IsCancelled(c.status) ? "cancelled"
                             : c.stop_reason == "eos"    ? "stop"
                                                         : c.stop_reason);
        d->set_text(ValidUtf8(*text));
        d->set_prompt_tokens(c.prompt_tokens);
        d->set_completion_tokens(static_cast<int64_t>(c.tokens.size()));
        d->set_cached_tokens(c.cached_tokens);
        d->set_ttft_ms(c.ttft_ms);
        self->Send(f);
      });
    };
    srv.loop.Submit(std::move(req), std::move(cb),
                    [self, id, session, &io](absl::StatusOr<serving::RequestId> got) {
                      asio::post(io, [self, id, session, got] {
                        if (!got.ok()) {
                          self->Release(id, session);
                          return self->Error(id, got.status());
                        }
                        auto it = self->live.find(id);
                        if (it != self->live.end()) it->second = *got;
                        if (self->closed || self->cancel_pending.erase(id) > 0) {
                          self->srv.loop.Cancel(*got);
                        }
                      });
                    });
  }
};

v1::ClusterStatus RpcServer::Impl::Status() const {
  v1::ClusterStatus s;
  s.set_world(opts.world);
  s.set_dp(opts.dp);
  s.set_pp(opts.pp);
  s.set_tp(opts.tp);
  s.set_model(opts.model_name);
  s.set_block_size(engine.block_size());
  const auto& m = engine.model();
  for (int r = 0; r < opts.world; ++r) {
    v1::RankInfo* ri = s.add_ranks();
    ri->set_rank(r);
    const int local = r % (opts.pp * opts.tp);
    ri->set_role(r == 0 ? "coordinator+worker" : local == 0 ? "replica-leader+worker" : "worker");
    const auto st = model::MakePipelineStage(m.config(), local / opts.tp, opts.pp);
    if (st.ok()) {
      ri->set_stage(st->stage);
      ri->set_layer_begin(static_cast<int32_t>(st->layer_begin));
      ri->set_layer_end(static_cast<int32_t>(st->layer_end));
    }
    ri->set_tp_rank(r % opts.tp);
    if (auto sh = model::MakeTpShard(m, r % opts.tp, opts.tp); sh.ok())
      ri->set_shard(sh->Describe());
    ri->set_kv_blocks(engine.n_blocks());
  }
  return s;
}

void RpcServer::Impl::Accept() {
  AcceptLoop(
      acceptor, [this] { return shutting_down; },
      [this](tcp::socket sock) {
        auto c = std::make_shared<RpcConn>(*this, std::move(sock));
        {
          std::lock_guard<std::mutex> lock(conns_mu);
          conns.insert(c);
        }
        c->Start();
      });
}

RpcServer::RpcServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<RpcServer>> RpcServer::Start(const RpcOptions& opts,
                                                            EngineLoop& loop,
                                                            const worker::Engine& engine) {
  auto impl = std::make_unique<Impl>(opts, loop, engine);
  if (auto s = Listen(impl->acceptor, opts.host, opts.port, " (RPC)"); !s.ok()) return s;
  Impl* p = impl.get();
  p->Accept();
  p->thread = std::thread([p] { p->io.run(); });
  return std::unique_ptr<RpcServer>(new RpcServer(std::move(impl)));
}

uint16_t RpcServer::port() const { return impl_->acceptor.local_endpoint().port(); }

void RpcServer::Shutdown() {
  Impl* p = impl_.get();
  if (!p->thread.joinable()) return;
  asio::post(p->io, [p] {
    p->shutting_down = true;
    boost::system::error_code ignored;
    p->acceptor.close(ignored);
    std::vector<std::shared_ptr<RpcConn>> idle;
    {
      std::lock_guard<std::mutex> lock(p->conns_mu);
      for (const auto& c : p->conns) {
        if (c->live.empty() && !c->writing) idle.push_back(c);
      }
    }
    for (auto& c : idle) c->Close();
  });
  WaitUntil(
      [p] {
        std::lock_guard<std::mutex> lock(p->conns_mu);
        return p->conns.empty();
      },
      std::chrono::seconds(5));
  p->io.stop();
  p->thread.join();
}

RpcServer::~RpcServer() {
  if (impl_ && impl_->thread.joinable()) Shutdown();
}

}  // namespace kvmesh::server
