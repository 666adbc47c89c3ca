#include "coordinator/serve.h"

#include <algorithm>
#include <csignal>
#include <iostream>
#include <map>
#include <sstream>

#include "coordinator/flags.h"
#include "coordinator/key_file.h"
#include "coordinator/launch.h"
#include "coordinator/serve_config.h"
#include "coordinator/usage.h"
#include "server/engine_loop.h"
#include "server/http_server.h"
#include "server/rpc_server.h"
#include "util/str_cat.h"

namespace kvmesh::coordinator {

int Serve(int argc, char** argv) {
  std::set<std::string> valued = LaunchFlagNames();
  valued.insert({"model", "host", "port", "api-key", "api-key-file", "max-body-bytes",
                 "served-model-name", "config", "rpc-port", "rpc-frame-timeout", "http-timeout"});
  auto f = Flags::Parse(argc, argv, 2, valued,
                        {"print-plan", "no-prefix-reuse", "prefix-reuse", "no-rpc", "no-repack"});
  if (!f.ok()) return Fail(f.status());
  if (f->help()) return PrintHelp();
  if (f->Has("prefix-reuse") && f->Has("no-prefix-reuse")) {
    return Fail(absl::InvalidArgumentError("give --prefix-reuse or --no-prefix-reuse, not both"));
  }
  if (f->Has("config")) {
    auto cfg = LoadServeConfig(f->String("config", ""));
    if (!cfg.ok()) return Fail(cfg.status());
    // The command line wins: a key given there replaces the file's key in either form.
    if (f->Has("api-key") || f->Has("api-key-file")) {
      cfg->erase("api-key");
      cfg->erase("api-key-file");
    }
    // --prefix-reuse turns reuse back on over the file's enable_prefix_caching: false.
    if (f->Has("prefix-reuse")) cfg->erase("no-prefix-reuse");
    // Messages about the file's values name its key and the file.
    const std::string path = f->String("config", "");
    std::map<std::string, std::string> spellings;
    for (const auto& [flag, value] : *cfg) {
      spellings[flag] = StrCat("'", ConfigKeyOf(flag), "' in --config '", path, "'");
    }
    f->AddDefaults(*cfg, spellings);
  }
  server::HttpOptions ho;
  ho.host = f->String("host", "127.0.0.1");
  auto port = f->Int("port", 8000, 0, 65535);
  if (!port.ok()) return Fail(port.status());
  ho.port = static_cast<uint16_t>(*port);
  auto rpc_port = f->Int("rpc-port", 8001, 0, 65535);
  if (!rpc_port.ok()) return Fail(rpc_port.status());
  auto frame_timeout = f->Int("rpc-frame-timeout", 60, 1, 3600);
  if (!frame_timeout.ok()) return Fail(frame_timeout.status());
  auto body = f->Int("max-body-bytes", 2 << 20, 1024, int64_t{1} << 30);
  if (!body.ok()) return Fail(body.status());
  ho.max_body_bytes = static_cast<size_t>(*body);
  auto http_timeout = f->Int("http-timeout", 60, 1, 3600);
  if (!http_timeout.ok()) return Fail(http_timeout.status());
  ho.timeout = std::chrono::seconds(*http_timeout);
  ho.model_name = f->String("served-model-name", ho.model_name);
  auto key = ApiKeyFromFlags(*f);
  if (!key.ok()) return Fail(key.status());
  ho.api_key = std::move(*key);
  Launch launch;
  if (auto s = SetUp(*f, launch); !s.ok()) return Fail(s);
  if (launch.rank != 0) {
    // mpirun forwards SIGTERM to every rank; workers stop when rank 0 has drained and tells them.
    std::signal(SIGTERM, SIG_IGN);
    std::signal(SIGINT, SIG_IGN);
  }
  return RunLaunched(launch, [&]() -> int {
    server::EngineLoop loop(*launch.serving);
    // The n choices of a request queue on one replica together: never more than its queue takes.
    ho.max_choices = std::min(ho.max_choices, launch.serving->max_waiting());
    auto http = server::HttpServer::Start(ho, loop, *launch.engine);
    if (!http.ok()) return Fail(http.status());
    (*http)->OnSignal([&loop] { loop.Stop(); });
    std::unique_ptr<server::RpcServer> rpc;
    if (!f->Has("no-rpc")) {
      server::RpcOptions ro;
      ro.host = ho.host;
      ro.port = static_cast<uint16_t>(*rpc_port);
      ro.api_key = ho.api_key;
      ro.frame_timeout = std::chrono::seconds(*frame_timeout);
      ro.world = launch.world;
      ro.tp = launch.tp;
      ro.pp = launch.pp;
      ro.dp = launch.dp;
      ro.model_name = ho.model_name;
      auto r = server::RpcServer::Start(ro, loop, *launch.engine);
      if (!r.ok()) return Fail(r.status());
      rpc = std::move(*r);
      std::cerr << "kvmesh: cluster RPC (kvmesh.v1) on " << ro.host << ":" << rpc->port()
                << std::endl;
    }
    std::cerr << "kvmesh: serving " << ho.model_name << " on http://" << ho.host << ":"
              << (*http)->port() << " (world " << launch.world << ", dp " << launch.dp << ", tp "
              << launch.tp << ", pp " << launch.pp << ", " << launch.engine->n_blocks()
              << " KV blocks of " << launch.engine->block_size() << " tokens)" << std::endl;
    const absl::Status s = loop.Run();
    (*http)->Shutdown();
    if (rpc) rpc->Shutdown();
    if (!s.ok()) return Fail(s);
    std::cerr << "kvmesh: stopped" << std::endl;
    return 0;
  });
}

}  // namespace kvmesh::coordinator
