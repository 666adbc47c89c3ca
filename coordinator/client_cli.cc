#include "coordinator/client_cli.h"

#include <google/protobuf/util/json_util.h>

#include <iostream>
#include <set>

#include "coordinator/flags.h"
#include "coordinator/key_file.h"
#include "coordinator/launch.h"
#include "coordinator/texts_file.h"
#include "coordinator/usage.h"
#include "server/rpc_client.h"
#include "util/str_cat.h"

namespace kvmesh::coordinator {

namespace {

namespace v1 = kvmesh::v1;

void PrintJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  std::cout << out << "\n";
}

absl::StatusOr<v1::SamplingParams> Sampling(const Flags& f) {
  v1::SamplingParams s;
  auto t = f.Float("temperature", 0.0, 0.0, 100.0);
  if (!t.ok()) return t.status();
  auto seed = f.Uint64("seed", 0);
  if (!seed.ok()) return seed.status();
  s.set_temperature(static_cast<float>(*t));
  if (f.Has("seed")) s.set_seed(*seed);  // else the server draws one per request
  return s;
}

// A generation's summary line (to stderr).
std::string Summary(const v1::Done& d) {
  return StrCat(d.prompt_tokens(), " prompt tokens (", d.cached_tokens(), " cached), ",
                d.completion_tokens(), " generated, TTFT ", Fixed(d.ttft_ms()), " ms, ",
                d.finish_reason());
}

// Streams a Generate / SessionAppend; prints the text as it comes, then a summary line.
int StreamOut(server::RpcClient& c, v1::Frame req) {
  auto done = c.Stream(std::move(req), [](const v1::Token& t) {
    std::cout << t.text() << std::flush;
    return true;
  });
  if (!done.ok()) return Fail(done.status());
  std::cout << "\n";
  std::cerr << "kvmesh client: " << Summary(*done) << "\n";
  return 0;
}

// n choices of one Generate: n requests in flight at once on the connection (the RPC API's `n`:
// they share the prompt's KV blocks on the server), choice i with seed + i when a seed is given
// (as the HTTP API's choices). Prints each choice's text once all have ended, and a summary line
// per choice.
int StreamChoices(server::RpcClient& c, const v1::Frame& req, int64_t n) {
  std::vector<v1::Frame> reqs(static_cast<size_t>(n), req);
  for (int64_t i = 0; i < n; ++i) {
    v1::SamplingParams* s = reqs[i].mutable_generate()->mutable_sampling();
    if (s->has_seed()) s->set_seed(s->seed() + static_cast<uint64_t>(i));
  }
  auto done = c.StreamAll(std::move(reqs), nullptr);
  if (!done.ok()) return Fail(done.status());
  for (size_t i = 0; i < done->size(); ++i) {
    std::cout << "[choice " << i << "] " << (*done)[i].text() << "\n";
    std::cerr << "kvmesh client: choice " << i << ": " << Summary((*done)[i]) << "\n";
  }
  return 0;
}

}  // namespace

