/* ew.c — elementwise kernels: broadcasting binary ops and comparisons,
 * unary activations and their gradients, Where, Not, Cast, scale and fill.
 *
 * How it works.  The broadcasting kernels (k_binary, k_compare, k_where,
 * k_where_grad) describe their index space as a Walk (walk.h): y is dense,
 * each operand has a stride per dim (0 = broadcast), and walk_push merges
 * dims that are back to back in every operand, so the common cases collapse
 * to one or two dims.  The innermost dim runs as a tight loop specialised on
 * its strides (contiguous / broadcast scalar / general), the outer dims
 * advance like an odometer, and the output is split across OpenMP threads
 * by linear position (par_range) when the build has -fopenmp.
 *
 * Unary ops are one switch per call with a plain loop per op.  Gradients
 * read the forward input x or output y as PyTorch's derivatives.yaml does,
 * so results track torch to the rounding of the dtype.  k_where and k_cast
 * work on raw element bytes / dtype codes and serve every dtype; the typed
 * bodies (float, double) are in ew_impl.h, included once per dtype below,
 * and the int64 comparison is stamped from the same row macro.  Index
 * arithmetic on int64 (k_binary_i64) takes fused.h's kf_binary_i64.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "walk.h"

/* ---- comparisons: one body for every input type ------------------------- */

/* y[i] = a[i*ia] OP b[i*ib] for one innermost row of n. */
#define K_CMP_ROW(OP)                                                              \
    do {                                                                           \
        if (ia == 1 && ib == 1)                                                    \
            for (int64_t i = 0; i < n; i++) y[i] = a[i] OP b[i];                   \
        else if (ia == 1 && ib == 0)                                               \
            for (int64_t i = 0; i < n; i++) y[i] = a[i] OP b[0];                   \
        else                                                                       \
            for (int64_t i = 0; i < n; i++) y[i] = a[i * ia] OP b[i * ib];         \
    } while (0)

/* Defines k_compare_S for element type T: a Walk over y with a, b strides. */
#define K_DEFINE_COMPARE(T, S)                                                     \
    static void compare_row_##S(int op, uint8_t *y, const T *a, const T *b,       \
                                int64_t n, int64_t ia, int64_t ib)                 \
    {                                                                              \
        switch (op) {                                                              \
        case K_EQ: K_CMP_ROW(==); break;                                           \
        case K_LT: K_CMP_ROW(<); break;                                            \
        case K_GT: K_CMP_ROW(>); break;                                            \
        case K_LE: K_CMP_ROW(<=); break;                                           \
        case K_GE: K_CMP_ROW(>=); break;                                           \
        default: die("k_compare: unknown op");                                     \
        }                                                                          \
    }                                                                              \
    void k_compare_##S(int op, uint8_t *y, const T *a, const T *b, int rank,       \
                       const int64_t *shape, const int64_t *sa, const int64_t *sb) \
    {                                                                              \
        Walk w = {0};                                                              \
        int64_t ia, ib, n;                                                         \
        if (numel(rank, shape) == 0)                                               \
            return;                                                                \
        for (int d = 0; d < rank; d++)                                             \
            walk_push(&w, shape[d], sa[d], sb[d]);                                 \
        n = walk_pop(&w, &ia, &ib);                                                \
        walk_seek(&w, 0);                                                          \
        do {                                                                       \
            compare_row_##S(op, y, a + w.oa, b + w.ob, n, ia, ib);                 \
            y += n;                                                                \
        } while (walk_next(&w));                                                   \
    }

K_DEFINE_COMPARE(float, f32)
K_DEFINE_COMPARE(double, f64)
K_DEFINE_COMPARE(int64_t, i64)

/* ---- int64 arithmetic (index tensors: small, one thread) ------------------ */

int64_t k_binary_i64(int op, int64_t *y, const int64_t *a, const int64_t *b, int rank,
                     const int64_t *shape, const int64_t *sa, const int64_t *sb)
{
    Walk w = {0};
    int64_t ia, ib, n, pos = 0, bad = -1;
    int divides = op == K_DIV || op == K_MOD || op == K_FMOD;
    if (op != K_ADD && op != K_SUB && op != K_MUL && op != K_MIN && op != K_MAX && !divides)
        die("k_binary_i64: an op without int64 arithmetic");
    if (numel(rank, shape) == 0)
        return -1;
    for (int d = 0; d < rank; d++)
        walk_push(&w, shape[d], sa[d], sb[d]);
    n = walk_pop(&w, &ia, &ib);
    walk_seek(&w, 0);
    do {
        for (int64_t i = 0; i < n; i++, pos++) {
            const int64_t u = a[w.oa + i * ia], v = b[w.ob + i * ib];
            if (divides && v == 0 && bad < 0)
                bad = pos;
            y[pos] = kf_binary_i64(op, u, v);
        }
    } while (walk_next(&w));
    return bad;
}

