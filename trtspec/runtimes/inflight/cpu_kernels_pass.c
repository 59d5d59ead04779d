/* A whole pass of a Llama-family decoder in one call, bfloat16 or float32 (and, at the end, the argmax of the head's
   logits that a greedy step takes): the layers' kernels of
   cpu_kernels_multiply.c and cpu_kernels_layer.c, in the order trtspec.runtimes.inflight.llama_step calls them one by
   one from Python.

   A decode step of SmolLM2-135M makes 30 x 9 kernel calls. From Python each is a ctypes call with its output tensor
   allocated, views taken and thread counts chosen: measured on a 2-core AMD EPYC (AVX512-BF16), the pass's Python
   took 2.4 ms of a 13.4 ms one-token pass, outside the kernels. Here the loop over the layers is C: the same kernels
   with the same arguments, so every output has the same bits (tests/test_llama_step.py compares the paths).

   Its threads: each kernel in its own OpenMP region, as from Python (team 1), or the whole pass in one region, each
   step dealt between the team's threads with a spinning barrier between steps (team > 1). Under OpenMP's passive
   wait a region wakes its sleeping threads through a futex, tens of microseconds on a VM: at 300 regions a pass,
   the kernels ran calls of fewer than 8 rows on one thread. Measured on the 2-core AMD EPYC (AVX512-BF16),
   SmolLM2-135M in bfloat16 after 150 cached tokens, the body of a pass alternated in one process, medians of 11,
   a region a kernel -> one region: 1 token 10.1 -> 7.8 ms, 5 tokens 11.1 -> 8.8, 8 tokens 19.9 -> 12.0 (beside
   two busy loops on the same 2 cores: 23.1 -> 15.4, 25.0 -> 24.6, 50.0 -> 32.1).

   The caller gives the residual stream h [M, H] (the embeddings, updated in place), out [M, H] for the final
   norm's result, and per layer the 12 addresses of ``layers`` (PASS_SLOTS below: the norms, the fused
   q/k/v, o, fused gate/up and down weights and their biases or 0, the layer's key and value caches). */
#include "cpu_kernels.h"
#include <omp.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KERNELS(T, S)                                                                                             \
    void trtspec_linear_##S(const T *x, const T *w, const T *b, T *y, int M, int N, int K, int threads);          \
    void trtspec_linear_##S##_part(const T *x, const T *w, const T *b, T *y, int M, int N, int K, int part,       \
                                   int parts);                                                                    \
    void trtspec_add_rmsnorm_##S(T *h, const T *delta, const T *w, T *out, int M, int H, float eps);              \
    void trtspec_rope_##S(T *x, const T *cos_t, const T *sin_t, int M, int stride, int heads, int d);             \
    void trtspec_silu_mul_##S(const T *gu, T *out, int M, int I);                                                 \
    void trtspec_attend_##S(const T *q, const T *k, const T *v, T *keys, T *values, T *out, const int64_t *segs,  \
                            int S_, int hq, int hk, int cap, int d, float scale, int threads);                    \
    int trtspec_attend_##S##_rows(const int64_t *segs, int S_, int64_t *rows, int *longest);                      \
    void trtspec_attend_##S##_write_part(const T *k, const T *v, T *keys, T *values, const int64_t *segs,         \
                                         const int64_t *rows, int n, int hk, int cap, int d, int part, int parts); \
    size_t trtspec_attend_##S##_scratch(int hq, int hk, int d, int longest);                                      \
    void trtspec_attend_##S##_items_part(const T *q, const T *keys, const T *values, T *out, const int64_t *segs, \
                                         const int64_t *rows, int n, int hq, int hk, int cap, int d, float scale, \
                                         int longest, float *scratch, int part, int parts);
KERNELS(uint16_t, bf16)
KERNELS(float, f32)

/* The addresses of one layer in ``layers`` (trtspec.runtimes.inflight.cpu_kernels.PASS_SLOTS names them). */
enum { NORM1, QKV, QKV_B, O, O_B, NORM2, GATE_UP, GATE_UP_B, DOWN, DOWN_B, KEYS, VALUES, PASS_SLOTS };

