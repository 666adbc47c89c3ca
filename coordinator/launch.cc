#include "coordinator/launch.h"

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "comm/shm/shm_communicator.h"
#include "model/shard.h"
#include "util/printable.h"
#include "util/str_cat.h"

namespace kvmesh::coordinator {

namespace {
constexpr char kDefaultModelFile[] = "SmolLM2-135M-Instruct.Q4_1.gguf";

std::string CacheDir() {
  if (const char* c = std::getenv("KVMESH_CACHE"); c && *c) return c;
  const char* home = std::getenv("HOME");
  return StrCat(home && *home ? home : ".", "/.cache/kvmesh");
}
}  // namespace

int Fail(const absl::Status& s) {
  // One line whatever the message carries (names and strings from a model file, a prompt).
  std::cerr << "kvmesh: error: "
            << util::Printable(std::string_view(s.message().data(), s.message().size())) << "\n";
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

std::string ModelPath(const Flags& f) {
  return f.String("model", StrCat(CacheDir(), "/", kDefaultModelFile));
}

Launch::~Launch() {
  serving.reset();
  remotes.clear();
  engine.reset();
  tp_comm.reset();  // communicators go before MPI_Finalize
  tp_mpi.reset();
  replica_comm.reset();
  world_comm.reset();
}

namespace {

// Every rank agrees on whether any rank failed; all print the error of the lowest failing rank.
absl::Status AgreeOnFailure(Launch& l, const absl::Status& mine) {
  if (l.world_comm == nullptr || l.world == 1) return mine;
  std::vector<float> failed(l.world, 0.0f);
  failed[l.rank] = mine.ok() ? 0.0f : 1.0f;
  if (auto s = l.world_comm->AllReduceSum(failed); !s.ok()) return s;
  int first = -1;
  for (int r = 0; r < l.world && first < 0; ++r) {
    if (failed[r] > 0) first = r;
  }
  if (first < 0) return absl::OkStatus();
  std::string msg(1024, '\0');
  if (l.rank == first) {
    const std::string m = StrCat("rank ", first, ": ", mine.message());
    msg.replace(0, std::min(m.size(), msg.size() - 1), m.substr(0, msg.size() - 1));
  }
  if (auto s = l.world_comm->Broadcast({reinterpret_cast<uint8_t*>(msg.data()), msg.size()}, first);
      !s.ok())
    return s;
  return absl::Status(l.rank == first ? mine.code() : absl::StatusCode::kAborted, msg.c_str());
}

// The settings every rank must share, as (name, value) pairs: what each rank sizes its KV pool,
// splits its model and checks its plans by. Ranks that disagree would wait forever in a
// collective or serve a plan another rank rejected, so they fail together instead.
using Setup = std::vector<std::pair<std::string, std::string>>;

// Every rank compares its setup with rank 0's; all print the first difference found by the
// lowest differing rank (via AgreeOnFailure).
absl::Status AgreeOnSetup(Launch& l, const Setup& mine) {
  if (l.world_comm == nullptr || l.world == 1) return absl::OkStatus();
  std::string text;
  for (const auto& [name, value] : mine) text += StrCat(name, "\x1f", value, "\x1e");
  uint64_t n = text.size();
  if (auto s = l.world_comm->Broadcast({reinterpret_cast<uint8_t*>(&n), sizeof n}, 0); !s.ok()) {
    return s;
  }
  std::string rank0 = l.rank == 0 ? text : std::string(n, '\0');
  if (auto s = l.world_comm->Broadcast({reinterpret_cast<uint8_t*>(rank0.data()), n}, 0); !s.ok()) {
    return s;
  }
  absl::Status differs;
  size_t at = 0;
  for (const auto& [name, value] : mine) {
    const size_t sep = rank0.find('\x1f', at), end = rank0.find('\x1e', at);
    const bool same = sep != std::string::npos && end != std::string::npos && sep < end &&
                      rank0.compare(at, sep - at, name) == 0 &&
                      rank0.compare(sep + 1, end - sep - 1, value) == 0;
    if (!same) {
      const std::string theirs =
          sep != std::string::npos && end != std::string::npos && sep < end
              ? StrCat(rank0.substr(at, sep - at), " ", rank0.substr(sep + 1, end - sep - 1))
              : "something else";
      differs = absl::InvalidArgumentError(
          StrCat(name, " ", value, ", but rank 0 has ", theirs, " (every rank needs the same)"));
      break;
    }
    at = end + 1;
  }
  return AgreeOnFailure(l, differs);
}

}  // namespace

const std::set<std::string>& LaunchFlagNames() {
  static const std::set<std::string> names = {"threads",
                                              "ctx-size",
                                              "tp",
                                              "pp",
                                              "kv-cache-mem",
                                              "block-size",
                                              "max-seqs",
                                              "max-batched-tokens",
                                              "max-waiting",
                                              "dp",
                                              "tp-collectives",
                                              "max-sessions",
                                              "activation-bits",
                                              "attention-bits"};
  return names;
}

absl::Status SetUp(const Flags& f, Launch& l) {
  auto threads = f.Int("threads", 0, 0, 1024);
  if (!threads.ok()) return threads.status();
  auto ctx = f.Int("ctx-size", 0, 0, int64_t{1} << 24);
  if (!ctx.ok()) return ctx.status();
  auto tp = f.Int("tp", 1, 1, 4096);
  if (!tp.ok()) return tp.status();
  auto pp = f.Int("pp", 1, 1, 4096);
  if (!pp.ok()) return pp.status();
  auto dp = f.Int("dp", 1, 1, 255);
  if (!dp.ok()) return dp.status();
  auto kv_mem = f.Int("kv-cache-mem", 512, 1, int64_t{1} << 20);
  if (!kv_mem.ok()) return kv_mem.status();
  auto block_size = f.Int("block-size", 16, 1, 1024);
  if (!block_size.ok()) return block_size.status();
  auto max_seqs = f.Int("max-seqs", 16, 1, 4096);
  if (!max_seqs.ok()) return max_seqs.status();
  auto max_batched = f.Int("max-batched-tokens", 512, 1, 1 << 20);
  if (!max_batched.ok()) return max_batched.status();
  auto max_waiting = f.Int("max-waiting", 1024, 1, 1 << 20);  // every request queues first
  if (!max_waiting.ok()) return max_waiting.status();
  auto max_sessions = f.Int("max-sessions", 256, 1, 1 << 20);
  if (!max_sessions.ok()) return max_sessions.status();
  auto act_bits = f.Int("activation-bits", 16, 8, 16);
  if (!act_bits.ok()) return act_bits.status();
  if (*act_bits != 8 && *act_bits != 16) {
    return absl::InvalidArgumentError(
        StrCat(f.Spelling("activation-bits"), " must be 8 or 16, not ", *act_bits));
  }
  auto attn_bits = f.Int("attention-bits", 32, 16, 32);
  if (!attn_bits.ok()) return attn_bits.status();
  if (*attn_bits != 16 && *attn_bits != 32) {
    return absl::InvalidArgumentError(
        StrCat(f.Spelling("attention-bits"), " must be 16 or 32, not ", *attn_bits));
  }
  l.tp = static_cast<int>(*tp);
  l.pp = static_cast<int>(*pp);
  const std::string collectives = f.String("tp-collectives", "shm");
  if (collectives != "shm" && collectives != "mpi") {
    return absl::InvalidArgumentError(
        StrCat(f.Spelling("tp-collectives"), " must be shm or mpi, not '", collectives, "'"));
  }
  l.dp = static_cast<int>(*dp);
  const int64_t per_replica = *tp * *pp;
  if (*dp * per_replica > 1 || comm::MpiRuntime::LaunchedWithMultipleRanks()) {
    auto mpi = comm::MpiRuntime::Init(nullptr, nullptr);
    if (!mpi.ok()) return mpi.status();
    l.mpi = std::move(*mpi);
    l.rank = l.mpi->world_rank();
    l.world = l.mpi->world_size();
    auto world_comm = comm::CreateMpiCommunicator(0, l.rank);
    if (!world_comm.ok()) return world_comm.status();
    l.world_comm = std::move(*world_comm);
    const Setup flags = {{"--tp", std::to_string(*tp)},
                         {"--pp", std::to_string(*pp)},
                         {"--dp", std::to_string(*dp)},
                         {"--tp-collectives", collectives},
                         {"--ctx-size", std::to_string(*ctx)},
                         {"--kv-cache-mem", std::to_string(*kv_mem)},
                         {"--block-size", std::to_string(*block_size)},
                         {"--activation-bits", std::to_string(*act_bits)},
                         {"--attention-bits", std::to_string(*attn_bits)},
                         {"--no-repack", f.Has("no-repack") ? "set" : "unset"}};
    // First: ranks given other sizes would disagree on the world size check below, and the
    // ones it passed would wait in a collective for the ones it failed.
    if (auto s = AgreeOnSetup(l, flags); !s.ok()) return s;
    if (l.world != *dp * per_replica) {
      return absl::InvalidArgumentError(
          StrCat("world size ", l.world, " does not match dp x pp x tp = ", *dp, " x ", *pp, " x ",
                 *tp, " (launch with mpirun -np ", *dp * per_replica, ")"));
    }
    // Replica r is world ranks [r * pp * tp, (r + 1) * pp * tp). TP groups are the ranks of one
    // stage of one replica; the replica's communicator carries its steps and stage-to-stage
    // sends; the world carries the coordinator's plans to the other replicas' leaders.
    auto tp_comm = comm::CreateMpiCommunicator(l.rank / l.tp, l.rank % l.tp);
    if (!tp_comm.ok()) return tp_comm.status();
    l.tp_comm = std::move(*tp_comm);
    // A TP group on one machine sums through shared memory (comm/shm/); MPI otherwise.
    if (l.tp > 1 && collectives == "shm") {
      auto shm = comm::CreateShmCommunicator(*l.tp_comm);
      if (shm.ok()) {
        l.tp_mpi = std::move(l.tp_comm);
        l.tp_comm = std::move(*shm);
      } else if (shm.status().code() != absl::StatusCode::kFailedPrecondition) {
        return shm.status();
      }
    }
    auto replica_comm = comm::CreateMpiCommunicator(static_cast<int>(l.rank / per_replica),
                                                    static_cast<int>(l.rank % per_replica));
    if (!replica_comm.ok()) return replica_comm.status();
    l.replica_comm = std::move(*replica_comm);
  }
  worker::EngineOptions o;
  o.model_path = ModelPath(f);
  o.threads = static_cast<int>(*threads);
  o.ctx_size = *ctx;
  o.tp_comm = l.tp_comm.get();
  o.world_comm = l.replica_comm.get();
  o.pp = l.pp;
  o.kv_cache_bytes = *kv_mem << 20;
  o.block_size = static_cast<int32_t>(*block_size);
  o.activation_bits = static_cast<int>(*act_bits);
  o.attention_bits = static_cast<int>(*attn_bits);
  o.repack_weights = !f.Has("no-repack");
  auto e = worker::Engine::Create(o);
  absl::Status st = e.status();
  if (!e.ok() && e.status().code() == absl::StatusCode::kNotFound && !f.Has("model")) {
    st = absl::NotFoundError(StrCat(e.status().message(), " (run `kvmesh model pull` first)"));
  }
  if (auto s = AgreeOnFailure(l, st); !s.ok()) return s;
  l.engine = std::move(*e);
  // The same flags can still give different engines: another model file, or another machine's
  // RAM limit on --kv-cache-mem.
  const Setup engine = {{"model and KV layout", l.engine->cache_salt()},
                        {"KV blocks", std::to_string(l.engine->n_blocks())},
                        {"vocabulary", std::to_string(l.engine->model().config().n_vocab)}};
  if (auto s = AgreeOnSetup(l, engine); !s.ok()) return s;
  if (l.rank == 0) {
    for (int r = 1; r < l.dp; ++r) {
      l.remotes.push_back(std::make_unique<worker::RemoteReplica>(
          l.world_comm.get(), static_cast<int>(r * per_replica),
          l.engine->model().config().n_vocab));
    }
    std::vector<worker::RemoteReplica*> remotes;
    for (auto& r : l.remotes) remotes.push_back(r.get());
    serving::ServingOptions so;
    so.max_seqs = static_cast<int32_t>(*max_seqs);
    so.max_batched_tokens = static_cast<int32_t>(*max_batched);
    so.max_waiting = static_cast<int32_t>(*max_waiting);
    so.max_sessions = static_cast<int32_t>(*max_sessions);
    so.prefix_caching = !f.Has("no-prefix-reuse");
    l.serving = std::make_unique<serving::ServingEngine>(*l.engine, so, remotes);
  }
  if (f.Has("print-plan") && l.rank == 0) {
    const auto& m = l.engine->model();
    std::cerr << "kvmesh: plan: world " << l.world << " = dp " << l.dp << " x pp " << l.pp
              << " x tp " << l.tp << "; rank 0 coordinates and is TP rank 0 of stage 0\n";
    for (int r = 0; r < l.world; ++r) {
      const int local = r % (l.pp * l.tp);
      const auto st = model::MakePipelineStage(m.config(), local / l.tp, l.pp);
      if (!st.ok()) continue;
      std::cerr << "kvmesh: plan: rank " << r << ": replica " << r / (l.pp * l.tp) << " stage "
                << st->stage << " layers [" << st->layer_begin << "," << st->layer_end << "), "
                << model::MakeTpShard(m, r % l.tp, l.tp)->Describe() << "\n";
    }
  }
  return absl::OkStatus();
}

int RunLaunched(Launch& l, const std::function<int()>& leader) {
  if (l.rank == 0) {
    const int rc = leader();
    // The followers are released even when a replica could not be: left in their broadcast,
    // they would hold this rank in MPI_Finalize.
    absl::Status s = l.serving->StopReplicas();
    if (absl::Status f = l.engine->StopFollowers(); s.ok()) s = f;
    return s.ok() ? rc : Fail(s);
  }
  if (l.engine->is_leader()) {  // the leader of another data-parallel replica
    if (auto s = worker::ServeReplica(*l.engine, l.world_comm.get(), 0); !s.ok()) return Fail(s);
    return 0;
  }
  if (auto s = l.engine->ServeFollower(); !s.ok()) return Fail(s);
  return 0;
}

}  // namespace kvmesh::coordinator
