/* launch.c — the kernels.h API for the cuda target: each kc_ function is
 * the twin of a k_ function (kc_map.h), same parameters and contract, with
 * device pointers.  It checks the contract on the host (aborting like
 * kernels/c when a caller breaks it), computes the launch geometry and
 * queues the kernel(s) with kc_launch; it never synchronises and never
 * reads device memory.
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
 * - GEMMs go to kc_gemm_f32 / kc_gemm_bf16 (the runtime's cuBLASLt);
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

#define KC_NARG(...) KC_NARG_(__VA_ARGS__, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define KC_NARG_(a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, n, ...) n
#define KC_CAT(a, b) KC_CAT_(a, b)
#define KC_CAT_(a, b) a##b
/* (T0, T1, ...) -> "T0 a0, T1 a1, ..." and "&a0, &a1, ..." */
#define KC_P1(t) t a0
#define KC_P2(t0, t) KC_P1(t0), t a1
#define KC_P3(t0, t1, t) KC_P2(t0, t1), t a2
#define KC_P4(t0, t1, t2, t) KC_P3(t0, t1, t2), t a3
#define KC_P5(t0, t1, t2, t3, t) KC_P4(t0, t1, t2, t3), t a4
#define KC_P6(t0, t1, t2, t3, t4, t) KC_P5(t0, t1, t2, t3, t4), t a5
#define KC_P7(t0, t1, t2, t3, t4, t5, t) KC_P6(t0, t1, t2, t3, t4, t5), t a6
#define KC_P8(t0, t1, t2, t3, t4, t5, t6, t) KC_P7(t0, t1, t2, t3, t4, t5, t6), t a7
#define KC_P9(t0, t1, t2, t3, t4, t5, t6, t7, t) KC_P8(t0, t1, t2, t3, t4, t5, t6, t7), t a8
#define KC_P10(t0, t1, t2, t3, t4, t5, t6, t7, t8, t) KC_P9(t0, t1, t2, t3, t4, t5, t6, t7, t8), t a9
#define KC_P11(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t)                                           \
    KC_P10(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9), t a10
#define KC_P12(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t)                                      \
    KC_P11(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10), t a11
#define KC_P13(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t)                                 \
    KC_P12(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11), t a12
#define KC_P14(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t)                            \
    KC_P13(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12), t a13
#define KC_P15(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t)                       \
    KC_P14(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13), t a14
#define KC_P16(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t)                  \
    KC_P15(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14), t a15
#define KC_A1 &a0
#define KC_A2 KC_A1, &a1
#define KC_A3 KC_A2, &a2
#define KC_A4 KC_A3, &a3
#define KC_A5 KC_A4, &a4
#define KC_A6 KC_A5, &a5
#define KC_A7 KC_A6, &a6
#define KC_A8 KC_A7, &a7
#define KC_A9 KC_A8, &a8
#define KC_A10 KC_A9, &a9
#define KC_A11 KC_A10, &a10
#define KC_A12 KC_A11, &a11
#define KC_A13 KC_A12, &a12
#define KC_A14 KC_A13, &a13
#define KC_A15 KC_A14, &a14
#define KC_A16 KC_A15, &a15
#define KC_PARAMS(...) KC_CAT(KC_P, KC_NARG(__VA_ARGS__))(__VA_ARGS__)
#define KC_ARGS(...) KC_CAT(KC_A, KC_NARG(__VA_ARGS__))

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

void kc_binary_f32(int op, float *y, const float *a, const float *b, int rank, const int64_t *shape,
                   const int64_t *sa, const int64_t *sb)
{
    const int64_t *st[2] = {sa, sb};
    KcWalk w;
    if (op < 0 || op >= K_BINARY_COUNT)
        die("k_binary", "unknown op");
    if (walk_build(&w, rank, shape, 2, st))
        launch_k_binary_f32(grid_for(w.n, KC_BLOCK), KC_BLOCK, op, y, a, b, w.n, w.rank, w.shape,
                            w.st[0], w.st[1]);
}

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

void kc_unary_f32(int op, float *y, const float *x, int64_t n, double p0, double p1)
{
    if (op < 0 || op >= K_UNARY_COUNT)
        die("k_unary", "unknown op");
    if (n > 0) /* p0, p1 rounded to float, as kernels/c */
        launch_k_unary_f32(grid_for(n, KC_BLOCK), KC_BLOCK, op, y, x, n, (float)p0, (float)p1);
}

