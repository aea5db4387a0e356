/* launch_impl.h — the launchers of kernels of an element type (launch.c),
 * included once per type with T (float or double), S (_f32 or _f64) and
 * KC_GEMM_T (the type's kc_gemm_add operand code) defined: each is the
 * twin kc_X_S of kernels.h's k_X_S, launching kernels.def's k_Y_S.  No
 * include guard on purpose. */

#define KFN(f) KC_CAT(f, S)

/* ---- ew.c -------------------------------------------------------------------- */

void KFN(kc_binary)(int op, T *y, const T *a, const T *b, int rank, const int64_t *shape,
                    const int64_t *sa, const int64_t *sb)
{
    const int64_t *st[2] = {sa, sb};
    KcWalk w;
    if (op < 0 || op >= K_BINARY_COUNT)
        die("k_binary", "unknown op");
    if (walk_build(&w, rank, shape, 2, st))
        KFN(launch_k_binary)(grid_for(w.n, KC_BLOCK), KC_BLOCK, op, y, a, b, w.n, w.rank, w.shape,
                             w.st[0], w.st[1]);
}

void KFN(kc_unary)(int op, T *y, const T *x, int64_t n, double p0, double p1)
{
    if (op < 0 || op >= K_UNARY_COUNT)
        die("k_unary", "unknown op");
    if (n > 0) /* p0, p1 rounded to T, as kernels/c */
        KFN(launch_k_unary)(grid_for(n, KC_BLOCK), KC_BLOCK, op, y, x, n, (T)p0, (T)p1);
}

void KFN(kc_unary_grad)(int op, T *dx, const T *dy, const T *x, const T *y, int64_t n,
                        double p0, double p1)
{
    if (op < 0 || op >= K_UNARY_COUNT)
        die("k_unary_grad", "unknown op");
    if (n > 0)
        KFN(launch_k_unary_grad)(grid_for(n, KC_BLOCK), KC_BLOCK, op, dx, dy, x, y, n, (T)p0,
                                 (T)p1);
}

void KFN(kc_scale)(T *y, const T *x, double alpha, int64_t n)
{
    if (n > 0)
        KFN(launch_k_scale)(grid_for(n, KC_BLOCK), KC_BLOCK, y, x, (T)alpha, n);
}

void KFN(kc_fill)(T *y, double v, int64_t n)
{
    if (n > 0)
        KFN(launch_k_fill)(grid_for(n, KC_BLOCK), KC_BLOCK, y, (T)v, n);
}

void KFN(kc_compare)(int op, uint8_t *y, const T *a, const T *b, int rank,
                     const int64_t *shape, const int64_t *sa, const int64_t *sb)
{
    const int64_t *st[2] = {sa, sb};
    KcWalk w;
    if (op < K_EQ || op > K_GE)
        die("k_compare", "unknown op");
    if (walk_build(&w, rank, shape, 2, st))
        KFN(launch_k_compare)(grid_for(w.n, KC_BLOCK), KC_BLOCK, op, y, a, b, w.n, w.rank, w.shape,
                              w.st[0], w.st[1]);
}

void KFN(kc_where_grad)(T *da, T *db, const uint8_t *c, const T *dy, int rank,
                        const int64_t *shape, const int64_t *sc)
{
    const int64_t *st[1] = {sc};
    KcWalk w;
    if ((da || db) && walk_build(&w, rank, shape, 1, st))
        KFN(launch_k_where_grad)(grid_for(w.n, KC_BLOCK), KC_BLOCK, da, db, c, dy, w.n, w.rank, w.shape,
                                 w.st[0]);
}

/* ---- copy.c -------------------------------------------------------------------- */

/* y = transpose(x, perm): y walked densely, x by the permuted strides.
 * When y's innermost dim is strided in x and some y dim q is x's contiguous
 * one, 32 x 32 tiles of (q, innermost) go through shared memory; every
 * other case is a strided copy that reads x in rows. */
