/* launch.c — the kernels.h API for the cuda target: each kc_ function is
 * the twin of a k_ function (kc_map.h), same parameters and contract, with
 * device pointers.  It checks the contract on the host (aborting like
 * kernels/c when a caller breaks it), computes the launch geometry and
 * queues the kernel(s) with kc_launch; it never synchronises and never
 * reads device memory.  The launchers of an element type are in
 * launch_impl.h, included below once for float and once for double.
 *
 * How the work is shaped (the kernels are in the .cu files):
 * - Broadcasting and strided kernels get a merged index space (a KcWalk:
 *   size-1 dims dropped, a dim folded into the one outside it when it is
 *   contiguous with it in every operand, as kernels/c's walk.h), so most
 *   calls reach the device with rank 1 or 2.
 * - Grid-stride kernels run KC_BLOCK threads per block and at most as many
 *   blocks as the device holds at once (kc_num_sms() x 2048 threads).
 * - Block-per-row kernels (softmax, norms, reductions, losses) size their
 *   blocks to the row: about four elements a thread, one warp to 1024.
 * - Scalars that change between steps (learning rate, step), and the
 *   optimizer settings beside them (betas, clip norm, ...), are read by
 *   the kernels from kc_step_params(); the host values passed for them are
 *   ignored.  Checked kernels (Gather, GatherElements and its backward,
 *   k_nd_index, k_binary_i64, cross-entropy, the NLL loss) take
 *   their slot from kc_next_check() on every call, launch or not, and
 *   return -1.
 * - GEMMs go to kc_gemm_f32 / kc_gemm_f64 / kc_gemm_bf16 / kc_gemm_f16 (the runtime's cuBLASLt);
 *   convolution is im2col + GEMM per (image, group) in the caller's
 *   workspace, exactly kernels/c's decomposition and workspace
 *   (k_conv2d_workspace elements).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kc_map.h"

/* ---- typed launches, one per kernels.def row ------------------------------ */

#include "kc_args.h"

/* launch_<name>(grid, block, the kernel's arguments): the arguments are
 * converted to the kernel's parameter types here, by C, before their
 * addresses go to kc_launch */
#define KC(name, params)                                                                      \
    static void launch_##name(unsigned grid, unsigned block, KC_PARAMS params)                \
    {                                                                                         \
        void *args[] = {KC_ARGS params};                                                      \
        kc_launch(KC_##name, grid, block, 0, args);                                           \
    }
#include "kernels.def"
#undef KC

const char *const kc_names[KC_COUNT] = {
#define KC(name, params) #name,
#include "kernels.def"
#undef KC
};

/* ---- geometry ------------------------------------------------------------ */

#define KC_BLOCK 256u    /* threads of the grid-stride kernels */
#define KC_SM_THREADS 2048 /* resident threads per multiprocessor (sm_80, sm_90) */

/* A caller broke a kernel's contract: say which and abort (kernels/c does
 * the same), rather than launch something that writes out of bounds. */
static void die(const char *fn, const char *msg)
{
    fprintf(stderr, "fsdpc kernels/cuda: %s: %s\n", fn, msg);
    abort();
}

static unsigned min_u(int64_t a, int64_t b) { return (unsigned)(a < b ? a : b); }

/* blocks for n elements of a grid-stride kernel: enough to fill the device
 * once, at least one */
static unsigned grid_for(int64_t n, unsigned block)
{
    int64_t want = (n + block - 1) / block, cap = (int64_t)kc_num_sms() * (KC_SM_THREADS / block);
    return want < 1 ? 1 : min_u(want, cap);
}

/* threads for a block that reduces len elements: ~4 per thread, 32..1024 */
static unsigned row_block(int64_t len)
{
    unsigned b = 32;
    while (b < 1024 && (int64_t)b * 4 < len)
        b *= 2;
    return b;
}

/* blocks for rows handled one per block (grid-stride over the rest) */
static unsigned row_grid(int64_t rows, unsigned block)
{
    return grid_for(rows * block, block);
}

/* at most KC_GRID_PARTIALS blocks: kernels that combine per-block partials */
static unsigned partial_grid(unsigned grid)
{
    return grid < KC_GRID_PARTIALS ? grid : KC_GRID_PARTIALS;
}

/* chunks of rows for a column reduction (k_reduce_cols,
 * k_layernorm_grad_cols) whose columns make tiles blocks: enough for a
 * device-full of blocks, at least 64 rows a chunk, and the partials (nv
 * values of ncols columns a chunk) within kc_colpart; 1: no split */
static int64_t col_chunks(int64_t tiles, int64_t rows, int nv, int64_t ncols)
{
    const int64_t want = (int64_t)kc_num_sms() * (KC_SM_THREADS / KC_BLOCK);
    int64_t chunks = (want + tiles - 1) / tiles;
    if (chunks > rows / 64)
        chunks = rows / 64;
    if (chunks > KC_COL_PARTIALS / (nv * (ncols > 0 ? ncols : 1)))
        chunks = KC_COL_PARTIALS / (nv * (ncols > 0 ? ncols : 1));
    return chunks < 1 ? 1 : chunks;
}

/* threads for a block of a column reduction whose warps split rows rows */
static unsigned col_block(int64_t rows)
{
    return 32 * min_u(rows / 4 < 1 ? 1 : rows / 4, 8);
}

static int64_t numel(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < rank; d++)
        n *= shape[d];
    return n;
}

