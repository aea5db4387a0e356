/* kernels_cast_test.c — checks k_cast of kernels/c (moved out of kernels_ew_test.c): conversions between the
 * model dtypes against naive ones written here (a float to an integer truncated, saturated where C leaves it
 * undefined), the narrow integers, and bfloat16 and float16 bit by bit.  The harness is ktest.h.
 */
#include "ktest.h"

/* ---- Cast --------------------------------------------------------------- */

/* One source value, held as what the source dtype stores. */
typedef struct {
    double f;
    int64_t i;
} Val;

static int64_t ref_f2i(double v, double lo, double hi)
{
    if (isnan(v)) return 0;
    if (v <= lo) return (int64_t)lo;
    if (v >= hi) return hi > 9e18 ? INT64_MAX : (int64_t)hi;
    return (int64_t)trunc(v);
}

/* Writes element k of the expected `to` array for source value v. */
static void ref_cast(int to, int from_float, Val v, void *y, int k)
{
    double f = from_float ? v.f : (double)v.i;
    switch (to) {
    case K_DT_F32: ((float *)y)[k] = from_float ? (float)v.f : (float)v.i; break;
    case K_DT_F64: ((double *)y)[k] = f; break;
    case K_DT_I64:
        ((int64_t *)y)[k] = from_float ? ref_f2i(f, -9223372036854775808.0, 9.3e18) : v.i;
        break;
    case K_DT_I32:
        ((int32_t *)y)[k] = from_float ? (int32_t)ref_f2i(f, -2147483648.0, 2147483647.0)
                                       : (int32_t)(uint32_t)(uint64_t)v.i;
        break;
    case K_DT_U8:
        ((uint8_t *)y)[k] = from_float ? (uint8_t)ref_f2i(f, 0, 255) : (uint8_t)(uint64_t)v.i;
        break;
    default: ((uint8_t *)y)[k] = from_float ? f != 0 : v.i != 0;
    }
}

static void store(int dt, void *x, int k, Val v)
{
    switch (dt) {
    case K_DT_F32: ((float *)x)[k] = (float)v.f; break;
    case K_DT_F64: ((double *)x)[k] = v.f; break;
    case K_DT_I64: ((int64_t *)x)[k] = v.i; break;
    case K_DT_I32: ((int32_t *)x)[k] = (int32_t)v.i; break;
    default: ((uint8_t *)x)[k] = (uint8_t)v.i;
    }
}

static void test_cast(int dt)
{
    static const double fv[] = {0, 1.5, -1.5, 2.75, -2.75, 255.9, 256.5, -300, 3e9, -3e9,
                                1e20, -1e20, NAN, INFINITY, -INFINITY, 0.1};
    static const int64_t iv[] = {0, 1, -1, 127, 255, 256, -129, 2147483648LL, -2147483649LL,
                                 (1LL << 40) + 3, INT64_MIN, INT64_MAX, (1LL << 53) + 1};
    static const int size[] = {4, 8, 8, 4, 1, 1};
    enum { NV = 16 };
    if (dt == F32)
        return;  /* dtype-generic: run once */
    for (int from = K_DT_F32; from <= K_DT_BOOL; from++)
        for (int to = K_DT_F32; to <= K_DT_BOOL; to++) {
            int ff = from <= K_DT_F64, n = ff ? 16 : 13;
            uint64_t x[NV], y[NV], want[NV];
            memset(y, 0, sizeof y), memset(want, 0, sizeof want);
            for (int k = 0; k < n; k++) {
                Val v = {fv[k], iv[k % 13]};
                if (from == K_DT_I32) v.i = (int32_t)(uint32_t)(uint64_t)v.i;
                if (from == K_DT_U8) v.i = (uint8_t)v.i;
                if (from == K_DT_BOOL) v.i = v.i != 0;
                if (from == K_DT_F32) v.f = (float)v.f;
                store(from, x, k, v);
                ref_cast(to, ff, v, want, k);
            }
            CTX("k_cast %d -> %d", from, to);
            k_cast(to, y, from, x, n);
            check_bytes(dt, y, want, (size_t)(n * size[to]));
        }
    /* in place with equal sizes: f32 -> i32 */
    static const float xv[4] = {1.5f, -2.5f, NAN, 7.0f};
    static const int32_t wi[4] = {1, -2, 0, 7};
    void *xf = xalloc(4, sizeof(float));  /* allocated: no declared type to alias */
    memcpy(xf, xv, sizeof xv);
    CTX("k_cast in place f32 -> i32");
    k_cast(K_DT_I32, xf, K_DT_F32, xf, 4);
    check_bytes(dt, xf, wi, sizeof wi);
    free(xf);
}