void KFN(kc_transpose)(T *y, const T *x, int rank, const int64_t *xshape, const int64_t *perm)
{
    int64_t shape[KC_MAX_RANK], ys[KC_MAX_RANK], xs[KC_MAX_RANK];
    const int64_t *st[2] = {ys, xs};
    KcWalk w;
    int q = -1;
    if (rank > KC_MAX_RANK)
        die("k_transpose", "rank above 8");
    for (int i = rank - 1; i >= 0; i--) {
        shape[i] = xshape[perm[i]];
        xs[i] = dense_stride(rank, xshape, (int)perm[i]);
        ys[i] = i == rank - 1 ? 1 : ys[i + 1] * shape[i + 1];
    }
    if (!walk_build(&w, rank, shape, 2, st))
        return;
    for (int d = 0; d + 1 < w.rank; d++)
        if (w.st[1].d[d] == 1)
            q = d;
    if (w.rank < 2 || w.st[1].d[w.rank - 1] == 1 || q < 0) {
        launch_k_copy_strided(grid_for(w.n, KC_BLOCK), KC_BLOCK, (int)sizeof(T), y, x, w.n, w.rank, w.shape,
                              w.st[0], w.st[1]);
        return;
    }
    const int64_t nq = w.shape.d[q], yq = w.st[0].d[q];
    walk_remove(&w, q);
    const int64_t nl = w.shape.d[w.rank - 1], ix = w.st[1].d[w.rank - 1];
    walk_remove(&w, w.rank - 1); /* what is left is the batch */
    const int64_t nbatch = numel(w.rank, w.shape.d);
    const int64_t tiles = nbatch * ((nq + 31) / 32) * ((nl + 31) / 32);
    KFN(launch_k_transpose_tiled)(grid_for(tiles * KC_BLOCK, KC_BLOCK), KC_BLOCK, y, x, nq, nl, ix, yq,
                                  nbatch, w.rank, w.shape, w.st[1], w.st[0]);
}

void KFN(kc_pad)(int mode, T *y, const T *x, int rank, const int64_t *xshape,
                 const int64_t *pads, double value)
{
    KDims ys, xs, pb;
    pad_dims("k_pad", mode, rank, xshape, pads, &ys, &xs, &pb);
    int64_t n = numel(rank, ys.d);
    if (n > 0)
        KFN(launch_k_pad)(grid_for(n, KC_BLOCK), KC_BLOCK, mode, y, x, n, rank, ys, xs, pb, (T)value);
}

void KFN(kc_pad_grad)(int mode, T *dx, const T *dy, int rank, const int64_t *xshape,
                      const int64_t *pads)
{
    KDims ys, xs, pb;
    pad_dims("k_pad_grad", mode, rank, xshape, pads, &ys, &xs, &pb);
    int64_t n = numel(rank, xshape);
    if (n > 0)
        KFN(launch_k_pad_grad)(grid_for(n, KC_BLOCK), KC_BLOCK, mode, dx, dy, n, rank, xs, ys, pb);
}

/* ---- matmul.c ------------------------------------------------------------------- */

void KFN(kc_matmul)(T *c, const T *a, const T *b, int64_t batch, int64_t sa, int64_t sb,
                    int64_t m, int64_t n, int64_t k, int ta, int tb, double beta)
{
    KFN(kc_gemm)(c, a, b, batch, sa, sb, m, n, k, ta, tb, beta);
}

/* the GEMM with its epilogue; a bias no cuBLASLt algorithm would add (kc_gemm_add
 * returns 0) is added here, row by row */
static void KFN(matmul_add)(KcGemmType type, T *c, const void *a, const void *b, const T *bias,
                        const T *add, double alpha, int64_t batch, int64_t sa, int64_t sb, int64_t m,
                        int64_t n, int64_t k, int ta, int tb)
{
    if (kc_gemm_add(type, c, a, b, bias, add, alpha, batch, sa, sb, m, n, k, ta, tb))
        return;
    const int64_t shape[2] = {batch * m, n}, sc[2] = {n, 1}, sbias[2] = {0, 1};
    KFN(kc_binary)(K_ADD, c, c, bias, 2, shape, sc, sbias);
}

