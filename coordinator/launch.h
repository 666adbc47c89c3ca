// How a kvmesh process takes its place in a run: alone, or as one rank of
// `mpirun -np K kvmesh ...` (world = dp x pp x tp; data-parallel replica d is world ranks
// [d * pp * tp, (d + 1) * pp * tp), and within it local rank q is TP rank q % tp of stage
// q / tp; rank 0 is the coordinator and the leader of replica 0).
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "comm/mpi/mpi_communicator.h"
#include "coordinator/flags.h"
#include "serving/serving_engine.h"
#include "worker/engine.h"

namespace kvmesh::coordinator {

// The flags SetUp reads (every command that launches an engine accepts them).
const std::set<std::string>& LaunchFlagNames();

// Prints "kvmesh: error: <message>" on stderr; returns the exit code (2 for bad input).
int Fail(const absl::Status& s);

// --model, or the file `kvmesh model pull` writes under $KVMESH_CACHE (~/.cache/kvmesh).
std::string ModelPath(const Flags& f);

struct Launch {
  std::unique_ptr<comm::MpiRuntime> mpi;
  std::unique_ptr<comm::Communicator> tp_comm, replica_comm, world_comm;
  std::unique_ptr<comm::Communicator> tp_mpi;  // the MPI group under a shared-memory tp_comm
  std::unique_ptr<worker::Engine> engine;
  std::vector<std::unique_ptr<worker::RemoteReplica>> remotes;  // rank 0: replicas 1..dp-1
  std::unique_ptr<serving::ServingEngine> serving;              // the coordinator's (rank 0) only
  int rank = 0, world = 1, tp = 1, pp = 1, dp = 1;
  ~Launch();
};

// Reads --threads --ctx-size --tp --pp --model --print-plan --kv-cache-mem (MiB per rank)
// --block-size --max-seqs --max-batched-tokens --no-prefix-reuse --tp-collectives
// --activation-bits --attention-bits --no-repack, starts MPI when
// the run has more than one rank, checks the world size and loads the engine on every rank. A
// failure on any rank is returned on every rank, naming the first failing rank. Rank 0 also gets
// the serving engine.
absl::Status SetUp(const Flags& f, Launch& l);

// Runs `leader` on rank 0 while the other ranks follow its steps. Returns the process's exit
// code: the leader's code on rank 0; 0, or 1 if the group broke, elsewhere.
int RunLaunched(Launch& l, const std::function<int()>& leader);

}  // namespace kvmesh::coordinator