/* The narrow integers (int8 .. uint64) a model's tensors may hold: to and
 * from every integer and float32 / float64.  Integer -> integer keeps the
 * low bits; float -> integer truncates and saturates to the target's range
 * (NaN 0); uint64 reads unsigned (2^64 - 1 -> float is 1.8e19, not -1). */
typedef struct {
    int dt, size, is_signed;
} NarrowDt;
static const NarrowDt narrow_dts[] = {
    {K_DT_I8, 1, 1}, {K_DT_U8, 1, 0}, {K_DT_I16, 2, 1}, {K_DT_U16, 2, 0}, {K_DT_I32, 4, 1},
    {K_DT_U32, 4, 0}, {K_DT_I64, 8, 1}, {K_DT_U64, 8, 0},
};

/* the value of the size-byte integer at p (little-endian bits, signed or not), as long double */
static long double narrow_value(const NarrowDt *d, const void *p)
{
    uint64_t u = 0;
    memcpy(&u, p, d->size < 8 ? (size_t)d->size : 8);
    int bits = d->size * 8;
    if (d->is_signed && bits < 64 && (u >> (bits - 1)) & 1)
        return (long double)(int64_t)(u | (~0ULL << bits));
    if (d->is_signed && bits == 64)
        return (long double)(int64_t)u;
    return (long double)u;
}

static void test_cast_narrow(int dt)
{
    static const double fv[] = {0, 1.7, -1.7, 127.5, -128.5, 255.9, 300, -40000, 70000, 5e9, -5e9, 1.9e19, -1e20,
                                NAN, INFINITY, -INFINITY};
    enum { NV = 16 };
    if (dt != F64)
        return;  /* dtype-generic: run once */
    uint64_t bits[NV];
    for (int k = 0; k < NV; k++) /* every byte pattern width: small, sign bits, wide */
        bits[k] = k < 8 ? (uint64_t)k * 0x9E3779B97F4A7C15ULL : (0x80ULL << (8 * (k % 8))) + (uint64_t)k;
    for (size_t a = 0; a < sizeof narrow_dts / sizeof *narrow_dts; a++) {
        const NarrowDt *from = &narrow_dts[a];
        uint8_t x[NV * 8];
        for (int k = 0; k < NV; k++)
            memcpy(x + k * from->size, &bits[k], (size_t)from->size);
        for (size_t b = 0; b < sizeof narrow_dts / sizeof *narrow_dts; b++) { /* integer -> integer: low bits */
            const NarrowDt *to = &narrow_dts[b];
            uint8_t y[NV * 8], want[NV * 8];
            for (int k = 0; k < NV; k++)
                memcpy(want + k * to->size, &bits[k], (size_t)to->size);
            if (from->size < to->size) /* widening extends the source's sign (or zero) */
                for (int k = 0; k < NV; k++) {
                    long double v = narrow_value(from, x + k * from->size);
                    int64_t w = v < 0 ? (int64_t)v : (int64_t)(uint64_t)v;
                    memcpy(want + k * to->size, &w, (size_t)to->size);
                }
            CTX("k_cast %d -> %d", from->dt, to->dt);
            k_cast(to->dt, y, from->dt, x, NV);
            check_bytes(dt, y, want, (size_t)(NV * to->size));
        }
        double yd[NV], wd[NV]; /* integer -> float64: exact below 2^53, uint64 unsigned */
        for (int k = 0; k < NV; k++)
            wd[k] = (double)narrow_value(from, x + k * from->size);
        CTX("k_cast %d -> f64", from->dt);
        k_cast(K_DT_F64, yd, from->dt, x, NV);
        check_bytes(dt, yd, wd, sizeof wd);
        uint8_t y[NV * 8], want[NV * 8]; /* float64 -> integer: truncated, saturated */
        for (int k = 0; k < NV; k++) {
            long double lo = narrow_value(from, &(uint64_t){from->is_signed ? 1ULL << (from->size * 8 - 1) : 0});
            long double hi = narrow_value(from, &(uint64_t){from->is_signed ? ~0ULL >> (65 - from->size * 8)
                                                                            : ~0ULL >> (64 - from->size * 8)});
            long double v = isnan(fv[k]) ? 0 : fv[k] < lo ? lo : fv[k] > hi ? hi : truncl(fv[k]);
            uint64_t w = v < 0 ? (uint64_t)(int64_t)v : (uint64_t)v;
            memcpy(want + k * from->size, &w, (size_t)from->size);
        }
        CTX("k_cast f64 -> %d", from->dt);
        k_cast(from->dt, y, K_DT_F64, fv, NV);
        check_bytes(dt, y, want, (size_t)(NV * from->size));
    }
}