int Client(int argc, char** argv) {
  if (argc < 3) {
    return Fail(absl::InvalidArgumentError(
        "client: give an action: health, tokenize, generate, chat, session, status or stats"));
  }
  const std::string action = argv[2];
  if (action == "--help" || action == "-h" || action == "help") return PrintHelp();
  static const std::set<std::string> kActions = {"health",  "tokenize", "generate", "chat",
                                                 "session", "status",   "stats"};
  if (!kActions.count(action)) {  // before connecting: a typo is not a network error
    return Fail(absl::InvalidArgumentError(
        StrCat("client: unknown action '", action,
               "' (health, tokenize, generate, chat, session, status or stats)")));
  }
  auto f = Flags::Parse(argc, argv, 3,
                        {"host", "port", "api-key", "api-key-file", "text", "prompt", "message",
                         "system", "max-tokens", "temperature", "seed", "id", "turns", "n"},
                        {"no-special"});
  if (!f.ok()) return Fail(f.status());
  if (f->help()) return PrintHelp();
  auto port = f->Int("port", 8001, 1, 65535);
  if (!port.ok()) return Fail(port.status());
  // 0 (not given): the server's default, what the context leaves.
  auto max_tokens = f->Int("max-tokens", 0, 1, 1 << 20);
  if (!max_tokens.ok()) return Fail(max_tokens.status());
  auto sampling = Sampling(*f);
  if (!sampling.ok()) return Fail(sampling.status());
  auto n = f->Int("n", 1, 1, 16);  // choices, as the HTTP API's `n`
  if (!n.ok()) return Fail(n.status());
  auto key = ApiKeyFromFlags(*f, "client: ");
  if (!key.ok()) return Fail(key.status());
  // Each action's required flags are checked, and a session's turns read, before connecting (a
  // missing flag or a bad file is not a network error).
  if (action == "tokenize" && !f->Has("text")) {
    return Fail(absl::InvalidArgumentError("client tokenize: --text is required"));
  }
  if (action == "generate" && !f->Has("prompt")) {
    return Fail(absl::InvalidArgumentError("client generate: --prompt is required"));
  }
  if (action == "chat" && !f->Has("message")) {
    return Fail(absl::InvalidArgumentError("client chat: --message is required"));
  }
  std::vector<std::string> turns;
  if (action == "session") {
    if (f->String("id", "").empty() || !f->Has("turns")) {
      return Fail(absl::InvalidArgumentError("client session: --id and --turns FILE are required"));
    }
    auto t = ReadTexts("--turns", f->String("turns", ""));
    if (!t.ok()) return Fail(t.status());
    turns = std::move(*t);
  }
  auto c = server::RpcClient::Connect(f->String("host", "127.0.0.1"), static_cast<uint16_t>(*port),
                                      *key);
  if (!c.ok()) return Fail(c.status());
  v1::Frame req;
  if (action == "health" || action == "status" || action == "stats" || action == "tokenize") {
    if (action == "health") req.mutable_health();
    if (action == "status") req.mutable_cluster_status();
    if (action == "stats") req.mutable_cache_stats();
    if (action == "tokenize") {
      req.mutable_tokenize()->set_text(f->String("text", ""));
      req.mutable_tokenize()->set_parse_special(!f->Has("no-special"));
    }
    auto r = (*c)->Call(req);
    if (!r.ok()) return Fail(r.status());
    if (r->has_healthy()) PrintJson(r->healthy());
    if (r->has_cluster()) PrintJson(r->cluster());
    if (r->has_cache()) PrintJson(r->cache());
    if (r->has_tokenized()) PrintJson(r->tokenized());
    return 0;
  }
  if (action == "generate" || action == "chat") {
    v1::GenerateRequest* g = req.mutable_generate();
    if (action == "generate") {
      g->set_prompt(f->String("prompt", ""));
    } else {
      if (f->Has("system")) {
        auto* m = g->add_messages();
        m->set_role("system");
        m->set_content(f->String("system", ""));
      }
      auto* m = g->add_messages();
      m->set_role("user");
      m->set_content(f->String("message", ""));
    }
    g->set_max_tokens(static_cast<int32_t>(*max_tokens));
    *g->mutable_sampling() = *sampling;
    return *n == 1 ? StreamOut(**c, req) : StreamChoices(**c, req, *n);
  }
  if (action == "session") {
    // Opens session --id, sends each turn of --turns (as `run --session` reads them:
    // coordinator/texts_file.h) as the next user message, prints each answer with its
    // cached-token count, then closes it.
    const std::string id = f->String("id", "");
    v1::Frame open;
    open.mutable_session_open()->set_session_id(id);
    open.mutable_session_open()->set_system(f->String("system", ""));
    if (auto r = (*c)->Call(open); !r.ok()) return Fail(r.status());
    v1::Frame close;
    close.mutable_session_close()->set_session_id(id);
    int turn = 0;
    for (const std::string& line : turns) {
      v1::Frame a;
      a.mutable_session_append()->set_session_id(id);
      a.mutable_session_append()->set_user(line);
      a.mutable_session_append()->set_max_tokens(static_cast<int32_t>(*max_tokens));
      *a.mutable_session_append()->mutable_sampling() = *sampling;
      auto done = (*c)->Stream(a, nullptr);
      if (!done.ok()) {
        (*c)->Call(close).IgnoreError();  // its KV is released on the server; the turn's error
        return Fail(done.status());       // is the one to report
      }
      std::cout << "[turn " << ++turn << "] " << done->prompt_tokens() << " prompt tokens, "
                << done->cached_tokens() << " cached, TTFT " << Fixed(done->ttft_ms()) << " ms\n"
                << done->text() << "\n";
    }
    if (auto r = (*c)->Call(close); !r.ok()) return Fail(r.status());
    return 0;
  }
  return Fail(absl::InvalidArgumentError(StrCat("client: unknown action '", action, "'")));
}

}  // namespace kvmesh::coordinator
