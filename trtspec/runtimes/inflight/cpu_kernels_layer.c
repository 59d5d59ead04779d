/* trtspec's per-layer CPU kernels besides the multiplies: the elementwise work (float32 and bfloat16) and the attention
   over the slot KV cache. Built with cpu_kernels_multiply.c into one library (trtspec.runtimes.inflight.cpu_kernels). */
#include "cpu_kernels.h"
#include <stdlib.h>

/* The step's elementwise work, row by row (each row's bits independent of the others), one call where eager torch
   dispatches four to six ops per layer: about 9 ms of a 58 ms float32 decode step on SmolLM2-135M's 30 layers. */

/* h += delta (when given), then out = w * (h * 1 / sqrt(mean(h^2) + eps)): transformers' LlamaRMSNorm after the
   residual add, in float32. */
void trtspec_add_rmsnorm_f32(float *h, const float *delta, const float *w, float *out, int M, int H, float eps) {
    for (int m = 0; m < M; m++) {
        float *r = h + (int64_t)m * H;
        float *o = out + (int64_t)m * H;
        if (delta) {
            const float *d = delta + (int64_t)m * H;
            for (int i = 0; i < H; i++) r[i] += d[i];
        }
        __m256 acc = _mm256_setzero_ps();
        int i = 0;
        for (; i + 8 <= H; i += 8) {
            __m256 v = _mm256_loadu_ps(r + i);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        float ss = hsum(acc);
        for (; i < H; i++) ss += r[i] * r[i];
        float inv = 1.0f / sqrtf(ss / (float)H + eps);
        for (i = 0; i < H; i++) o[i] = w[i] * (r[i] * inv);
    }
}

/* Rotary embedding in place on the first ``heads`` heads of d of every row of x (row stride ``stride`` floats),
   rotate-half form: x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin, cos/sin [M, d]. */
void trtspec_rope_f32(float *x, const float *cos_t, const float *sin_t, int M, int stride, int heads, int d) {
    int half = d / 2;
    for (int m = 0; m < M; m++) {
        const float *c = cos_t + (int64_t)m * d, *s = sin_t + (int64_t)m * d;
        for (int h = 0; h < heads; h++) {
            float *v = x + (int64_t)m * stride + (int64_t)h * d;
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * c[i] - b * s[i];
                v[i + half] = b * c[i + half] + a * s[i + half];
            }
        }
    }
}