/* bfloat16: rounding to nearest even on the bits, NaN, infinities, overflow,
 * subnormals, signed zero; and the other dtypes through float */
static void test_cast_bf16(int dt)
{
    static const uint32_t f32_bits[] = {
        0x3F800000, 0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x80000000, 0x7F800000, 0xFF800000,
        0x7FC00000, 0x7F800001, 0xFFC00001, 0x7F7FFFFF, 0x7F7F8000, 0x00000001, 0x00008000, 0x00018000,
        0xBF808000};
    static const uint16_t want16[] = {
        0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x3F80, 0x8000, 0x7F80, 0xFF80,
        0x7FC0, 0x7FC0, 0xFFC0, 0x7F80, 0x7F80, 0x0000, 0x0000, 0x0002,
        0xBF80};
    enum { N = sizeof f32_bits / sizeof f32_bits[0] };
    if (dt == F32)
        return;  /* dtype-generic: run once */
    float *x = xalloc(N, sizeof(float));
    uint16_t *y = xalloc(N, 2);
    memcpy(x, f32_bits, sizeof f32_bits);
    CTX("k_cast f32 -> bf16");
    k_cast(K_DT_BF16, y, K_DT_F32, x, N);
    check_bytes(dt, y, want16, sizeof want16);
    /* back: exact, the bits in the top half */
    uint32_t back[N], wantb[N];
    for (int i = 0; i < N; i++)
        wantb[i] = (uint32_t)want16[i] << 16;
    CTX("k_cast bf16 -> f32");
    k_cast(K_DT_F32, back, K_DT_BF16, y, N);
    check_bytes(dt, back, wantb, sizeof wantb);
    /* k_bf16_round (the fused loops' rounding) = the cast there and back, bit for bit, and k_bf16_bits of it
     * (their store of a rounded value, their tables' index) = the cast: every high half with low halves at and
     * around the ties, the ends and one drawn per high half */
    CTX("k_bf16_round = k_bf16_to_f32(k_bf16_from_f32), k_bf16_bits(k_bf16_round) = k_bf16_from_f32");
    uint32_t seed = 1, bad = 0;
    for (uint32_t hi = 0; hi < 0x10000u; hi++) {
        seed = seed * 1664525u + 1013904223u;
        const uint32_t lows[] = {0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, seed >> 16};
        for (int k = 0; k < 7; k++) {
            union { uint32_t u; float f; } v = {hi << 16 | lows[k]}, r, w;
            r.f = k_bf16_round(v.f);
            w.f = k_bf16_to_f32(k_bf16_from_f32(v.f));
            bad += r.u != w.u || k_bf16_bits(r.f) != k_bf16_from_f32(v.f);
        }
    }
    check_bytes(dt, &bad, &(uint32_t){0}, sizeof bad);
    /* double goes through float: 1 + 2^-8 + 2^-30 is 1 + 2^-8 in float, a tie, so 1 */
    double d[3] = {1.0 + 0x1p-8 + 0x1p-30, -3.0, 1e300};
    uint16_t wd[3] = {0x3F80, 0xC040, 0x7F80}, yd[3];
    CTX("k_cast f64 -> bf16");
    k_cast(K_DT_BF16, yd, K_DT_F64, d, 3);
    check_bytes(dt, yd, wd, sizeof wd);
    /* integers through float; to integers truncating as from float */
    int64_t iv[3] = {257, -1, (1LL << 40) + 1}, back_i[3], want_i[3] = {256, -1, 1LL << 40};
    uint16_t yi[3];
    CTX("k_cast i64 -> bf16 -> i64");
    k_cast(K_DT_BF16, yi, K_DT_I64, iv, 3);
    k_cast(K_DT_I64, back_i, K_DT_BF16, yi, 3);
    check_bytes(dt, back_i, want_i, sizeof want_i);
    /* to bool: NaN and -0 */
    uint16_t bv[3] = {0x7FC0, 0x8000, 0x3F80};
    uint8_t yb[3], wb[3] = {1, 0, 1};
    CTX("k_cast bf16 -> bool");
    k_cast(K_DT_BOOL, yb, K_DT_BF16, bv, 3);
    check_bytes(dt, yb, wb, sizeof wb);
    free(x), free(y);
}

/* float16: round to nearest even on the bits (ties both ways), overflow to
 * infinity from 65520 on, the subnormal range (ties, the largest rounding up
 * to the smallest normal, 2^-25 to zero), signed zeros, NaNs; back to float
 * exactly for every one of the 65536 values; the other dtypes through float */