static int64_t dense_stride(int rank, const int64_t *shape, int d)
{
    return numel(rank - d - 1, shape + d + 1);
}

/* ---- merged index spaces --------------------------------------------------- */

/* An index space of n positions over rank dims, with up to three operands'
 * strides per dim (KDims padded with zeros). */
typedef struct {
    int rank;
    int64_t n;
    KDims shape, st[3];
} KcWalk;

/* Appends dim (len, strides s[0..nops)) as the innermost; size-1 dims
 * vanish and a dim merges into the previous one when that one steps
 * exactly over it in every operand. */
static void walk_push(KcWalk *w, int nops, int64_t len, const int64_t *s)
{
    int r = w->rank, merge = r > 0;
    if (len == 1)
        return;
    for (int k = 0; k < nops && merge; k++)
        merge = w->st[k].d[r - 1] == s[k] * len;
    if (merge) {
        w->shape.d[r - 1] *= len;
        for (int k = 0; k < nops; k++)
            w->st[k].d[r - 1] = s[k];
        return;
    }
    if (r == KC_MAX_RANK)
        die("launch", "more than 8 dims after merging");
    w->shape.d[r] = len;
    for (int k = 0; k < nops; k++)
        w->st[k].d[r] = s[k];
    w->rank = r + 1;
}

/* The walk over shape with operand k's strides st[k]; returns its element
 * count (0: nothing to launch). */
static int64_t walk_build(KcWalk *w, int rank, const int64_t *shape, int nops,
                          const int64_t *const *st)
{
    memset(w, 0, sizeof *w);
    w->n = numel(rank, shape);
    if (w->n == 0)
        return 0;
    for (int d = 0; d < rank; d++) {
        int64_t s[3] = {0, 0, 0};
        for (int k = 0; k < nops; k++)
            s[k] = st[k][d];
        walk_push(w, nops, shape[d], s);
    }
    return w->n;
}

/* Removes dim d of w (shape and strides). */
static void walk_remove(KcWalk *w, int d)
{
    for (int e = d; e + 1 < w->rank; e++) {
        w->shape.d[e] = w->shape.d[e + 1];
        for (int k = 0; k < 3; k++)
            w->st[k].d[e] = w->st[k].d[e + 1];
    }
    w->rank--;
    w->shape.d[w->rank] = 0;
    for (int k = 0; k < 3; k++)
        w->st[k].d[w->rank] = 0;
}

/* ---- ew.c -------------------------------------------------------------------- */

int64_t kc_binary_i64(int op, int64_t *y, const int64_t *a, const int64_t *b, int rank, const int64_t *shape,
                      const int64_t *sa, const int64_t *sb)
{
    int64_t *check = kc_next_check();
    const int64_t *st[2] = {sa, sb};
    KcWalk w;
    if (op != K_ADD && op != K_SUB && op != K_MUL && op != K_DIV && op != K_MIN && op != K_MAX && op != K_MOD &&
        op != K_FMOD)
        die("k_binary_i64", "an op without int64 arithmetic");
    if (walk_build(&w, rank, shape, 2, st))
        launch_k_binary_i64(grid_for(w.n, KC_BLOCK), KC_BLOCK, op, y, a, b, w.n, w.rank, w.shape, w.st[0],
                            w.st[1], check);
    return -1;
}