void KFN(kc_matmul_add)(T *c, const T *a, const T *b, const T *bias, const T *add,
                        double alpha, int64_t batch, int64_t sa, int64_t sb, int64_t m, int64_t n, int64_t k, int ta,
                        int tb)
{
    KFN(matmul_add)(KC_GEMM_T, c, a, b, bias, add, alpha, batch, sa, sb, m, n, k, ta, tb);
}

/* ---- reduce.c ------------------------------------------------------------------- */

void KFN(kc_reduce)(int op, T *y, const T *x, int rank, const int64_t *xshape,
                    const int64_t *yshape)
{
    KcWalk k, r;
    if (op < K_RSUM || op > K_RPROD)
        die("k_reduce", "unknown op");
    if (numel(rank, xshape) == 0) { /* each group folds nothing */
        KFN(kc_fill)(y, op == K_RMEAN ? (double)NAN : red_init(op), numel(rank, yshape));
        return;
    }
    const int64_t group = reduce_split(rank, xshape, yshape, &k, &r);
    const double scale = op == K_RMEAN ? 1.0 / (double)group : 1.0;
    if (k.rank == 0 && group >= 65536) { /* one value from a large x: every block helps */
        KFN(launch_k_reduce_all)(partial_grid(grid_for(group, KC_BLOCK)), KC_BLOCK, op, y, x, group, scale);
        return;
    }
    if (k.rank > 0 && k.st[0].d[k.rank - 1] == 1) { /* innermost kept: column tiles */
        const int64_t nc = k.shape.d[k.rank - 1];
        walk_remove(&k, k.rank - 1);
        const int64_t nko = numel(k.rank, k.shape.d), tiles = nko * ((nc + 31) / 32);
        const int64_t chunks = col_chunks(tiles, group, 1, nko * nc);
        const unsigned block = col_block((group + chunks - 1) / chunks + 3);
        KFN(launch_k_reduce_cols)(row_grid(tiles * chunks, block), block, op, y, x, nko, nc, group, chunks,
                                  k.rank, k.shape, k.st[0], r.rank, r.shape, r.st[0], scale);
        if (chunks > 1)
            KFN(launch_k_cols_fold)(grid_for(nko * nc, KC_BLOCK), KC_BLOCK, op, y, NULL, nko * nc, chunks, scale);
        return;
    }
    const unsigned block = row_block(group);
    KFN(launch_k_reduce_rows)(row_grid(k.n, block), block, op, y, x, k.n, group, k.rank, k.shape,
                              k.st[0], r.rank, r.shape, r.st[0], scale);
}

void KFN(kc_reduce_sum_to)(T *y, const T *x, int rank, const int64_t *xshape,
                           const int64_t *yshape)
{
    KFN(kc_reduce)(K_RSUM, y, x, rank, xshape, yshape);
}

void KFN(kc_reduce_max_grad)(T *dx, const T *dy, const T *x, const T *y, int rank,
                             const int64_t *xshape, const int64_t *yshape)
{
    KcWalk k, r;
    if (numel(rank, xshape) == 0)
        return;
    const int64_t group = reduce_split(rank, xshape, yshape, &k, &r);
    const unsigned block = row_block(group);
    KFN(launch_k_reduce_max_grad)(row_grid(k.n, block), block, dx, dy, x, y, k.n, group, k.rank,
                                  k.shape, k.st[0], r.rank, r.shape, r.st[0]);
}

void KFN(kc_reduce_prod_grad)(T *dx, const T *dy, const T *x, int rank, const int64_t *xshape,
                              const int64_t *yshape)
{
    KcWalk k, r;
    if (numel(rank, xshape) == 0)
        return;
    const int64_t group = reduce_split(rank, xshape, yshape, &k, &r);
    const unsigned block = row_block(group);
    KFN(launch_k_reduce_prod_grad)(row_grid(k.n, block), block, dx, dy, x, k.n, group, k.rank, k.shape, k.st[0],
                                   r.rank, r.shape, r.st[0]);
}

