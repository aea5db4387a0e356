/* ew.cu — elementwise kernels, the twins of kernels/c/ew.c: broadcasting
 * binary ops and comparisons, unary activations and their gradients, Where
 * and its gradient, Not, Cast, scale and fill.
 *
 * Every kernel is a grid-stride loop over its dense output.  The launcher
 * (launch.c) hands the broadcasting kernels an index space that is already
 * merged (size-1 dims dropped, dims contiguous in every operand fused), so
 * most calls arrive with rank 1 or 2 and kc_offsets does little division.
 * The op is a switch inside the loop: it is uniform across the grid, so it
 * costs a few instructions per element of a kernel bound by memory.  The
 * arithmetic follows kernels/c operation for operation, in the element
 * type (float or double: each typed kernel is a template, stamped for both
 * by kernels.def), with the op parameters rounded to it by the launcher as
 * kernels/c does.
 */

/* ---- k_binary ------------------------------------------------------------ */

template <typename T, typename I>
KC_DEV void binary_loop(int op, T *y, const T *a, const T *b, I n, int rank,
                        const KDims &shape, const KDims &sa, const KDims &sb)
{
    for (I i = kc_first<I>(); i < n; i += kc_stride<I>()) {
        int64_t oa, ob, unused;
        kc_offsets(i, rank, shape, sa, sb, sb, oa, ob, unused);
        y[i] = kf_binary(op, a[oa], b[ob]); /* fused.h */
    }
}

/* y[i] = a[off_a(i)] OP b[off_b(i)] over n = numel(shape); y may alias a
 * dense operand */
template <typename T> KC_DEV void k_binary(int op, T *y, const T *a, const T *b, int64_t n, int rank,
                                           KDims shape, KDims sa, KDims sb)
{
    if (n <= KC_INT32_LIMIT)
        binary_loop<T, uint32_t>(op, y, a, b, (uint32_t)n, rank, shape, sa, sb);
    else
        binary_loop<T, int64_t>(op, y, a, b, n, rank, shape, sa, sb);
}

/* int64 index arithmetic (fused.h's kf_binary_i64); the first position
 * divided by zero goes to check */
KC_GLOBAL void k_binary_i64(int op, int64_t *y, const int64_t *a, const int64_t *b, int64_t n, int rank,
                            KDims shape, KDims sa, KDims sb, int64_t *check)
{
    const int divides = op == KF_DIV || op == KF_MOD || op == KF_FMOD;
    for (int64_t i = kc_first<int64_t>(); i < n; i += kc_stride<int64_t>()) {
        int64_t oa, ob, unused;
        kc_offsets(i, rank, shape, sa, sb, sb, oa, ob, unused);
        if (divides && b[ob] == 0)
            atomicMin((unsigned long long *)check, (unsigned long long)i);
        y[i] = kf_binary_i64(op, a[oa], b[ob]);
    }
}

/* ---- comparisons ----------------------------------------------------------- */

template <typename T> KC_DEV uint8_t compare_op(int op, T a, T b)
{
    switch (op) {
    case K_EQ: return a == b;
    case K_LT: return a < b;
    case K_GT: return a > b;
    case K_LE: return a <= b;
    default: return a >= b;
    }
}

template <typename T, typename I>
KC_DEV void compare_loop(int op, uint8_t *y, const T *a, const T *b, I n, int rank,
                         const KDims &shape, const KDims &sa, const KDims &sb)
{
    for (I i = kc_first<I>(); i < n; i += kc_stride<I>()) {
        int64_t oa, ob, unused;
        kc_offsets(i, rank, shape, sa, sb, sb, oa, ob, unused);
        y[i] = compare_op(op, a[oa], b[ob]);
    }
}

template <typename T> KC_DEV void k_compare(int op, uint8_t *y, const T *a, const T *b, int64_t n, int rank,
                                            KDims shape, KDims sa, KDims sb)
{
    if (n <= KC_INT32_LIMIT)
        compare_loop<T, uint32_t>(op, y, a, b, (uint32_t)n, rank, shape, sa, sb);
    else
        compare_loop<T, int64_t>(op, y, a, b, n, rank, shape, sa, sb);
}

