// CUDA twins of CPU kernels in kernels/ops.h. Same argument structs, device pointers; each call
// enqueues on `stream`, allocates nothing and returns the launch error (completion is observed
// by synchronising the stream).
#pragma once

#include <cuda_runtime.h>

#include "kernels/ops.h"

namespace kvmesh::kernels {

cudaError_t RmsNormCuda(const RmsNormArgs& a, cudaStream_t stream);
// a.pos is a device pointer too.
cudaError_t RopeCuda(const RopeArgs& a, cudaStream_t stream);

}  // namespace kvmesh::kernels
