/*
 * cpu/kernels.c — cpu/kernels.inc compiled for AVX-512, for AVX2 + FMA and in
 * plain C, and the choice among them at run time. The variants give the same
 * bits (cpu/simd.h), so the choice is about speed only.
 */
#if defined(__SANITIZE_ADDRESS__) && defined(__GNUC__) && !defined(__clang__)
/* (AddressSanitizer keeps the register blocks in memory, and gcc's variable
 * tracking for -g then takes minutes on the unrolled kernels: debug info only) */
#pragma GCC optimize("no-var-tracking", "no-var-tracking-assignments")
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"
#include "fad_math.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define FAD_CPU_X86 1
#include <immintrin.h>
#else
#define FAD_CPU_X86 0
#endif

#if FAD_CPU_X86
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#define FAD_SIMD 512
#define VFN(name) name##_avx512
#include "cpu/simd.h"
#include "cpu/kernels.inc"
#undef FAD_SIMD
#undef VFN
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define FAD_SIMD 256
#define VFN(name) name##_avx2
#include "cpu/simd.h"
#include "cpu/kernels.inc"
#undef FAD_SIMD
#undef VFN
#pragma GCC pop_options
#endif

#define FAD_SIMD 0
#define VFN(name) name##_c
#include "cpu/simd.h"
#include "cpu/kernels.inc"
#undef FAD_SIMD
#undef VFN

const fad_cpu_kernels *fad_cpu_kernels_get(void)
{
    const char *pin = getenv("FLASH_ATTN_DET_CPU_ISA");
    if (pin && !strcmp(pin, "c"))
        return &fad_cpu_kernels_c;
#if FAD_CPU_X86
    __builtin_cpu_init();
    const int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (avx512 && !(pin && !strcmp(pin, "avx2")))
        return &fad_cpu_kernels_avx512;
    if (avx2)
        return &fad_cpu_kernels_avx2;
#endif
    return &fad_cpu_kernels_c;
}
