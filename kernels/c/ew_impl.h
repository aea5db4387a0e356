/* ew_impl.h — typed bodies of ew.c, included once per dtype with
 * T (element type), S (name suffix) and KM(f) (libm name of f for T: expf or
 * exp) defined.  No include guard on purpose. */

/* ---- k_binary ---------------------------------------------------------- */

/* One innermost row: y[i] = a[i*ia] OP b[i*ib] (fused.h's row for op), with
 * the contiguous and broadcast stride patterns written out so the compiler
 * vectorises them. */
#define K_ROW(OP)                                                                          \
    do {                                                                                   \
        if (ia == 1 && ib == 1) {                                                          \
            for (int64_t i = 0; i < n; i++) y[i] = KFN(kf_binary)(OP, a[i], b[i]);         \
        } else if (ia == 1 && ib == 0) {                                                   \
            const T bv = b[0];                                                             \
            for (int64_t i = 0; i < n; i++) y[i] = KFN(kf_binary)(OP, a[i], bv);           \
        } else if (ia == 0 && ib == 1) {                                                   \
            const T av = a[0];                                                             \
            for (int64_t i = 0; i < n; i++) y[i] = KFN(kf_binary)(OP, av, b[i]);           \
        } else {                                                                           \
            for (int64_t i = 0; i < n; i++) y[i] = KFN(kf_binary)(OP, a[i * ia], b[i * ib]); \
        }                                                                                  \
    } while (0)
#define K_ROW_CASE(code, ...) case K_##code: K_ROW(K_##code); break;

static void KFN(binary_row)(int op, T *y, const T *a, const T *b, int64_t n,
                            int64_t ia, int64_t ib)
{
    switch (op) {
    KF_BINARY(K_ROW_CASE)
    default: die("k_binary: unknown op");
    }
}
#undef K_ROW_CASE
#undef K_ROW

typedef struct {
    int op;
    T *y;
    const T *a, *b;
    Walk outer;           /* every dim but the innermost */
    int64_t n, ia, ib;    /* the innermost dim */
} KFN(BinaryJob);

/* Computes y[lo..hi) of the dense output. */
static void KFN(binary_range)(void *ctx, int64_t lo, int64_t hi)
{
    const KFN(BinaryJob) *j = ctx;
    Walk w = j->outer;
    int64_t col = lo % j->n;
    walk_seek(&w, lo / j->n);
    for (int64_t pos = lo; pos < hi; col = 0, walk_next(&w)) {
        int64_t len = min64(j->n - col, hi - pos);
        KFN(binary_row)(j->op, j->y + pos, j->a + w.oa + col * j->ia,
                        j->b + w.ob + col * j->ib, len, j->ia, j->ib);
        pos += len;
    }
}

void KFN(k_binary)(int op, T *y, const T *a, const T *b, int rank,
                   const int64_t *shape, const int64_t *sa, const int64_t *sb)
{
    KFN(BinaryJob) j = {.op = op, .y = y, .a = a, .b = b};
    int64_t total = numel(rank, shape);
    if (total == 0)
        return;
    for (int d = 0; d < rank; d++)
        walk_push(&j.outer, shape[d], sa[d], sb[d]);
    j.n = walk_pop(&j.outer, &j.ia, &j.ib);
    par_range(KFN(binary_range), &j, total, 1);
}

/* ---- k_unary, k_unary_grad ---------------------------------------------- */

/* one loop per op (fused.h's row), op a constant in each; GELU's row picks its form (erf or tanh) by p0, so it
 * has a loop per form with p0 a constant in each: with p0 read at run time GCC keeps the row's branch in the
 * loop and runs it scalar (11 ns an element, where the vectorised loop of one form takes about 1); each loop
 * K_PAR_FOR's (walk.h: its thread's part inside a team that shares) */
