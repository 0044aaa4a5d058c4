/*
 * cpu/simd.h — a 16-lane fp32 vector, v16, for the CPU kernels (cpu/kernels.inc).
 *
 * Included once per instruction set by cpu/kernels.c with FAD_SIMD set to
 * 512 (AVX-512F), 256 (AVX2 + FMA: two 8-lane halves) or 0 (plain C), under a
 * matching `#pragma GCC target`; every name carries that set's suffix (VFN).
 * Each operation is lane by lane and exactly rounded (fused multiply-add, one
 * multiply, one add, selects), and the only reductions (vsum_tree, vmax_all)
 * have one fixed order, so the three variants give the same bits: the
 * instruction set the machine has decides the speed, never the result.
 */

#if FAD_SIMD == 512
typedef __m512 VFN(v16);
static inline VFN(v16) VFN(vzero)(void) { return _mm512_setzero_ps(); }
static inline VFN(v16) VFN(vset1)(float x) { return _mm512_set1_ps(x); }
static inline VFN(v16) VFN(vload)(const float *p) { return _mm512_loadu_ps(p); }
static inline void VFN(vstore)(float *p, VFN(v16) a) { _mm512_storeu_ps(p, a); }
static inline VFN(v16) VFN(vfma)(VFN(v16) a, VFN(v16) b, VFN(v16) c) { return _mm512_fmadd_ps(a, b, c); }
static inline VFN(v16) VFN(vmul)(VFN(v16) a, VFN(v16) b) { return _mm512_mul_ps(a, b); }
static inline VFN(v16) VFN(vadd)(VFN(v16) a, VFN(v16) b) { return _mm512_add_ps(a, b); }
static inline VFN(v16) VFN(vsub)(VFN(v16) a, VFN(v16) b) { return _mm512_sub_ps(a, b); }
/* b > a ? b : a (vmaxps returns its second operand unless the first is greater) */
static inline VFN(v16) VFN(vmax_sel)(VFN(v16) a, VFN(v16) b) { return _mm512_max_ps(b, a); }
/* a > b ? b : a */
static inline VFN(v16) VFN(vmin_sel)(VFN(v16) a, VFN(v16) b) { return _mm512_min_ps(b, a); }
/* 2^n for the integers n that t = n + 1.5 * 2^23 holds in its low bits (fad_exp2) */
static inline VFN(v16) VFN(vpow2_of_t)(VFN(v16) t)
{
    __m512i i = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(0x4B400000 - 127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(i, 23));
}
/* whether a lane of a is zero: the zero-weight test of the accumulating kernels */
static inline int VFN(vany_zero)(VFN(v16) a)
{
    return _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_EQ_OQ) != 0;
}
static inline VFN(v16) VFN(vload_bf16)(const uint16_t *p)
{
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
static inline VFN(v16) VFN(vload_fp16)(const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); /* exact */
}
/* fad_float_to_bf16 lane by lane: round to nearest even, a NaN kept quiet */
static inline void VFN(vstore_bf16)(uint16_t *p, VFN(v16) a)
{
    const __m512i u = _mm512_castps_si512(a);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x400000));
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
}
/* lanes (l, l + 8) added, then (l, l + 4), (l, l + 2), (0, 1) */
static inline float VFN(vsum_tree)(VFN(v16) a)
{
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a),
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}
#elif FAD_SIMD == 256
typedef struct VFN(v16) {
    __m256 lo, hi;
} VFN(v16);
#define V2_(expr_lo, expr_hi) \
    VFN(v16) r;               \
    r.lo = (expr_lo);         \
    r.hi = (expr_hi);         \
    return r
