// Instruction-set selection for the CPU kernels: detected once from CPUID, overridable with the
// environment variable KVMESH_ISA=scalar|avx2 (or SetIsa, for tests).
#pragma once

#include <string_view>

namespace kvmesh::kernels {

enum class Isa { kScalar, kAvx2 };

// The ISA kernels use now. The first call detects it (and reads KVMESH_ISA).
Isa ActiveIsa();
// Best ISA this CPU supports.
Isa DetectedIsa();
// Forces an ISA; returns false (and changes nothing) if the CPU lacks it. Not thread safe
// against running kernels: call between ops.
bool SetIsa(Isa isa);
std::string_view IsaName(Isa isa);

}  // namespace kvmesh::kernels
