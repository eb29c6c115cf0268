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
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

/* Element x of a cache row, as float32: bfloat16 is the top 16 bits of a float32. */
static inline __attribute__((always_inline)) float cache_at(const void *row, int64_t x, const int bf16)
{
    return bf16 ? bf16_to_f32(((const uint16_t *)row)[x]) : ((const float *)row)[x];
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
            for (int64_t x = 0; x < dim; x++) s += qg[x] * cache_at(key, x, bf16);
            scores[g * width + j] = s * scale;
        }
    }
    for (int64_t g = 0; g < group; g++) {
        float m = -FLT_MAX;
        for (int64_t j = 0; j < width; j++) m = scores[g * width + j] > m ? scores[g * width + j] : m;
        float sum = 0.f;
        for (int64_t j = 0; j < width; j++) {
            float e = expf(scores[g * width + j] - m);
            scores[g * width + j] = e;
            sum += e;
        }
        top[g] = m;
        total[g] = sum;
        for (int64_t x = 0; x < dim; x++) acc[g * dim + x] = 0.f;
    }
    for (int64_t j = 0; j < width; j++) {
        const char *value = values + j * dim * elt;
        for (int64_t g = 0; g < group; g++) {
            const float p = scores[g * width + j];
            float *a = acc + g * dim;
            for (int64_t x = 0; x < dim; x++) a[x] += p * cache_at(value, x, bf16);
        }
    }
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
            attend_span(q + (i * heads + h * group) * dim, kc, vc, slots[i], h, j0, j1 - j0, group, kv_heads,
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

/* The common head sizes get loops of constant length, which the compiler unrolls and vectorizes whole;
 * each cache dtype its own copy of the loops. */
#define DISPATCH(BF16)                                                                                      \
    do {                                                                                                    \
        if (dim == 64)                                                                                      \
            return attend_all(q, kc, vc, slots, positions, n, heads, kv_heads, max_len, 64, scale, parts, out, BF16); \
        else if (dim == 128)                                                                                \
            return attend_all(q, kc, vc, slots, positions, n, heads, kv_heads, max_len, 128, scale, parts, out, BF16); \
        else                                                                                                \
            return attend_all(q, kc, vc, slots, positions, n, heads, kv_heads, max_len, dim, scale, parts, out, BF16); \
    } while (0)

/* 0, or 1 if memory for the partial results could not be had (out is then not written). */
int decode_attention(const float *q, const char *kc, const char *vc, const int64_t *slots, const int64_t *positions,
                      int64_t n, int64_t heads, int64_t kv_heads, int64_t max_len, int64_t dim, float scale,
                      int64_t parts, float *out, int64_t bf16)
{
    if (bf16)
        DISPATCH(1);
    DISPATCH(0);
}
