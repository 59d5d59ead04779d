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

static inline __m256 load8_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

#endif
