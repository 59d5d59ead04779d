/* trtspec's float32 multiply of a few rows on an x86-64 CPU with AVX2 and FMA: y = x W^T (+ b), W [N, K] row-major
   as torch keeps a Linear's weight, x [M, K] with M small (a decode step, a verification of K + 1 tokens).

   Such a multiply is memory-bound: every weight is read once and used M times. oneDNN's and MKL's kernels read the
   weights at about half the machine's streaming bandwidth for M = 1 and cost 1.2-1.3x more for M = 5 (measured on a
   2-core AMD EPYC, AVX2). Here each weight vector is loaded once per group of up to 4 rows and multiplied into every
   row's accumulator in registers.

   Every output (m, n) is summed in the same order whatever M and the tile: one 8-lane accumulator over k in steps
   of 8, then its lanes, then the k tail, then the bias. So a row's bits do not depend on how many rows the call has:
   a verification's rows equal the decode steps' rows. Built by trtspec.runtimes.inflight.cpu_kernels with
   -O3 -march=native -fopenmp (the OpenMP runtime is torch's own libgomp, already loaded by then). */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

static inline float hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    __m128 sh = _mm_movehdup_ps(lo);
    __m128 s = _mm_add_ps(lo, sh);
    sh = _mm_movehl_ps(sh, s);
    s = _mm_add_ss(s, sh);
    return _mm_cvtss_f32(s);
}

/* The weight rows PREFETCH_ROWS ahead of a tile are asked for while it multiplies (the tile after next, in the thread's
   own range), so that more of the stream is in flight than the core's own prefetchers fetch. Measured on a 2-core
   AMD EPYC (AVX512-BF16), SmolLM2-135M's bfloat16 multiplies streamed from memory, a spinning OpenMP: 1 / 2 / 5 / 8
   rows 13.7 / 19.5 / 24.1 / 26.7 -> 12.4 / 14.3 / 16.1 / 17.5 ms. */
#define PREFETCH_ROWS 8

/* NT weight rows from n0 times MT input rows from m0. */
#define TILE(NT, MT)                                                                                              \
    static void tile_##NT##_##MT(const float *x, const float *w, const float *b, float *y, int N, int K, int n0, \
                                 int m0) {                                                                        \
        __m256 acc[NT][MT];                                                                                       \
        for (int i = 0; i < NT; i++)                                                                              \
            for (int j = 0; j < MT; j++) acc[i][j] = _mm256_setzero_ps();                                         \
        int k = 0;                                                                                                \
        for (; k + 8 <= K; k += 8) {                                                                              \
            __m256 xv[MT];                                                                                        \
            for (int j = 0; j < MT; j++) xv[j] = _mm256_loadu_ps(x + (int64_t)(m0 + j) * K + k);                 \
            if (m0 == 0 && n0 + PREFETCH_ROWS + NT <= N)                                                          \
                for (int i = 0; i < NT; i++)                                                                      \
                    _mm_prefetch((const char *)(w + (int64_t)(n0 + PREFETCH_ROWS + i) * K + k), _MM_HINT_T0);     \
            for (int i = 0; i < NT; i++) {                                                                        \
                __m256 wv = _mm256_loadu_ps(w + (int64_t)(n0 + i) * K + k);                                       \
                for (int j = 0; j < MT; j++) acc[i][j] = _mm256_fmadd_ps(wv, xv[j], acc[i][j]);                   \
            }                                                                                                     \
        }                                                                                                         \
        for (int i = 0; i < NT; i++)                                                                              \
            for (int j = 0; j < MT; j++) {                                                                        \
                float s = hsum(acc[i][j]);                                                                        \
                for (int kk = k; kk < K; kk++) s += x[(int64_t)(m0 + j) * K + kk] * w[(int64_t)(n0 + i) * K + kk]; \
                if (b) s += b[n0 + i];                                                                            \
                y[(int64_t)(m0 + j) * N + n0 + i] = s;                                                            \
            }                                                                                                     \
    }
TILE(4, 1)
TILE(1, 1)
TILE(2, 2)
TILE(1, 2)
TILE(2, 3)
TILE(1, 3)
TILE(1, 4)

/* Outputs in tiles of 4 weight rows, split over ``threads``; within a tile the input rows in groups of at most 4
   (their vectors stay in registers; the tile's weights, at most 4 x K floats, stay in L1 between the groups). */
