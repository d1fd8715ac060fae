#pragma once

// The CPU's hot loops are built three times, for AVX-512 (x86-64-v4), AVX2 with FMA (v3) and the
// baseline x86-64, and the loader picks the widest the machine runs (GCC's function
// multiversioning): the release build targets the baseline, whose loops are four floats wide.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MYRIAD_CPU_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MYRIAD_CPU_CLONES
#endif

// What a cloned function's loops inline: the clone's instructions apply to them only once inlined.
#if defined(__GNUC__)
#define MYRIAD_INLINE_LOOP inline __attribute__((always_inline))
#else
#define MYRIAD_INLINE_LOOP inline
#endif
