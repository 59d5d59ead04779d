/* A whole pass of a Llama-family decoder in one call, bfloat16 or float32 (and, at the end, the argmax of the head's
   logits that a greedy step takes): the layers' kernels of
   cpu_kernels_multiply.c and cpu_kernels_layer.c, in the order trtspec.runtimes.inflight.llama_step calls them one by
   one from Python.

   A decode step of SmolLM2-135M makes 30 x 9 kernel calls. From Python each is a ctypes call with its output tensor
   allocated, views taken and thread counts chosen: measured on a 2-core AMD EPYC (AVX512-BF16), the pass's Python
   took 2.4 ms of a 13.4 ms one-token pass, outside the kernels. Here the loop over the layers is C: the same kernels
   with the same arguments and thread counts, so every output has the same bits (tests/test_llama_step.py compares
   the two paths). The caller gives the residual stream h [M, H] (the embeddings, updated in place), out [M, H] for
   the final norm's result, and per layer the 12 addresses of ``layers`` (PASS_SLOTS below: the norms, the fused
   q/k/v, o, fused gate/up and down weights and their biases or 0, the layer's key and value caches). */
#include "cpu_kernels.h"
#include <stdlib.h>
#include <string.h>

#define KERNELS(T, S)                                                                                             \
    void trtspec_linear_##S(const T *x, const T *w, const T *b, T *y, int M, int N, int K, int threads);          \
    void trtspec_add_rmsnorm_##S(T *h, const T *delta, const T *w, T *out, int M, int H, float eps);              \
    void trtspec_rope_##S(T *x, const T *cos_t, const T *sin_t, int M, int stride, int heads, int d);             \
    void trtspec_silu_mul_##S(const T *gu, T *out, int M, int I);                                                 \
    void trtspec_attend_##S(const T *q, const T *k, const T *v, T *keys, T *values, T *out, const int64_t *segs,  \
                            int S_, int hq, int hk, int cap, int d, float scale, int threads);
KERNELS(uint16_t, bf16)
KERNELS(float, f32)

/* The addresses of one layer in ``layers`` (trtspec.runtimes.inflight.cpu_kernels.PASS_SLOTS names them). */
enum { NORM1, QKV, QKV_B, O, O_B, NORM2, GATE_UP, GATE_UP_B, DOWN, DOWN_B, KEYS, VALUES, PASS_SLOTS };

/* dims: M tokens, H hidden, hq / hk query / KV heads of d, I intermediate, cap the caches' capacity; threads: the
   q/k/v, o, gate/up and down multiplies' and the attention's (the counts cpu_kernels.threads_for gives). Returns 0,
   or -1 where the scratch could not be allocated (nothing written then). */
#define PASS(T, S)                                                                                                 \
    int trtspec_pass_##S(T *h, T *out, const int64_t *layers, int L, const T *final_norm, const T *cos_t,           \
                         const T *sin_t, const int64_t *segs, int nseg, int M, int H, int hq, int hk, int d, int I, \
                         int cap, float eps, float scale, const int *threads) {                                    \
        const int nq = hq * d, nk = hk * d, nqkv = nq + 2 * nk;                                                    \
        const size_t words = (size_t)M * ((size_t)H + nqkv + nq + 2 * (size_t)nk + nq + H + 3 * (size_t)I + H);   \
        T *x = (T *)malloc(sizeof(T) * (words > 0 ? words : 1));                                                   \
        if (!x) return -1;                                                                                         \
        T *qkv = x + (size_t)M * H, *q = qkv + (size_t)M * nqkv, *k = q + (size_t)M * nq, *v = k + (size_t)M * nk; \
        T *att = v + (size_t)M * nk, *o = att + (size_t)M * nq, *gu = o + (size_t)M * H;                           \
        T *act = gu + (size_t)M * 2 * I, *delta = act + (size_t)M * I;                                             \
        const T *residual = NULL; /* what the next norm adds to h first: the last layer's MLP output */          \
        for (int l = 0; l < L; l++) {                                                                              \
            const int64_t *p = layers + (size_t)l * PASS_SLOTS;                                                    \
            trtspec_add_rmsnorm_##S(h, residual, AT(T, p, NORM1), x, M, H, eps);                                   \
            trtspec_linear_##S(x, AT(T, p, QKV), AT(T, p, QKV_B), qkv, M, nqkv, H, threads[0]);                    \
            trtspec_rope_##S(qkv, cos_t, sin_t, M, nqkv, hq + hk, d);                                              \
            for (int t = 0; t < M; t++) { /* the attention reads q, k and v as contiguous [M, heads, d] */        \
                const T *row = qkv + (size_t)t * nqkv;                                                             \
                memcpy(q + (size_t)t * nq, row, sizeof(T) * nq);                                                   \
                memcpy(k + (size_t)t * nk, row + nq, sizeof(T) * nk);                                              \
                memcpy(v + (size_t)t * nk, row + nq + nk, sizeof(T) * nk);                                         \
            }                                                                                                      \
            trtspec_attend_##S(q, k, v, AT(T, p, KEYS), AT(T, p, VALUES), att, segs, nseg, hq, hk, cap, d, scale,  \
                               threads[4]);                                                                        \
            trtspec_linear_##S(att, AT(T, p, O), AT(T, p, O_B), o, M, H, nq, threads[1]);                          \
            trtspec_add_rmsnorm_##S(h, o, AT(T, p, NORM2), x, M, H, eps);                                          \
            trtspec_linear_##S(x, AT(T, p, GATE_UP), AT(T, p, GATE_UP_B), gu, M, 2 * I, H, threads[2]);            \
            trtspec_silu_mul_##S(gu, act, M, I);                                                                   \
            trtspec_linear_##S(act, AT(T, p, DOWN), AT(T, p, DOWN_B), delta, M, H, I, threads[3]);                 \
            residual = delta;                                                                                      \
        }                                                                                                          \
        trtspec_add_rmsnorm_##S(h, residual, final_norm, out, M, H, eps);                                          \
        free(x);                                                                                                   \
        return 0;                                                                                                  \
    }

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