void KFN(kc_softmax)(int is_log, T *y, const T *x, int64_t outer, int64_t axis, int64_t inner)
{
    if (outer * axis * inner <= 0)
        return;
    if (inner == 1) {
        const unsigned block = row_block(axis);
        KFN(launch_k_softmax_rows)(row_grid(outer, block), block, is_log, y, x, outer, axis);
    } else {
        KFN(launch_k_softmax_cols)(grid_for(outer * inner, KC_BLOCK), KC_BLOCK, is_log, y, x, outer,
                                   axis, inner);
    }
}

void KFN(kc_softmax_grad)(int is_log, T *dx, const T *dy, const T *y, int64_t outer,
                          int64_t axis, int64_t inner)
{
    if (outer * axis * inner <= 0)
        return;
    if (inner == 1) {
        const unsigned block = row_block(axis);
        KFN(launch_k_softmax_grad_rows)(row_grid(outer, block), block, is_log, dx, dy, y, outer, axis);
    } else {
        KFN(launch_k_softmax_grad_cols)(grid_for(outer * inner, KC_BLOCK), KC_BLOCK, is_log, dx, dy, y,
                                        outer, axis, inner);
    }
}

void KFN(kc_range)(T *y, double start, double delta, int64_t n)
{
    if (n > 0)
        KFN(launch_k_range)(grid_for(n, KC_BLOCK), KC_BLOCK, y, start, delta, n);
}

/* ---- norm.c -------------------------------------------------------------------------- */

void KFN(kc_layernorm)(T *y, T *mean, T *invstd, const T *x, const T *scale,
                       const T *bias, int64_t outer, int64_t inner, double eps)
{
    const unsigned block = row_block(inner);
    if (inner > 0 && outer > 0)
        KFN(launch_k_layernorm)(row_grid(outer, block), block, y, mean, invstd, x, scale, bias, outer,
                                inner, eps);
}

/* dscale / dbias first: dx may alias dy */
void KFN(kc_layernorm_grad)(T *dx, T *dscale, T *dbias, const T *dy, const T *x,
                            const T *mean, const T *invstd, const T *scale, int64_t outer,
                            int64_t inner)
{
    if (inner <= 0)
        return;
    if (dscale || dbias) {
        const int64_t chunks = col_chunks((inner + 31) / 32, outer, 2, inner);
        const unsigned block = col_block((outer + chunks - 1) / chunks);
        KFN(launch_k_layernorm_grad_cols)(row_grid((inner + 31) / 32 * chunks, block), block, dscale, dbias, dy,
                                          x, mean, invstd, outer, inner, chunks);
        if (chunks > 1)
            KFN(launch_k_cols_fold)(grid_for(inner, KC_BLOCK), KC_BLOCK, K_RSUM, dscale, dbias, inner, chunks,
                                    1.0);
    }
    if (dx && outer > 0) {
        const unsigned block = row_block(inner);
        KFN(launch_k_layernorm_grad)(row_grid(outer, block), block, dx, dy, x, mean, invstd, scale,
                                     outer, inner);
    }
}

void KFN(kc_batchnorm_train)(T *y, T *mean, T *invstd, T *rm_out, T *rv_out,
                             const T *x, const T *scale, const T *bias, const T *rm_in,
                             const T *rv_in, int64_t n, int64_t c, int64_t l, double eps,
                             double momentum)
{
    const unsigned block = row_block(n * l);
    if (c > 0)
        KFN(launch_k_batchnorm_train)(row_grid(c, block), block, y, mean, invstd, rm_out, rv_out, x,
                                      scale, bias, rm_in, rv_in, n, c, l, eps, momentum);
}

void KFN(kc_batchnorm_grad)(T *dx, T *dscale, T *dbias, const T *dy, const T *x,
                            const T *mean, const T *invstd, const T *scale, int64_t n,
                            int64_t c, int64_t l)
{
    const unsigned block = row_block(n * l);
    if (c > 0)
        KFN(launch_k_batchnorm_grad)(row_grid(c, block), block, dx, dscale, dbias, dy, x, mean, invstd,
                                     scale, n, c, l);
}