static void test_cast_f16(int dt)
{
    static const uint32_t f32_bits[] = {
        0x3F800000, 0x3F801000, 0x3F803000, 0x3F801001, 0x3F800FFF, /* 1; 1 + half an ulp: ties, near-ties */
        0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, /* -0, +-inf, +-NaN */
        0x7F7FFFFF, 0x477FE000, 0x477FEFFF, 0x477FF000, 0xC77FF000, /* float max; 65504; just below / at 65520 */
        0x38800000, 0x387FC000, 0x387FF000,                         /* 2^-14; the largest subnormal; rounds up */
        0x33800000, 0x33000000, 0x33000001, 0xB3400000, 0x33C00000, /* 2^-24; 2^-25 (tie to 0); subnormal ties */
        0x3A500000, 0x40490FDB};                                    /* 0.00079345703; pi */
    static const uint16_t want16[] = {
        0x3C00, 0x3C00, 0x3C02, 0x3C01, 0x3C00,
        0x8000, 0x7C00, 0xFC00, 0x7E00, 0xFE00,
        0x7C00, 0x7BFF, 0x7BFF, 0x7C00, 0xFC00,
        0x0400, 0x03FF, 0x0400,
        0x0001, 0x0000, 0x0001, 0x8001, 0x0002,
        0x1280, 0x4248};
    enum { N = sizeof f32_bits / sizeof f32_bits[0] };
    if (dt == F32)
        return; /* dtype-generic: run once */
    float *x = xalloc(N, sizeof(float));
    uint16_t *y = xalloc(N, 2);
    memcpy(x, f32_bits, sizeof f32_bits);
    CTX("k_cast f32 -> f16");
    k_cast(K_DT_F16, y, K_DT_F32, x, N);
    check_bytes(dt, y, want16, sizeof want16);
    CTX("k_f16_from_f32 on the same values");
    for (int i = 0; i < N; i++)
        y[i] = k_f16_from_f32(x[i]);
    check_bytes(dt, y, want16, sizeof want16);
    /* every float16 back to float and again: the same bits (NaNs quieted, sign kept) */
    uint16_t *h = xalloc(65536, 2), *h2 = xalloc(65536, 2);
    float *w = xalloc(65536, sizeof(float));
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    k_cast(K_DT_F32, w, K_DT_F16, h, 65536);
    k_cast(K_DT_F16, h2, K_DT_F32, w, 65536);
    int bad = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        int nan = (i & 0x7C00) == 0x7C00 && (i & 0x3FF);
        bad += nan ? h2[i] != (uint16_t)(i | 0x200) || !isnan(w[i]) : h2[i] != i;
    }
    CTX("every f16 -> f32 -> f16 gives it back");
    check_int(dt, bad, 0);
    CTX("f16 -> f32 on 1, 65504, 2^-24, -0, inf");
    float wv[5] = {w[0x3C00], w[0x7BFF], w[0x0001], w[0x8000], w[0x7C00]};
    check_int(dt, wv[0] == 1.0f && wv[1] == 65504.0f && wv[2] == 0x1p-24f && wv[3] == 0.0f && signbit(wv[3]) &&
                      isinf(wv[4]), 1);
    /* double goes through float: 1 + 2^-11 + 2^-40 is 1 + 2^-11 in float, a tie, so 1 */
    double d[3] = {1.0 + 0x1p-11 + 0x1p-40, -3.0, 1e300};
    uint16_t wd[3] = {0x3C00, 0xC200, 0x7C00}, yd[3];
    CTX("k_cast f64 -> f16");
    k_cast(K_DT_F16, yd, K_DT_F64, d, 3);
    check_bytes(dt, yd, wd, sizeof wd);
    /* integers through float; to integers truncating as from float; 2049 rounds to 2048 */
    int64_t iv[3] = {2049, -1, 100000}, back_i[3], want_i[3] = {2048, -1, INT64_MAX};
    uint16_t yi[3];
    CTX("k_cast i64 -> f16 -> i64 (100000 overflows to inf, saturating back)");
    k_cast(K_DT_F16, yi, K_DT_I64, iv, 3);
    k_cast(K_DT_I64, back_i, K_DT_F16, yi, 3);
    check_bytes(dt, back_i, want_i, sizeof want_i);
    uint16_t bv[3] = {0x7E00, 0x8000, 0x3C00};
    uint8_t yb[3], wb[3] = {1, 0, 1};
    CTX("k_cast f16 -> bool");
    k_cast(K_DT_BOOL, yb, K_DT_F16, bv, 3);
    check_bytes(dt, yb, wb, sizeof wb);
    free(x), free(y), free(h), free(h2), free(w);
}

int main(void)
{
    static void (*const tests[])(int) = {test_cast, test_cast_narrow, test_cast_bf16, test_cast_f16};
    return ktest_main("kernels_cast_test", tests, sizeof tests / sizeof tests[0]);
}