void kc_compare_i64(int op, uint8_t *y, const int64_t *a, const int64_t *b, int rank,
                    const int64_t *shape, const int64_t *sa, const int64_t *sb)
{
    const int64_t *st[2] = {sa, sb};
    KcWalk w;
    if (op < K_EQ || op > K_GE)
        die("k_compare", "unknown op");
    if (walk_build(&w, rank, shape, 2, st))
        launch_k_compare_i64(grid_for(w.n, KC_BLOCK), KC_BLOCK, op, y, a, b, w.n, w.rank, w.shape,
                             w.st[0], w.st[1]);
}

void kc_not(uint8_t *y, const uint8_t *x, int64_t n)
{
    if (n > 0)
        launch_k_not(grid_for(n, KC_BLOCK), KC_BLOCK, y, x, n);
}

static int dt_size(int dt)
{
    static const int size[] = {4, 8, 8, 4, 1, 1, 2, 2, 1, 2, 2, 4, 8};
    if (dt < K_DT_F32 || dt > K_DT_U64)
        die("k_cast", "unknown dtype");
    return size[dt];
}

void kc_cast(int to, void *y, int from, const void *x, int64_t n)
{
    const int64_t ey = dt_size(to), ex = dt_size(from);
    if (n <= 0)
        return;
    if (to == from) { /* bytes as they are (a bool byte 2 stays 2, as kernels/c) */
        if (y != x)
            kc_memcpy(y, x, n * ey);
        return;
    }
    if (ey != ex && (const char *)y < (const char *)x + n * ex && (const char *)x < (const char *)y + n * ey)
        die("k_cast", "y overlaps x with a different element size");
    launch_k_cast(grid_for(n, KC_BLOCK), KC_BLOCK, to, y, from, x, n);
}

void kc_where(int esize, void *y, const uint8_t *c, const void *a, const void *b, int rank,
              const int64_t *shape, const int64_t *sc, const int64_t *sa, const int64_t *sb)
{
    const int64_t *st[3] = {sc, sa, sb};
    KcWalk w;
    if (esize != 1 && esize != 2 && esize != 4 && esize != 8)
        die("k_where", "esize not 1, 2, 4 or 8");
    if (walk_build(&w, rank, shape, 3, st))
        launch_k_where(grid_for(w.n, KC_BLOCK), KC_BLOCK, esize, y, c, a, b, w.n, w.rank, w.shape,
                       w.st[0], w.st[1], w.st[2]);
}

/* ---- copy.c -------------------------------------------------------------------- */

void kc_copy_strided(int esize, int rank, const int64_t *shape, void *y, int64_t yoff,
                     const int64_t *ys, const void *x, int64_t xoff, const int64_t *xs)
{
    const int64_t *st[2] = {ys, xs};
    KcWalk w;
    if (esize != 1 && esize != 2 && esize != 4 && esize != 8)
        die("k_copy_strided", "esize not 1, 2, 4 or 8");
    for (int d = 0; d < rank; d++)
        if (shape[d] > 1 && ys[d] == 0)
            die("k_copy_strided", "y stride 0 on a dim of length > 1");
    if (walk_build(&w, rank, shape, 2, st))
        launch_k_copy_strided(grid_for(w.n, KC_BLOCK), KC_BLOCK, esize, (char *)y + yoff * esize,
                              (const char *)x + xoff * esize, w.n, w.rank, w.shape, w.st[0], w.st[1]);
}

