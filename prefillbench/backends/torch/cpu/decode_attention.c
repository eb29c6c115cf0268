/* Decode attention over a static per-slot KV cache, read in place (see cpu_decode_attention.py).
 *
 * q [n, heads, dim] and out [n, heads, dim] float32; k_cache, v_cache [slots, kv_heads, max_len, dim]
 * float32 or bfloat16 (read as float32: the top half of its bits); all contiguous. Decode i, at
 * position positions[i], attends positions 0 .. positions[i] of slot slots[i]. Each
 * (decode, K/V head) is cut into `parts` spans of positions, one OpenMP work item each; the
 * spans' partial softmaxes are merged after, as flash attention merges its tiles. OpenMP is the
 * runtime torch itself runs on (libgomp, resolved to the copy torch loaded), so these threads
 * are torch's own and no second pool competes with them for the cores. Built with -ffast-math (the
 * vector expf needs it), which lets the compiler assume no infinities: maxima start at -FLT_MAX.
 * With AVX-512, heads of 64 or 128 and groups of 1-8 take attend_span_avx512; others the plain loop.
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

/* Each of `group` rows of `width` scores becomes exp(score - its maximum): the maximum into top, the sum into total. */
static inline __attribute__((always_inline)) void softmax_rows(float *scores, int64_t width, int64_t group, float *top,
                                                               float *total)
{
    for (int64_t g = 0; g < group; g++) {
        float *row = scores + g * width, m = -FLT_MAX, sum = 0.f;
        for (int64_t j = 0; j < width; j++) m = row[j] > m ? row[j] : m;
        for (int64_t j = 0; j < width; j++) {
            row[j] = expf(row[j] - m);
            sum += row[j];
        }
        top[g] = m;
        total[g] = sum;
    }
}

static inline __attribute__((always_inline)) void attend_span(
    const float *q, const char *kc, const char *vc, int64_t slot, int64_t h, int64_t j0, int64_t width,
    int64_t group, int64_t kv_heads, int64_t max_len, const int64_t dim, float scale,
    float *scores, float *top, float *total, float *acc, const int bf16)
{
    const int64_t elt = bf16 ? 2 : 4;
    const char *keys = kc + ((slot * kv_heads + h) * max_len + j0) * dim * elt;
    const char *values = vc + ((slot * kv_heads + h) * max_len + j0) * dim * elt;
    /* One pass over the keys: each row is loaded once for the whole group (from L1 for all but the first). */
    for (int64_t j = 0; j < width; j++) {
        const char *key = keys + j * dim * elt;
        for (int64_t g = 0; g < group; g++) {
            const float *qg = q + g * dim;
            float s = 0.f;
            for (int64_t x = 0; x < dim; x++) s += qg[x] * element_f32(key, x, bf16);
            scores[g * width + j] = s * scale;
        }
    }
    softmax_rows(scores, width, group, top, total);
    for (int64_t x = 0; x < group * dim; x++) acc[x] = 0.f;
    for (int64_t j = 0; j < width; j++) {
        const char *value = values + j * dim * elt;
        for (int64_t g = 0; g < group; g++) {
            const float p = scores[g * width + j];
            float *a = acc + g * dim;
            for (int64_t x = 0; x < dim; x++) a[x] += p * element_f32(value, x, bf16);
        }
    }
}

#ifdef __AVX512F__
/* The same span for a head size and group size known when compiling (dispatched below), in AVX-512.
 * The plain loop above spent most of its time on one horizontal sum per (key, query) behind a chain
 * of dependent FMAs, and kept the V sums in memory: it read a 2 MB-page cache at 22-25 GB/s (30
 * layers of SmolLM2's heads at 1,024 positions, 2 threads). Here the scores of 16 keys are summed
 * across lanes together (hsum16: 45 shuffles and adds for 16 dot products) and the V sums stay in
 * registers: 27-34 GB/s, 0.76x the time at 1 and 16 sequences, 0.91x at 4 (paired in one process).
 * Software prefetch 2 or 4 KB ahead was slower (0.84-0.92x against 0.76x), so there is none. */
#define INLINE static inline __attribute__((always_inline))