/* A barrier for the threads of one pass: they spin while the others finish their part of a step, and past
   YIELD_NS of it yield the core at each turn, so that a thread the system took off its core (a busy machine, more
   threads than cores) gets it back. A pass of a few tokens has 300 steps of 10-100 us: woken from OpenMP's wait at
   each (a futex each time under the passive policy), the second thread cost more than it gave. The threads spin
   only inside a pass: between passes they wait as OpenMP's policy says. */
#ifndef YIELD_NS
#define YIELD_NS 200000
#endif
#ifndef SPIN_PAUSE
#define SPIN_PAUSE 1
#endif
typedef struct {
    _Atomic int arrived;
    _Atomic unsigned turn;
} pass_barrier;

static inline int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void pass_wait(pass_barrier *b, int parts) {
    if (parts <= 1) return;
    unsigned turn = atomic_load_explicit(&b->turn, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&b->arrived, 1, memory_order_acq_rel) == parts - 1) {
        atomic_store_explicit(&b->arrived, 0, memory_order_relaxed);
        atomic_store_explicit(&b->turn, turn + 1, memory_order_release);
        return;
    }
    int64_t since = 0;
    int yielding = 0;
    for (long spin = 1; atomic_load_explicit(&b->turn, memory_order_acquire) == turn; spin++) {
        if (yielding) {
            sched_yield();
            continue;
        }
        if (SPIN_PAUSE) _mm_pause();
        if (spin % 256 == 0) { /* the clock every 256 turns (microseconds) */
            int64_t t = now_ns();
            if (!since)
                since = t;
            else if (t - since > YIELD_NS)
                yielding = 1;
        }
    }
}

/* dims: M tokens, H hidden, hq / hk query / KV heads of d, I intermediate, cap the caches' capacity.

   team 1: the kernels one after another on this thread, each with its own threads (``threads``: the q/k/v, o,
   gate/up and down multiplies' and the attention's, the counts cpu_kernels.threads_for gives, each call its own
   OpenMP region). team > 1: one OpenMP region of ``team`` threads for the whole pass, each step dealt between them
   (a multiply's tiles of outputs, the attention's work items, the rows of the elementwise steps) and a pass_barrier
   between steps. Each output is computed by one thread in the same order either way: the same bits. Returns 0, or
   -1 where the scratch could not be allocated (nothing written then). */