/* Pad's output shape and begin pads as KDims; checks what kernels/c checks */
static void pad_dims(const char *fn, int mode, int rank, const int64_t *xshape, const int64_t *pads,
                     KDims *ys, KDims *xs, KDims *pb)
{
    memset(ys, 0, sizeof *ys), memset(xs, 0, sizeof *xs), memset(pb, 0, sizeof *pb);
    if (rank > KC_MAX_RANK)
        die(fn, "rank above 8");
    if (mode < K_PAD_CONSTANT || mode > K_PAD_EDGE)
        die(fn, "unknown mode");
    for (int d = 0; d < rank; d++) {
        xs->d[d] = xshape[d];
        pb->d[d] = pads[d];
        ys->d[d] = xshape[d] + pads[d] + pads[rank + d];
        if (ys->d[d] < 0)
            die(fn, "negative output dim");
        if (mode != K_PAD_CONSTANT && xshape[d] == 0 && ys->d[d] > 0)
            die(fn, "edge / reflect padding of an empty dim");
    }
}

/* ---- reduce.c ------------------------------------------------------------------- */

/* x's dims split into the kept walk K (y dense over it) and the reduced
 * walk R, strides in x; returns the elements per group */
static int64_t reduce_split(int rank, const int64_t *xshape, const int64_t *yshape, KcWalk *kept,
                            KcWalk *red)
{
    int64_t count = 1;
    memset(kept, 0, sizeof *kept), memset(red, 0, sizeof *red);
    for (int d = 0; d < rank; d++) {
        const int64_t s = dense_stride(rank, xshape, d);
        if (yshape[d] != 1 && yshape[d] != xshape[d])
            die("k_reduce", "y dim neither 1 nor x's");
        if (yshape[d] == 1)
            count *= xshape[d];
        walk_push(yshape[d] == 1 ? red : kept, 1, xshape[d], &s);
    }
    kept->n = numel(kept->rank, kept->shape.d);
    red->n = count;
    return count;
}

static double red_init(int op)
{
    return op == K_RMAX ? -(double)INFINITY : op == K_RMIN ? (double)INFINITY : op == K_RPROD ? 1 : 0;
}

void kc_range_i64(int64_t *y, int64_t start, int64_t delta, int64_t n)
{
    if (n > 0)
        launch_k_range_i64(grid_for(n, KC_BLOCK), KC_BLOCK, y, start, delta, n);
}

void kc_trilu(int esize, int upper, void *y, const void *x, int64_t batch, int64_t rows, int64_t cols,
              int64_t k)
{
    const int64_t n = batch * rows * cols;
    if (esize != 1 && esize != 2 && esize != 4 && esize != 8)
        die("k_trilu", "esize not 1, 2, 4 or 8");
    if (n > 0)
        launch_k_trilu(grid_for(n, KC_BLOCK), KC_BLOCK, esize, upper, y, x, n, rows, cols, k);
}

/* ---- conv.c: the checks ---------------------------------------------------------------- */

static void conv_check(const KConv2d *p)
{
    const char *bad = k_conv2d_bad(p);
    if (bad)
        die("k_conv2d", bad);
}

static void pool_check(const KPool2d *p)
{
    const char *bad = k_pool2d_bad(p);
    if (bad)
        die("k_pool2d", bad);
}

/* ---- gather.c ------------------------------------------------------------------------- */

int64_t kc_gather(int esize, void *y, const void *x, const int64_t *idx, int64_t outer, int64_t axis,
                  int64_t inner, int64_t nidx)
{
    int64_t *check = kc_next_check(), n = outer * nidx * inner;
    if (esize != 1 && esize != 2 && esize != 4 && esize != 8)
        die("k_gather", "esize not 1, 2, 4 or 8");
    if (n > 0 || nidx > 0) /* the indices are checked even when y is empty */
        launch_k_gather(grid_for(n > nidx ? n : nidx, KC_BLOCK), KC_BLOCK, esize, y, x, idx, outer, axis,
                        inner, nidx, check);
    return -1;
}

/* GatherElements' columns (kernels/c/gather.c): idx's shape, idx's and x's
 * strides; returns the number of columns */