#define K_UNARY_LOOP(code, a, b) K_PAR_FOR(n, y[i] = KFN(kf_unary)(code, x[i], a, b))
#define K_UNARY_CASE(code, ...)                                                            \
    case K_##code:                                                                         \
        K_UNARY_LOOP(K_##code, a, b);                                                      \
        break;

void KFN(k_unary)(int op, T *y, const T *x, int64_t n, double p0, double p1)
{
    const T a = (T)p0, b = (T)p1;
    if (op == K_GELU && a == 0) {
        K_UNARY_LOOP(K_GELU, (T)0, b);
        return;
    }
    if (op == K_GELU) {
        K_UNARY_LOOP(K_GELU, (T)1, b);
        return;
    }
    switch (op) {
    KF_UNARY(K_UNARY_CASE)
    default: die("k_unary: unknown op");
    }
}
#undef K_UNARY_CASE
#undef K_UNARY_LOOP

/* x and y are read only where the rule reads them (either may be NULL
 * otherwise); GELU (whose row reads x alone) a loop per form, as in k_unary */
#define K_UNARY_GRAD_CASE(code, ...)                                                       \
    case K_##code: {                                                                       \
        const int rx = kf_unary_reads(K_##code) & KF_READS_X;                              \
        const int ry = kf_unary_reads(K_##code) & KF_READS_Y;                              \
        K_PAR_FOR(n, dx[i] = KFN(kf_unary_grad)(K_##code, dy[i], rx ? x[i] : (T)0, ry ? y[i] : (T)0, a, b)); \
        break;                                                                             \
    }
#define K_GELU_GRAD_LOOP(a, b) K_PAR_FOR(n, dx[i] = KFN(kf_unary_grad)(K_GELU, dy[i], x[i], (T)0, a, b))

void KFN(k_unary_grad)(int op, T *dx, const T *dy, const T *x, const T *y,
                       int64_t n, double p0, double p1)
{
    const T a = (T)p0, b = (T)p1;
    if (op == K_GELU && a == 0) {
        K_GELU_GRAD_LOOP((T)0, b);
        return;
    }
    if (op == K_GELU) {
        K_GELU_GRAD_LOOP((T)1, b);
        return;
    }
    switch (op) {
    KF_UNARY(K_UNARY_GRAD_CASE)
    default: die("k_unary_grad: unknown op");
    }
}
#undef K_UNARY_GRAD_CASE
#undef K_GELU_GRAD_LOOP

/* ---- k_scale, k_fill ---------------------------------------------------- */

/* alpha is rounded to T first, as a float tensor times a Python scalar is.  Both K_PAR_FOR's loops (walk.h). */
void KFN(k_scale)(T *y, const T *x, double alpha, int64_t n)
{
    const T s = (T)alpha;
    K_PAR_FOR(n, y[i] = s * x[i]);
}

void KFN(k_fill)(T *y, double v, int64_t n)
{
    const T t = (T)v;
    K_PAR_FOR(n, y[i] = t);
}

/* ---- k_where_grad ------------------------------------------------------- */

typedef struct {
    T *da, *db;
    const uint8_t *c;
    const T *dy;
    Walk w;  /* over c: the outer dims; rows of n with c's stride ic */
    int64_t n, ic;
} KFN(WhereGradJob);

static void KFN(where_grad_rows)(void *ctx, int64_t lo, int64_t hi)
{
    const KFN(WhereGradJob) *j = ctx;
    Walk w = j->w;
    walk_seek(&w, lo);
    for (int64_t r = lo; r < hi; r++, walk_next(&w)) {
        const uint8_t *cr = j->c + w.oa;
        const int64_t pos = r * j->n;
        for (int64_t i = 0; i < j->n; i++) {
            if (j->da)
                j->da[pos + i] = cr[i * j->ic] ? j->dy[pos + i] : (T)0;
            if (j->db)
                j->db[pos + i] = cr[i * j->ic] ? (T)0 : j->dy[pos + i];
        }
    }
}

void KFN(k_where_grad)(T *da, T *db, const uint8_t *c, const T *dy, int rank,
                       const int64_t *shape, const int64_t *sc)
{
    KFN(WhereGradJob) j = {.da = da, .db = db, .c = c, .dy = dy};
    int64_t unused;
    if (numel(rank, shape) == 0)
        return;
    for (int d = 0; d < rank; d++)
        walk_push(&j.w, shape[d], sc[d], 0);
    j.n = walk_pop(&j.w, &j.ic, &unused);
    par_range(KFN(where_grad_rows), &j, numel(j.w.rank, j.w.shape), j.n);
}