#define PASS(T, S)                                                                                                 \
    int trtspec_pass_##S(T *h, T *out, const int64_t *layers, int L, const T *final_norm, const T *cos_t,           \
                         const T *sin_t, const int64_t *segs, int nseg, int M, int H, int hq, int hk, int d, int I, \
                         int cap, float eps, float scale, const int *threads, int team) {                          \
        const int nq = hq * d, nk = hk * d, nqkv = nq + 2 * nk;                                                    \
        const size_t words = (size_t)M * ((size_t)H + nqkv + nq + 2 * (size_t)nk + nq + H + 3 * (size_t)I + H);   \
        T *x = (T *)malloc(sizeof(T) * (words > 0 ? words : 1));                                                   \
        if (!x) return -1;                                                                                         \
        T *qkv = x + (size_t)M * H, *q = qkv + (size_t)M * nqkv, *k = q + (size_t)M * nq, *v = k + (size_t)M * nk; \
        T *att = v + (size_t)M * nk, *o = att + (size_t)M * nq, *gu = o + (size_t)M * H;                           \
        T *act = gu + (size_t)M * 2 * I, *delta = act + (size_t)M * I;                                             \
        if (team <= 1) {                                                                                           \
            const T *residual = NULL; /* what the next norm adds to h first: the last layer's MLP output */      \
            for (int l = 0; l < L; l++) {                                                                          \
                const int64_t *p = layers + (size_t)l * PASS_SLOTS;                                                \
                trtspec_add_rmsnorm_##S(h, residual, AT(T, p, NORM1), x, M, H, eps);                               \
                trtspec_linear_##S(x, AT(T, p, QKV), AT(T, p, QKV_B), qkv, M, nqkv, H, threads[0]);                \
                trtspec_rope_##S(qkv, cos_t, sin_t, M, nqkv, hq + hk, d);                                          \
                split_qkv_##S(qkv, q, k, v, 0, M, nq, nk);                                                         \
                trtspec_attend_##S(q, k, v, AT(T, p, KEYS), AT(T, p, VALUES), att, segs, nseg, hq, hk, cap, d,     \
                                   scale, threads[4]);                                                             \
                trtspec_linear_##S(att, AT(T, p, O), AT(T, p, O_B), o, M, H, nq, threads[1]);                      \
                trtspec_add_rmsnorm_##S(h, o, AT(T, p, NORM2), x, M, H, eps);                                      \
                trtspec_linear_##S(x, AT(T, p, GATE_UP), AT(T, p, GATE_UP_B), gu, M, 2 * I, H, threads[2]);        \
                trtspec_silu_mul_##S(gu, act, M, I);                                                               \
                trtspec_linear_##S(act, AT(T, p, DOWN), AT(T, p, DOWN_B), delta, M, H, I, threads[3]);             \
                residual = delta;                                                                                  \
            }                                                                                                      \
            trtspec_add_rmsnorm_##S(h, residual, final_norm, out, M, H, eps);                                      \
            free(x);                                                                                               \
            return 0;                                                                                              \
        }                                                                                                          \
        int total = 0;                                                                                             \
        for (int s = 0; s < nseg; s++) total += (int)segs[4 * s + 3];                                              \
        int64_t *rows = (int64_t *)malloc(sizeof(int64_t) * 2 * (total > 0 ? total : 1));                         \
        int longest = 0, n = rows ? trtspec_attend_##S##_rows(segs, nseg, rows, &longest) : 0;                     \
        const size_t per = trtspec_attend_##S##_scratch(hq, hk, d, longest);                                      \
        float *scratch = rows ? (float *)malloc(sizeof(float) * per * team) : NULL;                                \
        if (!scratch) {                                                                                            \
            free(rows);                                                                                            \
            free(x);                                                                                               \
            return -1;                                                                                             \
        }                                                                                                          \
        pass_barrier bar = {0, 0};                                                                                 \
        _Pragma("omp parallel num_threads(team)") {                                                                \
            const int parts = omp_get_num_threads(), part = omp_get_thread_num();                                  \
            float *mine = scratch + per * part;                                                                    \
            int r0, r1; /* this thread's rows of the elementwise steps */                                          \
            share(M, part, parts, &r0, &r1);                                                                       \
            const int mr = r1 - r0;                                                                                \
            const T *residual = NULL;                                                                              \
            for (int l = 0; l < L; l++) {                                                                          \
                const int64_t *p = layers + (size_t)l * PASS_SLOTS;                                                \
                T *hr = h + (size_t)r0 * H, *xr = x + (size_t)r0 * H;                                              \
                if (mr > 0)                                                                                        \
                    trtspec_add_rmsnorm_##S(hr, residual ? residual + (size_t)r0 * H : NULL, AT(T, p, NORM1), xr,  \
                                            mr, H, eps);                                                           \
                pass_wait(&bar, parts);                                                                            \
                trtspec_linear_##S##_part(x, AT(T, p, QKV), AT(T, p, QKV_B), qkv, M, nqkv, H, part, parts);        \
                pass_wait(&bar, parts);                                                                            \
                if (mr > 0)                                                                                        \
                    trtspec_rope_##S(qkv + (size_t)r0 * nqkv, cos_t + (size_t)r0 * d, sin_t + (size_t)r0 * d, mr,  \
                                     nqkv, hq + hk, d);                                                            \
                split_qkv_##S(qkv, q, k, v, r0, r1, nq, nk);                                                       \
                pass_wait(&bar, parts);                                                                            \
                trtspec_attend_##S##_write_part(k, v, AT(T, p, KEYS), AT(T, p, VALUES), segs, rows, n, hk, cap, d, \
                                                part, parts);                                                      \
                pass_wait(&bar, parts);                                                                            \
                trtspec_attend_##S##_items_part(q, AT(T, p, KEYS), AT(T, p, VALUES), att, segs, rows, n, hq, hk,   \
                                                cap, d, scale, longest, mine, part, parts);                        \
                pass_wait(&bar, parts);                                                                            \
                trtspec_linear_##S##_part(att, AT(T, p, O), AT(T, p, O_B), o, M, H, nq, part, parts);              \
                pass_wait(&bar, parts);                                                                            \
                if (mr > 0) trtspec_add_rmsnorm_##S(hr, o + (size_t)r0 * H, AT(T, p, NORM2), xr, mr, H, eps);      \
                pass_wait(&bar, parts);                                                                            \
                trtspec_linear_##S##_part(x, AT(T, p, GATE_UP), AT(T, p, GATE_UP_B), gu, M, 2 * I, H, part, parts); \
                pass_wait(&bar, parts);                                                                            \
                if (mr > 0) trtspec_silu_mul_##S(gu + (size_t)r0 * 2 * I, act + (size_t)r0 * I, mr, I);           \
                pass_wait(&bar, parts);                                                                            \
                trtspec_linear_##S##_part(act, AT(T, p, DOWN), AT(T, p, DOWN_B), delta, M, H, I, part, parts);     \
                pass_wait(&bar, parts);                                                                            \
                residual = delta;                                                                                  \
            }                                                                                                      \
            if (mr > 0)                                                                                            \
                trtspec_add_rmsnorm_##S(h + (size_t)r0 * H, residual ? residual + (size_t)r0 * H : NULL,           \
                                        final_norm, out + (size_t)r0 * H, mr, H, eps);                             \
        }                                                                                                          \
        free(scratch);                                                                                             \
        free(rows);                                                                                                \
        free(x);                                                                                                   \
        return 0;                                                                                                  \
    }

