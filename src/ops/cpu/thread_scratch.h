// Per-thread scratch buffers of the CPU kernels, outside the per-target code (matmul_hwy.cpp and nn_hwy.cpp
// are compiled once per SIMD target; their buffers are shared by every target).
//
// Each buffer is grow-only and 64-byte aligned, and its first use reserves 256 KB — more than any decode-sized
// call needs. reserve_thread_scratch() makes that first use happen up front on every thread of a pool
// (models call it when they size their workspace), so that a worker that meets a kernel for the first time
// mid-decode — which depends on timing: whether the pool's threads were awake — does not allocate then.
#pragma once
#include <cstddef>

namespace nextn::ops {

enum class ScratchKind { kFused, kPanel, kAcc, kPrescale, kIndexer, kCount };

// A buffer of at least n floats for this thread, 64-byte aligned (valid until the next call of that kind).
// (ops::reserve_thread_scratch() in ops.h reserves every kind's first 256 KB for the calling thread.)
float* thread_scratch(ScratchKind kind, size_t n);

}  // namespace nextn::ops
