// Test helper: the main() of GoogleTest suites launched by mpirun. Starts MPI, lets only rank 0
// print gtest's report, and returns the worst exit code of all ranks on every rank.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include "comm/mpi/mpi_communicator.h"

namespace kvmesh::testing {

// Sets *runtime to the process's MPI runtime for the tests to use.
inline int RunMpiTests(int argc, char** argv, comm::MpiRuntime** runtime) {
  ::testing::InitGoogleTest(&argc, argv);
  auto mpi = comm::MpiRuntime::Init(&argc, &argv);
  if (!mpi.ok()) return 1;
  *runtime = mpi->get();
  if ((*mpi)->world_rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int rc = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

}  // namespace kvmesh::testing
