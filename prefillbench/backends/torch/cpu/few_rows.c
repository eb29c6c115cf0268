/* Products of a few rows (decode steps) by a weight packed for one sequential read (see cpu_few_rows.py).
 *
 * y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]), for m < 9 rows. The weight is packed once into
 * blocks of NB output rows, 64 bytes of each row after the other: [N/NB][K*size/64][NB][64 bytes].
 * A block is then one sequential stream that the hardware prefetcher keeps ahead of, where
 * nn.Linear's layout read NB rows at once is NB short streams; measured, that layout read the
 * weights at 18-23 GB/s and this one at 31-45 GB/s against a 46 GB/s plain read.
 * Software prefetch (2 KB ahead, one per line) is issued only for more than 4 rows, where a block
 * is multiplied in two passes and the first is dense in FMAs: measured on two threads, fp32, 5-8
 * rows took 1.12-1.20x the time without it; 1-4 rows took 1.03-1.23x the time with it (1.1-1.4x
 * on one thread, fp32 and bf16).
 * Each thread takes a contiguous range of blocks; a block's rows are multiplied 4 at a time, so
 * 16 accumulators stay in registers and a second group of rows finds the block in L1.
 * bfloat16 uses the AVX512-BF16 pair products (float32 sums, as oneDNN's bf16 product) and
 * rounds each result once, after the bias, as torch's bf16 linear does.
 */
#include <stdint.h>
#include <string.h>
#include <omp.h>
#include "bf16.h"
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#define NB 4
#define UNIT 64            /* bytes of one row in one step of a block */
#define MAX_ROWS 8
#define PREFETCH_AHEAD 2048 /* bytes; the best of 1, 2 and 4 KB measured */

int few_rows_block_rows(void) { return NB; }
int few_rows_unit_bytes(void) { return UNIT; }

/* w [N, K] of `size`-byte elements -> p, packed as above; N % NB == 0 and K * size % UNIT == 0. */
void few_rows_pack(const void *w, void *p, int64_t N, int64_t K, int64_t size)
{
    const int64_t row = K * size, units = row / UNIT;
    #pragma omp parallel for
    for (int64_t nb = 0; nb < N / NB; nb++)
        for (int64_t u = 0; u < units; u++)
            for (int j = 0; j < NB; j++)
                memcpy((char *)p + ((nb * units + u) * NB + j) * UNIT, (const char *)w + (nb * NB + j) * row + u * UNIT, UNIT);
}

/* One block (NB output rows) times `mr` (1-4) rows of x, as float32 sums in acc[r * NB + j];
 * `prefetch` (the same for a whole call, so the branch is predicted) asks for the block ahead.
 * Always inlined and called with a literal mr (dispatch below), so the accumulators stay in
 * registers: indexed by a runtime row count they would live on the stack. */
