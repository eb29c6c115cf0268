/* bfloat16 as this package's C kernels read and write it: the top 16 bits of a float32.
 * Included by each kernel's source; c_kernels hashes every header here into a build's cache key. */
#ifndef PREFILLBENCH_BF16_H
#define PREFILLBENCH_BF16_H

#include <stdint.h>
#include <string.h>

static inline __attribute__((always_inline)) float bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Rounded to nearest, ties to even, as torch rounds float32 to bfloat16; a NaN stays a NaN. */
static inline __attribute__((always_inline)) uint16_t f32_to_bf16(float v)
{
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((bits >> 16) | 0x40u);
    return (uint16_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

/* Element i of a float32 array, or of a bfloat16 one widened: how the kernels read either dtype. */
static inline __attribute__((always_inline)) float element_f32(const void *p, int64_t i, const int bf16)
{
    return bf16 ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

#ifdef __AVX512F__
#include <immintrin.h>

/* Elements i .. i + 15 in one float32 vector, as element_f32 reads each. */
static inline __attribute__((always_inline)) __m512 vector_f32(const void *p, int64_t i, const int bf16)
{
    if (bf16)
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i))), 16));
    return _mm512_loadu_ps((const float *)p + i);
}
#endif

#endif