static inline VFN(v16) VFN(vzero)(void) { V2_(_mm256_setzero_ps(), _mm256_setzero_ps()); }
static inline VFN(v16) VFN(vset1)(float x) { V2_(_mm256_set1_ps(x), _mm256_set1_ps(x)); }
static inline VFN(v16) VFN(vload)(const float *p) { V2_(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)); }
static inline void VFN(vstore)(float *p, VFN(v16) a)
{
    _mm256_storeu_ps(p, a.lo);
    _mm256_storeu_ps(p + 8, a.hi);
}
static inline VFN(v16) VFN(vfma)(VFN(v16) a, VFN(v16) b, VFN(v16) c)
{
    V2_(_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi));
}
static inline VFN(v16) VFN(vmul)(VFN(v16) a, VFN(v16) b) { V2_(_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)); }
static inline VFN(v16) VFN(vadd)(VFN(v16) a, VFN(v16) b) { V2_(_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)); }
static inline VFN(v16) VFN(vsub)(VFN(v16) a, VFN(v16) b) { V2_(_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)); }
static inline VFN(v16) VFN(vmax_sel)(VFN(v16) a, VFN(v16) b) { V2_(_mm256_max_ps(b.lo, a.lo), _mm256_max_ps(b.hi, a.hi)); }
static inline VFN(v16) VFN(vmin_sel)(VFN(v16) a, VFN(v16) b) { V2_(_mm256_min_ps(b.lo, a.lo), _mm256_min_ps(b.hi, a.hi)); }
static inline __m256 VFN(pow2_half)(__m256 t)
{
    __m256i i = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(0x4B400000 - 127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(i, 23));
}
static inline VFN(v16) VFN(vpow2_of_t)(VFN(v16) t) { V2_(VFN(pow2_half)(t.lo), VFN(pow2_half)(t.hi)); }
static inline int VFN(vany_zero)(VFN(v16) a)
{
    const __m256 z = _mm256_setzero_ps();
    return _mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(a.lo, z, _CMP_EQ_OQ),
                                           _mm256_cmp_ps(a.hi, z, _CMP_EQ_OQ))) != 0;
}
static inline __m256 VFN(bf16_half)(const uint16_t *p)
{
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
static inline VFN(v16) VFN(vload_bf16)(const uint16_t *p) { V2_(VFN(bf16_half)(p), VFN(bf16_half)(p + 8)); }
static inline VFN(v16) VFN(vload_fp16)(const uint16_t *p)
{
    V2_(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)),
        _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8))));
}
static inline void VFN(vstore_bf16)(uint16_t *p, VFN(v16) a)
{
    float x[16];
    VFN(vstore)(x, a);
    for (int l = 0; l < 16; l++)
        p[l] = fad_float_to_bf16(x[l]);
}
static inline float VFN(vsum_tree)(VFN(v16) a)
{
    __m256 s8 = _mm256_add_ps(a.lo, a.hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}
#undef V2_
#else /* plain C: the definition the others reproduce */
typedef struct VFN(v16) {
    float x[16];
} VFN(v16);
#define VLOOP_ for (int l_ = 0; l_ < 16; l_++)
static inline VFN(v16) VFN(vzero)(void) { VFN(v16) r; VLOOP_ r.x[l_] = 0.f; return r; }
static inline VFN(v16) VFN(vset1)(float x) { VFN(v16) r; VLOOP_ r.x[l_] = x; return r; }
static inline VFN(v16) VFN(vload)(const float *p) { VFN(v16) r; VLOOP_ r.x[l_] = p[l_]; return r; }
static inline void VFN(vstore)(float *p, VFN(v16) a) { VLOOP_ p[l_] = a.x[l_]; }
static inline VFN(v16) VFN(vfma)(VFN(v16) a, VFN(v16) b, VFN(v16) c)
{
    VFN(v16) r;
    VLOOP_ r.x[l_] = FAD_FMA(a.x[l_], b.x[l_], c.x[l_]);
    return r;
}
static inline VFN(v16) VFN(vmul)(VFN(v16) a, VFN(v16) b) { VFN(v16) r; VLOOP_ r.x[l_] = FAD_MUL(a.x[l_], b.x[l_]); return r; }
static inline VFN(v16) VFN(vadd)(VFN(v16) a, VFN(v16) b) { VFN(v16) r; VLOOP_ r.x[l_] = FAD_ADD(a.x[l_], b.x[l_]); return r; }
static inline VFN(v16) VFN(vsub)(VFN(v16) a, VFN(v16) b) { VFN(v16) r; VLOOP_ r.x[l_] = a.x[l_] - b.x[l_]; return r; }
static inline VFN(v16) VFN(vmax_sel)(VFN(v16) a, VFN(v16) b) { VFN(v16) r; VLOOP_ r.x[l_] = b.x[l_] > a.x[l_] ? b.x[l_] : a.x[l_]; return r; }
static inline VFN(v16) VFN(vmin_sel)(VFN(v16) a, VFN(v16) b) { VFN(v16) r; VLOOP_ r.x[l_] = a.x[l_] > b.x[l_] ? b.x[l_] : a.x[l_]; return r; }
static inline VFN(v16) VFN(vpow2_of_t)(VFN(v16) t)
{
    VFN(v16) r;
    VLOOP_ {
        uint32_t u;
        memcpy(&u, &t.x[l_], 4);
        u = (u - (0x4B400000u - 127u)) << 23;
        memcpy(&r.x[l_], &u, 4);
    }
    return r;
}
static inline int VFN(vany_zero)(VFN(v16) a)
{
    int z = 0;
    VLOOP_ z |= a.x[l_] == 0.f;
    return z;
}
static inline VFN(v16) VFN(vload_bf16)(const uint16_t *p) { VFN(v16) r; VLOOP_ r.x[l_] = fad_bf16_to_float(p[l_]); return r; }
static inline VFN(v16) VFN(vload_fp16)(const uint16_t *p) { VFN(v16) r; VLOOP_ r.x[l_] = fad_fp16_to_float(p[l_]); return r; }
static inline void VFN(vstore_bf16)(uint16_t *p, VFN(v16) a) { VLOOP_ p[l_] = fad_float_to_bf16(a.x[l_]); }
static inline float VFN(vsum_tree)(VFN(v16) a)
{
    float s8[8], s4[4], s2[2];
    for (int l = 0; l < 8; l++) s8[l] = FAD_ADD(a.x[l], a.x[l + 8]);
    for (int l = 0; l < 4; l++) s4[l] = FAD_ADD(s8[l], s8[l + 4]);
    for (int l = 0; l < 2; l++) s2[l] = FAD_ADD(s4[l], s4[l + 2]);
    return FAD_ADD(s2[0], s2[1]);
}
#undef VLOOP_
#endif

/* fad_exp2 (fad_math.h) lane by lane, the same operations in the same order */
static inline VFN(v16) VFN(vexp2)(VFN(v16) x)
{
    x = VFN(vmax_sel)(x, VFN(vset1)(-127.f));
    x = VFN(vmin_sel)(x, VFN(vset1)(128.f));
    const VFN(v16) t = VFN(vadd)(x, VFN(vset1)(FAD_EXP2_ROUNDER));
    const VFN(v16) f = VFN(vsub)(x, VFN(vsub)(t, VFN(vset1)(FAD_EXP2_ROUNDER)));
    VFN(v16) p = VFN(vfma)(f, VFN(vset1)(FAD_EXP2_C5), VFN(vset1)(FAD_EXP2_C4));
    p = VFN(vfma)(p, f, VFN(vset1)(FAD_EXP2_C3));
    p = VFN(vfma)(p, f, VFN(vset1)(FAD_EXP2_C2));
    p = VFN(vfma)(p, f, VFN(vset1)(FAD_EXP2_C1));
    p = VFN(vfma)(p, f, VFN(vset1)(FAD_EXP2_C0));
    p = VFN(vfma)(p, f, VFN(vset1)(1.f));
    return VFN(vmul)(p, VFN(vpow2_of_t)(t));
}