KC_GLOBAL void k_compare_i64(int op, uint8_t *y, const int64_t *a, const int64_t *b, int64_t n,
                             int rank, KDims shape, KDims sa, KDims sb)
{
    if (n <= KC_INT32_LIMIT)
        compare_loop<int64_t, uint32_t>(op, y, a, b, (uint32_t)n, rank, shape, sa, sb);
    else
        compare_loop<int64_t, int64_t>(op, y, a, b, n, rank, shape, sa, sb);
}

/* ---- k_unary, k_unary_grad -------------------------------------------------- */

template <typename T> KC_DEV void k_unary(int op, T *y, const T *x, int64_t n, T p0, T p1)
{
    for (int64_t i = kc_first<int64_t>(); i < n; i += kc_stride<int64_t>())
        y[i] = kf_unary(op, x[i], p0, p1); /* fused.h */
}

/* x and y are read only where the op's rule reads them (the other may be
 * NULL) */
template <typename T> KC_DEV void k_unary_grad(int op, T *dx, const T *dy, const T *x, const T *y,
                                               int64_t n, T p0, T p1)
{
    const int reads = kf_unary_reads(op);
    for (int64_t i = kc_first<int64_t>(); i < n; i += kc_stride<int64_t>())
        dx[i] = kf_unary_grad(op, dy[i], reads & KF_READS_X ? x[i] : (T)0, reads & KF_READS_Y ? y[i] : (T)0, p0,
                              p1);
}

/* ---- k_scale, k_fill, k_not ------------------------------------------------- */

template <typename T> KC_DEV void k_scale(T *y, const T *x, T alpha, int64_t n)
{
    for (int64_t i = kc_first<int64_t>(); i < n; i += kc_stride<int64_t>())
        y[i] = alpha * x[i];
}

template <typename T> KC_DEV void k_fill(T *y, T v, int64_t n)
{
    for (int64_t i = kc_first<int64_t>(); i < n; i += kc_stride<int64_t>())
        y[i] = v;
}

KC_GLOBAL void k_not(uint8_t *y, const uint8_t *x, int64_t n)
{
    for (int64_t i = kc_first<int64_t>(); i < n; i += kc_stride<int64_t>())
        y[i] = !x[i];
}

/* ---- k_where, k_where_grad -------------------------------------------------- */

template <typename U, typename I>
KC_DEV void where_loop(U *y, const uint8_t *c, const U *a, const U *b, I n, int rank,
                       const KDims &shape, const KDims &sc, const KDims &sa, const KDims &sb)
{
    for (I i = kc_first<I>(); i < n; i += kc_stride<I>()) {
        int64_t oc, oa, ob;
        kc_offsets(i, rank, shape, sc, sa, sb, oc, oa, ob);
        y[i] = c[oc] ? a[oa] : b[ob];
    }
}

template <typename I>
KC_DEV void where_esize(int esize, void *y, const uint8_t *c, const void *a, const void *b, I n,
                        int rank, const KDims &shape, const KDims &sc, const KDims &sa,
                        const KDims &sb)
{
    switch (esize) {
    case 1:
        where_loop((uint8_t *)y, c, (const uint8_t *)a, (const uint8_t *)b, n, rank, shape, sc, sa, sb);
        break;
    case 2:
        where_loop((uint16_t *)y, c, (const uint16_t *)a, (const uint16_t *)b, n, rank, shape, sc, sa,
                   sb);
        break;
    case 4:
        where_loop((uint32_t *)y, c, (const uint32_t *)a, (const uint32_t *)b, n, rank, shape, sc, sa,
                   sb);
        break;
    default:
        where_loop((uint64_t *)y, c, (const uint64_t *)a, (const uint64_t *)b, n, rank, shape, sc, sa,
                   sb);
    }
}