void KFN(kc_batchnorm_infer)(T *y, const T *x, const T *scale, const T *bias,
                             const T *mean, const T *var, int64_t n, int64_t c, int64_t l,
                             double eps)
{
    if (n * c * l > 0)
        KFN(launch_k_batchnorm_infer)(grid_for(n * c * l, KC_BLOCK), KC_BLOCK, y, x, scale, bias, mean,
                                      var, n, c, l, eps);
}

void KFN(kc_bn_running_var)(T *rv_out, const T *rv_in, const T *invstd, int64_t c,
                            double eps, double momentum)
{
    if (c > 0)
        KFN(launch_k_bn_running_var)(grid_for(c, KC_BLOCK), KC_BLOCK, rv_out, rv_in, invstd, c, eps,
                                     momentum);
}

/* ---- conv.c --------------------------------------------------------------------------- */

/* col of image nb, group gi in ws (the caller's k_conv2d_workspace) */
static void KFN(im2col)(const KConv2d *p, T *ws, const T *xg)
{
    const int64_t n = p->c / p->groups * p->kh * p->kw * p->oh * p->ow;
    if (n > 0)
        KFN(launch_k_im2col)(grid_for(n, KC_BLOCK), KC_BLOCK, *p, ws, xg);
}

void KFN(kc_conv2d)(const KConv2d *p, T *y, const T *x, const T *w, const T *b, T *ws)
{
    conv_check(p);
    const int64_t g = p->groups, cg = p->c / g, mg = p->m / g, hw = p->h * p->w;
    const int64_t kk = cg * p->kh * p->kw, nout = p->oh * p->ow;
    if (k_conv2d_is_direct(p) && g == 1) /* y_i = w x_i for every image: one batched GEMM */
        KFN(kc_gemm)(y, w, x, p->n, 0, p->c * hw, p->m, nout, kk, 0, 0, 0.0);
    else
        for (int64_t nb = 0; nb < p->n; nb++)
            for (int64_t gi = 0; gi < g; gi++) {
                const T *xg = x + (nb * p->c + gi * cg) * hw, *col = xg;
                if (!k_conv2d_is_direct(p)) {
                    KFN(im2col)(p, ws, xg);
                    col = ws;
                }
                KFN(kc_gemm)(y + (nb * p->m + gi * mg) * nout, w + gi * mg * kk, col, 1, 0, 0, mg, nout,
                             kk, 0, 0, 0.0);
            }
    if (b && p->n * p->m * nout > 0)
        KFN(launch_k_conv2d_bias)(grid_for(p->n * p->m * nout, KC_BLOCK), KC_BLOCK, y, b, p->n, p->m,
                                  nout);
}

/* dx written: by the GEMM (direct) or by col2im, which writes every pixel */
void KFN(kc_conv2d_grad_x)(const KConv2d *p, T *dx, const T *dy, const T *w, T *ws)
{
    conv_check(p);
    const int64_t g = p->groups, cg = p->c / g, mg = p->m / g, hw = p->h * p->w;
    const int64_t kk = cg * p->kh * p->kw, nout = p->oh * p->ow;
    if (k_conv2d_is_direct(p) && g == 1) {
        KFN(kc_gemm)(dx, w, dy, p->n, 0, p->m * nout, kk, nout, p->m, 1, 0, 0.0);
        return;
    }
    for (int64_t nb = 0; nb < p->n; nb++)
        for (int64_t gi = 0; gi < g; gi++) {
            T *dxg = dx + (nb * p->c + gi * cg) * hw;
            KFN(kc_gemm)(k_conv2d_is_direct(p) ? dxg : ws, w + gi * mg * kk, dy + (nb * p->m + gi * mg) * nout, 1,
                         0, 0, kk, nout, mg, 1, 0, 0.0);
            if (!k_conv2d_is_direct(p) && cg * hw > 0)
                KFN(launch_k_col2im)(grid_for(cg * hw, KC_BLOCK), KC_BLOCK, *p, dxg, ws);
        }
}