/* Rows [r0, r1) of the fused q/k/v output into the contiguous [M, heads, d] q, k and v the attention reads. */
#define SPLIT_QKV(T, S)                                                                                            \
    static void split_qkv_##S(const T *qkv, T *q, T *k, T *v, int r0, int r1, int nq, int nk) {                    \
        const int nqkv = nq + 2 * nk;                                                                              \
        for (int t = r0; t < r1; t++) {                                                                            \
            const T *row = qkv + (size_t)t * nqkv;                                                                 \
            memcpy(q + (size_t)t * nq, row, sizeof(T) * nq);                                                       \
            memcpy(k + (size_t)t * nk, row + nq, sizeof(T) * nk);                                                  \
            memcpy(v + (size_t)t * nk, row + nq + nk, sizeof(T) * nk);                                             \
        }                                                                                                          \
    }
SPLIT_QKV(uint16_t, bf16)
SPLIT_QKV(float, f32)

#define AT(T, p, i) ((T *)(intptr_t)(p)[i])
PASS(uint16_t, bf16)
PASS(float, f32)

/* Each row's index of its largest value, as torch.argmax gives it: the first of equal maxima, a NaN larger than any
   number (the first NaN wins). The greedy tokens of the vocabulary head's logits, read where the head wrote them:
   torch converted SmolLM2's 49,152 bfloat16 logits to float32 and took their argmax in 0.4 ms a step. */
#define ARGMAX(T, S, TO_F32)                                                                                       \
    void trtspec_argmax_##S(const T *x, int M, int N, int64_t *out) {                                             \
        for (int m = 0; m < M; m++) {                                                                              \
            const T *r = x + (size_t)m * N;                                                                        \
            int best = 0;                                                                                          \
            float top = TO_F32(r[0]);                                                                              \
            if (top == top)                                                                                        \
                for (int i = 1; i < N; i++) {                                                                      \
                    const float v = TO_F32(r[i]);                                                                  \
                    if (v > top) {                                                                                 \
                        best = i;                                                                                  \
                        top = v;                                                                                   \
                    } else if (v != v) {                                                                           \
                        best = i;                                                                                  \
                        break;                                                                                     \
                    }                                                                                              \
                }                                                                                                  \
            out[m] = best;                                                                                         \
        }                                                                                                          \
    }
static inline float same_f32(float v) { return v; }
ARGMAX(uint16_t, bf16, bf16_to_f32)
ARGMAX(float, f32, same_f32)
