/* Causal attention of a prompt chunk over its own slot of the cache, flash style (see cpu_prefill_attention.py).
 *
 * float32, or bfloat16 inputs widened as they are read (sums in float32, as SDPA's CPU kernel keeps them;
 * out is float32 either way). Query t of the chunk (row t of q, head h at q + t * q_stride + h * dim) sits at position
 * start + t and attends positions 0 .. start + t of its slot: keys and values [kv_heads, max_len, dim]
 * (the slot's part of the cache, contiguous). out [T, heads, dim], contiguous.
 * Work items are (head, block of QB queries), heaviest first, over torch's OpenMP threads. An item
 * walks its key blocks of KB positions up to its last query's position: the scores of a block are
 * a QB x KB product (the keys transposed once per call, so 16 keys fill a vector), then the online
 * softmax (as flash attention: a running maximum and sum per row, the output rescaled), then a
 * QB x dim product with the values. Blocks wholly above the diagonal are never touched, which
 * SDPA's CPU kernel skips only in whole tiles of 512 keys.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#define QB 64 /* queries per work item */
#define KB 64 /* keys per block */
#define ROWS 4 /* query rows per register tile */
#define INLINE static inline __attribute__((always_inline))
/* Keeps a loaded vector in a register: left to itself, GCC folds the load into each FMA that uses it,
 * and a tile's ROWS FMAs per vector then load it ROWS times (20 loads per 16 FMAs, more than the
 * load ports take; measured in perf annotate). */
#define IN_REGISTER(v) __asm__("" : "+v"(v))

/* s[r][0..KB) = sum_x q[r][x] * kt[x][0..KB), for ROWS rows of q (row stride dim); kt's rows `kt_stride` apart. */
INLINE void scores_tile(const float *q, const float *kt, int64_t kt_stride, float *s, const int64_t dim)
{
#ifdef __AVX512F__
    __m512 acc[ROWS][KB / 16];
    for (int r = 0; r < ROWS; r++)
        for (int v = 0; v < KB / 16; v++) acc[r][v] = _mm512_setzero_ps();
    for (int64_t x = 0; x < dim; x++) {
        __m512 k[KB / 16];
        for (int v = 0; v < KB / 16; v++) {
            k[v] = _mm512_loadu_ps(kt + x * kt_stride + v * 16);
            IN_REGISTER(k[v]);
        }
        for (int r = 0; r < ROWS; r++) {
            const __m512 qx = _mm512_set1_ps(q[r * dim + x]);
            for (int v = 0; v < KB / 16; v++) acc[r][v] = _mm512_fmadd_ps(qx, k[v], acc[r][v]);
        }
    }
    for (int r = 0; r < ROWS; r++)
        for (int v = 0; v < KB / 16; v++) _mm512_storeu_ps(s + r * KB + v * 16, acc[r][v]);
#else
    for (int r = 0; r < ROWS; r++)
        for (int j = 0; j < KB; j++) {
            float a = 0.f;
            for (int64_t x = 0; x < dim; x++) a += q[r * dim + x] * kt[x * kt_stride + j];
            s[r * KB + j] = a;
        }
#endif
}

/* o[r][c0..c0+64) = o[r] * alpha[r] + sum_j p[r][j] * v[j][c0..c0+64), for ROWS rows and `keys` rows of v
 * (row stride dim). 64 output columns at a time keep the 16 sums in registers for any head size. */
INLINE void values_tile(const float *p, const void *v, const float *alpha, float *o, int64_t keys, const int64_t dim,
                        int64_t c0, const int bf16)
{
#ifdef __AVX512F__
    __m512 acc[ROWS][4];
    for (int r = 0; r < ROWS; r++) {
        const __m512 a = _mm512_set1_ps(alpha[r]);
        for (int c = 0; c < 4; c++) acc[r][c] = _mm512_mul_ps(a, _mm512_loadu_ps(o + r * dim + c0 + c * 16));
    }
    for (int64_t j = 0; j < keys; j++) {
        __m512 w[4];
        for (int c = 0; c < 4; c++) {
            w[c] = vector_f32(v, j * dim + c0 + c * 16, bf16);
            IN_REGISTER(w[c]);
        }
        for (int r = 0; r < ROWS; r++) {
            const __m512 pj = _mm512_set1_ps(p[r * KB + j]);
            for (int c = 0; c < 4; c++) acc[r][c] = _mm512_fmadd_ps(pj, w[c], acc[r][c]);
        }
    }
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < 4; c++) _mm512_storeu_ps(o + r * dim + c0 + c * 16, acc[r][c]);
#else
    for (int r = 0; r < ROWS; r++)
        for (int64_t x = c0; x < c0 + 64; x++) {
            float a = o[r * dim + x] * alpha[r];
            for (int64_t j = 0; j < keys; j++) a += p[r * KB + j] * element_f32(v, j * dim + x, bf16);
            o[r * dim + x] = a;
        }
#endif
}

/* One work item: queries [q0, q0 + nq) of head h. kt: the keys of h's K/V head transposed a block at a time,
 * [key block][dim][KB] (zero past the last position). Scratch: qs [QB][dim], s [QB][KB], o [QB][dim]. */