/* dw written: the first image's GEMM has beta 0, the others add (beta 1) */
void KFN(kc_conv2d_grad_w)(const KConv2d *p, T *dw, const T *dy, const T *x, T *ws)
{
    conv_check(p);
    const int64_t g = p->groups, cg = p->c / g, mg = p->m / g, hw = p->h * p->w;
    const int64_t kk = cg * p->kh * p->kw, nout = p->oh * p->ow;
    if (p->n == 0)
        kc_memset(dw, 0, p->m * kk * (int64_t)sizeof(T));
    for (int64_t nb = 0; nb < p->n; nb++)
        for (int64_t gi = 0; gi < g; gi++) {
            const T *xg = x + (nb * p->c + gi * cg) * hw, *col = xg;
            if (!k_conv2d_is_direct(p)) {
                KFN(im2col)(p, ws, xg);
                col = ws;
            }
            KFN(kc_gemm)(dw + gi * mg * kk, dy + (nb * p->m + gi * mg) * nout, col, 1, 0, 0, mg, kk, nout,
                         0, 1, nb > 0 ? 1.0 : 0.0);
        }
}

void KFN(kc_conv2d_grad_b)(const KConv2d *p, T *db, const T *dy)
{
    const unsigned block = row_block(p->n * p->oh * p->ow);
    if (p->m > 0)
        KFN(launch_k_conv2d_grad_b)(row_grid(p->m, block), block, *p, db, dy);
}

void KFN(kc_maxpool2d)(const KPool2d *p, T *y, int64_t *arg, const T *x)
{
    const int64_t n = p->n * p->c * p->oh * p->ow;
    pool_check(p);
    if (n > 0)
        KFN(launch_k_maxpool2d)(grid_for(n, KC_BLOCK), KC_BLOCK, *p, y, arg, x);
}

void KFN(kc_maxpool2d_grad)(const KPool2d *p, T *dx, const T *dy, const int64_t *arg)
{
    const int64_t n = p->n * p->c * p->h * p->w;
    pool_check(p);
    if (n > 0)
        KFN(launch_k_maxpool2d_grad)(grid_for(n, KC_BLOCK), KC_BLOCK, *p, dx, dy, arg);
}

void KFN(kc_avgpool2d)(const KPool2d *p, T *y, const T *x)
{
    const int64_t n = p->n * p->c * p->oh * p->ow;
    pool_check(p);
    if (n > 0)
        KFN(launch_k_avgpool2d)(grid_for(n, KC_BLOCK), KC_BLOCK, *p, y, x);
}

void KFN(kc_avgpool2d_grad)(const KPool2d *p, T *dx, const T *dy)
{
    const int64_t n = p->n * p->c * p->h * p->w;
    pool_check(p);
    if (n > 0)
        KFN(launch_k_avgpool2d_grad)(grid_for(n, KC_BLOCK), KC_BLOCK, *p, dx, dy);
}

void KFN(kc_global_avgpool)(T *y, const T *x, int64_t nc, int64_t hw)
{
    const unsigned block = row_block(hw);
    if (nc > 0)
        KFN(launch_k_global_avgpool)(row_grid(nc, block), block, y, x, nc, hw);
}

void KFN(kc_global_avgpool_grad)(T *dx, const T *dy, int64_t nc, int64_t hw)
{
    if (nc * hw > 0)
        KFN(launch_k_global_avgpool_grad)(grid_for(nc * hw, KC_BLOCK), KC_BLOCK, dx, dy, nc, hw);
}

/* ---- gather.c ------------------------------------------------------------------------- */