void trtspec_linear_f32(const float *x, const float *w, const float *b, float *y, int M, int N, int K, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int n0 = 0; n0 < N; n0 += 4) {
        int nt = N - n0 < 4 ? N - n0 : 4;
        for (int m0 = 0; m0 < M;) {
            int mt = M - m0;
            if (mt >= 4) {
                for (int i = 0; i < nt; i++) tile_1_4(x, w, b, y, N, K, n0 + i, m0);
                m0 += 4;
            } else if (mt == 3) {
                int i = 0;
                for (; i + 2 <= nt; i += 2) tile_2_3(x, w, b, y, N, K, n0 + i, m0);
                for (; i < nt; i++) tile_1_3(x, w, b, y, N, K, n0 + i, m0);
                m0 += 3;
            } else if (mt == 2) {
                int i = 0;
                for (; i + 2 <= nt; i += 2) tile_2_2(x, w, b, y, N, K, n0 + i, m0);
                for (; i < nt; i++) tile_1_2(x, w, b, y, N, K, n0 + i, m0);
                m0 += 2;
            } else {
                if (nt == 4)
                    tile_4_1(x, w, b, y, N, K, n0, m0);
                else
                    for (int i = 0; i < nt; i++) tile_1_1(x, w, b, y, N, K, n0 + i, m0);
                m0 += 1;
            }
        }
    }
}

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

/* The bfloat16 multiply, y = x W^T (+ b), x [M, K], W [N, K], b [N] and y [M, N] bfloat16 (raw 16-bit words), K a
   multiple of 32, any M. Half the float32 weights' bytes, so a decode step reads half as much memory. Each output is a
   float32 sum in the same order whatever M and the tile (one 16-lane accumulator over k in steps of 32, products of
   pairs, then its lanes in a fixed tree, then the bias), rounded once to bfloat16 (nearest even): a row's bits do not
   depend on the pass it is in, at any row count. With AVX512-BF16 the pairs go through VDPBF16PS; without it (AVX2
   only) each pair's two products are exact float32 products added by FMA, in the order VDPBF16PS documents. */
static inline float bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = {(uint32_t)h << 16};
    return v.f;
}

static inline uint16_t f32_to_bf16(float f) {
    union { float f; uint32_t u; } v = {f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u); /* NaN stays NaN */
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)(v.u >> 16);
}

#if defined(__AVX512BF16__) && defined(__AVX512F__)
typedef __m512 bacc_t;
#define BACC_ZERO() _mm512_setzero_ps()
#define BACC_SUM(a) hsum(_mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1))))
/* acc += pairs of x (32 bfloat16 at px) times pairs of w (32 at pw) */
#define BACC_DOT(acc, xv, pw) acc = _mm512_dpbf16_ps(acc, xv, (__m512bh)_mm512_loadu_si512((const void *)(pw)))
#define BX_T __m512bh
#define BX_LOAD(px) ((__m512bh)_mm512_loadu_si512((const void *)(px)))
#else
/* 16 lanes as two 8-lane halves: lane i holds the pair (2i, 2i + 1) of each 32-element block */
typedef struct { __m256 lo, hi; } bacc_t;
typedef struct { __m256 ev[2], od[2]; } bx_t;
static inline bacc_t bacc_zero(void) { bacc_t a = {_mm256_setzero_ps(), _mm256_setzero_ps()}; return a; }
static inline bx_t bx_load(const uint16_t *p) {
    const __m256i hi16 = _mm256_set1_epi32((int)0xffff0000u);
    bx_t r;
    for (int h = 0; h < 2; h++) {
        __m256i words = _mm256_loadu_si256((const __m256i *)(p + 16 * h));
        r.ev[h] = _mm256_castsi256_ps(_mm256_slli_epi32(words, 16));
        r.od[h] = _mm256_castsi256_ps(_mm256_and_si256(words, hi16));
    }
    return r;
}
static inline void bacc_dot(bacc_t *a, const bx_t *x, const uint16_t *pw) {
    bx_t w = bx_load(pw);
    a->lo = _mm256_fmadd_ps(x->od[0], w.od[0], a->lo);
    a->lo = _mm256_fmadd_ps(x->ev[0], w.ev[0], a->lo);
    a->hi = _mm256_fmadd_ps(x->od[1], w.od[1], a->hi);
    a->hi = _mm256_fmadd_ps(x->ev[1], w.ev[1], a->hi);
}
static inline float bacc_sum(bacc_t a) { return hsum(_mm256_add_ps(a.lo, a.hi)); }
#define BACC_ZERO() bacc_zero()
#define BACC_SUM(a) bacc_sum(a)
#define BACC_DOT(acc, xv, pw) bacc_dot(&(acc), &(xv), (pw))
#define BX_T bx_t
#define BX_LOAD(px) bx_load(px)
#endif

#define BTILE(NT, MT)                                                                                             \
    static void btile_##NT##_##MT(const uint16_t *x, const uint16_t *w, const uint16_t *b, uint16_t *y, int N,   \
                                  int K, int n0, int m0) {                                                        \
        bacc_t acc[NT][MT];                                                                                       \
        for (int i = 0; i < NT; i++)                                                                              \
            for (int j = 0; j < MT; j++) acc[i][j] = BACC_ZERO();                                                 \
        for (int k = 0; k < K; k += 32) {                                                                         \
            BX_T xv[MT];                                                                                          \
            for (int j = 0; j < MT; j++) xv[j] = BX_LOAD(x + (int64_t)(m0 + j) * K + k);                          \
            if (m0 == 0 && n0 + PREFETCH_ROWS + NT <= N)                                                          \
                for (int i = 0; i < NT; i++)                                                                      \
                    _mm_prefetch((const char *)(w + (int64_t)(n0 + PREFETCH_ROWS + i) * K + k), _MM_HINT_T0);     \
            for (int i = 0; i < NT; i++)                                                                          \
                for (int j = 0; j < MT; j++) BACC_DOT(acc[i][j], xv[j], w + (int64_t)(n0 + i) * K + k);           \
        }                                                                                                         \
        for (int i = 0; i < NT; i++)                                                                              \
            for (int j = 0; j < MT; j++) {                                                                        \
                float s = BACC_SUM(acc[i][j]);                                                                    \
                if (b) s += bf16_to_f32(b[n0 + i]);                                                               \
                y[(int64_t)(m0 + j) * N + n0 + i] = f32_to_bf16(s);                                               \
            }                                                                                                     \
    }