/* ---- k_not, k_cast ------------------------------------------------------ */

void k_not(uint8_t *y, const uint8_t *x, int64_t n)
{
#pragma omp parallel for schedule(static) if (n >= K_PAR_MIN)
    for (int64_t i = 0; i < n; i++)
        y[i] = !x[i];
}

/* float -> integer in [lo, hi]: truncation toward zero, NaN -> 0, saturated
 * (a C cast of an out-of-range float is undefined behaviour). */
static int64_t float_to_int(double v, double lo, double hi)
{
    if (v != v)
        return 0;
    if (v <= lo)
        return (int64_t)lo;
    if (v >= hi)  /* the int64 bound 2^63 - 1 is not a double: 2^63 stands for it */
        return hi >= 9223372036854775807.0 ? INT64_MAX : (int64_t)hi;
    return (int64_t)v;
}

/* float -> uint64 as float_to_int, its bits in an int64 (2^64 stands for
 * the bound 2^64 - 1) */
static int64_t float_to_u64(double v)
{
    if (v != v || v <= 0)
        return 0;
    return (int64_t)(v >= 18446744073709551616.0 ? UINT64_MAX : (uint64_t)v);
}

static int is_float_dt(int dt) { return dt == K_DT_F32 || dt == K_DT_F64 || dt == K_DT_BF16 || dt == K_DT_F16; }

/* Reads element i of a float K_DT_* array as double (exact for all four). */
static double load_f(int dt, const void *x, int64_t i)
{
    switch (dt) {
    case K_DT_F32: return ((const float *)x)[i];
    case K_DT_BF16: return k_bf16_to_f32(((const uint16_t *)x)[i]);
    case K_DT_F16: return k_f16_to_f32(((const uint16_t *)x)[i]);
    default: return ((const double *)x)[i];
    }
}

/* Reads element i of an integer K_DT_* array as int64 (a uint64 as its bits). */
static int64_t load_i(int dt, const void *x, int64_t i)
{
    switch (dt) {
    case K_DT_I64: case K_DT_U64: return ((const int64_t *)x)[i];
    case K_DT_I32: return ((const int32_t *)x)[i];
    case K_DT_U32: return ((const uint32_t *)x)[i];
    case K_DT_I16: return ((const int16_t *)x)[i];
    case K_DT_U16: return ((const uint16_t *)x)[i];
    case K_DT_I8: return ((const int8_t *)x)[i];
    case K_DT_U8: case K_DT_BOOL: return ((const uint8_t *)x)[i];
    default: die("k_cast: unknown dtype"); return 0;
    }
}

/* Stores v (int64 bits) as element i of an integer K_DT_* array: a
 * narrower integer keeps the low bits (two's complement wraparound). */
static void store_i(int dt, void *y, int64_t i, int64_t v)
{
    uint64_t u = (uint64_t)v;
    switch (dt) {
    case K_DT_I64: case K_DT_U64: ((uint64_t *)y)[i] = u; return;
    case K_DT_I32: case K_DT_U32: ((uint32_t *)y)[i] = (uint32_t)u; return;
    case K_DT_I16: case K_DT_U16: ((uint16_t *)y)[i] = (uint16_t)u; return;
    case K_DT_I8: case K_DT_U8: ((uint8_t *)y)[i] = (uint8_t)u; return;
    case K_DT_BOOL: ((uint8_t *)y)[i] = u != 0; return;
    default: die("k_cast: unknown dtype");
    }
}