/* out = silu(g) * u for gu = [g | u] of 2 I per row: the MLP's activation. */
void trtspec_silu_mul_f32(const float *gu, float *out, int M, int I) {
    for (int m = 0; m < M; m++) {
        const float *g = gu + (int64_t)m * 2 * I, *u = g + I;
        float *o = out + (int64_t)m * I;
        for (int i = 0; i < I; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* The bfloat16 step's elementwise work and attention, row by row like the float32 kernels above. Each torch op on
   bfloat16 computes in float32 and rounds its result to bfloat16; these kernels round where those ops do (the residual
   add, the norm's two products, each product and the sum of the rotary embedding, silu and its product), so they give
   torch's bits except for the order of the norm's mean and expf's last float32 bit. */

void trtspec_add_rmsnorm_bf16(uint16_t *h, const uint16_t *delta, const uint16_t *w, uint16_t *out, int M, int H,
                              float eps) {
    for (int m = 0; m < M; m++) {
        uint16_t *r = h + (int64_t)m * H;
        uint16_t *o = out + (int64_t)m * H;
        if (delta) {
            const uint16_t *d = delta + (int64_t)m * H;
            for (int i = 0; i < H; i++) r[i] = f32_to_bf16(bf16_to_f32(r[i]) + bf16_to_f32(d[i]));
        }
        float ss = 0.0f;
        for (int i = 0; i < H; i++) {
            float v = bf16_to_f32(r[i]);
            ss += v * v;
        }
        float inv = 1.0f / sqrtf(ss / (float)H + eps);
        for (int i = 0; i < H; i++) o[i] = f32_to_bf16(bf16_to_f32(w[i]) * r16(bf16_to_f32(r[i]) * inv));
    }
}

void trtspec_rope_bf16(uint16_t *x, const uint16_t *cos_t, const uint16_t *sin_t, int M, int stride, int heads,
                       int d) {
    int half = d / 2;
    for (int m = 0; m < M; m++) {
        const uint16_t *c = cos_t + (int64_t)m * d, *s = sin_t + (int64_t)m * d;
        for (int h = 0; h < heads; h++) {
            uint16_t *v = x + (int64_t)m * stride + (int64_t)h * d;
            for (int i = 0; i < half; i++) {
                float a = bf16_to_f32(v[i]), b = bf16_to_f32(v[i + half]);
                v[i] = f32_to_bf16(r16(a * bf16_to_f32(c[i])) + r16(-b * bf16_to_f32(s[i])));
                v[i + half] = f32_to_bf16(r16(b * bf16_to_f32(c[i + half])) + r16(a * bf16_to_f32(s[i + half])));
            }
        }
    }
}

void trtspec_silu_mul_bf16(const uint16_t *gu, uint16_t *out, int M, int I) {
    for (int m = 0; m < M; m++) {
        const uint16_t *g = gu + (int64_t)m * 2 * I, *u = g + I;
        uint16_t *o = out + (int64_t)m * I;
        for (int i = 0; i < I; i++) {
            float x = bf16_to_f32(g[i]);
            o[i] = f32_to_bf16(r16(x / (1.0f + expf(-x))) * bf16_to_f32(u[i]));
        }
    }
}

/* Causal attention of a pass's segments over the slot KV cache, float32 or bfloat16 (the same
   sums in float32 either way; bfloat16 outputs rounded once), head_dim a multiple of 8.
   segs: S x 4 int64 (slot, past, start, count): the segment's tokens are rows start .. start + count - 1 of q, k, v
   ([T, hq, d], [T, hk, d], [T, hk, d], contiguous rows) at positions past .. past + count - 1. Their keys and values
   are first written into the cache (keys/values [slots, hk, cap, d]); then every (row, query head) attends over its
   slot's keys 0 .. position: scores in order of the keys, a max-subtracted softmax, the values summed in the same
   order. Each row's result depends on its own position and cache only, not on the rows beside it.
   The work items are (row, KV head): the query heads that share a KV head (grouped-query attention) go over its keys
   and values together, each key and value row read and converted to float32 once for all of them (before, once per
   query head). Each (row, query head) still computes exactly the sums it computed alone, in the same order, so its
   bits are unchanged (checked against the kernel before on float32 and bfloat16, 1-12 query heads per KV head, head
   sizes 16-256, decodes, verifications and prefills). Measured on a 2-core AMD EPYC (AVX512-BF16), bfloat16,
   SmolLM2-135M's 9 query / 3 KV heads of 64, 30 layers, 300 cached tokens, both kernels in one process: a
   verification of 5 rows 5.17 -> 3.97 ms, 8 sequences x 1 row 7.83 -> 6.30, 8 x 5 rows 28.5 -> 21.0, a 300-token
   prefill 146 -> 103 ms. A pass with fewer than two (row, KV head) items per thread (a decode row) keeps the per-head
   items (ATTEND_HEADS below). */
static inline __m256 load8_f32(const float *p) { return _mm256_loadu_ps(p); }
static inline void store8_f32(float *p, __m256 v) { _mm256_storeu_ps(p, v); }
static inline void store8_bf16(uint16_t *p, __m256 v) {
    float tmp[8];
    _mm256_storeu_ps(tmp, v);
    for (int e = 0; e < 8; e++) p[e] = f32_to_bf16(tmp[e]);
}
static inline float to_f32_f32(float v) { return v; }

#define ATT_GROUP 8   /* query heads per work item at most (more per KV head: in turns of this many) */
#define ATT_DIM 256   /* head_dim at most (the scratch rows below) */

/* One work item: query heads h0 .. h0 + gh - 1 of one row (sharing KV head K/V), L keys. q rows at qrow (hq x d),
   out rows likewise; scores: gh x stride floats of scratch. Inlined with constant gh and d where the model's are
   common, so the per-head loops unroll and the accumulators stay in registers. */
#define ATTEND_ITEM(NAME, T, LOAD8, STORE8, TO_F32)                                                                 \
    static inline __attribute__((always_inline)) void NAME(const T *qrow, T *orow, const T *K, const T *V, int L,  \
                                                           int h0, int gh, int d, float scale, float *scores,      \
                                                           int stride) {                                           \
        float qf[ATT_GROUP * ATT_DIM] __attribute__((aligned(32)));                                               \
        float xf[ATT_DIM] __attribute__((aligned(32)));                                                           \
        float m[ATT_GROUP], sum[ATT_GROUP];                                                                       \
        for (int e = 0; e < gh; e++) {                                                                            \
            for (int i = 0; i < d; i++) qf[e * d + i] = TO_F32(qrow[(h0 + e) * d + i]);                          \
            m[e] = -INFINITY;                                                                                     \
        }                                                                                                         \
        for (int j = 0; j < L; j++) {                                                                             \
            for (int i = 0; i < d; i += 8) _mm256_store_ps(xf + i, LOAD8(K + (int64_t)j * d + i));               \
            for (int e = 0; e < gh; e++) {                                                                        \
                __m256 acc = _mm256_setzero_ps();                                                                 \
                for (int i = 0; i < d; i += 8)                                                                    \
                    acc = _mm256_fmadd_ps(_mm256_load_ps(qf + e * d + i), _mm256_load_ps(xf + i), acc);          \
                float sc = hsum(acc) * scale;                                                                     \
                scores[e * stride + j] = sc;                                                                      \
                if (sc > m[e]) m[e] = sc;                                                                         \
            }                                                                                                     \
        }                                                                                                         \
        for (int e = 0; e < gh; e++) {                                                                            \
            float *sc = scores + e * stride, s = 0.0f;                                                            \
            for (int j = 0; j < L; j++) {                                                                         \
                sc[j] = expf(sc[j] - m[e]);                                                                       \
                s += sc[j];                                                                                       \
            }                                                                                                     \
            sum[e] = s;                                                                                           \
        }                                                                                                         \
        for (int i0 = 0; i0 < d; i0 += 64) { /* per head 8 accumulators: one pass over the values per 64 */       \
            int nv = (d - i0 < 64 ? d - i0 : 64) / 8;                                                             \
            __m256 acc[ATT_GROUP][8];                                                                             \
            for (int e = 0; e < gh; e++)                                                                          \
                for (int i = 0; i < nv; i++) acc[e][i] = _mm256_setzero_ps();                                     \
            for (int j = 0; j < L; j++) {                                                                         \
                const T *vr = V + (int64_t)j * d + i0;                                                            \
                __m256 vv[8];                                                                                     \
                for (int i = 0; i < nv; i++) vv[i] = LOAD8(vr + 8 * i);                                           \
                for (int e = 0; e < gh; e++) {                                                                    \
                    __m256 p = _mm256_set1_ps(scores[e * stride + j]);                                            \
                    for (int i = 0; i < nv; i++) acc[e][i] = _mm256_fmadd_ps(p, vv[i], acc[e][i]);                \
                }                                                                                                 \
            }                                                                                                     \
            for (int e = 0; e < gh; e++) {                                                                        \
                __m256 inv = _mm256_set1_ps(1.0f / sum[e]);                                                       \
                for (int i = 0; i < nv; i++) STORE8(orow + (h0 + e) * d + i0 + 8 * i, _mm256_mul_ps(acc[e][i], inv)); \
            }                                                                                                     \
        }                                                                                                         \
    }

/* Per (row, query head) work items, each key and value converted as it is used (the kernel before the grouping):
   where a pass has fewer than two (row, KV head) items per thread (a decode row: 3 for 2 threads), grouped items
   leave a thread idle and this is faster (one row of SmolLM2-135M after 300 tokens, 30 layers, measured
   alternately: 2.0-2.4 ms against 2.4-3.0 grouped). A statement inside ATTEND (its locals: n, rows, longest). */
#define ATTEND_HEADS(T, LOAD8, STORE8, TO_F32)                                                                      \
    {                                                                                                             \
        int items = n * hq;                                                                                       \
        _Pragma("omp parallel num_threads(threads)") {                                                            \
            float *scores = (float *)__builtin_alloca(sizeof(float) * (longest > 0 ? longest : 1));               \
            float *qf = (float *)__builtin_alloca(sizeof(float) * d);                                             \
            _Pragma("omp for schedule(static)") for (int it = 0; it < items; it++) {                              \
                int row = it / hq, h = it % hq, kvh = h / g;                                                      \
                int64_t s = rows[2 * row], r = rows[2 * row + 1];                                                 \
                int64_t slot = segs[4 * s], past = segs[4 * s + 1], start = segs[4 * s + 2];                      \
                int L = (int)(past + r + 1);                                                                      \
                const T *qv = q + ((start + r) * hq + h) * d;                                                     \
                for (int i = 0; i < d; i++) qf[i] = TO_F32(qv[i]);                                                \
                const T *K = keys + (slot * hk + kvh) * (int64_t)cap * d;                                         \
                const T *V = values + (slot * hk + kvh) * (int64_t)cap * d;                                       \
                float m = -INFINITY;                                                                              \
                for (int j = 0; j < L; j++) {                                                                     \
                    __m256 acc = _mm256_setzero_ps();                                                             \
                    for (int i = 0; i < d; i += 8)                                                                \
                        acc = _mm256_fmadd_ps(_mm256_loadu_ps(qf + i), LOAD8(K + (int64_t)j * d + i), acc);       \
                    float sc = hsum(acc) * scale;                                                                 \
                    scores[j] = sc;                                                                               \
                    if (sc > m) m = sc;                                                                           \
                }                                                                                                 \
                float sum = 0.0f;                                                                                 \
                for (int j = 0; j < L; j++) {                                                                     \
                    scores[j] = expf(scores[j] - m);                                                              \
                    sum += scores[j];                                                                             \
                }                                                                                                 \
                T *o = out + ((start + r) * hq + h) * d;                                                          \
                __m256 inv = _mm256_set1_ps(1.0f / sum);                                                          \
                for (int i0 = 0; i0 < d; i0 += 128) { /* up to 16 accumulators: one pass over the values per 128 */ \
                    int nv = (d - i0 < 128 ? d - i0 : 128) / 8;                                                   \
                    __m256 acc[16];                                                                               \
                    for (int i = 0; i < nv; i++) acc[i] = _mm256_setzero_ps();                                    \
                    for (int j = 0; j < L; j++) {                                                                 \
                        __m256 p = _mm256_set1_ps(scores[j]);                                                     \
                        const T *vr = V + (int64_t)j * d + i0;                                                    \
                        for (int i = 0; i < nv; i++) acc[i] = _mm256_fmadd_ps(p, LOAD8(vr + 8 * i), acc[i]);      \
                    }                                                                                             \
                    for (int i = 0; i < nv; i++) STORE8(o + i0 + 8 * i, _mm256_mul_ps(acc[i], inv));              \
                }                                                                                                 \
            }                                                                                                     \
        }                                                                                                         \
    }

#define ATTEND(NAME, T, LOAD8, STORE8, TO_F32)                                                                      \
    ATTEND_ITEM(NAME##_item, T, LOAD8, STORE8, TO_F32)                                                            \
    void NAME(const T *q, const T *k, const T *v, T *keys, T *values, T *out, const int64_t *segs, int S, int hq,  \
              int hk, int cap, int d, float scale, int threads) {                                                \
        int g = hq / hk;                                                                                          \
        int total = 0, longest = 0;                                                                               \
        for (int s = 0; s < S; s++) {                                                                             \
            int64_t slot = segs[4 * s], past = segs[4 * s + 1], start = segs[4 * s + 2], count = segs[4 * s + 3]; \
            for (int r = 0; r < count; r++)                                                                       \
                for (int h = 0; h < hk; h++) {                                                                    \
                    int64_t dst = ((slot * hk + h) * cap + past + r) * d, src = ((start + r) * hk + h) * d;       \
                    for (int i = 0; i < d; i++) {                                                                 \
                        keys[dst + i] = k[src + i];                                                               \
                        values[dst + i] = v[src + i];                                                             \
                    }                                                                                             \
                }                                                                                                 \
            total += (int)count;                                                                                  \
            if (past + count > longest) longest = (int)(past + count);                                            \
        }                                                                                                         \
        /* work items: (segment row, KV head), in row order */                                                    \
        int64_t *rows = (int64_t *)__builtin_alloca(sizeof(int64_t) * 2 * (total > 0 ? total : 1));               \
        int n = 0;                                                                                                \
        for (int s = 0; s < S; s++)                                                                               \
            for (int r = 0; r < segs[4 * s + 3]; r++) {                                                           \
                rows[2 * n] = s;                                                                                  \
                rows[2 * n + 1] = r;                                                                              \
                n++;                                                                                              \
            }                                                                                                     \
        if (n * hk < 2 * threads) {                                                                               \
            ATTEND_HEADS(T, LOAD8, STORE8, TO_F32)                                                                \
            return;                                                                                               \
        }                                                                                                         \
        /* a KV head's query heads together, in turns of at most ATT_GROUP */                                     \
        int per = g < ATT_GROUP ? g : ATT_GROUP;                                                                  \
        int chunks = (g + per - 1) / per, items = n * hk * chunks, stride = longest > 0 ? longest : 1;            \
        _Pragma("omp parallel num_threads(threads)") {                                                            \
            /* on the heap: a long context's scores for several heads outgrow a worker thread's stack */          \
            float *scores = (float *)malloc(sizeof(float) * (size_t)per * stride);                                \
            _Pragma("omp for schedule(static)") for (int it = 0; it < items; it++) {                              \
                int row = it / (hk * chunks), kvh = it / chunks % hk, h0 = it % chunks * per;                     \
                int gh = g - h0 < per ? g - h0 : per;                                                             \
                int64_t s = rows[2 * row], r = rows[2 * row + 1];                                                 \
                int64_t slot = segs[4 * s], past = segs[4 * s + 1], start = segs[4 * s + 2];                      \
                int L = (int)(past + r + 1);                                                                      \
                const T *qrow = q + ((start + r) * hq + kvh * g) * d;                                             \
                T *orow = out + ((start + r) * hq + kvh * g) * d;                                                 \
                const T *K = keys + (slot * hk + kvh) * (int64_t)cap * d;                                         \
                const T *V = values + (slot * hk + kvh) * (int64_t)cap * d;                                       \
                if (d == 64 && gh == 3) /* SmolLM2-135M and the tests' models */                                  \
                    NAME##_item(qrow, orow, K, V, L, h0, 3, 64, scale, scores, stride);                           \
                else if (d == 64 && gh == 4)                                                                      \
                    NAME##_item(qrow, orow, K, V, L, h0, 4, 64, scale, scores, stride);                           \
                else if (d == 128 && gh == 4)                                                                     \
                    NAME##_item(qrow, orow, K, V, L, h0, 4, 128, scale, scores, stride);                          \
                else                                                                                              \
                    NAME##_item(qrow, orow, K, V, L, h0, gh, d, scale, scores, stride);                           \
            }                                                                                                     \
            free(scores);                                                                                         \
        }                                                                                                         \
    }
ATTEND(trtspec_attend_f32, float, load8_f32, store8_f32, to_f32_f32)
ATTEND(trtspec_attend_bf16, uint16_t, load8_bf16, store8_bf16, bf16_to_f32)