/* Lane b of the result: the sum of a[b]'s 16 lanes. */
INLINE __m512 hsum16(const __m512 a[16])
{
    __m512 pairs[8], quads[4];
    for (int i = 0; i < 8; i++)  /* 128-bit lane L: (a0, a1, a0, a1) partial sums of pair i */
        pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; i++) {  /* 128-bit lane L: keys 4i..4i+3, each its sum over lane L */
        __m512d x = _mm512_castps_pd(pairs[2 * i]), y = _mm512_castps_pd(pairs[2 * i + 1]);
        quads[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    __m512 w01 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_f32x4(quads[0], quads[1], _MM_SHUFFLE(3, 1, 3, 1)));
    __m512 w23 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_f32x4(quads[2], quads[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(w01, w23, _MM_SHUFFLE(3, 1, 3, 1)));
}

INLINE void attend_span_avx512(
    const float *q, const char *kc, const char *vc, int64_t slot, int64_t h, int64_t j0, int64_t width,
    const int64_t group, int64_t kv_heads, int64_t max_len, const int64_t dim, float scale,
    float *scores, float *top, float *total, float *acc, const int bf16)
{
    const int64_t elt = bf16 ? 2 : 4, chunks = dim / 16;
    const char *keys = kc + ((slot * kv_heads + h) * max_len + j0) * dim * elt;
    const char *values = vc + ((slot * kv_heads + h) * max_len + j0) * dim * elt;
    const __m512 scale16 = _mm512_set1_ps(scale);
    int64_t j = 0;
    for (; j + 16 <= width; j += 16) {
        const char *block = keys + j * dim * elt;
        for (int64_t g = 0; g < group; g++) {
            __m512 qv[8], a[16];
            for (int64_t c = 0; c < chunks; c++) qv[c] = _mm512_loadu_ps(q + g * dim + 16 * c);
            for (int b = 0; b < 16; b++) {
                a[b] = _mm512_mul_ps(qv[0], vector_f32(block + b * dim * elt, 0, bf16));
                for (int64_t c = 1; c < chunks; c++) a[b] = _mm512_fmadd_ps(qv[c], vector_f32(block + b * dim * elt, 16 * c, bf16), a[b]);
            }
            _mm512_storeu_ps(scores + g * width + j, _mm512_mul_ps(hsum16(a), scale16));
        }
    }
    for (; j < width; j++) {  /* the last keys, fewer than 16 */
        const char *key = keys + j * dim * elt;
        for (int64_t g = 0; g < group; g++) {
            __m512 s = _mm512_setzero_ps();
            for (int64_t c = 0; c < chunks; c++) s = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * dim + 16 * c), vector_f32(key, 16 * c, bf16), s);
            scores[g * width + j] = _mm512_reduce_add_ps(s) * scale;
        }
    }
    softmax_rows(scores, width, group, top, total);
    /* V: as many queries at a time as keep their sums in 16 registers; further ones read the span again, from cache. */
    const int64_t per_pass = 16 / chunks > 0 ? 16 / chunks : 1;
    for (int64_t g0 = 0; g0 < group; g0 += per_pass) {
        __m512 sums[16];
        for (int i = 0; i < 16; i++) sums[i] = _mm512_setzero_ps();
        for (int64_t i = 0; i < width; i++) {
            const char *value = values + i * dim * elt;
            __m512 v[8];
            for (int64_t c = 0; c < chunks; c++) v[c] = vector_f32(value, 16 * c, bf16);
            for (int64_t g = 0; g < per_pass; g++) {
                if (g0 + g >= group) break;  /* per_pass and group are constants: the loop unrolls, sums stay in registers */
                const __m512 p = _mm512_set1_ps(scores[(g0 + g) * width + i]);
                for (int64_t c = 0; c < chunks; c++) sums[g * chunks + c] = _mm512_fmadd_ps(p, v[c], sums[g * chunks + c]);
            }
        }
        for (int64_t g = 0; g < per_pass && g0 + g < group; g++)
            for (int64_t c = 0; c < chunks; c++) _mm512_storeu_ps(acc + (g0 + g) * dim + 16 * c, sums[g * chunks + c]);
    }
}
#endif

/* The span with its head size, group size and cache dtype as constants, so that its loops unroll and
 * its sums stay in registers. The switch has to be here, called from inside the OpenMP region: GCC
 * outlines a parallel region's body before it inlines, so constants passed into a function that
 * holds the region never reach its loops (one outlined copy served every head size). */
#define SIZED(G, D, BF) attend_span_avx512(q, kc, vc, slot, h, j0, width, G, kv_heads, max_len, D, scale, scores, top, total, acc, BF)
#define GROUPS(D, BF)                                                  \
    switch (group) {                                                   \
    case 1: SIZED(1, D, BF); return;                                   \
    case 2: SIZED(2, D, BF); return;                                   \
    case 3: SIZED(3, D, BF); return;                                   \
    case 4: SIZED(4, D, BF); return;                                   \
    case 5: SIZED(5, D, BF); return;                                   \
    case 6: SIZED(6, D, BF); return;                                   \
    case 7: SIZED(7, D, BF); return;                                   \
    case 8: SIZED(8, D, BF); return;                                   \
    }

static void attend_span_sized(
    const float *q, const char *kc, const char *vc, int64_t slot, int64_t h, int64_t j0, int64_t width,
    int64_t group, int64_t kv_heads, int64_t max_len, int64_t dim, float scale,
    float *scores, float *top, float *total, float *acc, int bf16)
{
#ifdef __AVX512F__
    if (dim == 64 && bf16) GROUPS(64, 1)
    if (dim == 64 && !bf16) GROUPS(64, 0)
    if (dim == 128 && bf16) GROUPS(128, 1)
    if (dim == 128 && !bf16) GROUPS(128, 0)
#endif
    if (bf16)
        attend_span(q, kc, vc, slot, h, j0, width, group, kv_heads, max_len, dim, scale, scores, top, total, acc, 1);
    else
        attend_span(q, kc, vc, slot, h, j0, width, group, kv_heads, max_len, dim, scale, scores, top, total, acc, 0);
}

