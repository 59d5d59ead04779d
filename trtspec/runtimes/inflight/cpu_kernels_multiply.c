/* trtspec's multiplies, float32 (a few rows) and bfloat16 (any rows), on an x86-64 CPU with AVX2 and FMA.

   The float32 multiply of a few rows: y = x W^T (+ b), W [N, K] row-major as torch keeps a Linear's weight, x [M, K] with M small (a decode step, a verification of K + 1 tokens).

   Such a multiply is memory-bound: every weight is read once and used M times. oneDNN's and MKL's kernels read the
   weights at about half the machine's streaming bandwidth for M = 1 and cost 1.2-1.3x more for M = 5 (measured on a
   2-core AMD EPYC, AVX2). Here each weight vector is loaded once per group of up to 4 rows and multiplied into every
   row's accumulator in registers.

   Every output (m, n) is summed in the same order whatever M and the tile: one 8-lane accumulator over k in steps
   of 8, then its lanes, then the k tail, then the bias. So a row's bits do not depend on how many rows the call has:
   a verification's rows equal the decode steps' rows. Built by trtspec.runtimes.inflight.cpu_kernels with
   -O3 -march=native -fopenmp (the OpenMP runtime is torch's own libgomp, already loaded by then). */
#include "cpu_kernels.h"

/* The weight rows PREFETCH_ROWS ahead of a tile are asked for while it multiplies (the tile after next, in the thread's
   own range), so that more of the stream is in flight than the core's own prefetchers fetch. Into L2 (_MM_HINT_T1),
   not L1: the L2 keeps more misses in flight, and the weights are read once per pass, from L2 as fast as from L1.
   Measured on a 2-core AMD EPYC (AVX512-BF16), SmolLM2-135M's 121 multiplies streamed from memory, a spinning
   OpenMP: bfloat16, 1 / 2 / 5 / 8 rows, no prefetch 13.7 / 19.5 / 24.1 / 26.7 ms, into L1 12.4 / 14.3 / 16.1 / 17.5,
   into L2 (interleaved with L1 in one process, benchmarks/multiply.py) 0.65-0.7x L1's time at every row count: the
   rows beyond the first now cost little more than their arithmetic. */
#ifndef PREFETCH_ROWS /* benchmarks/multiply.py builds variants with -D */
#define PREFETCH_ROWS 8
#endif
#ifndef PREFETCH_HINT
#define PREFETCH_HINT _MM_HINT_T1
#endif

/* s plus the products of the last K - k0 inputs (K not a multiple of 8), in order. One out-of-line copy for every
   tile: inlined, the compiler may compile the loop differently in each (fused multiply-adds or not), and a row's
   bits would then depend on the tile that computed it. */
__attribute__((noinline)) static float dot_tail(float s, const float *x, const float *w, int k0, int K) {
    for (int kk = k0; kk < K; kk++) s += x[kk] * w[kk];
    return s;
}

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
                    _mm_prefetch((const char *)(w + (int64_t)(n0 + PREFETCH_ROWS + i) * K + k), PREFETCH_HINT);     \
            for (int i = 0; i < NT; i++) {                                                                        \
                __m256 wv = _mm256_loadu_ps(w + (int64_t)(n0 + i) * K + k);                                       \
                for (int j = 0; j < MT; j++) acc[i][j] = _mm256_fmadd_ps(wv, xv[j], acc[i][j]);                   \
            }                                                                                                     \
        }                                                                                                         \
        for (int i = 0; i < NT; i++)                                                                              \
            for (int j = 0; j < MT; j++) {                                                                        \
                float s = hsum(acc[i][j]);                                                                        \
                s = dot_tail(s, x + (int64_t)(m0 + j) * K, w + (int64_t)(n0 + i) * K, k, K);                    \
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

/* A pass of 1-2 rows: 2 weight rows times 3 input rows, the rows from ``rows`` on repeating the last (their sums
   dropped); the sums are the other tiles' (bits unchanged). The 2 x 3 tile streams the weights fastest of the float32
   tiles: one thread, the 30 layers' multiplies of SmolLM2-135M, 15 alternated rounds, 1 / 2 / 3 rows 19.6 / 19.2 /
   17.0 ms through the 4 x 1, 2 x 2 and 2 x 3 tiles, 16.5 / 16.8 padded (4 rows 18.6 / 18.3). */
static void tile_2_pad(const float *x, const float *w, const float *b, float *y, int N, int K, int n0, int rows) {
    __m256 acc[2][3];
    const float *xr[3];
    for (int j = 0; j < 3; j++) xr[j] = x + (int64_t)(j < rows ? j : rows - 1) * K;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) acc[i][j] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 xv[3];
        for (int j = 0; j < 3; j++) xv[j] = _mm256_loadu_ps(xr[j] + k);
        if (n0 + PREFETCH_ROWS + 2 <= N)
            for (int i = 0; i < 2; i++)
                _mm_prefetch((const char *)(w + (int64_t)(n0 + PREFETCH_ROWS + i) * K + k), PREFETCH_HINT);
        for (int i = 0; i < 2; i++) {
            __m256 wv = _mm256_loadu_ps(w + (int64_t)(n0 + i) * K + k);
            for (int j = 0; j < 3; j++) acc[i][j] = _mm256_fmadd_ps(wv, xv[j], acc[i][j]);
        }
    }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < rows; j++) {
            float s = dot_tail(hsum(acc[i][j]), xr[j], w + (int64_t)(n0 + i) * K, k, K);
            if (b) s += b[n0 + i];
            y[(int64_t)j * N + n0 + i] = s;
        }
}

