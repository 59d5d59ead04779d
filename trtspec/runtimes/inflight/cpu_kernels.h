/* Helpers shared by trtspec's CPU kernels (cpu_kernels_multiply.c, cpu_kernels_layer.c): an 8-lane sum in a fixed
   order and bfloat16 <-> float32 conversions (bfloat16 as raw 16-bit words; rounding to nearest even, as torch's). */
#ifndef TRTSPEC_CPU_KERNELS_H
#define TRTSPEC_CPU_KERNELS_H
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

/* Part ``part`` of ``parts`` of n work items, contiguous, as OpenMP's static schedule deals them: [*a, *b). */
static inline void share(int n, int part, int parts, int *a, int *b) {
    int q = n / parts, r = n % parts;
    *a = part * q + (part < r ? part : r);
    *b = *a + q + (part < r);
}

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

static inline float r16(float f) { return bf16_to_f32(f32_to_bf16(f)); } /* round to bfloat16 and back */

/* Eight floats rounded to bfloat16 words as f32_to_bf16 rounds each (nearest even, NaN kept a NaN). */
static inline __m128i round8_bf16(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)), nan);
    r = _mm256_packus_epi32(r, r); /* words 0-3 in lane 0, 4-7 in lane 1 */
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(r, 0x08));
}

/* bfloat16 words back to floats (exact). */
static inline __m256 widen8_bf16(__m128i w) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(w), 16));
}

/* Eight bfloat16 words from memory as floats. */
static inline __m256 load8_bf16(const uint16_t *p) {
    return widen8_bf16(_mm_loadu_si128((const __m128i *)p));
}

/* r16 of eight floats. */
static inline __m256 r16_8(__m256 v) { return widen8_bf16(round8_bf16(v)); }

/* e^x for four doubles, relative error below 1e-14 (x clamped to +-700: a float's e^x is 0 or inf beyond it). */
static inline __m256d exp4_f64(__m256d x) {
    x = _mm256_max_pd(_mm256_min_pd(x, _mm256_set1_pd(700.0)), _mm256_set1_pd(-700.0));
    const __m256d n = _mm256_round_pd(_mm256_mul_pd(x, _mm256_set1_pd(1.4426950408889634)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256d r = _mm256_fnmadd_pd(n, _mm256_set1_pd(6.93147180369123816490e-01), x); /* ln 2, high part: exact */
    r = _mm256_fnmadd_pd(n, _mm256_set1_pd(1.90821492927058770002e-10), r);       /* ... and the rest */
    /* |r| <= ln(2) / 2: Taylor to r^11 / 11! (the next term is below 7e-15 of the sum), in Estrin's order: the
       chain of dependent operations is 6 long, not Horner's 11 (2.5x faster here, the same float results) */
#define EXP_C(k) _mm256_set1_pd(1.0 / (k))
    const __m256d r2 = _mm256_mul_pd(r, r), r4 = _mm256_mul_pd(r2, r2), r8 = _mm256_mul_pd(r4, r4);
    const __m256d a0 = _mm256_fmadd_pd(r, EXP_C(1.0), _mm256_set1_pd(1.0));
    const __m256d a1 = _mm256_fmadd_pd(r, EXP_C(6.0), EXP_C(2.0));
    const __m256d a2 = _mm256_fmadd_pd(r, EXP_C(120.0), EXP_C(24.0));
    const __m256d a3 = _mm256_fmadd_pd(r, EXP_C(5040.0), EXP_C(720.0));
    const __m256d a4 = _mm256_fmadd_pd(r, EXP_C(362880.0), EXP_C(40320.0));
    const __m256d a5 = _mm256_fmadd_pd(r, EXP_C(39916800.0), EXP_C(3628800.0));
#undef EXP_C
    const __m256d b0 = _mm256_fmadd_pd(a1, r2, a0), b1 = _mm256_fmadd_pd(a3, r2, a2), b2 = _mm256_fmadd_pd(a5, r2, a4);
    const __m256d p = _mm256_fmadd_pd(b2, r8, _mm256_fmadd_pd(b1, r4, b0));
    /* 2^n: n + 1023 in the exponent field (the rounding constant 1.5 * 2^52 leaves n + 1023 in the low bits) */
    const __m256i e = _mm256_slli_epi64(
        _mm256_castpd_si256(_mm256_add_pd(n, _mm256_set1_pd(6755399441055744.0 + 1023.0))), 52);
    return _mm256_mul_pd(p, _mm256_castsi256_pd(e));
}

/* expf of eight floats: computed in double and rounded once, so each is the correctly rounded e^x but for ties
   closer than 1e-14. libm's expf (within 0.502 ulp) differs from it in the last bit of about 0.03 % of results
   (silu x up in float32, measured over 3.1M elements); rounded to bfloat16 those vanish: the bfloat16 silu x up gave
   libm's bits on all 3.1M, and the example's greedy text is unchanged. */
static inline __m256 exp8_f32(__m256 x) {
    const __m128 lo = _mm256_cvtpd_ps(exp4_f64(_mm256_cvtps_pd(_mm256_castps256_ps128(x))));
    const __m128 hi = _mm256_cvtpd_ps(exp4_f64(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1))));
    return _mm256_set_m128(hi, lo);
}

#endif
