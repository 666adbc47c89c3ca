// Instruction-set selection for the CPU kernels: detected once from CPUID, overridable with the
// environment variable KVMESH_ISA=scalar|avx2|avx512|amx (a level the CPU lacks is ignored), or
// SetIsa for tests. avx2 means AVX2+FMA+F16C; avx512 adds AVX-512 F/DQ/BW/VL/VNNI; amx adds
// AMX-TILE/AMX-INT8 (granted by the OS) and AVX-512 VBMI. Each level computes the same bits.
#pragma once

#include <string_view>

namespace kvmesh::kernels {

enum class Isa { kScalar, kAvx2, kAvx512, kAmx };

// The ISA kernels use now. The first call detects it (and reads KVMESH_ISA).
Isa ActiveIsa();
// Best ISA this CPU supports.
Isa DetectedIsa();
// Forces an ISA; returns false (and changes nothing) if the CPU lacks it. Not thread safe
// against running kernels: call between ops.
bool SetIsa(Isa isa);
std::string_view IsaName(Isa isa);

}  // namespace kvmesh::kernels