static int64_t columns(int rank, const int64_t *shape, const int64_t *xshape, int axis, KDims *sh, KDims *is,
                       KDims *xs)
{
    int64_t si = 1, sx = 1, cols = 1;
    if (rank < 1 || rank > KC_MAX_RANK || axis < 0 || axis >= rank)
        die("k_gather_elements", "rank or axis out of range");
    memset(sh, 0, sizeof *sh), memset(is, 0, sizeof *is), memset(xs, 0, sizeof *xs);
    for (int d = rank - 1; d >= 0; d--) {
        if (d != axis && shape[d] > xshape[d])
            die("k_gather_elements", "indices longer than x along a dim other than the axis");
        sh->d[d] = shape[d], is->d[d] = si, xs->d[d] = sx;
        si *= shape[d], sx *= xshape[d];
        if (d != axis)
            cols *= shape[d];
    }
    return cols;
}

int64_t kc_gather_elements(int esize, void *y, const void *x, const int64_t *idx, int rank, const int64_t *shape,
                           const int64_t *xshape, int axis)
{
    int64_t *check = kc_next_check();
    KDims sh, is, xs;
    const int64_t cols = columns(rank, shape, xshape, axis, &sh, &is, &xs), n = cols * shape[axis];
    if (esize != 1 && esize != 2 && esize != 4 && esize != 8)
        die("k_gather_elements", "esize not 1, 2, 4 or 8");
    if (n > 0)
        launch_k_gather_elements(grid_for(n, KC_BLOCK), KC_BLOCK, esize, y, x, idx, rank, axis, cols,
                                 xshape[axis], sh, is, xs, check);
    return -1;
}

int64_t kc_nd_index(int64_t *y, const int64_t *idx, int64_t batch, int64_t nq, int k, const int64_t *dims)
{
    int64_t *check = kc_next_check();
    KDims d;
    if (k < 1 || k > KC_MAX_RANK)
        die("k_nd_index", "tuple length out of range");
    memset(&d, 0, sizeof d);
    for (int i = 0; i < k; i++)
        d.d[i] = dims[i];
    if (batch * nq > 0)
        launch_k_nd_index(grid_for(batch * nq * k, KC_BLOCK), KC_BLOCK, y, idx, batch, nq, k, d, check);
    return -1;
}

/* ---- optim.c ------------------------------------------------------------------------------ */

/* loss scaling: the scale and accum come from kc_step_params() (the scale
 * changes between replays of one graph), not from the arguments */
void kc_loss_seed_f32(float *y, int64_t n, double scale, int64_t accum)
{
    (void)scale, (void)accum;
    if (n > 0)
        launch_k_loss_seed_f32(grid_for(n, KC_BLOCK), KC_BLOCK, y, n, kc_step_params());
}

void kc_unscale_sq_f32(float *y, double scale)
{
    (void)scale;
    launch_k_unscale_sq_f32(1, 1, y, kc_step_params());
}

void kc_nan_unless_finite(int ydt, void *y, int xdt, const void *x)
{
    launch_k_nan_unless_finite(1, 1, ydt, y, xdt, x);
}

/* ---- attn.c: the problem's dims as attn.cu's kernels take them ---------------------- */

static KDims attn_dims(int64_t batch, int64_t t, int64_t s, int64_t d, int64_t dv, int64_t nbias, int64_t brep,
                       int64_t kvrep, int64_t heads, int flags)
{
    KDims p;
    if (batch < 0 || t < 0 || s < 0 || d < 0 || dv < 0 || nbias < 1 || brep < 1 || nbias >= ((int64_t)1 << 31) ||
        brep >= ((int64_t)1 << 31))
        die("k_attention", "negative dims, or a bias layout below 1 or past 2^31");
    if (kvrep < 1 || kvrep > ((int64_t)1 << 30) || batch % kvrep)
        die("k_attention", "kvrep below 1, or not dividing the problems");
    if (heads < 0 || (heads && (!(flags & K_ATTN_KROW) || heads % kvrep || batch % heads)))
        die("k_attention", "heads is not a layout of the problems (it needs the keys as rows, kvrep dividing heads, "
                           "heads dividing batch)");
    memset(&p, 0, sizeof p);
    /* attn.cu's KC_ATTN_*: nbias and brep share a slot, heads has the next */
    p.d[0] = batch, p.d[1] = t, p.d[2] = s, p.d[3] = d, p.d[4] = dv, p.d[5] = nbias | brep << 32, p.d[6] = heads;
    p.d[7] = (int64_t)(uint32_t)flags | (kvrep - 1) << KC_ATTN_KVREP_SHIFT; /* attn.cu's KC_ATTN_FLAGS */
    return p;
}

