/* gather_impl.h — typed body of gather.c, included once per dtype with
 * T (element type) and S (name suffix) defined.  No include guard on purpose. */

typedef struct {
    T *dx;
    const T *dy;
    const int64_t *idx;
    int64_t axis, inner, nidx, blocks;  /* blocks = column blocks per outer */
} KFN(ScatterJob);

/* Units [lo, hi): unit u = (outer o, column block b); zero its dx columns,
 * then add every index's dy row segment in ascending index order. */
static void KFN(scatter_units)(void *ctx, int64_t lo, int64_t hi)
{
    const KFN(ScatterJob) *j = ctx;
    for (int64_t u = lo; u < hi; u++) {
        const int64_t o = u / j->blocks, c0 = u % j->blocks * K_COLS;
        const int64_t t = min64(K_COLS, j->inner - c0);
        T *dxo = j->dx + o * j->axis * j->inner + c0;
        for (int64_t a = 0; a < j->axis; a++)
            memset(dxo + a * j->inner, 0, (size_t)t * sizeof(T));
        for (int64_t i = 0; i < j->nidx; i++) {
            int64_t k = j->idx[i] < 0 ? j->idx[i] + j->axis : j->idx[i];
            if (k < 0 || k >= j->axis)
                continue;
            T *d = dxo + k * j->inner;
            const T *s = j->dy + (o * j->nidx + i) * j->inner + c0;
            for (int64_t c = 0; c < t; c++)
                d[c] += s[c];
        }
    }
}

void KFN(k_gather_grad)(T *dx, const T *dy, const int64_t *idx, int64_t outer,
                        int64_t axis, int64_t inner, int64_t nidx)
{
    KFN(ScatterJob) j = {dx, dy, idx, axis, inner, nidx, (inner + K_COLS - 1) / K_COLS};
    if (inner <= 0 || axis <= 0)
        return;
    par_range(KFN(scatter_units), &j, outer * j.blocks, (nidx + axis) * min64(inner, K_COLS));
}

typedef struct {
    const Columns *c;
    T *dx;
    const T *dy;
    const int64_t *idx;
} KFN(ScatterColumnsJob);

static void KFN(scatter_columns)(void *ctx, int64_t lo, int64_t hi)
{
    const KFN(ScatterColumnsJob) *j = ctx;
    const Columns *c = j->c;
    for (int64_t u = lo; u < hi; u++) {
        int64_t oi, ox;
        column_at(c, u, &oi, &ox);
        for (int64_t a = 0; a < c->len; a++, oi += c->istep) {
            int64_t k = j->idx[oi] < 0 ? j->idx[oi] + c->axdim : j->idx[oi];
            j->dx[ox + k * c->xstep] += j->dy[oi];
        }
    }
}

int64_t KFN(k_gather_elements_grad)(T *dx, const T *dy, const int64_t *idx, int rank,
                                    const int64_t *shape, const int64_t *xshape, int axis)
{
    Columns c = columns(rank, shape, xshape, axis);
    KFN(ScatterColumnsJob) j = {&c, dx, dy, idx};
    int64_t nx = 1;
    for (int d = 0; d < rank; d++)
        nx *= xshape[d];
    for (int64_t i = 0; i < c.cols * c.len; i++) /* ScatterElements' indices come here unchecked */
        if (idx[i] < -c.axdim || idx[i] >= c.axdim)
            return i;
    memset(dx, 0, (size_t)nx * sizeof(T));
    par_range(KFN(scatter_columns), &j, c.cols, c.len);
    return -1;
}