BTILE(4, 4)
BTILE(4, 3)
BTILE(4, 2)
BTILE(4, 1)
BTILE(1, 4)
BTILE(1, 1)

/* Outputs in tiles of 4 weight rows, split over ``threads``; within a tile the input rows in groups of 4 (the tile's
   weights, 4 x K bfloat16, stay in L1 while the rows stream past). */
void trtspec_linear_bf16(const uint16_t *x, const uint16_t *w, const uint16_t *b, uint16_t *y, int M, int N, int K,
                         int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int n0 = 0; n0 < N; n0 += 4) {
        int nt = N - n0 < 4 ? N - n0 : 4;
        int m0 = 0;
        if (nt == 4) {
            for (; m0 + 4 <= M; m0 += 4) btile_4_4(x, w, b, y, N, K, n0, m0);
            if (M - m0 == 3) btile_4_3(x, w, b, y, N, K, n0, m0);
            if (M - m0 == 2) btile_4_2(x, w, b, y, N, K, n0, m0);
            if (M - m0 == 1) btile_4_1(x, w, b, y, N, K, n0, m0);
        } else {
            for (int i = 0; i < nt; i++) {
                int m = 0;
                for (; m + 4 <= M; m += 4) btile_1_4(x, w, b, y, N, K, n0 + i, m);
                for (; m < M; m++) btile_1_1(x, w, b, y, N, K, n0 + i, m);
            }
        }
    }
}

/* 1 when this build multiplies bfloat16 pairs with VDPBF16PS (AVX512-BF16), 0 when it emulates them with AVX2. */
int trtspec_bf16_native(void) {
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    return 1;
#else
    return 0;
#endif
}

/* The bfloat16 step's elementwise work and attention, row by row like the float32 kernels above. Each torch op on
   bfloat16 computes in float32 and rounds its result to bfloat16; these kernels round where those ops do (the residual
   add, the norm's two products, each product and the sum of the rotary embedding, silu and its product), so they give
   torch's bits except for the order of the norm's mean and expf's last float32 bit. */
static inline float r16(float f) { return bf16_to_f32(f32_to_bf16(f)); } /* round to bfloat16 and back */

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

static inline __m256 load8_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* Causal attention of a pass's segments over the slot KV cache, float32 or bfloat16 (the same
   sums in float32 either way; bfloat16 outputs rounded once), head_dim a multiple of 8.
   segs: S x 4 int64 (slot, past, start, count): the segment's tokens are rows start .. start + count - 1 of q, k, v
   ([T, hq, d], [T, hk, d], [T, hk, d], contiguous rows) at positions past .. past + count - 1. Their keys and values
   are first written into the cache (keys/values [slots, hk, cap, d]); then every (row, query head) attends over its
   slot's keys 0 .. position: scores in order of the keys, a max-subtracted softmax, the values summed in the same
   order. Each row's result depends on its own position and cache only, not on the rows beside it. */
static inline __m256 load8_f32(const float *p) { return _mm256_loadu_ps(p); }
static inline void store8_f32(float *p, __m256 v) { _mm256_storeu_ps(p, v); }
static inline void store8_bf16(uint16_t *p, __m256 v) {
    float tmp[8];
    _mm256_storeu_ps(tmp, v);
    for (int e = 0; e < 8; e++) p[e] = f32_to_bf16(tmp[e]);
}
static inline float to_f32_f32(float v) { return v; }

#define ATTEND(NAME, T, LOAD8, STORE8, TO_F32)                                                                      \
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
        /* work items: (segment row, query head), in row order */                                                 \
        int64_t *rows = (int64_t *)__builtin_alloca(sizeof(int64_t) * 2 * (total > 0 ? total : 1));               \
        int n = 0;                                                                                                \
        for (int s = 0; s < S; s++)                                                                               \
            for (int r = 0; r < segs[4 * s + 3]; r++) {                                                           \
                rows[2 * n] = s;                                                                                  \
                rows[2 * n + 1] = r;                                                                              \
                n++;                                                                                              \
            }                                                                                                     \
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
ATTEND(trtspec_attend_f32, float, load8_f32, store8_f32, to_f32_f32)
ATTEND(trtspec_attend_bf16, uint16_t, load8_bf16, store8_bf16, bf16_to_f32)