void KFN(kc_gather_grad)(T *dx, const T *dy, const int64_t *idx, int64_t outer, int64_t axis,
                         int64_t inner, int64_t nidx)
{
    if (inner <= 0 || axis <= 0)
        return;
    kc_memset(dx, 0, outer * axis * inner * (int64_t)sizeof(T));
    if (outer * inner == 0 || nidx == 0)
        return;
    /* split each column's rows into power-of-two buckets until about two
     * device-fulls of threads run (an embedding has few columns) */
    const int64_t want = 2 * (int64_t)kc_num_sms() * KC_SM_THREADS;
    int64_t buckets = 1;
    while (buckets * 2 <= axis && buckets < KC_GATHER_THREADS && buckets * outer * inner < want)
        buckets *= 2;
    if (nidx <= KC_GATHER_SLOTS - KC_GATHER_THREADS - 1) { /* each bucket walks its own list */
        launch_k_gather_lists(1, KC_GATHER_THREADS, idx, nidx, axis, buckets);
        KFN(launch_k_gather_grad_lists)(grid_for(buckets * outer * inner, KC_BLOCK), KC_BLOCK, dx, dy, idx,
                                        outer, axis, inner, nidx, buckets);
        return;
    }
    KFN(launch_k_gather_grad)(grid_for(buckets * outer * inner, KC_BLOCK), KC_BLOCK, dx, dy, idx, outer,
                              axis, inner, nidx, buckets);
}

int64_t KFN(kc_gather_elements_grad)(T *dx, const T *dy, const int64_t *idx, int rank, const int64_t *shape,
                                     const int64_t *xshape, int axis)
{
    int64_t *check = kc_next_check();
    KDims sh, is, xs;
    const int64_t cols = columns(rank, shape, xshape, axis, &sh, &is, &xs);
    const int64_t nx = numel(rank, xshape);
    if (nx > 0)
        kc_memset(dx, 0, nx * (int64_t)sizeof(T));
    if (cols * shape[axis] > 0)
        KFN(launch_k_gather_elements_grad)(grid_for(cols * shape[axis], KC_BLOCK), KC_BLOCK, dx, dy, idx, rank,
                                           axis, cols, xshape[axis], sh, is, xs, check);
    return -1;
}

/* ---- random.c -------------------------------------------------------------------------- */

/* the step comes from kc_step_params(), not from `step` */
void KFN(kc_dropout)(T *y, uint8_t *mask, const T *x, int64_t n, double ratio, uint64_t seed,
                     uint32_t stream, uint32_t step)
{
    (void)step;
    if (n > 0)
        KFN(launch_k_dropout)(grid_for((n + 3) / 4, KC_BLOCK), KC_BLOCK, y, mask, x, n, ratio, seed, stream,
                              kc_step_params());
}

void KFN(kc_dropout_grad)(T *dx, const T *dy, const uint8_t *mask, int64_t n, double ratio)
{
    if (n > 0)
        KFN(launch_k_dropout_grad)(grid_for(n, KC_BLOCK), KC_BLOCK, dx, dy, mask, n, ratio);
}

/* ---- loss.c ----------------------------------------------------------------------------- */

void KFN(kc_mse)(T *loss, const T *p, const T *t, int64_t n)
{
    KFN(launch_k_mse)(partial_grid(grid_for(n, KC_BLOCK)), KC_BLOCK, loss, p, t, n);
}

void KFN(kc_mse_grad)(T *dp, const T *dloss, const T *p, const T *t, int64_t n)
{
    if (n > 0)
        KFN(launch_k_mse_grad)(grid_for(n, KC_BLOCK), KC_BLOCK, dp, dloss, p, t, n);
}

int64_t KFN(kc_cross_entropy)(T *loss, const T *x, const int64_t *labels, int64_t rows,
                              int64_t classes)
{
    int64_t *check = kc_next_check();
    const unsigned block = row_block(classes);
    KFN(launch_k_cross_entropy)(partial_grid(row_grid(rows, block)), block, loss, x, labels, rows, classes,
                                check);
    return -1;
}

void KFN(kc_cross_entropy_grad)(T *dx, const T *dloss, const T *x, const int64_t *labels,
                                int64_t rows, int64_t classes)
{
    const unsigned block = row_block(classes);
    if (rows > 0 && classes > 0)
        KFN(launch_k_cross_entropy_grad)(row_grid(rows, block), block, dx, dloss, x, labels, rows, classes);
}