INLINE void attend_block(const void *q, int64_t q_stride, const float *kt, const void *values,
                         int64_t max_len, int64_t start, int64_t q0, int64_t nq, int64_t h, int64_t group, const int64_t dim,
                         float scale, float *out, int64_t heads, float *qs, float *s, float *o, const int bf16)
{
    const char *vh = (const char *)values + (h / group) * max_len * dim * (bf16 ? 2 : 4);
    const int64_t rows = (nq + ROWS - 1) / ROWS * ROWS; /* a short chunk computes only the tiles it fills */
    float top[QB], sum[QB], alpha[QB];
    /* the queries, scaled; rows past nq zero (their results are dropped) */
    for (int64_t r = 0; r < rows; r++)
        for (int64_t x = 0; x < dim; x++) qs[r * dim + x] = r < nq ? element_f32(q, (q0 + r) * q_stride + h * dim + x, bf16) * scale : 0.f;
    memset(o, 0, sizeof(float) * rows * dim);
    for (int64_t r = 0; r < rows; r++) {
        top[r] = -FLT_MAX;
        sum[r] = 0.f;
    }
    const int64_t last = start + q0 + nq - 1; /* the last position any of these queries sees */
    for (int64_t k0 = 0; k0 <= last; k0 += KB) {
        const int64_t nk = last + 1 - k0 < KB ? last + 1 - k0 : KB;
        for (int64_t r = 0; r < rows; r += ROWS) scores_tile(qs + r * dim, kt + k0 * dim, KB, s + r * KB, dim);
        for (int64_t r = 0; r < rows; r++) {
            float *row = s + r * KB;
            const int64_t seen = start + q0 + r - k0 + 1; /* keys of this block row r may see */
            const int64_t n = seen < nk ? (seen > 0 ? seen : 0) : nk;
            float m = top[r];
            for (int64_t j = 0; j < n; j++) m = row[j] > m ? row[j] : m;
            /* Plain loops, so each vectorizes (expf through libmvec's 16-wide expf). Its arguments are held
             * above -80: below that libmvec takes a scalar path per element, and e^-80 is 0 to a sum of 1s. */
            for (int64_t j = 0; j < KB; j++) row[j] = expf(fmaxf(row[j] - m, -80.f));
            for (int64_t j = n; j < KB; j++) row[j] = 0.f; /* masked */
            float total = 0.f;
            for (int64_t j = 0; j < KB; j++) total += row[j];
            alpha[r] = expf(top[r] - m);
            sum[r] = sum[r] * alpha[r] + total;
            top[r] = m;
        }
        for (int64_t r = 0; r < rows; r += ROWS)
            for (int64_t c0 = 0; c0 < dim; c0 += 64) values_tile(s + r * KB, vh + k0 * dim * (bf16 ? 2 : 4), alpha + r, o + r * dim, nk, dim, c0, bf16);
    }
    for (int64_t r = 0; r < nq; r++) {
        const float inv = 1.f / sum[r];
        float *dst = out + ((q0 + r) * heads + h) * dim;
        for (int64_t x = 0; x < dim; x++) dst[x] = o[r * dim + x] * inv;
    }
}

INLINE int attend_all(const void *q, int64_t q_stride, const void *keys, const void *values, int64_t max_len,
                      int64_t start, int64_t T, int64_t heads, int64_t kv_heads, const int64_t dim, float scale, float *out,
                      int bf16)
{
    const int64_t blocks = (T + QB - 1) / QB, items = heads * blocks, group = heads / kv_heads;
    const int64_t seen = start + T, key_blocks = (seen + KB - 1) / KB;
    /* Keys transposed once per call and K/V head (16 positions fill a vector), shared by the heads of its group;
     * a block's tile contiguous: rows of one long transposed matrix, 4 KB apart, fell into the same L1 sets. */
    float *kt = malloc(sizeof(float) * kv_heads * key_blocks * dim * KB);
    if (!kt) return 1;
    int failed = 0;
    #pragma omp parallel reduction(|| : failed)
    {
        #pragma omp for schedule(static)
        for (int64_t t = 0; t < kv_heads * key_blocks; t++) {
            const int64_t kvh = t / key_blocks, k0 = (t % key_blocks) * KB;
            const int64_t first = (kvh * max_len + k0) * dim;
            float *dst = kt + t * dim * KB;
            for (int64_t j = 0; j < KB; j++)
                for (int64_t x = 0; x < dim; x++) dst[x * KB + j] = k0 + j < seen ? element_f32(keys, first + j * dim + x, bf16) : 0.f;
        }
        float *scratch = malloc(sizeof(float) * (2 * QB * dim + QB * KB));
        failed = !scratch;
        /* the last query blocks see the most keys: hand them out first */
        #pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < items; t++) {
            if (!scratch) continue;
            const int64_t b = blocks - 1 - t / heads, h = t % heads;
            const int64_t q0 = b * QB, nq = T - q0 < QB ? T - q0 : QB;
            float *qs = scratch, *o = qs + QB * dim, *s = o + QB * dim;
            /* The dtype a literal here, inside the parallel region (GCC outlines a region's body before it
             * inlines, so a constant from outside would not reach the loops): one copy of the loops each. */
            if (bf16)
                attend_block(q, q_stride, kt + (h / group) * key_blocks * dim * KB, values, max_len, start, q0, nq, h,
                             group, dim, scale, out, heads, qs, s, o, 1);
            else
                attend_block(q, q_stride, kt + (h / group) * key_blocks * dim * KB, values, max_len, start, q0, nq, h,
                             group, dim, scale, out, heads, qs, s, o, 0);
        }
        free(scratch);
    }
    free(kt);
    return failed;
}

/* 0; 1 if scratch memory could not be had; 2 for a head size it does not take (64 and 128 only). */
int prefill_attention(const void *q, int64_t q_stride, const void *keys, const void *values, int64_t max_len,
                      int64_t start, int64_t T, int64_t heads, int64_t kv_heads, int64_t dim, float scale, float *out,
                      int64_t bf16)
{
    if (dim != 64 && dim != 128) return 2;
    return attend_all(q, q_stride, keys, values, max_len, start, T, heads, kv_heads, dim, scale, out, (int)bf16);
}