/* Outputs in tiles of 4 weight rows, split over ``threads``; within a tile the input rows in groups of at most 4
   (their vectors stay in registers; the tile's weights, at most 4 x K floats, stay in L1 between the groups). */
static inline void f32_outputs(const float *x, const float *w, const float *b, float *y, int M, int N, int K, int n0) {
    int nt = N - n0 < 4 ? N - n0 : 4;
    if (M < 3 && nt == 4) {
        tile_2_pad(x, w, b, y, N, K, n0, M);
        tile_2_pad(x, w, b, y, N, K, n0 + 2, M);
        return;
    }
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

void trtspec_linear_f32(const float *x, const float *w, const float *b, float *y, int M, int N, int K, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int n0 = 0; n0 < N; n0 += 4) f32_outputs(x, w, b, y, M, N, K, n0);
}

/* Part ``part`` of ``parts`` of trtspec_linear_f32's outputs (a contiguous share of its tiles of 4 weight rows), on
   the calling thread: the whole pass's threads (cpu_kernels_pass.c) share a multiply between them. */
void trtspec_linear_f32_part(const float *x, const float *w, const float *b, float *y, int M, int N, int K, int part,
                             int parts) {
    int t0, t1;
    share((N + 3) / 4, part, parts, &t0, &t1);
    for (int t = t0; t < t1; t++) f32_outputs(x, w, b, y, M, N, K, 4 * t);
}

/* The bfloat16 multiply, y = x W^T (+ b), x [M, K], W [N, K], b [N] and y [M, N] bfloat16 (raw 16-bit words), K a
   multiple of 32, any M. Half the float32 weights' bytes, so a decode step reads half as much memory. Each output is a
   float32 sum in the same order whatever M and the tile (one 16-lane accumulator over k in steps of 32, products of
   pairs, then its lanes in a fixed tree, then the bias), rounded once to bfloat16 (nearest even): a row's bits do not
   depend on the pass it is in, at any row count. With AVX512-BF16 the pairs go through VDPBF16PS; without it (AVX2
   only) each pair's two products are exact float32 products added by FMA, in the order VDPBF16PS documents. */
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

/* NT weight rows from n0 times MT input rows from m0, of which the first ``rows`` are stored: a pass of fewer rows
   than MT repeats its last row into the others (their sums computed and dropped; each stored sum is the same as in an
   exact-size tile). */