/* A float converted to integer dtype dt, saturated to its range (int64 bits). */
static int64_t float_to_dt(int dt, double v)
{
    switch (dt) {
    case K_DT_I64: return float_to_int(v, -9223372036854775808.0, 9223372036854775807.0);
    case K_DT_U64: return float_to_u64(v);
    case K_DT_I32: return float_to_int(v, INT32_MIN, INT32_MAX);
    case K_DT_U32: return float_to_int(v, 0, UINT32_MAX);
    case K_DT_I16: return float_to_int(v, INT16_MIN, INT16_MAX);
    case K_DT_U16: return float_to_int(v, 0, UINT16_MAX);
    case K_DT_I8: return float_to_int(v, INT8_MIN, INT8_MAX);
    default: return float_to_int(v, 0, UINT8_MAX); /* U8 */
    }
}

/* Element i of the source converted to dtype `to`, stored.  Going through
 * double keeps f32 -> f64 exact and f64 -> f32 correctly rounded; integer
 * sources go through int64 (uint64 through uint64) so an integer -> f32
 * rounds once.  To bfloat16 and float16 goes through float (two roundings
 * from double or int64, as PyTorch's). */
static void cast_one(int to, void *y, int from, const void *x, int64_t i)
{
    if (is_float_dt(from)) {
        double v = load_f(from, x, i);
        switch (to) {
        case K_DT_F32: ((float *)y)[i] = (float)v; return;
        case K_DT_F64: ((double *)y)[i] = v; return;
        case K_DT_BF16: ((uint16_t *)y)[i] = k_bf16_from_f32((float)v); return;
        case K_DT_F16: ((uint16_t *)y)[i] = k_f16_from_f32((float)v); return;
        case K_DT_BOOL: ((uint8_t *)y)[i] = v != 0; return;
        default: store_i(to, y, i, float_to_dt(to, v)); return;
        }
    }
    int64_t v = load_i(from, x, i);
    int u = from == K_DT_U64;
    float f = u ? (float)(uint64_t)v : (float)v;
    switch (to) {
    case K_DT_F32: ((float *)y)[i] = f; return;
    case K_DT_F64: ((double *)y)[i] = u ? (double)(uint64_t)v : (double)v; return;
    case K_DT_BF16: ((uint16_t *)y)[i] = k_bf16_from_f32(f); return;
    case K_DT_F16: ((uint16_t *)y)[i] = k_f16_from_f32(f); return;
    default: store_i(to, y, i, v); return;
    }
}

static int dt_size(int dt)
{
    static const int size[] = {4, 8, 8, 4, 1, 1, 2, 2, 1, 2, 2, 4, 8};
    if (dt < 0 || dt > K_DT_U64)
        die("k_cast: unknown dtype");
    return size[dt];
}

/* do n elements of ey bytes at y share a byte with n of ex bytes at x? */
static int overlaps(const void *y, const void *x, int64_t n, int ey, int ex)
{
    return (const char *)y < (const char *)x + n * ex && (const char *)x < (const char *)y + n * ey;
}

/* One k_cast's elements [lo, hi): the common float pairs as plain loops (the bfloat16 ones vectorise),
 * everything else element by element through cast_one; a cast to its own dtype copies bytes. */
typedef struct {
    int to, from;
    void *y;
    const void *x;
    int64_t n;
} CastJob;

static void cast_range(void *ctx, int64_t lo, int64_t hi)
{
    const CastJob *j = ctx;
    const int to = j->to, from = j->from;
    if (to == from)
        memmove((char *)j->y + lo * dt_size(to), (const char *)j->x + lo * dt_size(to),
                (size_t)(hi - lo) * (size_t)dt_size(to));
    else if (from == K_DT_F32 && to == K_DT_F64)
        for (int64_t i = lo; i < hi; i++) ((double *)j->y)[i] = ((const float *)j->x)[i];
    else if (from == K_DT_F64 && to == K_DT_F32)
        for (int64_t i = lo; i < hi; i++) ((float *)j->y)[i] = (float)((const double *)j->x)[i];
    else if (from == K_DT_F32 && to == K_DT_BF16)
        for (int64_t i = lo; i < hi; i++) ((uint16_t *)j->y)[i] = k_bf16_from_f32(((const float *)j->x)[i]);
    else if (from == K_DT_BF16 && to == K_DT_F32)
        for (int64_t i = lo; i < hi; i++) ((float *)j->y)[i] = k_bf16_to_f32(((const uint16_t *)j->x)[i]);
    else if (from == K_DT_F32 && to == K_DT_F16)
        for (int64_t i = lo; i < hi; i++) ((uint16_t *)j->y)[i] = k_f16_from_f32(((const float *)j->x)[i]);
    else if (from == K_DT_F16 && to == K_DT_F32)
        for (int64_t i = lo; i < hi; i++) ((float *)j->y)[i] = k_f16_to_f32(((const uint16_t *)j->x)[i]);
    else
        for (int64_t i = lo; i < hi; i++)
            cast_one(to, j->y, from, j->x, i);
}