/* Blocks of the attention kernels (attn.cu): one per unit, a unit being a
 * (problem, tile of query rows, output chunk) in the forward and dq
 * kernels, a (K/V problem, tile of keys, output chunk) in the dk, dv kernel;
 * h = 2 for float64, whose tiles are half the size.  The kernels loop over
 * the units, so a cap on the grid changes nothing but the speed. */
typedef struct {
    unsigned fwd, q, kv;
} AttnGrid;

static unsigned attn_blocks(int64_t units) { return min_u(units < 1 ? 1 : units, 1 << 30); }

static AttnGrid attn_grid(const KDims *p, int h)
{
    const int64_t batch = p->d[0], t = p->d[1], s = p->d[2], d = p->d[3], dv = p->d[4];
    const int64_t bm = KC_ATTN_BM / h, dk = KC_ATTN_DK / h, kbm = KC_ATTN_KBM / h;
    const int64_t tiles = (t + bm - 1) / bm, nkd = (d + dk - 1) / dk, nvd = (dv + dk - 1) / dk;
    const int64_t kvrep = (p->d[7] >> KC_ATTN_KVREP_SHIFT) + 1; /* the kv kernel's unit: a K/V problem */
    AttnGrid g = {attn_blocks(batch * tiles * nvd), attn_blocks(batch * tiles * nkd),
                  attn_blocks(batch / kvrep * ((s + kbm - 1) / kbm) * (nkd > nvd ? nkd : nvd))};
    return g;
}

/* attn.cu has no attention dropout yet: passes/attention.c leaves the Dropout unfused on --target cuda; nor row
 * strides other than the heads layout's (passes/pack.c packs q, k, v on --target cpu only) */
static void attn_no_dropout(double drop, const KAttnLd *ld)
{
    if (drop > 0)
        die("k_attention", "attention dropout is not on --target cuda (passes/attention.c keeps such a chain unfused)");
    if (ld && (ld->q || ld->k || ld->v || ld->y || ld->dq || ld->dk || ld->dv))
        die("k_attention", "row strides (KAttnLd) are not on --target cuda (passes/pack.c packs on --target cpu only)");
}

/* kc_attention##S and kc_attention_grad##S for q, kt, v, y, dy, dq, dkt, dval
 * of type E and lse, the bias and dbias of type T (h: AttnGrid's); the
 * workspace kernels/c needs is not used.
 * The backward: dq by the q kernel, dk and dv by the kv kernel, dbias (when
 * wanted) by a block per bias row. */
#define KC_ATTN_LAUNCHERS(S, E, T, h)                                                                          \
    void kc_attention##S(E *y, T *lse, const E *q, const E *kt, int flags, const E *v, const T *bias,            \
                         int64_t batch, int64_t t, int64_t s, int64_t d, int64_t dv, int64_t nbias, int64_t brep, \
                         int64_t kvrep, int64_t heads, double scale, double drop, uint64_t seed,              \
                         uint32_t stream, uint32_t step, T *ws, const KAttnLd *ld)                             \
    {                                                                                                          \
        const KDims p = attn_dims(batch, t, s, d, dv, nbias, brep, kvrep, heads, flags);                       \
        (void)ws, (void)seed, (void)stream, (void)step;                                                        \
        attn_no_dropout(drop, ld);                                                                             \
        if (batch * t > 0 && dv > 0)                                                                           \
            launch_k_attention##S(attn_grid(&p, h).fwd, KC_ATTN_BLOCK, y, lse, q, kt, v, bias, p, scale);      \
    }                                                                                                          \
    void kc_attention_grad##S(E *dq, E *dkt, E *dval, T *dbias, const E *dy, const E *q, const E *kt,           \
                              int flags, const E *v, const T *bias, const E *y, const T *lse, int64_t batch,   \
                              int64_t t, int64_t s, int64_t d, int64_t dv, int64_t nbias, int64_t brep,        \
                              int64_t kvrep, int64_t heads, double scale, double drop, uint64_t seed,         \
                              uint32_t stream, uint32_t step, T *ws, const KAttnLd *ld)                        \
    {                                                                                                          \
        const KDims p = attn_dims(batch, t, s, d, dv, nbias, brep, kvrep, heads, flags);                       \
        const AttnGrid g = attn_grid(&p, h);                                                                   \
        (void)ws, (void)seed, (void)stream, (void)step;                                                        \
        attn_no_dropout(drop, ld);                                                                             \
        if (batch * t > 0 && d > 0)                                                                            \
            launch_k_attention_grad_q##S(g.q, KC_ATTN_BLOCK, dq, dy, q, kt, v, bias, y, lse, p, scale);        \
        if (batch * s > 0 && d + dv > 0)                                                                       \
            launch_k_attention_grad_kv##S(g.kv, KC_ATTN_BLOCK, dkt, dval, dy, q, kt, v, bias, y, lse, p,       \
                                          scale);                                                              \
        if (dbias && nbias * t * s > 0)                                                                        \
            launch_k_attention_grad_bias##S(row_grid(nbias * t, KC_ATTN_BLOCK), KC_ATTN_BLOCK, dbias, dy, q,   \
                                            kt, v, bias, y, lse, p, scale);                                    \
    }