#define BTILE(NT, MT)                                                                                             \
    static void btile_##NT##_##MT(const uint16_t *x, const uint16_t *w, const uint16_t *b, uint16_t *y, int N,    \
                                  int K, int n0, int m0, int rows) {                                              \
        const uint16_t *xr[MT];                                                                                   \
        for (int j = 0; j < MT; j++) xr[j] = x + (int64_t)(m0 + (j < rows ? j : rows - 1)) * K;                   \
        bacc_t acc[NT][MT];                                                                                       \
        for (int i = 0; i < NT; i++)                                                                              \
            for (int j = 0; j < MT; j++) acc[i][j] = BACC_ZERO();                                                 \
        for (int k = 0; k < K; k += 32) {                                                                         \
            BX_T xv[MT];                                                                                          \
            for (int j = 0; j < MT; j++) xv[j] = BX_LOAD(xr[j] + k);                                              \
            if (m0 == 0 && n0 + PREFETCH_ROWS + NT <= N)                                                          \
                for (int i = 0; i < NT; i++)                                                                      \
                    _mm_prefetch((const char *)(w + (int64_t)(n0 + PREFETCH_ROWS + i) * K + k), PREFETCH_HINT);   \
            for (int i = 0; i < NT; i++)                                                                          \
                for (int j = 0; j < MT; j++) BACC_DOT(acc[i][j], xv[j], w + (int64_t)(n0 + i) * K + k);           \
        }                                                                                                         \
        for (int i = 0; i < NT; i++)                                                                              \
            for (int j = 0; j < rows; j++) {                                                                      \
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

/* With AVX512-BF16 (32 vector registers) a pass of 5 or 6 rows is one 4 x 5 or 4 x 6 tile instead of a 4 x 4 and a
   4 x 1 / 4 x 2: 20 or 24 sums at once, each in its own order as before (bits unchanged). Measured as below, 31
   alternated rounds: 5 rows 15.4 -> 14.3 ms, 6 rows 17.0 -> 15.4 (4 rows, untouched, 13.6 / 13.5); a pass of 5 rows
   is one sequence verifying K 4. Larger passes keep the 4 x 4 groups and their exact tails: the same last tile after
   them read 0.88-1.07x, at 13, 17 and 21 rows slower. The AVX2 build has 16 registers: there these tiles would
   spill, and it keeps the 4 x 1 / 4 x 2 tails. */
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define WIDE_TAILS 1
BTILE(4, 5)
BTILE(4, 6)
#endif

/* Outputs in tiles of 4 weight rows, split over ``threads``; within a tile the input rows in groups of 4 (the tile's
   weights, 4 x K bfloat16, stay in L1 while the rows stream past), a pass of fewer than 4 rows padded to 4, a tail of
   1-2 rows in a wider last tile where the registers allow.

   A pass of fewer than 4 rows goes through the 4 x 4 tile, its missing rows repeating the last one (their sums are
   computed and dropped). Each output is the same sum in the same order as in the exact-size tiles, so the bits are
   theirs; but the 4 x 4 tile streams the weights faster, though it does 4 / M times the arithmetic: measured on the
   2-core AMD EPYC (one thread, bfloat16, the 30 layers' multiplies of SmolLM2-135M, 25 alternated rounds, medians)
   1 / 2 / 3 rows 12.0 / 13.5 / 12.2 ms through the 4 x 1 / 4 x 2 / 4 x 3 tiles, 10.7 / 10.5 / 10.6 ms padded (4 rows
   10.6-10.9); with two threads 15.6 / 16.4 / 15.3 against 14.1 / 14.5 / 14.6 (passive wait), 10.9 / 10.5 / 10.4
   against 9.7 / 10.1 / 10.3 (spinning). Below 4 rows a multiply is memory-bound: the arithmetic is free, and the
   smaller tiles' loops, a few dot products per weight load, leave the stream slower (why, not established). Past 4
   rows the last 1-3 keep their exact tile: there the passes are compute-bound (5 rows 11.6 ms exact, 14.7 padded). */
static inline void bf16_outputs(const uint16_t *x, const uint16_t *w, const uint16_t *b, uint16_t *y, int M, int N,
                                int K, int n0) {
    int nt = N - n0 < 4 ? N - n0 : 4;
    int m0 = 0;
    if (nt == 4 && M < 4) {
        btile_4_4(x, w, b, y, N, K, n0, 0, M);
#if WIDE_TAILS
    } else if (nt == 4 && M == 5) {
        btile_4_5(x, w, b, y, N, K, n0, 0, 5);
    } else if (nt == 4 && M == 6) {
        btile_4_6(x, w, b, y, N, K, n0, 0, 6);
#endif
    } else if (nt == 4) {
        for (; m0 + 4 <= M; m0 += 4) btile_4_4(x, w, b, y, N, K, n0, m0, 4);
        if (M - m0 == 3) btile_4_3(x, w, b, y, N, K, n0, m0, 3);
        if (M - m0 == 2) btile_4_2(x, w, b, y, N, K, n0, m0, 2);
        if (M - m0 == 1) btile_4_1(x, w, b, y, N, K, n0, m0, 1);
    } else {
        for (int i = 0; i < nt; i++) {
            int m = 0;
            for (; m + 4 <= M; m += 4) btile_1_4(x, w, b, y, N, K, n0 + i, m, 4);
            for (; m < M; m++) btile_1_1(x, w, b, y, N, K, n0 + i, m, 1);
        }
    }
}

void trtspec_linear_bf16(const uint16_t *x, const uint16_t *w, const uint16_t *b, uint16_t *y, int M, int N, int K,
                         int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int n0 = 0; n0 < N; n0 += 4) bf16_outputs(x, w, b, y, M, N, K, n0);
}

/* Part ``part`` of ``parts`` of trtspec_linear_bf16's outputs, on the calling thread (as trtspec_linear_f32_part). */
void trtspec_linear_bf16_part(const uint16_t *x, const uint16_t *w, const uint16_t *b, uint16_t *y, int M, int N,
                              int K, int part, int parts) {
    int t0, t1;
    share((N + 3) / 4, part, parts, &t0, &t1);
    for (int t = t0; t < t1; t++) bf16_outputs(x, w, b, y, M, N, K, 4 * t);
}

/* 1 when this build multiplies bfloat16 pairs with VDPBF16PS (AVX512-BF16), 0 when it emulates them with AVX2. */
int trtspec_bf16_native(void) {
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    return 1;
#else
    return 0;
#endif
}