/* the whole cast on one thread (one unit of par_range's) */
static void cast_all(void *ctx, int64_t lo, int64_t hi)
{
    (void)lo, (void)hi;
    cast_range(ctx, 0, ((const CastJob *)ctx)->n);
}

/* Split by par_range, so that the generated step may cast inside a team that shares (codegen/team.c): each
 * element is converted alike however the range is cut.  With y == x of equal size, element i is read before
 * it is written, so in place is safe; y overlapping x otherwise (equal sizes) is done on one thread in
 * order, as one memmove for a copy; different sizes overlapping are refused. */
void k_cast(int to, void *y, int from, const void *x, int64_t n)
{
    const CastJob j = {to, from, y, x, n};
    if (n <= 0 || (to == from && y == x))
        return;
    const int sy = dt_size(to), sx = dt_size(from);
    if (y != x && overlaps(y, x, n, sy, sx)) {
        if (sy != sx)
            die("k_cast: y overlaps x with a different element size");
        par_range(cast_all, (void *)&j, 1, n);
        return;
    }
    par_range(cast_range, (void *)&j, n, 1);
}

/* ---- k_where ------------------------------------------------------------ */

/* One row of n esize-byte elements; U is the unsigned type of that size. */
#define K_WHERE_ROW(U)                                                             \
    do {                                                                           \
        U *yy = y;                                                                 \
        const U *aa = a, *bb = b;                                                  \
        for (int64_t i = 0; i < n; i++)                                            \
            yy[i] = c[i * ic] ? aa[i * ia] : bb[i * ib];                           \
    } while (0)

static void where_row(int esize, void *y, const uint8_t *c, const void *a, const void *b,
                      int64_t n, int64_t ic, int64_t ia, int64_t ib)
{
    switch (esize) {
    case 1: K_WHERE_ROW(uint8_t); break;
    case 2: K_WHERE_ROW(uint16_t); break;
    case 4: K_WHERE_ROW(uint32_t); break;
    case 8: K_WHERE_ROW(uint64_t); break;
    default: die("k_where: esize not 1, 2, 4 or 8");
    }
}

typedef struct {
    int esize;
    char *y;
    const uint8_t *c;
    const char *a, *b;
    Walk outer;              /* sa, sb, sc = strides of a, b, c */
    int64_t n, ia, ib, ic;   /* the innermost dim */
} WhereJob;

static void where_range(void *ctx, int64_t lo, int64_t hi)
{
    const WhereJob *j = ctx;
    const int64_t e = j->esize;
    Walk w = j->outer;
    int64_t col = lo % j->n;
    walk_seek(&w, lo / j->n);
    for (int64_t pos = lo; pos < hi; col = 0, walk_next(&w)) {
        int64_t len = min64(j->n - col, hi - pos);
        where_row(j->esize, j->y + pos * e, j->c + w.oc + col * j->ic,
                  j->a + (w.oa + col * j->ia) * e, j->b + (w.ob + col * j->ib) * e,
                  len, j->ic, j->ia, j->ib);
        pos += len;
    }
}

void k_where(int esize, void *y, const uint8_t *c, const void *a, const void *b,
             int rank, const int64_t *shape, const int64_t *sc, const int64_t *sa,
             const int64_t *sb)
{
    WhereJob j = {.esize = esize, .y = y, .c = c, .a = a, .b = b};
    int64_t total = numel(rank, shape);
    if (total == 0)
        return;
    for (int d = 0; d < rank; d++)
        walk_push3(&j.outer, shape[d], sa[d], sb[d], sc[d]);
    j.n = walk_pop3(&j.outer, &j.ia, &j.ib, &j.ic);
    par_range(where_range, &j, total, 1);
}

/* ---- typed bodies ------------------------------------------------------- */

#define T float
#define S f32
#define KM(fn) fn##f
#include "ew_impl.h"
#undef T
#undef S
#undef KM

#define T double
#define S f64
#define KM(fn) fn
#include "ew_impl.h"
#undef T
#undef S
#undef KM