KC_ATTN_LAUNCHERS(_f32, float, float, 1)
KC_ATTN_LAUNCHERS(_f64, double, double, 2)
KC_ATTN_LAUNCHERS(_bf16, uint16_t, float, 1)
KC_ATTN_LAUNCHERS(_f16, uint16_t, float, 1)
#undef KC_ATTN_LAUNCHERS

/* ---- the typed launchers, once per element type ------------------------------------ */

#define T float
#define S _f32
#define KC_GEMM_T KC_GEMM_F32
#include "launch_impl.h"
#undef T
#undef S
#undef KC_GEMM_T

#define T double
#define S _f64
#define KC_GEMM_T KC_GEMM_F64
#include "launch_impl.h"
#undef T
#undef S
#undef KC_GEMM_T

/* ---- loss.c: cross-entropy of 16-bit logits (float32 loss) ------------------------------ */

#define KC_CE_LOW_LAUNCHERS(S)                                                                                 \
    int64_t kc_cross_entropy##S(float *loss, const uint16_t *x, const int64_t *labels, int64_t rows,          \
                                int64_t classes)                                                               \
    {                                                                                                          \
        int64_t *check = kc_next_check();                                                                      \
        const unsigned block = row_block(classes);                                                             \
        launch_k_cross_entropy##S(partial_grid(row_grid(rows, block)), block, loss, x, labels, rows, classes,  \
                                  check);                                                                      \
        return -1;                                                                                             \
    }                                                                                                          \
    void kc_cross_entropy_grad##S(uint16_t *dx, const float *dloss, const uint16_t *x, const int64_t *labels,  \
                                  int64_t rows, int64_t classes)                                               \
    {                                                                                                          \
        const unsigned block = row_block(classes);                                                             \
        if (rows > 0 && classes > 0)                                                                           \
            launch_k_cross_entropy_grad##S(row_grid(rows, block), block, dx, dloss, x, labels, rows, classes); \
    }
KC_CE_LOW_LAUNCHERS(_bf16)
KC_CE_LOW_LAUNCHERS(_f16)
#undef KC_CE_LOW_LAUNCHERS

/* ---- norm.c: LayerNorm of 16-bit x into 16-bit y ------------------------------------------ */

#define KC_LN_LOW_LAUNCHERS(S)                                                                                 \
    void kc_layernorm##S(uint16_t *y, float *mean, float *invstd, const uint16_t *x, const float *scale,       \
                         const float *bias, int64_t outer, int64_t inner, double eps)                          \
    {                                                                                                          \
        const unsigned block = row_block(inner);                                                               \
        if (inner > 0 && outer > 0)                                                                            \
            launch_k_layernorm##S(row_grid(outer, block), block, y, mean, invstd, x, scale, bias, outer, inner, eps); \
    }
KC_LN_LOW_LAUNCHERS(_bf16)
KC_LN_LOW_LAUNCHERS(_f16)
#undef KC_LN_LOW_LAUNCHERS

/* ---- reduce.c: the sums of 16-bit x into float32 y (a bias gradient of a 16-bit dY) ---- */

