// The local physical limit of tensor-parallel communication: median latency of a bare
// MPI_Allreduce (and of the logits MPI_Gatherv) at the sizes kvmesh's TP forward uses.
//   mpirun -np 2 build/bin/allreduce_bench [n_embd=576] [n_vocab=49152] [prefill_tokens=512]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench/median.h"

namespace {

double MedianUs(const std::vector<double>& seconds) { return kvmesh::bench::Median(seconds) * 1e6; }

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int n_embd = argc > 1 ? std::atoi(argv[1]) : 576;
  const int n_vocab = argc > 2 ? std::atoi(argv[2]) : 49152;
  const int prefill = argc > 3 ? std::atoi(argv[3]) : 512;
  auto allreduce = [&](int n, int reps) {
    std::vector<float> buf(n, 1.0f);
    std::vector<double> t;
    for (int i = 0; i < reps + 10; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      if (i >= 10) t.push_back(MPI_Wtime() - t0);
    }
    return MedianUs(t);
  };
  const double decode_us = allreduce(n_embd, 2000);
  const double prefill_us = allreduce(n_embd * prefill, 50);
  std::vector<int> counts(size), displs(size);
  for (int r = 0; r < size; ++r) {
    counts[r] = n_vocab / size + (r < n_vocab % size ? 1 : 0);
    displs[r] = r == 0 ? 0 : displs[r - 1] + counts[r - 1];
  }
  std::vector<float> mine(counts[rank], 1.0f), all(n_vocab);
  std::vector<double> t;
  for (int i = 0; i < 510; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    MPI_Gatherv(mine.data(), counts[rank], MPI_FLOAT, all.data(), counts.data(), displs.data(),
                MPI_FLOAT, 0, MPI_COMM_WORLD);
    if (i >= 10) t.push_back(MPI_Wtime() - t0);
  }
  const double gather_us = MedianUs(t);
  if (rank == 0) {
    std::printf(
        "{\"ranks\": %d, \"allreduce_decode_us\": %.2f, \"allreduce_prefill_us\": %.1f, "
        "\"gather_logits_us\": %.2f, \"n_embd\": %d, \"prefill_tokens\": %d}\n",
        size, decode_us, prefill_us, gather_us, n_embd, prefill);
  }
  MPI_Finalize();
  return 0;
}