void kc_unary_grad_f32(int op, float *dx, const float *dy, const float *x, const float *y, int64_t n,
                       double p0, double p1)
{
    if (op < 0 || op >= K_UNARY_COUNT)
        die("k_unary_grad", "unknown op");
    if (n > 0)
        launch_k_unary_grad_f32(grid_for(n, KC_BLOCK), KC_BLOCK, op, dx, dy, x, y, n, (float)p0,
                                (float)p1);
}

void kc_scale_f32(float *y, const float *x, double alpha, int64_t n)
{
    if (n > 0)
        launch_k_scale_f32(grid_for(n, KC_BLOCK), KC_BLOCK, y, x, (float)alpha, n);
}

void kc_fill_f32(float *y, double v, int64_t n)
{
    if (n > 0)
        launch_k_fill_f32(grid_for(n, KC_BLOCK), KC_BLOCK, y, (float)v, n);
}

void kc_compare_f32(int op, uint8_t *y, const float *a, const float *b, int rank,
                    const int64_t *shape, const int64_t *sa, const int64_t *sb)
{
    const int64_t *st[2] = {sa, sb};
    KcWalk w;
    if (op < K_EQ || op > K_GE)
        die("k_compare", "unknown op");
    if (walk_build(&w, rank, shape, 2, st))
        launch_k_compare_f32(grid_for(w.n, KC_BLOCK), KC_BLOCK, op, y, a, b, w.n, w.rank, w.shape,
                             w.st[0], w.st[1]);
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

void kc_where_grad_f32(float *da, float *db, const uint8_t *c, const float *dy, int rank,
                       const int64_t *shape, const int64_t *sc)
{
    const int64_t *st[1] = {sc};
    KcWalk w;
    if ((da || db) && walk_build(&w, rank, shape, 1, st))
        launch_k_where_grad_f32(grid_for(w.n, KC_BLOCK), KC_BLOCK, da, db, c, dy, w.n, w.rank, w.shape,
                                w.st[0]);
}

void kc_not(uint8_t *y, const uint8_t *x, int64_t n)
{
    if (n > 0)
        launch_k_not(grid_for(n, KC_BLOCK), KC_BLOCK, y, x, n);
}

static int dt_size(int dt)
{
    static const int size[] = {4, 8, 8, 4, 1, 1, 2, 2};
    if (dt < K_DT_F32 || dt > K_DT_F16)
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

/* y = transpose(x, perm): y walked densely, x by the permuted strides.
 * When y's innermost dim is strided in x and some y dim q is x's contiguous
 * one, 32 x 32 tiles of (q, innermost) go through shared memory; every
 * other case is a strided copy that reads x in rows. */
void kc_transpose_f32(float *y, const float *x, int rank, const int64_t *xshape, const int64_t *perm)
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
        launch_k_copy_strided(grid_for(w.n, KC_BLOCK), KC_BLOCK, 4, y, x, w.n, w.rank, w.shape,
                              w.st[0], w.st[1]);
        return;
    }
    const int64_t nq = w.shape.d[q], yq = w.st[0].d[q];
    walk_remove(&w, q);
    const int64_t nl = w.shape.d[w.rank - 1], ix = w.st[1].d[w.rank - 1];
    walk_remove(&w, w.rank - 1); /* what is left is the batch */
    const int64_t nbatch = numel(w.rank, w.shape.d);
    const int64_t tiles = nbatch * ((nq + 31) / 32) * ((nl + 31) / 32);
    launch_k_transpose_tiled_f32(grid_for(tiles * KC_BLOCK, KC_BLOCK), KC_BLOCK, y, x, nq, nl, ix, yq,
                                 nbatch, w.rank, w.shape, w.st[1], w.st[0]);
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

void kc_pad_f32(int mode, float *y, const float *x, int rank, const int64_t *xshape,
                const int64_t *pads, double value)
{
    KDims ys, xs, pb;
    pad_dims("k_pad", mode, rank, xshape, pads, &ys, &xs, &pb);
    int64_t n = numel(rank, ys.d);
    if (n > 0)
        launch_k_pad_f32(grid_for(n, KC_BLOCK), KC_BLOCK, mode, y, x, n, rank, ys, xs, pb, (float)value);
}

void kc_pad_grad_f32(int mode, float *dx, const float *dy, int rank, const int64_t *xshape,
                     const int64_t *pads)
{
    KDims ys, xs, pb;
    pad_dims("k_pad_grad", mode, rank, xshape, pads, &ys, &xs, &pb);
    int64_t n = numel(rank, xshape);
    if (n > 0)
        launch_k_pad_grad_f32(grid_for(n, KC_BLOCK), KC_BLOCK, mode, dx, dy, n, rank, xs, ys, pb);
}

/* ---- matmul.c ------------------------------------------------------------------- */

void kc_matmul_f32(float *c, const float *a, const float *b, int64_t batch, int64_t sa, int64_t sb,
                   int64_t m, int64_t n, int64_t k, int ta, int tb, double beta)
{
    kc_gemm_f32(c, a, b, batch, sa, sb, m, n, k, ta, tb, beta);
}

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

/* the GEMM with its epilogue; a bias no cuBLASLt algorithm would add (kc_gemm_add
 * returns 0) is added here, row by row */
static void matmul_add(KcGemmType type, float *c, const void *a, const void *b, const float *bias,
                       const float *add, double alpha, int64_t batch, int64_t sa, int64_t sb, int64_t m,
                       int64_t n, int64_t k, int ta, int tb)
{
    if (kc_gemm_add(type, c, a, b, bias, add, alpha, batch, sa, sb, m, n, k, ta, tb))
        return;
    const int64_t shape[2] = {batch * m, n}, sc[2] = {n, 1}, sbias[2] = {0, 1};
    kc_binary_f32(K_ADD, c, c, bias, 2, shape, sc, sbias);
}

void kc_matmul_add_f32(float *c, const float *a, const float *b, const float *bias, const float *add,
                       double alpha, int64_t batch, int64_t sa, int64_t sb, int64_t m, int64_t n, int64_t k, int ta,
                       int tb)
{
    matmul_add(KC_GEMM_F32, c, a, b, bias, add, alpha, batch, sa, sb, m, n, k, ta, tb);
}

void kc_matmul_add_bf16(float *c, const uint16_t *a, const uint16_t *b, const float *bias, const float *add,
                        double alpha, int64_t batch, int64_t sa, int64_t sb, int64_t m, int64_t n, int64_t k, int ta,
                        int tb)
{
    matmul_add(KC_GEMM_BF16, c, a, b, bias, add, alpha, batch, sa, sb, m, n, k, ta, tb);
}

void kc_matmul_add_f16(float *c, const uint16_t *a, const uint16_t *b, const float *bias, const float *add,
                       double alpha, int64_t batch, int64_t sa, int64_t sb, int64_t m, int64_t n, int64_t k, int ta,
                       int tb)
{
    matmul_add(KC_GEMM_F16, c, a, b, bias, add, alpha, batch, sa, sb, m, n, k, ta, tb);
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

void kc_reduce_f32(int op, float *y, const float *x, int rank, const int64_t *xshape,
                   const int64_t *yshape)
{
    KcWalk k, r;
    if (op < K_RSUM || op > K_RPROD)
        die("k_reduce", "unknown op");
    if (numel(rank, xshape) == 0) { /* each group folds nothing */
        kc_fill_f32(y, op == K_RMEAN ? (double)NAN : red_init(op), numel(rank, yshape));
        return;
    }
    const int64_t group = reduce_split(rank, xshape, yshape, &k, &r);
    const double scale = op == K_RMEAN ? 1.0 / (double)group : 1.0;
    if (k.rank == 0 && group >= 65536) { /* one value from a large x: every block helps */
        launch_k_reduce_all_f32(partial_grid(grid_for(group, KC_BLOCK)), KC_BLOCK, op, y, x, group, scale);
        return;
    }
    if (k.rank > 0 && k.st[0].d[k.rank - 1] == 1) { /* innermost kept: column tiles */
        const int64_t nc = k.shape.d[k.rank - 1];
        walk_remove(&k, k.rank - 1);
        const int64_t nko = numel(k.rank, k.shape.d), tiles = nko * ((nc + 31) / 32);
        const unsigned block = 32 * min_u((group + 3) / 4 < 1 ? 1 : (group + 3) / 4, 8);
        launch_k_reduce_cols_f32(row_grid(tiles, block), block, op, y, x, nko, nc, group, k.rank,
                                 k.shape, k.st[0], r.rank, r.shape, r.st[0], scale);
        return;
    }
    const unsigned block = row_block(group);
    launch_k_reduce_rows_f32(row_grid(k.n, block), block, op, y, x, k.n, group, k.rank, k.shape,
                             k.st[0], r.rank, r.shape, r.st[0], scale);
}

void kc_reduce_sum_to_f32(float *y, const float *x, int rank, const int64_t *xshape,
                          const int64_t *yshape)
{
    kc_reduce_f32(K_RSUM, y, x, rank, xshape, yshape);
}

void kc_reduce_max_grad_f32(float *dx, const float *dy, const float *x, const float *y, int rank,
                            const int64_t *xshape, const int64_t *yshape)
{
    KcWalk k, r;
    if (numel(rank, xshape) == 0)
        return;
    const int64_t group = reduce_split(rank, xshape, yshape, &k, &r);
    const unsigned block = row_block(group);
    launch_k_reduce_max_grad_f32(row_grid(k.n, block), block, dx, dy, x, y, k.n, group, k.rank,
                                 k.shape, k.st[0], r.rank, r.shape, r.st[0]);
}

void kc_reduce_prod_grad_f32(float *dx, const float *dy, const float *x, int rank, const int64_t *xshape,
                             const int64_t *yshape)
{
    KcWalk k, r;
    if (numel(rank, xshape) == 0)
        return;
    const int64_t group = reduce_split(rank, xshape, yshape, &k, &r);
    const unsigned block = row_block(group);
    launch_k_reduce_prod_grad_f32(row_grid(k.n, block), block, dx, dy, x, k.n, group, k.rank, k.shape, k.st[0],
                                  r.rank, r.shape, r.st[0]);
}

void kc_softmax_f32(int is_log, float *y, const float *x, int64_t outer, int64_t axis, int64_t inner)
{
    if (outer * axis * inner <= 0)
        return;
    if (inner == 1) {
        const unsigned block = row_block(axis);
        launch_k_softmax_rows_f32(row_grid(outer, block), block, is_log, y, x, outer, axis);
    } else {
        launch_k_softmax_cols_f32(grid_for(outer * inner, KC_BLOCK), KC_BLOCK, is_log, y, x, outer,
                                  axis, inner);
    }
}

void kc_softmax_grad_f32(int is_log, float *dx, const float *dy, const float *y, int64_t outer,
                         int64_t axis, int64_t inner)
{
    if (outer * axis * inner <= 0)
        return;
    if (inner == 1) {
        const unsigned block = row_block(axis);
        launch_k_softmax_grad_rows_f32(row_grid(outer, block), block, is_log, dx, dy, y, outer, axis);
    } else {
        launch_k_softmax_grad_cols_f32(grid_for(outer * inner, KC_BLOCK), KC_BLOCK, is_log, dx, dy, y,
                                       outer, axis, inner);
    }
}

void kc_range_f32(float *y, double start, double delta, int64_t n)
{
    if (n > 0)
        launch_k_range_f32(grid_for(n, KC_BLOCK), KC_BLOCK, y, start, delta, n);
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

/* ---- norm.c -------------------------------------------------------------------------- */

void kc_layernorm_f32(float *y, float *mean, float *invstd, const float *x, const float *scale,
                      const float *bias, int64_t outer, int64_t inner, double eps)
{
    const unsigned block = row_block(inner);
    if (inner > 0 && outer > 0)
        launch_k_layernorm_f32(row_grid(outer, block), block, y, mean, invstd, x, scale, bias, outer,
                               inner, eps);
}

/* dscale / dbias first: dx may alias dy */
void kc_layernorm_grad_f32(float *dx, float *dscale, float *dbias, const float *dy, const float *x,
                           const float *mean, const float *invstd, const float *scale, int64_t outer,
                           int64_t inner)
{
    if (inner <= 0)
        return;
    if (dscale || dbias) {
        const unsigned block = 32 * min_u(outer / 4 < 1 ? 1 : outer / 4, 8);
        launch_k_layernorm_grad_cols_f32(row_grid((inner + 31) / 32, block), block, dscale, dbias, dy,
                                         x, mean, invstd, outer, inner);
    }
    if (dx && outer > 0) {
        const unsigned block = row_block(inner);
        launch_k_layernorm_grad_f32(row_grid(outer, block), block, dx, dy, x, mean, invstd, scale,
                                    outer, inner);
    }
}

void kc_batchnorm_train_f32(float *y, float *mean, float *invstd, float *rm_out, float *rv_out,
                            const float *x, const float *scale, const float *bias, const float *rm_in,
                            const float *rv_in, int64_t n, int64_t c, int64_t l, double eps,
                            double momentum)
{
    const unsigned block = row_block(n * l);
    if (c > 0)
        launch_k_batchnorm_train_f32(row_grid(c, block), block, y, mean, invstd, rm_out, rv_out, x,
                                     scale, bias, rm_in, rv_in, n, c, l, eps, momentum);
}

void kc_batchnorm_grad_f32(float *dx, float *dscale, float *dbias, const float *dy, const float *x,
                           const float *mean, const float *invstd, const float *scale, int64_t n,
                           int64_t c, int64_t l)
{
    const unsigned block = row_block(n * l);
    if (c > 0)
        launch_k_batchnorm_grad_f32(row_grid(c, block), block, dx, dscale, dbias, dy, x, mean, invstd,
                                    scale, n, c, l);
}

void kc_batchnorm_infer_f32(float *y, const float *x, const float *scale, const float *bias,
                            const float *mean, const float *var, int64_t n, int64_t c, int64_t l,
                            double eps)
{
    if (n * c * l > 0)
        launch_k_batchnorm_infer_f32(grid_for(n * c * l, KC_BLOCK), KC_BLOCK, y, x, scale, bias, mean,
                                     var, n, c, l, eps);
}

void kc_bn_running_var_f32(float *rv_out, const float *rv_in, const float *invstd, int64_t c,
                           double eps, double momentum)
{
    if (c > 0)
        launch_k_bn_running_var_f32(grid_for(c, KC_BLOCK), KC_BLOCK, rv_out, rv_in, invstd, c, eps,
                                    momentum);
}

/* ---- conv.c --------------------------------------------------------------------------- */

static void conv_check(const KConv2d *p)
{
    const char *bad = k_conv2d_bad(p);
    if (bad)
        die("k_conv2d", bad);
}

/* col of image nb, group gi in ws (the caller's k_conv2d_workspace) */
static void im2col(const KConv2d *p, float *ws, const float *xg)
{
    const int64_t n = p->c / p->groups * p->kh * p->kw * p->oh * p->ow;
    if (n > 0)
        launch_k_im2col_f32(grid_for(n, KC_BLOCK), KC_BLOCK, *p, ws, xg);
}

void kc_conv2d_f32(const KConv2d *p, float *y, const float *x, const float *w, const float *b, float *ws)
{
    conv_check(p);
    const int64_t g = p->groups, cg = p->c / g, mg = p->m / g, hw = p->h * p->w;
    const int64_t kk = cg * p->kh * p->kw, nout = p->oh * p->ow;
    if (k_conv2d_is_direct(p) && g == 1) /* y_i = w x_i for every image: one batched GEMM */
        kc_gemm_f32(y, w, x, p->n, 0, p->c * hw, p->m, nout, kk, 0, 0, 0.0);
    else
        for (int64_t nb = 0; nb < p->n; nb++)
            for (int64_t gi = 0; gi < g; gi++) {
                const float *xg = x + (nb * p->c + gi * cg) * hw, *col = xg;
                if (!k_conv2d_is_direct(p)) {
                    im2col(p, ws, xg);
                    col = ws;
                }
                kc_gemm_f32(y + (nb * p->m + gi * mg) * nout, w + gi * mg * kk, col, 1, 0, 0, mg, nout,
                            kk, 0, 0, 0.0);
            }
    if (b && p->n * p->m * nout > 0)
        launch_k_conv2d_bias_f32(grid_for(p->n * p->m * nout, KC_BLOCK), KC_BLOCK, y, b, p->n, p->m,
                                 nout);
}

/* dx written: by the GEMM (direct) or by col2im, which writes every pixel */
void kc_conv2d_grad_x_f32(const KConv2d *p, float *dx, const float *dy, const float *w, float *ws)
{
    conv_check(p);
    const int64_t g = p->groups, cg = p->c / g, mg = p->m / g, hw = p->h * p->w;
    const int64_t kk = cg * p->kh * p->kw, nout = p->oh * p->ow;
    if (k_conv2d_is_direct(p) && g == 1) {
        kc_gemm_f32(dx, w, dy, p->n, 0, p->m * nout, kk, nout, p->m, 1, 0, 0.0);
        return;
    }
    for (int64_t nb = 0; nb < p->n; nb++)
        for (int64_t gi = 0; gi < g; gi++) {
            float *dxg = dx + (nb * p->c + gi * cg) * hw;
            kc_gemm_f32(k_conv2d_is_direct(p) ? dxg : ws, w + gi * mg * kk, dy + (nb * p->m + gi * mg) * nout, 1,
                        0, 0, kk, nout, mg, 1, 0, 0.0);
            if (!k_conv2d_is_direct(p) && cg * hw > 0)
                launch_k_col2im_f32(grid_for(cg * hw, KC_BLOCK), KC_BLOCK, *p, dxg, ws);
        }
}

/* dw written: the first image's GEMM has beta 0, the others add (beta 1) */
void kc_conv2d_grad_w_f32(const KConv2d *p, float *dw, const float *dy, const float *x, float *ws)
{
    conv_check(p);
    const int64_t g = p->groups, cg = p->c / g, mg = p->m / g, hw = p->h * p->w;
    const int64_t kk = cg * p->kh * p->kw, nout = p->oh * p->ow;
    if (p->n == 0)
        kc_memset(dw, 0, p->m * kk * (int64_t)sizeof(float));
    for (int64_t nb = 0; nb < p->n; nb++)
        for (int64_t gi = 0; gi < g; gi++) {
            const float *xg = x + (nb * p->c + gi * cg) * hw, *col = xg;
            if (!k_conv2d_is_direct(p)) {
                im2col(p, ws, xg);
                col = ws;
            }
            kc_gemm_f32(dw + gi * mg * kk, dy + (nb * p->m + gi * mg) * nout, col, 1, 0, 0, mg, kk, nout,
                        0, 1, nb > 0 ? 1.0 : 0.0);
        }
}

void kc_conv2d_grad_b_f32(const KConv2d *p, float *db, const float *dy)
{
    const unsigned block = row_block(p->n * p->oh * p->ow);
    if (p->m > 0)
        launch_k_conv2d_grad_b_f32(row_grid(p->m, block), block, *p, db, dy);
}

static void pool_check(const KPool2d *p)
{
    const char *bad = k_pool2d_bad(p);
    if (bad)
        die("k_pool2d", bad);
}

void kc_maxpool2d_f32(const KPool2d *p, float *y, int64_t *arg, const float *x)
{
    const int64_t n = p->n * p->c * p->oh * p->ow;
    pool_check(p);
    if (n > 0)
        launch_k_maxpool2d_f32(grid_for(n, KC_BLOCK), KC_BLOCK, *p, y, arg, x);
}

void kc_maxpool2d_grad_f32(const KPool2d *p, float *dx, const float *dy, const int64_t *arg)
{
    const int64_t n = p->n * p->c * p->h * p->w;
    pool_check(p);
    if (n > 0)
        launch_k_maxpool2d_grad_f32(grid_for(n, KC_BLOCK), KC_BLOCK, *p, dx, dy, arg);
}

void kc_avgpool2d_f32(const KPool2d *p, float *y, const float *x)
{
    const int64_t n = p->n * p->c * p->oh * p->ow;
    pool_check(p);
    if (n > 0)
        launch_k_avgpool2d_f32(grid_for(n, KC_BLOCK), KC_BLOCK, *p, y, x);
}

void kc_avgpool2d_grad_f32(const KPool2d *p, float *dx, const float *dy)
{
    const int64_t n = p->n * p->c * p->h * p->w;
    pool_check(p);
    if (n > 0)
        launch_k_avgpool2d_grad_f32(grid_for(n, KC_BLOCK), KC_BLOCK, *p, dx, dy);
}

void kc_global_avgpool_f32(float *y, const float *x, int64_t nc, int64_t hw)
{
    const unsigned block = row_block(hw);
    if (nc > 0)
        launch_k_global_avgpool_f32(row_grid(nc, block), block, y, x, nc, hw);
}

void kc_global_avgpool_grad_f32(float *dx, const float *dy, int64_t nc, int64_t hw)
{
    if (nc * hw > 0)
        launch_k_global_avgpool_grad_f32(grid_for(nc * hw, KC_BLOCK), KC_BLOCK, dx, dy, nc, hw);
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

void kc_gather_grad_f32(float *dx, const float *dy, const int64_t *idx, int64_t outer, int64_t axis,
                        int64_t inner, int64_t nidx)
{
    if (inner <= 0 || axis <= 0)
        return;
    kc_memset(dx, 0, outer * axis * inner * (int64_t)sizeof(float));
    if (outer * inner == 0 || nidx == 0)
        return;
    /* split each column's rows into power-of-two buckets until about two
     * device-fulls of threads run (an embedding has few columns) */
    const int64_t want = 2 * (int64_t)kc_num_sms() * KC_SM_THREADS;
    int64_t buckets = 1;
    while (buckets * 2 <= axis && buckets < 1024 && buckets * outer * inner < want)
        buckets *= 2;
    launch_k_gather_grad_f32(grid_for(buckets * outer * inner, KC_BLOCK), KC_BLOCK, dx, dy, idx, outer,
                             axis, inner, nidx, buckets);
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

int64_t kc_gather_elements_grad_f32(float *dx, const float *dy, const int64_t *idx, int rank, const int64_t *shape,
                                    const int64_t *xshape, int axis)
{
    int64_t *check = kc_next_check();
    KDims sh, is, xs;
    const int64_t cols = columns(rank, shape, xshape, axis, &sh, &is, &xs);
    const int64_t nx = numel(rank, xshape);
    if (nx > 0)
        kc_memset(dx, 0, nx * (int64_t)sizeof(float));
    if (cols * shape[axis] > 0)
        launch_k_gather_elements_grad_f32(grid_for(cols * shape[axis], KC_BLOCK), KC_BLOCK, dx, dy, idx, rank,
                                          axis, cols, xshape[axis], sh, is, xs, check);
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

/* ---- random.c -------------------------------------------------------------------------- */

/* the step comes from kc_step_params(), not from `step` */
void kc_dropout_f32(float *y, uint8_t *mask, const float *x, int64_t n, double ratio, uint64_t seed,
                    uint32_t stream, uint32_t step)
{
    (void)step;
    if (n > 0)
        launch_k_dropout_f32(grid_for((n + 3) / 4, KC_BLOCK), KC_BLOCK, y, mask, x, n, ratio, seed, stream,
                             kc_step_params());
}

void kc_dropout_grad_f32(float *dx, const float *dy, const uint8_t *mask, int64_t n, double ratio)
{
    if (n > 0)
        launch_k_dropout_grad_f32(grid_for(n, KC_BLOCK), KC_BLOCK, dx, dy, mask, n, ratio);
}

/* ---- loss.c ----------------------------------------------------------------------------- */

void kc_mse_f32(float *loss, const float *p, const float *t, int64_t n)
{
    launch_k_mse_f32(partial_grid(grid_for(n, KC_BLOCK)), KC_BLOCK, loss, p, t, n);
}

void kc_mse_grad_f32(float *dp, const float *dloss, const float *p, const float *t, int64_t n)
{
    if (n > 0)
        launch_k_mse_grad_f32(grid_for(n, KC_BLOCK), KC_BLOCK, dp, dloss, p, t, n);
}

int64_t kc_cross_entropy_f32(float *loss, const float *x, const int64_t *labels, int64_t rows,
                             int64_t classes)
{
    int64_t *check = kc_next_check();
    const unsigned block = row_block(classes);
    launch_k_cross_entropy_f32(partial_grid(row_grid(rows, block)), block, loss, x, labels, rows, classes,
                               check);
    return -1;
}

void kc_cross_entropy_grad_f32(float *dx, const float *dloss, const float *x, const int64_t *labels,
                               int64_t rows, int64_t classes)
{
    const unsigned block = row_block(classes);
    if (rows > 0 && classes > 0)
        launch_k_cross_entropy_grad_f32(row_grid(rows, block), block, dx, dloss, x, labels, rows, classes);
}

int64_t kc_nll_loss_f32(float *loss, const float *lp, const int64_t *labels, const float *weights,
                        int64_t n, int64_t c, int64_t d, int reduction, int has_ignore,
                        int64_t ignore_index)
{
    int64_t *check = kc_next_check();
    if (reduction < K_LOSS_NONE || reduction > K_LOSS_MEAN)
        die("k_nll_loss", "unknown reduction");
    if (reduction != K_LOSS_NONE || n * d > 0)
        launch_k_nll_loss_f32(partial_grid(grid_for(n * d, KC_BLOCK)), KC_BLOCK, loss, lp, labels,
                              weights, n, c, d, reduction, has_ignore, ignore_index, check);
    return -1;
}

/* dx = dx_in or 0 by a device copy / fill, then one block subtracts the
 * counted positions' w g / ws */
void kc_nll_loss_grad_f32(float *dx, const float *dx_in, const float *dloss, const int64_t *labels,
                          const float *weights, int64_t n, int64_t c, int64_t d, int reduction,
                          int has_ignore, int64_t ignore_index)
{
    const int64_t bytes = n * c * d * (int64_t)sizeof(float);
    if (reduction < K_LOSS_NONE || reduction > K_LOSS_MEAN)
        die("k_nll_loss_grad", "unknown reduction");
    if (!dx_in)
        kc_memset(dx, 0, bytes);
    else if (dx != dx_in)
        kc_memcpy(dx, dx_in, bytes);
    if (dloss && n * d > 0)
        launch_k_nll_loss_grad_f32(1, row_block(n * d), dx, dloss, labels, weights, n, c, d, reduction,
                                   has_ignore, ignore_index);
}

/* ---- optim.c ------------------------------------------------------------------------------ */

/* The hyper-parameters, the step, the clip norm, the loss scale and the
 * micro-step come from kc_step_params(); gsq (the squared norm, on the
 * device) is passed on for the kernel to read when clipping or loss scaling.  Launched at every micro-step: the
 * kernel, not the host, decides whether this one updates (one captured
 * graph replays them all). */
void kc_adamw_f32(float *p, const float *g, float *m, float *v, int64_t n, double lr, double beta1,
                  double beta2, double eps, double wd, int l2, double lr_mult, int64_t step, const float *gsq,
                  double clip, double scale, int64_t micro, int64_t accum)
{
    /* the hyper-parameters come from kc_step_params() (a graph replays with new ones); wd only says whether
     * this part decays (--no-decay: 0 where it does not), l2 how, lr_mult its factor: fixed for a run */
    (void)lr, (void)beta1, (void)beta2, (void)eps, (void)step, (void)clip, (void)scale, (void)micro, (void)accum;
    if (n > 0)
        launch_k_adamw_f32(grid_for(n, KC_BLOCK), KC_BLOCK, p, g, m, v, n, wd != 0 ? (l2 ? 2 : 1) : 0, lr_mult,
                           gsq, kc_step_params());
}

void kc_sgd_f32(float *p, const float *g, float *buf, int64_t n, double lr, double momentum, double wd,
                int nesterov, double lr_mult, int64_t step, const float *gsq, double clip, double scale,
                int64_t micro, int64_t accum)
{
    (void)lr, (void)momentum, (void)step, (void)clip, (void)scale, (void)micro, (void)accum; /* wd: as kc_adamw */
    if (n > 0)
        launch_k_sgd_f32(grid_for(n, KC_BLOCK), KC_BLOCK, p, g, buf, n, wd != 0, nesterov, lr_mult, gsq,
                         kc_step_params());
}

/* the micro-step comes from kc_step_params(), not from `micro` */
void kc_grad_accum_f32(float *y, const float *x, int64_t n, int64_t micro)
{
    (void)micro;
    if (n > 0)
        launch_k_grad_accum_f32(grid_for(n, KC_BLOCK), KC_BLOCK, y, x, n, kc_step_params());
}

/* launched for n == 0 too: y[0] is still written (0, or y[0] kept) */
void kc_sum_squares_f32(float *y, const float *x, int64_t n, int accumulate)
{
    launch_k_sum_squares_f32(partial_grid(grid_for(n, KC_BLOCK)), KC_BLOCK, y, x, n, accumulate);
}

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