/* ONNX Where on esize-byte elements, y dense over shape */
KC_GLOBAL void k_where(int esize, void *y, const uint8_t *c, const void *a, const void *b, int64_t n,
                       int rank, KDims shape, KDims sc, KDims sa, KDims sb)
{
    if (n <= KC_INT32_LIMIT)
        where_esize<uint32_t>(esize, y, c, a, b, (uint32_t)n, rank, shape, sc, sa, sb);
    else
        where_esize<int64_t>(esize, y, c, a, b, n, rank, shape, sc, sa, sb);
}

/* da = c ? dy : 0, db = c ? 0 : dy over y's dense shape (either may be NULL) */
template <typename T> KC_DEV void k_where_grad(T *da, T *db, const uint8_t *c, const T *dy, int64_t n,
                                               int rank, KDims shape, KDims sc)
{
    for (int64_t i = kc_first<int64_t>(); i < n; i += kc_stride<int64_t>()) {
        const bool take = c[kc_offset1(i, rank, shape, sc)] != 0;
        if (da)
            da[i] = take ? dy[i] : (T)0;
        if (db)
            db[i] = take ? (T)0 : dy[i];
    }
}

/* ---- k_cast ----------------------------------------------------------------- */

/* float -> integer in [lo, hi]: toward zero, NaN -> 0, saturated (as
 * kernels/c; 2^63 stands for the int64 bound, which no double holds) */
KC_DEV int64_t cast_float_to_int(double v, double lo, double hi)
{
    if (v != v)
        return 0;
    if (v <= lo)
        return (int64_t)lo;
    if (v >= hi)
        return hi >= 9223372036854775807.0 ? (int64_t)0x7fffffffffffffffLL : (int64_t)hi;
    return (int64_t)v;
}

/* float -> uint64 as cast_float_to_int, its bits in an int64 (2^64 stands
 * for the bound 2^64 - 1) */
KC_DEV int64_t cast_float_to_u64(double v)
{
    if (v != v || v <= 0)
        return 0;
    return (int64_t)(v >= 18446744073709551616.0 ? ~0ull : (unsigned long long)v);
}

KC_DEV bool cast_is_float(int dt)
{
    return dt == K_DT_F32 || dt == K_DT_F64 || dt == K_DT_BF16 || dt == K_DT_F16;
}

/* a float dtype's element as double: exact for all four */
KC_DEV double cast_load_float(int dt, const void *x, int64_t i)
{
    switch (dt) {
    case K_DT_F32: return ((const float *)x)[i];
    case K_DT_F64: return ((const double *)x)[i];
    case K_DT_F16: return kc_f16_to_f32(((const uint16_t *)x)[i]);
    default: return kc_bf16_to_f32(((const uint16_t *)x)[i]); /* BF16 */
    }
}

/* an integer dtype's element as int64 (a uint64 as its bits) */
KC_DEV int64_t cast_load_int(int dt, const void *x, int64_t i)
{
    switch (dt) {
    case K_DT_I64: case K_DT_U64: return ((const int64_t *)x)[i];
    case K_DT_I32: return ((const int32_t *)x)[i];
    case K_DT_U32: return ((const uint32_t *)x)[i];
    case K_DT_I16: return ((const int16_t *)x)[i];
    case K_DT_U16: return ((const uint16_t *)x)[i];
    case K_DT_I8: return ((const int8_t *)x)[i];
    default: return ((const uint8_t *)x)[i]; /* U8, BOOL */
    }
}

/* v (int64 bits) stored as an integer dtype's element i: a narrower integer
 * keeps the low bits (two's complement wraparound), as kernels/c */
KC_DEV void cast_store_int(int dt, void *y, int64_t i, int64_t v)
{
    const uint64_t u = (uint64_t)v;
    switch (dt) {
    case K_DT_I64: case K_DT_U64: ((uint64_t *)y)[i] = u; return;
    case K_DT_I32: case K_DT_U32: ((uint32_t *)y)[i] = (uint32_t)u; return;
    case K_DT_I16: case K_DT_U16: ((uint16_t *)y)[i] = (uint16_t)u; return;
    case K_DT_I8: case K_DT_U8: ((uint8_t *)y)[i] = (uint8_t)u; return;
    default: ((uint8_t *)y)[i] = u != 0; return; /* BOOL */
    }
}

