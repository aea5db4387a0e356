/* random_impl.h — typed bodies of random.c, included once per dtype with
 * T (element type) and S (name suffix) defined.  No include guard on purpose. */

typedef struct {
    T *y;
    uint8_t *mask;
    const T *x;
    int64_t n;
    double ratio;
    uint64_t seed;
    uint32_t stream, step;
} KFN(DropoutJob);

/* Chunks [lo, hi) of K_CHUNK elements: draw the keep flags, then write. */
static void KFN(dropout_chunks)(void *ctx, int64_t lo, int64_t hi)
{
    const KFN(DropoutJob) *j = ctx;
    const T s = (T)1 / (T)(1 - j->ratio);
    uint8_t m[K_CHUNK];
    for (int64_t c = lo; c < hi; c++) {
        const int64_t b = c * K_CHUNK, t = min64(K_CHUNK, j->n - b);
        philox_keep(m, b, b + t, j->ratio, j->seed, j->stream, j->step);
        for (int64_t i = 0; i < t; i++)
            j->y[b + i] = m[i] ? j->x[b + i] * s : (T)0;
        if (j->mask)
            memcpy(j->mask + b, m, (size_t)t);
    }
}

void KFN(k_dropout)(T *y, uint8_t *mask, const T *x, int64_t n, double ratio,
                    uint64_t seed, uint32_t stream, uint32_t step)
{
    KFN(DropoutJob) j = {y, mask, x, n, ratio, seed, stream, step};
    if (n <= 0)
        return;
    if (ratio <= 0) {  /* nothing dropped: an exact copy */
        if (y != x)
            memcpy(y, x, (size_t)n * sizeof(T));
        if (mask)
            memset(mask, 1, (size_t)n);
        return;
    }
    if (ratio >= 1) {
        memset(y, 0, (size_t)n * sizeof(T));
        if (mask)
            memset(mask, 0, (size_t)n);
        return;
    }
    par_range(KFN(dropout_chunks), &j, (n + K_CHUNK - 1) / K_CHUNK, K_CHUNK);
}

void KFN(k_dropout_grad)(T *dx, const T *dy, const uint8_t *mask, int64_t n, double ratio)
{
    if (ratio >= 1) {
        memset(dx, 0, (size_t)(n > 0 ? n : 0) * sizeof(T));
        return;
    }
    const T s = (T)1 / (T)(1 - ratio);
    for (int64_t i = 0; i < n; i++)
        dx[i] = mask[i] ? dy[i] * s : (T)0;
}
