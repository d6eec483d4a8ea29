// The Highway targets every SIMD source of the CPU backend is compiled for; include it right before
// "hwy/foreach_target.h" (after defining HWY_TARGET_INCLUDE). Every attainable target, not only those
// better than the x86-64-v3 baseline, so the scalar fallback is compiled too and tests can force each one.
// SSSE3/SSE4 would add nothing: AVX2 is the baseline. (No include guard: harmless when repeated.)
#ifndef HWY_COMPILE_ALL_ATTAINABLE
#define HWY_COMPILE_ALL_ATTAINABLE
#endif
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4)
#endif
