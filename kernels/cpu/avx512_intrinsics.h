// Internal: <immintrin.h> for the AVX-512 and AMX files, without GCC 12's false warnings.
// GCC 12 reports its own intrinsics' `__m512 __Y = __Y;` placeholders as maybe uninitialized
// (GCC bug 105593, fixed in 13) wherever they are inlined: hundreds of false warnings per build.
// The state at the intrinsics' own lines is what counts, so this must bring the translation
// unit's first <immintrin.h>: include it before anything that brings that header (the standard
// headers these files include do not).
// Clang (the fuzzers' build) has no -Wmaybe-uninitialized and warns about the unknown group.
#pragma once

#pragma GCC diagnostic push
#ifndef __clang__
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