#define INLINE static inline __attribute__((always_inline))
INLINE void block_f32(const float *x, const float *b, int64_t K, int mr, int prefetch, float *acc)
{
#ifdef __AVX512F__
    __m512 s[4][NB];
    for (int r = 0; r < 4; r++)
        for (int j = 0; j < NB; j++) s[r][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16, b += NB * 16) {
        if (prefetch)
            for (int line = 0; line < NB; line++) __builtin_prefetch((const char *)b + PREFETCH_AHEAD + line * UNIT);
        __m512 w[NB];
        for (int j = 0; j < NB; j++) w[j] = _mm512_loadu_ps(b + j * 16);
        for (int r = 0; r < mr; r++) {
            __m512 xv = _mm512_loadu_ps(x + r * K + k);
            for (int j = 0; j < NB; j++) s[r][j] = _mm512_fmadd_ps(xv, w[j], s[r][j]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < NB; j++) acc[r * NB + j] = _mm512_reduce_add_ps(s[r][j]);
#else
    for (int i = 0; i < mr * NB; i++) acc[i] = 0.0f;
    for (int64_t k = 0; k < K; k += 16, b += NB * 16)
        for (int r = 0; r < mr; r++)
            for (int j = 0; j < NB; j++)
                for (int l = 0; l < 16; l++) acc[r * NB + j] += x[r * K + k + l] * b[j * 16 + l];
#endif
}

/* One row: block_f32 would chain each output's FMAs through one accumulator, K/16 deep; two sets
 * (even and odd 16-element steps) halve the chains. Measured, one thread: 0.87-0.89x the time. */
INLINE void block_f32_one_row(const float *x, const float *b, int64_t K, float *acc)
{
#ifdef __AVX512F__
    __m512 even[NB], odd[NB];
    for (int j = 0; j < NB; j++) even[j] = odd[j] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32, b += NB * 32) {
        const __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
        for (int j = 0; j < NB; j++) even[j] = _mm512_fmadd_ps(x0, _mm512_loadu_ps(b + j * 16), even[j]);
        for (int j = 0; j < NB; j++) odd[j] = _mm512_fmadd_ps(x1, _mm512_loadu_ps(b + (NB + j) * 16), odd[j]);
    }
    if (k < K) {  /* K is a multiple of 16: at most one step left */
        const __m512 x0 = _mm512_loadu_ps(x + k);
        for (int j = 0; j < NB; j++) even[j] = _mm512_fmadd_ps(x0, _mm512_loadu_ps(b + j * 16), even[j]);
    }
    for (int j = 0; j < NB; j++) acc[j] = _mm512_reduce_add_ps(_mm512_add_ps(even[j], odd[j]));
#else
    block_f32(x, b, K, 1, 0, acc);
#endif
}

INLINE void block_bf16(const uint16_t *x, const uint16_t *b, int64_t K, int mr, int prefetch, float *acc)
{
#if defined(__AVX512BF16__)
    __m512 s[4][NB];
    for (int r = 0; r < 4; r++)
        for (int j = 0; j < NB; j++) s[r][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 32, b += NB * 32) {
        if (prefetch)
            for (int line = 0; line < NB; line++) __builtin_prefetch((const char *)b + PREFETCH_AHEAD + line * UNIT);
        __m512bh w[NB];
        for (int j = 0; j < NB; j++) w[j] = (__m512bh)_mm512_loadu_si512(b + j * 32);
        for (int r = 0; r < mr; r++) {
            __m512bh xv = (__m512bh)_mm512_loadu_si512(x + r * K + k);
            for (int j = 0; j < NB; j++) s[r][j] = _mm512_dpbf16_ps(s[r][j], xv, w[j]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < NB; j++) acc[r * NB + j] = _mm512_reduce_add_ps(s[r][j]);
#else
    for (int i = 0; i < mr * NB; i++) acc[i] = 0.0f;
    for (int64_t k = 0; k < K; k += 32, b += NB * 32)
        for (int r = 0; r < mr; r++)
            for (int j = 0; j < NB; j++)
                for (int l = 0; l < 32; l++) acc[r * NB + j] += bf16_to_f32(x[r * K + k + l]) * bf16_to_f32(b[j * 32 + l]);
#endif
}

/* x [M, K], packed weight p, bias [N] or NULL, y [M, N]; all float32, or all bfloat16 when bf16.
 * Returns 0, or -1 for a shape it does not take (its caller checks first). */
int few_rows(const void *x, const void *p, const void *bias, void *y, int64_t M, int64_t N, int64_t K,
             int bf16, int threads)
{
    const int64_t size = bf16 ? 2 : 4;
    if (M < 1 || M > MAX_ROWS || N % NB || (K * size) % UNIT) return -1;
    const int64_t blocks = N / NB;
    const int prefetch = M > 4;
    #pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        float acc[4 * NB];
        for (int64_t nb = blocks * t / nt; nb < blocks * (t + 1) / nt; nb++) {
            const char *b = (const char *)p + nb * NB * K * size;
            for (int64_t r0 = 0; r0 < M; r0 += 4) {
                const int mr = M - r0 < 4 ? (int)(M - r0) : 4;
                if (bf16) {
                    const uint16_t *xr = (const uint16_t *)x + r0 * K, *bb = (const uint16_t *)b;
                    switch (mr) {
                    case 1: block_bf16(xr, bb, K, 1, prefetch, acc); break;
                    case 2: block_bf16(xr, bb, K, 2, prefetch, acc); break;
                    case 3: block_bf16(xr, bb, K, 3, prefetch, acc); break;
                    default: block_bf16(xr, bb, K, 4, prefetch, acc);
                    }
                } else {
                    const float *xr = (const float *)x + r0 * K, *bb = (const float *)b;
                    switch (mr) {
                    case 1: block_f32_one_row(xr, bb, K, acc); break;
                    case 2: block_f32(xr, bb, K, 2, prefetch, acc); break;
                    case 3: block_f32(xr, bb, K, 3, prefetch, acc); break;
                    default: block_f32(xr, bb, K, 4, prefetch, acc);
                    }
                }
                for (int r = 0; r < mr; r++)
                    for (int j = 0; j < NB; j++) {
                        const int64_t n = nb * NB + j;
                        float v = acc[r * NB + j];
                        if (bf16) {
                            if (bias) v += bf16_to_f32(((const uint16_t *)bias)[n]);
                            ((uint16_t *)y)[(r0 + r) * N + n] = f32_to_bf16(v);
                        } else {
                            if (bias) v += ((const float *)bias)[n];
                            ((float *)y)[(r0 + r) * N + n] = v;
                        }
                    }
            }
        }
    }
    return 0;
}
