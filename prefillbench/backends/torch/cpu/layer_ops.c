/* A decoder layer's elementwise work in one pass each (see cpu_layer_ops.py).
 *
 * Tensors are contiguous float32 or bfloat16 (all of one call the same), computed in float32.
 * In bfloat16 every result is rounded where transformers' modules round it (after each op of
 * theirs), so the two paths agree to the last bit but for the order of one sum. Rows are split
 * over OpenMP threads (torch's own libgomp, as in decode_attention.c) only when there are
 * enough of them to pay for waking a thread: a decode step's few rows stay on the caller's.
 * The dtype is a literal inside each parallel loop (FOR_ROWS): OpenMP outlines the loop into a
 * function of its own, where a dtype passed in from outside would be a runtime value, and the
 * branches it leaves in the inner loops keep them from vectorizing (measured: 1.4 ns an element).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"

/* Elements per call below which one thread does it all. */
#define PARALLEL_FROM 16384
/* The widest head the rotary kernel takes (its callers check). */
#define MAX_HEAD_DIM 512

/* Rounded to bfloat16 and back: what a bfloat16 op's result holds. */
static inline __attribute__((always_inline)) float rounded(float v, const int bf16)
{
    return bf16 ? bf16_to_f32(f32_to_bf16(v)) : v;
}

static inline __attribute__((always_inline)) void store(void *p, int64_t i, float v, const int bf16)
{
    if (bf16)
        ((uint16_t *)p)[i] = f32_to_bf16(v);
    else
        ((float *)p)[i] = v;
}

/* residual += delta (when delta is given), then out = weight * RMSNorm(residual), for row r. */
static inline __attribute__((always_inline)) void add_rms_norm_row(
    void *restrict residual, const void *restrict delta, const void *restrict weight, void *restrict out, int64_t r,
    int64_t dim, float eps, const int bf16)
{
    const int64_t base = r * dim;
    float squares = 0.0f;
    if (delta) {
        for (int64_t i = 0; i < dim; i++) {
            float x = rounded(element_f32(residual, base + i, bf16) + element_f32(delta, base + i, bf16), bf16);
            store(residual, base + i, x, bf16);
            squares += x * x;
        }
    } else {
        for (int64_t i = 0; i < dim; i++) {
            float x = element_f32(residual, base + i, bf16);
            squares += x * x;
        }
    }
    const float inv = 1.0f / sqrtf(squares / (float)dim + eps);
    for (int64_t i = 0; i < dim; i++)
        store(out, base + i, element_f32(weight, i, bf16) * rounded(element_f32(residual, base + i, bf16) * inv, bf16), bf16);
}

/* Rotary embedding in place on the first `heads` heads of row r (q's and k's heads of a fused qkv
 * row `width` wide): x * cos + rotate_half(x) * sin, with cos and sin [rows, dim]. Each head's
 * halves are read into locals first: written in place, they would alias the loads. */
static inline __attribute__((always_inline)) void rotary_row(
    void *restrict qkv, const void *restrict cos, const void *restrict sin, int64_t r, int64_t width, int64_t heads,
    int64_t dim, const int bf16)
{
    const int64_t half = dim / 2;
    float c[MAX_HEAD_DIM], s[MAX_HEAD_DIM], a[MAX_HEAD_DIM / 2], b[MAX_HEAD_DIM / 2];
    for (int64_t i = 0; i < dim; i++) {
        c[i] = element_f32(cos, r * dim + i, bf16);
        s[i] = element_f32(sin, r * dim + i, bf16);
    }
    for (int64_t h = 0; h < heads; h++) {
        const int64_t x0 = r * width + h * dim;
        for (int64_t i = 0; i < half; i++) {
            a[i] = element_f32(qkv, x0 + i, bf16);
            b[i] = element_f32(qkv, x0 + half + i, bf16);
        }
        for (int64_t i = 0; i < half; i++)
            store(qkv, x0 + i, rounded(a[i] * c[i], bf16) - rounded(b[i] * s[i], bf16), bf16);
        for (int64_t i = 0; i < half; i++)
            store(qkv, x0 + half + i, rounded(b[i] * c[half + i], bf16) + rounded(a[i] * s[half + i], bf16), bf16);
    }
}

/* Row r of out [rows, inner] = silu(gate) * up, with gate_up [rows, 2 * inner] holding gate then up. */
static inline __attribute__((always_inline)) void silu_mul_row(
    const void *restrict gate_up, void *restrict out, int64_t r, int64_t inner, const int bf16)
{
    const int64_t g0 = r * 2 * inner;
    for (int64_t i = 0; i < inner; i++) {
        const float g = element_f32(gate_up, g0 + i, bf16);
        /* exp of at most 88 stays finite: -ffast-math lets the compiler assume no infinities. */
        const float silu = rounded(g / (1.0f + expf(fminf(-g, 88.0f))), bf16);
        store(out, r * inner + i, silu * element_f32(gate_up, g0 + inner + i, bf16), bf16);
    }
}

#define FOR_ROWS(rows, elements, call)                                                  \
    do {                                                                                \
        const int64_t work = (elements);                                                \
        _Pragma("omp parallel for schedule(static) if (work >= PARALLEL_FROM)")         \
        for (int64_t r = 0; r < (rows); r++)                                            \
            call;                                                                       \
    } while (0)

void add_rms_norm(void *residual, const void *delta, const void *weight, void *out, int64_t rows, int64_t dim,
                  float eps, int64_t bf16)
{
    if (bf16)
        FOR_ROWS(rows, rows * dim, add_rms_norm_row(residual, delta, weight, out, r, dim, eps, 1));
    else
        FOR_ROWS(rows, rows * dim, add_rms_norm_row(residual, delta, weight, out, r, dim, eps, 0));
}

void rotary(void *qkv, const void *cos, const void *sin, int64_t rows, int64_t width, int64_t heads, int64_t dim, int64_t bf16)
{
    if (bf16)
        FOR_ROWS(rows, rows * heads * dim, rotary_row(qkv, cos, sin, r, width, heads, dim, 1));
    else
        FOR_ROWS(rows, rows * heads * dim, rotary_row(qkv, cos, sin, r, width, heads, dim, 0));
}

void silu_mul(const void *gate_up, void *out, int64_t rows, int64_t inner, int64_t bf16)
{
    if (bf16)
        FOR_ROWS(rows, rows * inner, silu_mul_row(gate_up, out, r, inner, 1));
    else
        FOR_ROWS(rows, rows * inner, silu_mul_row(gate_up, out, r, inner, 0));
}
