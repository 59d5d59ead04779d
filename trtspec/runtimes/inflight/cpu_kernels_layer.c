/* trtspec's per-layer CPU kernels besides the multiplies: the elementwise work (float32 and bfloat16) and the attention
   over the slot KV cache. Built with cpu_kernels_multiply.c into one library (trtspec.runtimes.inflight.cpu_kernels). */
#include "cpu_kernels.h"
#include <omp.h>
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

/* silu(x) = x / (1 + e^-x) of eight floats, each operation rounded as the scalar float expression's. */
static inline __m256 silu8(__m256 x) {
    const __m256 e = exp8_f32(_mm256_sub_ps(_mm256_setzero_ps(), x));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

/* out = silu(g) * u for gu = [g | u] of 2 I per row: the MLP's activation. Eight at a time (a row's last I % 8
   through the same vector code, padded), so every element gets the same operations wherever it lies. With libm's
   expf one element at a time it took 11.4 ms of a 69 ms bfloat16 pass of 8 sequences x 5 tokens (SmolLM2-135M, 2-core
   AMD EPYC), now 3.9; 8 x 1 tokens 2.2 -> 0.85 ms. */
void trtspec_silu_mul_f32(const float *gu, float *out, int M, int I) {
    for (int m = 0; m < M; m++) {
        const float *g = gu + (int64_t)m * 2 * I, *u = g + I;
        float *o = out + (int64_t)m * I;
        int i = 0;
        for (; i + 8 <= I; i += 8)
            _mm256_storeu_ps(o + i, _mm256_mul_ps(silu8(_mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
        if (i < I) {
            float gt[8] = {0}, ut[8] = {0}, ot[8];
            for (int t = 0; t < I - i; t++) gt[t] = g[i + t], ut[t] = u[i + t];
            _mm256_storeu_ps(ot, _mm256_mul_ps(silu8(_mm256_loadu_ps(gt)), _mm256_loadu_ps(ut)));
            for (int t = 0; t < I - i; t++) o[i + t] = ot[t];
        }
    }
}

/* The bfloat16 step's elementwise work and attention, row by row like the float32 kernels above. Each torch op on
   bfloat16 computes in float32 and rounds its result to bfloat16; these kernels round where those ops do (the residual
   add, the norm's two products, each product and the sum of the rotary embedding, silu and its product), so they give
   torch's bits except for the order of the norm's mean and expf's last float32 bit. */

/* The sum of squares of row r, H elements, one float in order (as the rows' sums were always taken). */
static inline float sum_squares_bf16(const uint16_t *r, int H) {
    float ss = 0.0f;
    for (int i = 0; i < H; i++) {
        float v = bf16_to_f32(r[i]);
        ss += v * v;
    }
    return ss;
}

/* Rows in fours: their four sums in order side by side (each a chain of dependent adds: alone, a row's sum waited
   on each add), the residual add and the scaling eight elements at a time, each element's operations those of the
   scalar expressions (round8_bf16 rounds as f32_to_bf16), so the bits are those of the row-by-row kernel before
   (compared on 1-40 rows of 13-576). One call of 40 rows x 576: 31.7 -> 20.3 us; 8 rows 7.3 -> 5.2. */
void trtspec_add_rmsnorm_bf16(uint16_t *h, const uint16_t *delta, const uint16_t *w, uint16_t *out, int M, int H,
                              float eps) {
    for (int m0 = 0; m0 < M; m0 += 4) {
        int nr = M - m0 < 4 ? M - m0 : 4;
        uint16_t *r = h + (int64_t)m0 * H;
        if (delta) {
            const uint16_t *d = delta + (int64_t)m0 * H;
            int64_t n = (int64_t)nr * H, i = 0;
            for (; i + 8 <= n; i += 8) {
                __m256 a = load8_bf16(r + i);
                __m256 b = load8_bf16(d + i);
                _mm_storeu_si128((__m128i *)(r + i), round8_bf16(_mm256_add_ps(a, b)));
            }
            for (; i < n; i++) r[i] = f32_to_bf16(bf16_to_f32(r[i]) + bf16_to_f32(d[i]));
        }
        float ss[4];
        if (nr == 4) {
            const uint16_t *r0 = r, *r1 = r + H, *r2 = r + 2 * (int64_t)H, *r3 = r + 3 * (int64_t)H;
            float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
            for (int i = 0; i < H; i++) {
                float v0 = bf16_to_f32(r0[i]), v1 = bf16_to_f32(r1[i]), v2 = bf16_to_f32(r2[i]), v3 = bf16_to_f32(r3[i]);
                s0 += v0 * v0;
                s1 += v1 * v1;
                s2 += v2 * v2;
                s3 += v3 * v3;
            }
            ss[0] = s0, ss[1] = s1, ss[2] = s2, ss[3] = s3;
        } else {
            for (int q = 0; q < nr; q++) ss[q] = sum_squares_bf16(r + (int64_t)q * H, H);
        }
        for (int q = 0; q < nr; q++) {
            const uint16_t *rq = r + (int64_t)q * H;
            uint16_t *o = out + (int64_t)(m0 + q) * H;
            float inv = 1.0f / sqrtf(ss[q] / (float)H + eps);
            const __m256 iv = _mm256_set1_ps(inv);
            int i = 0;
            for (; i + 8 <= H; i += 8) {
                __m256 x = r16_8(_mm256_mul_ps(load8_bf16(rq + i), iv));
                __m256 wv = load8_bf16(w + i);
                _mm_storeu_si128((__m128i *)(o + i), round8_bf16(_mm256_mul_ps(wv, x)));
            }
            for (; i < H; i++) o[i] = f32_to_bf16(bf16_to_f32(w[i]) * r16(bf16_to_f32(rq[i]) * inv));
        }
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

/* silu rounded to bfloat16, times up, rounded (as torch's two bfloat16 ops round): eight words. */
static inline __m128i silu_mul8_bf16(const uint16_t *g, const uint16_t *u) {
    const __m256 x = load8_bf16(g);
    return round8_bf16(_mm256_mul_ps(r16_8(silu8(x)), load8_bf16(u)));
}

void trtspec_silu_mul_bf16(const uint16_t *gu, uint16_t *out, int M, int I) {
    for (int m = 0; m < M; m++) {
        const uint16_t *g = gu + (int64_t)m * 2 * I, *u = g + I;
        uint16_t *o = out + (int64_t)m * I;
        int i = 0;
        for (; i + 8 <= I; i += 8) _mm_storeu_si128((__m128i *)(o + i), silu_mul8_bf16(g + i, u + i));
        if (i < I) {
            uint16_t gt[8] = {0}, ut[8] = {0}, ot[8];
            for (int t = 0; t < I - i; t++) gt[t] = g[i + t], ut[t] = u[i + t];
            _mm_storeu_si128((__m128i *)ot, silu_mul8_bf16(gt, ut));
            for (int t = 0; t < I - i; t++) o[i + t] = ot[t];
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
static inline void store8_bf16(uint16_t *p, __m256 v) { _mm_storeu_si128((__m128i *)p, round8_bf16(v)); }
static inline float to_f32_f32(float v) { return v; }

/* sc[j] = e^(sc[j] - m) for j < L, eight at a time (the last L % 8 padded through the same code: every score gets
   the same operations wherever it lies). With libm's expf one score at a time, attention took 4.4 ms of a bfloat16
   pass of 8 sequences x 1 token after 256 (SmolLM2-135M, 30 layers, 2-core AMD EPYC), now 3.6; 8 x 5: 13.1 -> 10.5.
   The sum of the scores stays one float in order. */
static inline void softmax_exp(float *sc, int L, float m) {
    const __m256 mv = _mm256_set1_ps(m);
    int j = 0;
    for (; j + 8 <= L; j += 8) _mm256_storeu_ps(sc + j, exp8_f32(_mm256_sub_ps(_mm256_loadu_ps(sc + j), mv)));
    if (j < L) {
        float t[8] = {0};
        for (int i = 0; i < L - j; i++) t[i] = sc[j + i];
        _mm256_storeu_ps(t, exp8_f32(_mm256_sub_ps(_mm256_loadu_ps(t), mv)));
        for (int i = 0; i < L - j; i++) sc[j + i] = t[i];
    }
}

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
            softmax_exp(sc, L, m[e]);                                                                             \
            for (int j = 0; j < L; j++) s += sc[j];                                                               \
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
   alternately: 2.0-2.4 ms against 2.4-3.0 grouped). ``scratch``: longest + d floats. */
#define ATTEND_HEAD_ITEM(NAME, T, LOAD8, STORE8, TO_F32)                                                            \
    static void NAME(const T *q, const T *keys, const T *values, T *out, const int64_t *segs, const int64_t *rows,  \
                     int it, int hq, int hk, int cap, int d, float scale, float *scratch, int longest) {            \
        float *scores = scratch, *qf = scratch + longest;                                                         \
        int g = hq / hk, row = it / hq, h = it % hq, kvh = h / g;                                                 \
        int64_t s = rows[2 * row], r = rows[2 * row + 1];                                                         \
        int64_t slot = segs[4 * s], past = segs[4 * s + 1], start = segs[4 * s + 2];                              \
        int L = (int)(past + r + 1);                                                                              \
        const T *qv = q + ((start + r) * hq + h) * d;                                                             \
        for (int i = 0; i < d; i++) qf[i] = TO_F32(qv[i]);                                                        \
        const T *K = keys + (slot * hk + kvh) * (int64_t)cap * d;                                                 \
        const T *V = values + (slot * hk + kvh) * (int64_t)cap * d;                                               \
        float m = -INFINITY;                                                                                      \
        for (int j = 0; j < L; j++) {                                                                             \
            __m256 acc = _mm256_setzero_ps();                                                                     \
            for (int i = 0; i < d; i += 8)                                                                        \
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(qf + i), LOAD8(K + (int64_t)j * d + i), acc);               \
            float sc = hsum(acc) * scale;                                                                         \
            scores[j] = sc;                                                                                       \
            if (sc > m) m = sc;                                                                                   \
        }                                                                                                         \
        float sum = 0.0f;                                                                                         \
        softmax_exp(scores, L, m);                                                                                \
        for (int j = 0; j < L; j++) sum += scores[j];                                                             \
        T *o = out + ((start + r) * hq + h) * d;                                                                  \
        __m256 inv = _mm256_set1_ps(1.0f / sum);                                                                  \
        for (int i0 = 0; i0 < d; i0 += 128) { /* up to 16 accumulators: one pass over the values per 128 */       \
            int nv = (d - i0 < 128 ? d - i0 : 128) / 8;                                                           \
            __m256 acc[16];                                                                                       \
            for (int i = 0; i < nv; i++) acc[i] = _mm256_setzero_ps();                                            \
            for (int j = 0; j < L; j++) {                                                                         \
                __m256 p = _mm256_set1_ps(scores[j]);                                                             \
                const T *vr = V + (int64_t)j * d + i0;                                                            \
                for (int i = 0; i < nv; i++) acc[i] = _mm256_fmadd_ps(p, LOAD8(vr + 8 * i), acc[i]);              \
            }                                                                                                     \
            for (int i = 0; i < nv; i++) STORE8(o + i0 + 8 * i, _mm256_mul_ps(acc[i], inv));                      \
        }                                                                                                         \
    }

/* The attention in three steps, so that the whole pass (cpu_kernels_pass.c) can deal each between its threads:
   NAME_rows: the table of the pass's rows (segment, row in it), in order; returns their number (the longest window in
   *longest). NAME_write_part: rows [part] of the segments' keys and values into the cache. NAME_items_part: the
   work items over the cache dealt in turn (item part, part + parts, ...: a prefill's later rows attend over more
   keys), with ``scratch``, NAME_scratch(...) floats for this thread (enough for either kind of item: the kind
   depends on the number of parts, and OpenMP may give a region fewer threads than asked). Which items a pass
   has (per (row, query head) or per (row, KV head)) depends on the number of parts; each (row, query head) computes
   the same sums either way. */
#define ATTEND(NAME, T, LOAD8, STORE8, TO_F32)                                                                      \
    ATTEND_ITEM(NAME##_item, T, LOAD8, STORE8, TO_F32)                                                            \
    ATTEND_HEAD_ITEM(NAME##_head_item, T, LOAD8, STORE8, TO_F32)                                                  \
    int NAME##_rows(const int64_t *segs, int S, int64_t *rows, int *longest) {                                    \
        int n = 0;                                                                                                \
        *longest = 0;                                                                                             \
        for (int s = 0; s < S; s++) {                                                                             \
            int64_t past = segs[4 * s + 1], count = segs[4 * s + 3];                                              \
            for (int r = 0; r < count; r++) {                                                                     \
                rows[2 * n] = s;                                                                                  \
                rows[2 * n + 1] = r;                                                                              \
                n++;                                                                                              \
            }                                                                                                     \
            if (past + count > *longest) *longest = (int)(past + count);                                          \
        }                                                                                                         \
        return n;                                                                                                 \
    }                                                                                                             \
    void NAME##_write_part(const T *k, const T *v, T *keys, T *values, const int64_t *segs, const int64_t *rows,  \
                           int n, int hk, int cap, int d, int part, int parts) {                                  \
        int a, b;                                                                                                 \
        share(n, part, parts, &a, &b);                                                                            \
        for (int t = a; t < b; t++) {                                                                             \
            int64_t s = rows[2 * t], r = rows[2 * t + 1];                                                         \
            int64_t slot = segs[4 * s], past = segs[4 * s + 1], start = segs[4 * s + 2];                          \
            for (int h = 0; h < hk; h++) {                                                                        \
                int64_t dst = ((slot * hk + h) * cap + past + r) * d, src = ((start + r) * hk + h) * d;           \
                for (int i = 0; i < d; i++) {                                                                     \
                    keys[dst + i] = k[src + i];                                                                   \
                    values[dst + i] = v[src + i];                                                                 \
                }                                                                                                 \
            }                                                                                                     \
        }                                                                                                         \
    }                                                                                                             \
    static inline int NAME##_grouped(int n, int hk, int parts) { return n * hk >= 2 * parts; }                    \
    static inline int NAME##_per(int hq, int hk) { return hq / hk < ATT_GROUP ? hq / hk : ATT_GROUP; }            \
    size_t NAME##_scratch(int hq, int hk, int d, int longest) { /* for either kind of item */                    \
        size_t stride = longest > 0 ? (size_t)longest : 1, grouped = (size_t)NAME##_per(hq, hk) * stride;        \
        return grouped > stride + d ? grouped : stride + d;                                                       \
    }                                                                                                             \
    void NAME##_items_part(const T *q, const T *keys, const T *values, T *out, const int64_t *segs,               \
                           const int64_t *rows, int n, int hq, int hk, int cap, int d, float scale, int longest,  \
                           float *scratch, int part, int parts) {                                                 \
        int g = hq / hk;                                                                                          \
        if (!NAME##_grouped(n, hk, parts)) {                                                                      \
            for (int it = part; it < n * hq; it += parts)                                                         \
                NAME##_head_item(q, keys, values, out, segs, rows, it, hq, hk, cap, d, scale, scratch, longest);  \
            return;                                                                                               \
        }                                                                                                         \
        /* a KV head's query heads together, in turns of at most ATT_GROUP */                                     \
        int per = NAME##_per(hq, hk);                                                                             \
        int chunks = (g + per - 1) / per, stride = longest > 0 ? longest : 1;                                     \
        for (int it = part; it < n * hk * chunks; it += parts) {                                                  \
            int row = it / (hk * chunks), kvh = it / chunks % hk, h0 = it % chunks * per;                         \
            int gh = g - h0 < per ? g - h0 : per;                                                                 \
            int64_t s = rows[2 * row], r = rows[2 * row + 1];                                                     \
            int64_t slot = segs[4 * s], past = segs[4 * s + 1], start = segs[4 * s + 2];                          \
            int L = (int)(past + r + 1);                                                                          \
            const T *qrow = q + ((start + r) * hq + kvh * g) * d;                                                 \
            T *orow = out + ((start + r) * hq + kvh * g) * d;                                                     \
            const T *K = keys + (slot * hk + kvh) * (int64_t)cap * d;                                             \
            const T *V = values + (slot * hk + kvh) * (int64_t)cap * d;                                           \
            if (d == 64 && gh == 3) /* SmolLM2-135M and the tests' models */                                      \
                NAME##_item(qrow, orow, K, V, L, h0, 3, 64, scale, scratch, stride);                              \
            else if (d == 64 && gh == 4)                                                                          \
                NAME##_item(qrow, orow, K, V, L, h0, 4, 64, scale, scratch, stride);                              \
            else if (d == 128 && gh == 4)                                                                         \
                NAME##_item(qrow, orow, K, V, L, h0, 4, 128, scale, scratch, stride);                             \
            else                                                                                                  \
                NAME##_item(qrow, orow, K, V, L, h0, gh, d, scale, scratch, stride);                              \
        }                                                                                                         \
    }                                                                                                             \
    void NAME(const T *q, const T *k, const T *v, T *keys, T *values, T *out, const int64_t *segs, int S, int hq,  \
              int hk, int cap, int d, float scale, int threads) {                                                \
        int total = 0, longest = 0;                                                                               \
        for (int s = 0; s < S; s++) total += (int)segs[4 * s + 3];                                                \
        int64_t *rows = (int64_t *)__builtin_alloca(sizeof(int64_t) * 2 * (total > 0 ? total : 1));               \
        int n = NAME##_rows(segs, S, rows, &longest);                                                             \
        NAME##_write_part(k, v, keys, values, segs, rows, n, hk, cap, d, 0, 1);                                   \
        _Pragma("omp parallel num_threads(threads)") {                                                            \
            int parts = omp_get_num_threads(), part = omp_get_thread_num();                                       \
            /* on the heap: a long context's scores for several heads outgrow a worker thread's stack */          \
            float *scratch = (float *)malloc(sizeof(float) * NAME##_scratch(hq, hk, d, longest));                  \
            if (!scratch) abort();                                                                                \
            NAME##_items_part(q, keys, values, out, segs, rows, n, hq, hk, cap, d, scale, longest, scratch, part, \
                              parts);                                                                             \
            free(scratch);                                                                                        \
        }                                                                                                         \
    }
ATTEND(trtspec_attend_f32, float, load8_f32, store8_f32, to_f32_f32)
ATTEND(trtspec_attend_bf16, uint16_t, load8_bf16, store8_bf16, bf16_to_f32)