/* kc_reduce_f32's K_RSUM with x's elements widened as they are loaded (reduce.cu's _bf16 / _f16 instances) */
#define KC_SUM_LOW_LAUNCHERS(S)                                                                                \
    void kc_reduce_sum_to##S(float *y, const uint16_t *x, int rank, const int64_t *xshape, const int64_t *yshape) \
    {                                                                                                          \
        KcWalk k, r;                                                                                           \
        if (numel(rank, xshape) == 0) {                                                                        \
            kc_fill_f32(y, 0.0, numel(rank, yshape));                                                          \
            return;                                                                                            \
        }                                                                                                      \
        const int64_t group = reduce_split(rank, xshape, yshape, &k, &r);                                      \
        if (k.rank == 0 && group >= 65536) {                                                                   \
            launch_k_reduce_all##S(partial_grid(grid_for(group, KC_BLOCK)), KC_BLOCK, K_RSUM, y, x, group, 1.0); \
            return;                                                                                            \
        }                                                                                                      \
        if (k.rank > 0 && k.st[0].d[k.rank - 1] == 1) {                                                        \
            const int64_t nc = k.shape.d[k.rank - 1];                                                          \
            walk_remove(&k, k.rank - 1);                                                                       \
            const int64_t nko = numel(k.rank, k.shape.d), tiles = nko * ((nc + 31) / 32);                      \
            const int64_t chunks = col_chunks(tiles, group, 1, nko * nc);                                      \
            const unsigned block = col_block((group + chunks - 1) / chunks + 3);                               \
            launch_k_reduce_cols##S(row_grid(tiles * chunks, block), block, K_RSUM, y, x, nko, nc, group, chunks, \
                                    k.rank, k.shape, k.st[0], r.rank, r.shape, r.st[0], 1.0);                  \
            if (chunks > 1)                                                                                    \
                launch_k_cols_fold_f32(grid_for(nko * nc, KC_BLOCK), KC_BLOCK, K_RSUM, y, NULL, nko * nc, chunks, \
                                       1.0);                                                                   \
            return;                                                                                            \
        }                                                                                                      \
        const unsigned block = row_block(group);                                                               \
        launch_k_reduce_rows##S(row_grid(k.n, block), block, K_RSUM, y, x, k.n, group, k.rank, k.shape, k.st[0], \
                                r.rank, r.shape, r.st[0], 1.0);                                                \
    }
KC_SUM_LOW_LAUNCHERS(_bf16)
KC_SUM_LOW_LAUNCHERS(_f16)
#undef KC_SUM_LOW_LAUNCHERS

/* ---- matmul.c: bfloat16 and float16 operands, float32 C ------------------------------- */

void kc_matmul_bf16(float *c, const uint16_t *a, const uint16_t *b, int64_t batch, int64_t sa, int64_t sb,
                    int64_t m, int64_t n, int64_t k, int ta, int tb, double beta)
{
    kc_gemm_bf16(c, a, b, batch, sa, sb, m, n, k, ta, tb, beta);
}

void kc_matmul_f16(float *c, const uint16_t *a, const uint16_t *b, int64_t batch, int64_t sa, int64_t sb,
                   int64_t m, int64_t n, int64_t k, int ta, int tb, double beta)
{
    kc_gemm_f16(c, a, b, batch, sa, sb, m, n, k, ta, tb, beta);
}

void kc_matmul_add_bf16(float *c, const uint16_t *a, const uint16_t *b, const float *bias, const float *add,
                        double alpha, int64_t batch, int64_t sa, int64_t sb, int64_t m, int64_t n, int64_t k, int ta,
                        int tb)
{
    matmul_add_f32(KC_GEMM_BF16, c, a, b, bias, add, alpha, batch, sa, sb, m, n, k, ta, tb);
}

void kc_matmul_add_f16(float *c, const uint16_t *a, const uint16_t *b, const float *bias, const float *add,
                       double alpha, int64_t batch, int64_t sa, int64_t sb, int64_t m, int64_t n, int64_t k, int ta,
                       int tb)
{
    matmul_add_f32(KC_GEMM_F16, c, a, b, bias, add, alpha, batch, sa, sb, m, n, k, ta, tb);
}