int64_t KFN(kc_nll_loss)(T *loss, const T *lp, const int64_t *labels, const T *weights,
                         int64_t n, int64_t c, int64_t d, int reduction, int has_ignore,
                         int64_t ignore_index)
{
    int64_t *check = kc_next_check();
    if (reduction < K_LOSS_NONE || reduction > K_LOSS_MEAN)
        die("k_nll_loss", "unknown reduction");
    if (reduction != K_LOSS_NONE || n * d > 0)
        KFN(launch_k_nll_loss)(partial_grid(grid_for(n * d, KC_BLOCK)), KC_BLOCK, loss, lp, labels,
                               weights, n, c, d, reduction, has_ignore, ignore_index, check);
    return -1;
}

/* dx = dx_in or 0 by a device copy / fill, then one block subtracts the
 * counted positions' w g / ws */
void KFN(kc_nll_loss_grad)(T *dx, const T *dx_in, const T *dloss, const int64_t *labels,
                           const T *weights, int64_t n, int64_t c, int64_t d, int reduction,
                           int has_ignore, int64_t ignore_index)
{
    const int64_t bytes = n * c * d * (int64_t)sizeof(T);
    if (reduction < K_LOSS_NONE || reduction > K_LOSS_MEAN)
        die("k_nll_loss_grad", "unknown reduction");
    if (!dx_in)
        kc_memset(dx, 0, bytes);
    else if (dx != dx_in)
        kc_memcpy(dx, dx_in, bytes);
    if (dloss && n * d > 0)
        KFN(launch_k_nll_loss_grad)(1, row_block(n * d), dx, dloss, labels, weights, n, c, d, reduction,
                                    has_ignore, ignore_index);
}

/* ---- optim.c ------------------------------------------------------------------------------ */

/* The hyper-parameters, the step, the clip norm, the loss scale and the
 * micro-step come from kc_step_params(); gsq (the squared norm, on the
 * device) is passed on for the kernel to read when clipping or loss scaling.  Launched at every micro-step: the
 * kernel, not the host, decides whether this one updates (one captured
 * graph replays them all). */
void KFN(kc_adamw)(T *p, const T *g, T *m, T *v, int64_t n, double lr, double beta1,
                   double beta2, double eps, double wd, int l2, double lr_mult, int64_t step, const T *gsq,
                   double clip, double scale, int64_t micro, int64_t accum)
{
    /* the hyper-parameters come from kc_step_params() (a graph replays with new ones); wd only says whether
     * this part decays (--no-decay: 0 where it does not), l2 how, lr_mult its factor: fixed for a run */
    (void)lr, (void)beta1, (void)beta2, (void)eps, (void)step, (void)clip, (void)scale, (void)micro, (void)accum;
    if (n > 0)
        KFN(launch_k_adamw)(grid_for(n, KC_BLOCK), KC_BLOCK, p, g, m, v, n, wd != 0 ? (l2 ? 2 : 1) : 0, lr_mult,
                            gsq, kc_step_params());
}

void KFN(kc_sgd)(T *p, const T *g, T *buf, int64_t n, double lr, double momentum, double wd,
                 int nesterov, double lr_mult, int64_t step, const T *gsq, double clip, double scale,
                 int64_t micro, int64_t accum)
{
    (void)lr, (void)momentum, (void)step, (void)clip, (void)scale, (void)micro, (void)accum; /* wd: as kc_adamw */
    if (n > 0)
        KFN(launch_k_sgd)(grid_for(n, KC_BLOCK), KC_BLOCK, p, g, buf, n, wd != 0, nesterov, lr_mult, gsq,
                          kc_step_params());
}

/* the micro-step comes from kc_step_params(), not from `micro` */
void KFN(kc_grad_accum)(T *y, const T *x, int64_t n, int64_t micro)
{
    (void)micro;
    if (n > 0)
        KFN(launch_k_grad_accum)(grid_for(n, KC_BLOCK), KC_BLOCK, y, x, n, kc_step_params());
}

/* launched for n == 0 too: y[0] is still written (0, or y[0] kept) */
void KFN(kc_sum_squares)(T *y, const T *x, int64_t n, int accumulate)
{
    KFN(launch_k_sum_squares)(partial_grid(grid_for(n, KC_BLOCK)), KC_BLOCK, y, x, n, accumulate);
}

#undef KFN