static inline __attribute__((always_inline)) int attend_all(
    const float *q, const char *kc, const char *vc, const int64_t *slots, const int64_t *positions,
    int64_t n, int64_t heads, int64_t kv_heads, int64_t max_len, const int64_t dim, float scale,
    int64_t parts, float *out, const int bf16)
{
    const int64_t group = heads / kv_heads;
    const int64_t items = n * kv_heads * parts;
    int64_t longest = 0;
    for (int64_t i = 0; i < n; i++) longest = positions[i] + 1 > longest ? positions[i] + 1 : longest;
    const int64_t span_max = (longest + parts - 1) / parts;
    /* per item: group maxima, group sums, group x dim partial outputs */
    float *part = malloc(sizeof(float) * items * group * (dim + 2));
    if (!part) return 1;
    int failed = 0;
    #pragma omp parallel reduction(|| : failed)
    {
        float *scores = malloc(sizeof(float) * group * (span_max > 0 ? span_max : 1));
        failed = !scores;
        #pragma omp for schedule(static)
        for (int64_t t = 0; t < items; t++) {
            if (!scores) continue;
            const int64_t p = t % parts, i = (t / parts) / kv_heads, h = (t / parts) % kv_heads;
            const int64_t len = positions[i] + 1;
            const int64_t span = (len + parts - 1) / parts;
            int64_t j0 = p * span, j1 = j0 + span;
            if (j1 > len) j1 = len;
            float *top = part + t * group * (dim + 2), *total = top + group, *acc = total + group;
            if (j1 <= j0) {
                for (int64_t g = 0; g < group; g++) total[g] = 0.f;
                continue;
            }
            attend_span_sized(q + (i * heads + h * group) * dim, kc, vc, slots[i], h, j0, j1 - j0, group, kv_heads,
                              max_len, dim, scale, scores, top, total, acc, bf16);
        }
        free(scores);
    }
    if (failed) {
        free(part);
        return 1;
    }
    for (int64_t r = 0; r < n * kv_heads; r++) {
        const int64_t i = r / kv_heads, h = r % kv_heads;
        for (int64_t g = 0; g < group; g++) {
            float m = -FLT_MAX, sum = 0.f;
            for (int64_t p = 0; p < parts; p++) {
                const float *top = part + (r * parts + p) * group * (dim + 2);
                if (top[group + g] > 0.f && top[g] > m) m = top[g];
            }
            float *o = out + (i * heads + h * group + g) * dim;
            for (int64_t x = 0; x < dim; x++) o[x] = 0.f;
            for (int64_t p = 0; p < parts; p++) {
                const float *top = part + (r * parts + p) * group * (dim + 2);
                if (top[group + g] == 0.f) continue;  /* an empty span */
                const float w = expf(top[g] - m);
                sum += w * top[group + g];
                const float *acc = top + 2 * group + g * dim;
                for (int64_t x = 0; x < dim; x++) o[x] += w * acc[x];
            }
            for (int64_t x = 0; x < dim; x++) o[x] /= sum;
        }
    }
    free(part);
    return 0;
}

/* 0, or 1 if memory for the partial results could not be had (out is then not written). */
int decode_attention(const float *q, const char *kc, const char *vc, const int64_t *slots, const int64_t *positions,
                      int64_t n, int64_t heads, int64_t kv_heads, int64_t max_len, int64_t dim, float scale,
                      int64_t parts, float *out, int64_t bf16)
{
    return attend_all(q, kc, vc, slots, positions, n, heads, kv_heads, max_len, dim, scale, parts, out, (int)bf16);
}

/* A decode step's fused q/k/v product, qkv [n, width] (q's heads, then k's, then v's, head_dim each, in the
 * model's dtype), made ready for decode_attention: q widened into q_out [n, heads, dim] float32, k and v written
 * into the caches at (slots[i], :, positions[i]). The decode plan's step and the fused eager path's decodes
 * (stage_and_attend) both stage through it; the unfused path takes a .to(float32) and two index_put a layer. */
void stage_decode_qkv(const void *qkv, int64_t n, int64_t width, int64_t heads, int64_t kv_heads, int64_t dim,
                      float *q_out, char *kc, char *vc, const int64_t *slots, const int64_t *positions,
                      int64_t max_len, int64_t bf16)
{
    const int64_t size = bf16 ? 2 : 4;
    for (int64_t i = 0; i < n; i++) {
        const char *row = (const char *)qkv + i * width * size;
        for (int64_t x = 0; x < heads * dim; x++) q_out[i * heads * dim + x] = element_f32(row, x, (int)bf16);
        for (int64_t h = 0; h < kv_heads; h++) {
            const int64_t at = ((slots[i] * kv_heads + h) * max_len + positions[i]) * dim * size;
            memcpy(kc + at, row + (heads + h) * dim * size, dim * size);
            memcpy(vc + at, row + (heads + kv_heads + h) * dim * size, dim * size);
        }
    }
}