/* a float converted to integer dtype dt, saturated to its range (int64 bits) */
KC_DEV int64_t cast_float_to_dt(int dt, double v)
{
    switch (dt) {
    case K_DT_I64: return cast_float_to_int(v, -9223372036854775808.0, 9223372036854775807.0);
    case K_DT_U64: return cast_float_to_u64(v);
    case K_DT_I32: return cast_float_to_int(v, -2147483648.0, 2147483647.0);
    case K_DT_U32: return cast_float_to_int(v, 0, 4294967295.0);
    case K_DT_I16: return cast_float_to_int(v, -32768.0, 32767.0);
    case K_DT_U16: return cast_float_to_int(v, 0, 65535.0);
    case K_DT_I8: return cast_float_to_int(v, -128.0, 127.0);
    default: return cast_float_to_int(v, 0, 255.0); /* U8 */
    }
}

/* element i of x (dtype from) converted to dtype to and stored in y: floats
 * go through double, integers through int64 (uint64 through uint64), as
 * kernels/c's cast_one.  To bfloat16 or float16, everything first becomes a
 * float (f64 and int64 round there) and then rounds once more, as kernels/c
 * does.  float32 <-> bfloat16 / float16 only moves bits, never through a GPU
 * float conversion, which may hand back a canonical NaN where the CPU keeps
 * the NaN's sign. */
KC_DEV void cast_one(int to, void *y, int from, const void *x, int64_t i)
{
    if (from == K_DT_F32 && to == K_DT_BF16) {
        ((uint16_t *)y)[i] = kc_bf16_from_f32(((const float *)x)[i]);
        return;
    }
    if (from == K_DT_BF16 && to == K_DT_F32) {
        ((float *)y)[i] = kc_bf16_to_f32(((const uint16_t *)x)[i]);
        return;
    }
    if (from == K_DT_F32 && to == K_DT_F16) {
        ((uint16_t *)y)[i] = kc_f16_from_f32(((const float *)x)[i]);
        return;
    }
    if (from == K_DT_F16 && to == K_DT_F32) {
        ((float *)y)[i] = kc_f16_to_f32(((const uint16_t *)x)[i]);
        return;
    }
    if (cast_is_float(from)) {
        const double v = cast_load_float(from, x, i);
        switch (to) {
        case K_DT_F32: ((float *)y)[i] = (float)v; return;
        case K_DT_F64: ((double *)y)[i] = v; return;
        case K_DT_BF16: ((uint16_t *)y)[i] = kc_bf16_from_f32((float)v); return;
        case K_DT_F16: ((uint16_t *)y)[i] = kc_f16_from_f32((float)v); return;
        case K_DT_BOOL: ((uint8_t *)y)[i] = v != 0; return;
        default: cast_store_int(to, y, i, cast_float_to_dt(to, v)); return;
        }
    }
    const int64_t v = cast_load_int(from, x, i);
    const bool u = from == K_DT_U64;
    const float f = u ? (float)(uint64_t)v : (float)v;
    switch (to) {
    case K_DT_F32: ((float *)y)[i] = f; return;
    case K_DT_F64: ((double *)y)[i] = u ? (double)(uint64_t)v : (double)v; return;
    case K_DT_BF16: ((uint16_t *)y)[i] = kc_bf16_from_f32(f); return;
    case K_DT_F16: ((uint16_t *)y)[i] = kc_f16_from_f32(f); return;
    default: cast_store_int(to, y, i, v); return;
    }
}

/* y = (to) x for to != from (the launcher copies bytes when they are equal);
 * in place is safe when both have one element size: element i is read
 * before it is written, by the same thread */
KC_GLOBAL void k_cast(int to, void *y, int from, const void *x, int64_t n)
{
    for (int64_t i = kc_first<int64_t>(); i < n; i += kc_stride<int64_t>())
        cast_one(to, y, from, x, i);
}
