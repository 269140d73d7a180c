/* The x86 instances of the integer quantized products (qdot_body.h): one
 * for AVX2 and one for AVX-512 VNNI on 256-bit vectors.  Only these
 * functions carry target attributes, so the rest of the build keeps the
 * baseline x86-64 flags and one binary runs everywhere; qdot.c asks cpuid
 * which instance this machine can run. */
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/qdot_x86.h"
#include "kernels/cpu/quant.h"
#include "kernels/kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define QD_ATTR __attribute__((target("avx2,fma,f16c")))
#define QD_NAME(x) x##_avx2
#define QD_VNNI 0
#include "kernels/cpu/qdot_body.h"
#undef QD_ATTR
#undef QD_NAME
#undef QD_VNNI

#define QD_ATTR __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))
#define QD_NAME(x) x##_vnni
#define QD_VNNI 1
#include "kernels/cpu/qdot_body.h"
#undef QD_ATTR
#undef QD_NAME
#undef QD_VNNI

int k__cpu_isa(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma"))
        return K_ISA_VNNI;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return K_ISA_AVX2;
    return K_ISA_REF;
}

#else

int k__cpu_isa(void)
{
    return K_ISA_REF;
}

#endif
