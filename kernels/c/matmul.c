/* matmul.c — batched GEMM on top of OpenBLAS (CBLAS) or oneDNN's sgemm.
 *
 * How it works.  k_matmul is row-major throughout: op(A_i) is m x k, op(B_i)
 * is k x n, C_i is dense m x n.  A transposed operand is just a different
 * leading dimension handed to the GEMM, so no data is moved.  A float32 GEMM
 * runs on the library chosen at start-up (k_gemm_f32, below), a float64 one
 * on OpenBLAS.  Batches are
 * one GEMM call each, except when B is shared (sb == 0) and the A batches sit
 * back to back untransposed: then the batch folds into the rows and the whole
 * thing is a single (batch*m) x n GEMM, which lets the library thread and
 * block across it (the Linear-layer-on-[B,S,D] case).
 *
 * BLAS corner cases are handled here rather than passed through: k == 0 is a
 * plain C = beta C (BLAS would reject a zero leading dimension), and beta == 0
 * never reads C, so an uninitialised arena slot cannot leak NaN in.
 *
 * k_matmul_add (a MatMulAdd: the fuse pass's GEMM epilogue) presets C to
 * bias + addend and runs the GEMM with beta 1 (and its alpha), so the GEMM
 * adds the product into it: one pass over C instead of the product's
 * write, read and rewrite.
 *
 * The bfloat16 GEMMs are in matmul_bf16.c (oneDNN where the CPU has
 * AVX512-BF16, else the widened path below).
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels.h"
#include "walk.h"

int k_threads(int n, char *why, size_t cap)
{
    const char *eo = getenv("OMP_NUM_THREADS"), *eb = getenv("OPENBLAS_NUM_THREADS");
    eo = eo && *eo ? eo : NULL;
    eb = eb && *eb ? eb : NULL;
    if (n < 1)
        n = 1;
#ifdef _OPENMP
    if (!eo)
        omp_set_num_threads(n);
    int no = omp_get_max_threads();
#else
    int no = 1;
#endif
    if (!eb && !eo) /* OpenBLAS reads OMP_NUM_THREADS too when its own is unset */
        openblas_set_num_threads(n);
    int nb = openblas_get_num_threads();
    snprintf(why, cap, "%d for the kernels%s, %d for OpenBLAS%s", no, eo ? " (OMP_NUM_THREADS)" : "", nb,
             eb ? " (OPENBLAS_NUM_THREADS)" : eo ? " (OMP_NUM_THREADS)" : "");
    return nb;
}

void k_team_get(int *omp, int *blas)
{
#ifdef _OPENMP
    *omp = omp_get_max_threads();
#else
    *omp = 1;
#endif
    *blas = openblas_get_num_threads();
}

void k_team_set(int omp, int blas)
{
    openblas_set_num_threads(blas); /* its OpenMP build sets OpenMP's count too: OpenMP's after it */
#ifdef _OPENMP
    omp_set_num_threads(omp);
#else
    (void)omp;
#endif
}

void k_team_share(int64_t *lo, int64_t *hi)
{
#ifdef _OPENMP
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num(), n = *hi - *lo;
    const int64_t chunk = (n + nt - 1) / nt, a = min64(t * chunk, n);
    *hi = *lo + min64(a + chunk, n);
    *lo += a;
#else
    (void)lo, (void)hi;
#endif
}

const char *k_blas_kernels(void)
{
    const char *c = openblas_get_corename();
    return c && *c ? c : "?";
}

/* CBLAS takes int dims; fsdpc's shapes are checked long before this, so a
 * larger one is an internal bug: abort loudly, also in release builds. */
static void check_dims(int64_t m, int64_t n, int64_t k)
{
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX) {
        fprintf(stderr, "fsdpc kernels/c: k_matmul dim above INT_MAX (%lld, %lld, %lld)\n",
                (long long)m, (long long)n, (long long)k);
        abort();
    }
}

/* ---- the float32 GEMM's library --------------------------------------------
 *
 * Every float32 GEMM of the kernels (k_matmul_f32, k_matmul_add_f32, the
 * fused attention's tiles, the widened 16-bit GEMMs' blocks) is one
 * k_gemm_f32, which runs it on the library chosen at start-up (k_gemm_use):
 * OpenBLAS's cblas_sgemm or oneDNN's dnnl_sgemm.  Neither is faster
 * everywhere: on an AMD Zen 5 with OPENBLAS_CORETYPE=Haswell (AVX2 kernels)
 * oneDNN's AVX-512 sgemm ran 1.8-2.0x OpenBLAS's on the GPT step's shapes at
 * 1 thread, where OpenBLAS's own AVX-512 kernels (SkylakeX, on Intel) may
 * match it; so the executable measures both (runtime/dev_host.c) unless
 * FSDPC_GEMM names one.  The choice is made once, before any step, and
 * every rank takes rank 0's: a process never mixes the two (--recompute
 * recomputes the forward's bits) and the ranks sum alike.  float64 stays on
 * OpenBLAS (oneDNN has no double GEMM).  Both run on the kernels' OpenMP
 * team, and inside it (the batch split below, the tiles) on the calling
 * thread alone.  k == 0 is C = beta C here; beta 0 never reads C on either
 * (dnnl_sgemm's beta 0 writes C without reading it: a NaN there stays out). */

static int g_gemm = K_GEMM_OPENBLAS;

void k_gemm_use(int lib) { g_gemm = lib == K_GEMM_ONEDNN ? K_GEMM_ONEDNN : K_GEMM_OPENBLAS; }

int k_gemm_lib(void) { return g_gemm; }

const char *k_gemm_name(int lib) { return lib == K_GEMM_ONEDNN ? "oneDNN" : "OpenBLAS"; }

void k_gemm_f32_on(int lib, float *c, int64_t ldc, const float *a, int64_t lda, const float *b, int64_t ldb,
                   int64_t m, int64_t n, int64_t k, int ta, int tb, double alpha, double beta)
{
    if (m <= 0 || n <= 0)
        return;
    if (k <= 0) { /* C = beta C, beta 0 writing exact zeros */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++)
                c[i * ldc + j] = beta == 0 ? 0.0f : (float)beta * c[i * ldc + j];
        return;
    }
    if (lib == K_GEMM_ONEDNN) {
        dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, (float)alpha, a, lda, b, ldb,
                                      (float)beta, c, ldc);
        if (st != dnnl_success) {
            fprintf(stderr, "fsdpc kernels/c: dnnl_sgemm(%c, %c, m %lld, n %lld, k %lld) failed: %s\n",
                    ta ? 'T' : 'N', tb ? 'T' : 'N', (long long)m, (long long)n, (long long)k, dnnl_status2str(st));
            abort();
        }
        return;
    }
    check_dims(m, n, k);
    check_dims(lda, ldb, ldc);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)m, (int)n,
                (int)k, (float)alpha, a, (int)lda, b, (int)ldb, (float)beta, c, (int)ldc);
}

void k_gemm_f32(float *c, int64_t ldc, const float *a, int64_t lda, const float *b, int64_t ldb, int64_t m,
                int64_t n, int64_t k, int ta, int tb, double alpha, double beta)
{
    k_gemm_f32_on(g_gemm, c, ldc, a, lda, b, ldb, m, n, k, ta, tb, alpha, beta);
}

/* float64: OpenBLAS's, k_gemm_f32's contract */
static void blas_f64(double *c, int64_t ldc, const double *a, int64_t lda, const double *b, int64_t ldb, int64_t m,
                     int64_t n, int64_t k, int ta, int tb, double alpha, double beta)
{
    check_dims(m, n, k);
    check_dims(lda, ldb, ldc);
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)m, (int)n,
                (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

#define T float
#define S f32
#define K_GEMM k_gemm_f32
#include "matmul_impl.h"
#undef T
#undef S
#undef K_GEMM

#define T double
#define S f64
#define K_GEMM blas_f64
#include "matmul_impl.h"
#undef T
#undef S
#undef K_GEMM

/* ---- float16 or bfloat16 operands, float32 result, widened -----------------
 *
 * OpenBLAS has no float16 GEMM, and Debian 12's (0.3.21) declares cblas_sbgemm
 * but does not export it, so a float16 GEMM — and a bfloat16 one where oneDNN
 * has no native bf16 GEMM (matmul_bf16.c) — is a float32 GEMM of the widened
 * operands: bfloat16 -> float is exact and so is the product of two bfloat16
 * values in float, hence the result is what an sbgemm computes (float32
 * accumulation) up to summation order.  The operands are widened block by
 * block, op(A) in BM x BK blocks, op(B) in BK x BN blocks, each block pair
 * one cblas_sgemm accumulating into C (k_gemm_widened_16, which takes
 * leading dimensions).  A block is widened as it is stored, its rows read
 * whole, and cblas_sgemm transposes a transposed one (widening it into op()'s
 * layout read down a column: bench/attn_16.c's widened bf16 attention
 * backward, T 1024, whose GEMMs read P and Q transposed, went from 1.33x
 * to 0.97x the float32 kernel's time; a 768 x 3072 x 4096 bf16 GEMM with
 * B transposed, as the step's Linears read their weights, from 66 to 85
 * GFLOP/s at 1 thread, the others at 86-91 before and after).  The widening costs m n k (1/BM + 1/BN) conversions
 * against the GEMM's 2 m n k flops.  Every caller hands k_gemm_widened_16 a
 * scratch of its own (kernels never allocate).
 *
 * k_matmul_widened_16, the step's GEMM, splits its C into tiles of at most
 * TILE x TILE, of equal sizes (tiles(): from the shape alone, at least
 * MIN_TILES where the sides allow, so that a 128 x 128 or 384 x 128 weight
 * gradient is not one tile on one thread, or 256 + 128 rows on two), each
 * tile's product one cblas_sgemm per BK block of k on widened blocks, in k
 * order; a MatMulAdd's preset of C (bias + addend) is done tile by tile at
 * its first block, in the GEMM's own region.  The team (OpenBLAS
 * runs single-threaded inside it) takes units: runs of tiles along a row of
 * C (or a column, whichever widens less), each unit on one thread in that
 * thread's slot of the fixed wide[] (at most SLOTS threads), k block by k
 * block, the run's op(A) block (op(B) for a column) widened once for all its
 * tiles and the other operand's per tile; a line is cut into several runs
 * only where the lines are too few for the team.  It used to widen on one
 * thread and fork the team for every block's sgemm (a bf16 step at 2 threads
 * about 3x fp32's), then (until 2026-11-27) widened both blocks per tile
 * (widening 4.5 % of a 256/6/256/8 bf16 GPT step at 1 thread, now 3.1 %).
 * Whatever the units, each C element gets the same sgemm calls on the same
 * blocks in the same k order, so any team gives the same bits.  The tiles
 * measured 1.04-1.05x float32's GEMM time on the 128/4/128/8 GPT step's
 * GEMMs and 0.96x on the 256/6/256/8 one's at 1 thread; each operand
 * widened whole once and one sgemm, 1.06-1.09x (bench/bf16_gemm.py's
 * `whole` side, 2026-11-28: a whole widened operand leaves L2 before the
 * sgemm packs it, a 256 x 256 block does not).  A MatMulAdd stored in 16
 * bits (k_matmul_add_rows_16) rounds each tile into its 16-bit output as
 * soon as the tile is done, the scratch's row blocks one after the other in
 * one region: the widened bf16 GPT 128/4/128/8 step at 2 threads went from
 * 320 parallel regions to 247, and to 177 with k_cast in the step's team
 * runs (codegen/team.c; fp32's: 183).  Inside a team the step runs (k_share)
 * the units are split over its threads as the own region splits them (the
 * first SLOTS threads, a slot of wide[] each: my_units), with no fork, and
 * the rows variant's blocks need a barrier only where a block's tiling
 * differs from the one before (a shorter last block): otherwise each thread
 * presets, computes and rounds the same tiles of the scratch in every block
 * (bf16 widened GPT 128/4/128/8 at 2 threads: 89 forks a step to 3).
 * float16 operands take the same path with another widening: float16 ->
 * float is exact too, and a product of two float16 values (11-bit
 * significands) fits float's 24 bits. */

enum { BM = K_WIDE_BM, BN = K_WIDE_BN, BK = K_WIDE_BK, TILE = 256, MIN_TILES = 2, MIN_SIDE = 64, SLOTS = 16 };
#define SLOT_FLOATS (2 * TILE * BK) /* a run's shared block and a tile's own, TILE x BK each */
static float wide[SLOTS][SLOT_FLOATS]; /* a slot per thread of the team (untouched pages cost nothing) */

/* the rows x cols block at (r0, c0) of the 16-bit matrix x (ld columns; f16:
 * float16, else bfloat16) into dense float w, in x's own layout: rows read
 * whole, each conversion loop on its own (the bfloat16 one vectorises) */
static void widen(float *w, const uint16_t *x, int64_t ld, int64_t r0, int64_t c0, int64_t rows, int64_t cols,
                  int f16)
{
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *xr = x + (r0 + r) * ld + c0;
        float *wr = w + r * cols;
        if (f16)
            for (int64_t c = 0; c < cols; c++)
                wr[c] = k_f16_to_f32(xr[c]);
        else
            for (int64_t c = 0; c < cols; c++)
                wr[c] = k_bf16_to_f32(xr[c]);
    }
}

/* a caller's scratch too small for its GEMM: an internal bug, said and aborted on */
static void die_scratch(int64_t m, int64_t n, int64_t k, int64_t wn)
{
    fprintf(stderr, "fsdpc kernels/c: k_gemm_widened_16 (m %lld, n %lld, k %lld) given %lld floats of scratch\n",
            (long long)m, (long long)n, (long long)k, (long long)wn);
    abort();
}

/* C (m x n, ldc) = beta C, beta 0 writing exact zeros: a GEMM with k 0 */
static void scale_rows(float *c, int64_t ldc, int64_t m, int64_t n, double beta)
{
    for (int64_t i = 0; i < m; i++)
        scale_c_f32(c + i * ldc, n, beta);
}

void k_gemm_widened_16(float *c, int64_t ldc, const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb,
                       int64_t m, int64_t n, int64_t k, int ta, int tb, double alpha, double beta, int f16, float *w,
                       int64_t wn)
{
    if (m <= 0 || n <= 0)
        return;
    if (k <= 0) {
        scale_rows(c, ldc, m, n, beta);
        return;
    }
    check_dims(m, n, k);
    check_dims(lda, ldb, ldc);
    if (!w || wn < k_gemm_widened_scratch(m, n, k))
        die_scratch(m, n, k, wn);
    /* each block widened as it is stored (op(A) is m x k: stored k x m when ta), cblas_sgemm transposing */
    float *wa = w, *wb = w + (m < BM ? m : BM) * (k < BK ? k : BK);
    for (int64_t i0 = 0; i0 < m; i0 += BM) {
        int64_t bm = m - i0 < BM ? m - i0 : BM;
        for (int64_t k0 = 0; k0 < k; k0 += BK) {
            int64_t bk = k - k0 < BK ? k - k0 : BK;
            if (ta)
                widen(wa, a, lda, k0, i0, bk, bm, f16);
            else
                widen(wa, a, lda, i0, k0, bm, bk, f16);
            for (int64_t j0 = 0; j0 < n; j0 += BN) {
                int64_t bn = n - j0 < BN ? n - j0 : BN;
                if (tb)
                    widen(wb, b, ldb, j0, k0, bn, bk, f16);
                else
                    widen(wb, b, ldb, k0, j0, bk, bn, f16);
                k_gemm_f32(c + i0 * ldc + j0, ldc, wa, ta ? bm : bk, wb, tb ? bk : bn, bm, bn, bk, ta, tb, alpha,
                           k0 ? 1.0 : beta);
            }
        }
    }
}

/* one k_matmul_widened_16: C_i = alpha op(A_i) op(B_i) + beta C_i for i < batch (A_i at a + i sa, ...) */
typedef struct {
    float *c;
    uint16_t *y;              /* k_matmul_add_rows_16: C's tiles rounded into y (16 bits, ld n) as they are done */
    const float *bias, *add;  /* C = bias (each row) + add before the product (k_matmul_add's), tile by tile */
    const uint16_t *a, *b;
    int64_t sa, sb, m, n, k, lda, ldb;
    int64_t tr, tc; /* a tile's rows and columns (the last ones of C may be fewer) */
    int ta, tb, f16;
    double alpha, beta;
} Wide;

/* rows i0.. (bm) x columns k0.. (bk) of op(A_i) widened into w, in A's layout; columns j0.. (bn) x rows k0.. of
 * op(B_i) into w, in B's */
static void widen_a(float *w, const Wide *g, int64_t i, int64_t i0, int64_t bm, int64_t k0, int64_t bk)
{
    if (g->ta)
        widen(w, g->a + i * g->sa, g->lda, k0, i0, bk, bm, g->f16);
    else
        widen(w, g->a + i * g->sa, g->lda, i0, k0, bm, bk, g->f16);
}
static void widen_b(float *w, const Wide *g, int64_t i, int64_t j0, int64_t bn, int64_t k0, int64_t bk)
{
    if (g->tb)
        widen(w, g->b + i * g->sb, g->ldb, j0, k0, bn, bk, g->f16);
    else
        widen(w, g->b + i * g->sb, g->ldb, k0, j0, bk, bn, g->f16);
}

/* the k block k0.. of C_i's tile (i0, j0) from the widened blocks wa, wb: the first block scales C by beta */
static void tile_block(const Wide *g, int64_t i, int64_t i0, int64_t j0, int64_t k0, const float *wa,
                       const float *wb)
{
    const int64_t bm = g->m - i0 < g->tr ? g->m - i0 : g->tr, bn = g->n - j0 < g->tc ? g->n - j0 : g->tc;
    const int64_t bk = g->k - k0 < BK ? g->k - k0 : BK;
    float *c = g->c + i * g->m * g->n + i0 * g->n + j0;
    if (!k0 && (g->bias || g->add)) /* epilogue_c_f32's arithmetic, on this tile */
        for (int64_t r = 0; r < bm; r++) {
            const float *ad = g->add ? g->add + i * g->m * g->n + (i0 + r) * g->n + j0 : NULL;
            for (int64_t j = 0; j < bn; j++) {
                float v = ad ? ad[j] : 0.0f;
                c[r * g->n + j] = g->bias ? v + g->bias[j0 + j] : v;
            }
        }
    k_gemm_f32(c, g->n, wa, g->ta ? bm : bk, wb, g->tb ? bk : bn, bm, bn, bk,
               g->ta, g->tb, g->alpha, k0 ? 1.0 : g->beta);
}

/* One unit: tiles t0..t1 of line `line` of C_i, a line being a row of tiles (rows) or a column of them: k block
 * by k block, the line's block of its shared operand (op(A) for a row) widened once, the other's per tile. */
static void run_unit(const Wide *g, int rows, int64_t i, int64_t line, int64_t t0, int64_t t1, float *w)
{
    float *shared = w, *own = w + TILE * BK;
    const int64_t lt = rows ? g->tr : g->tc, xt = rows ? g->tc : g->tr; /* a line's width, a tile's along it */
    const int64_t l0 = line * lt, ln = (rows ? g->m : g->n) - l0 < lt ? (rows ? g->m : g->n) - l0 : lt;
    for (int64_t k0 = 0; k0 < g->k; k0 += BK) {
        const int64_t bk = g->k - k0 < BK ? g->k - k0 : BK;
        if (rows)
            widen_a(shared, g, i, l0, ln, k0, bk);
        else
            widen_b(shared, g, i, l0, ln, k0, bk);
        for (int64_t t = t0; t < t1; t++) {
            const int64_t x0 = t * xt, xn = (rows ? g->n : g->m) - x0 < xt ? (rows ? g->n : g->m) - x0 : xt;
            if (rows) {
                widen_b(own, g, i, x0, xn, k0, bk);
                tile_block(g, i, l0, x0, k0, shared, own);
            } else {
                widen_a(own, g, i, x0, xn, k0, bk);
                tile_block(g, i, x0, l0, k0, own, shared);
            }
        }
    }
    if (g->y) /* the run's tiles are done: rounded while in cache */
        for (int64_t t = t0; t < t1; t++) {
            const int64_t x0 = t * xt, xn = (rows ? g->n : g->m) - x0 < xt ? (rows ? g->n : g->m) - x0 : xt;
            const int64_t r0 = rows ? l0 : x0, rn = rows ? ln : xn, c0 = rows ? x0 : l0, cn = rows ? xn : ln;
            for (int64_t r = r0; r < r0 + rn; r++) {
                const float *cr = g->c + i * g->m * g->n + r * g->n + c0;
                uint16_t *yr = g->y + i * g->m * g->n + r * g->n + c0;
                if (g->f16)
                    for (int64_t j = 0; j < cn; j++)
                        yr[j] = k_f16_from_f32(cr[j]);
                else
                    for (int64_t j = 0; j < cn; j++)
                        yr[j] = k_bf16_from_f32(cr[j]);
            }
        }
}

/* C's tiling, from the shape alone (never the team, so that every team makes the same sgemm calls): tm x tn
 * tiles of tr x tc, at most TILE x TILE, of equal sizes rounded up to 16 (the last row or column of tiles
 * smaller), and where a batch's C has fewer than MIN_TILES tiles, more of them down to MIN_SIDE on a side
 * (cutting the larger side first): a 128 x 128 weight gradient is 4 tiles, not 1 on one thread of the team. */
static int64_t tile_side(int64_t len, int64_t count)
{
    return ((len + count - 1) / count + 15) / 16 * 16;
}
static void tiles(int64_t batch, int64_t m, int64_t n, int64_t *tm, int64_t *tn, int64_t *tr, int64_t *tc)
{
    int64_t cm = (m + TILE - 1) / TILE, cn = (n + TILE - 1) / TILE;
    while (batch * cm * cn < MIN_TILES) {
        const int64_t r = tile_side(m, cm), c = tile_side(n, cn);
        if (r >= c && r >= 2 * MIN_SIDE)
            cm++;
        else if (c >= 2 * MIN_SIDE)
            cn++;
        else if (r >= 2 * MIN_SIDE)
            cm++;
        else
            break;
    }
    *tr = tile_side(m, cm), *tc = tile_side(n, cn);
    *tm = (m + *tr - 1) / *tr, *tn = (n + *tc - 1) / *tc;
}

/* runs a line of `along` tiles is cut into: 1, or more where `lines` lines are too few units for a team of nt
 * (4 a thread, for balance) */
static int64_t runs_per_line(int64_t lines, int64_t along, int nt)
{
    int64_t s = 1;
    while (nt > 1 && lines * s < 4 * (int64_t)nt && s < along)
        s++;
    return s;
}

/* how a Wide's units split C (`units` of them, unit u: matrix i, line, run): rows of tiles (op(A)'s blocks
 * widened once a run, op(B)'s once a tile) or columns, whichever widens less; g's tiling set here */
typedef struct {
    int rows;
    int64_t lines, along, runs, units;
} Plan;

static Plan plan(Wide *g, int64_t batch, int nt)
{
    int64_t tm, tn;
    tiles(batch, g->m, g->n, &tm, &tn, &g->tr, &g->tc);
    const int64_t m = g->m, n = g->n, k = g->k;
    const int64_t sr = runs_per_line(batch * tm, tn, nt), sc = runs_per_line(batch * tn, tm, nt);
    Plan p;
    p.rows = m * k * sr + k * n * tm <= k * n * sc + m * k * tn;
    p.lines = p.rows ? tm : tn, p.along = p.rows ? tn : tm, p.runs = p.rows ? sr : sc;
    p.units = batch * p.lines * p.runs;
    return p;
}

static void unit(const Wide *g, const Plan *p, int64_t u)
{
    const int64_t i = u / (p->lines * p->runs), line = u / p->runs % p->lines, r = u % p->runs;
    run_unit(g, p->rows, i, line, r * p->along / p->runs, (r + 1) * p->along / p->runs, wide[slot_of_thread()]);
}

/* inside a team that shares (k_share, codegen/team.c): the threads that take units, its first SLOTS (a slot of
 * wide[] each: my_units); 0 elsewhere */
static int team_slots(void)
{
#ifdef _OPENMP
    if (k_sharing && omp_in_parallel())
        return omp_get_num_threads() < SLOTS ? omp_get_num_threads() : SLOTS;
#endif
    return 0;
}

/* this thread's units of p, split as `omp for schedule(static)` over the first SLOTS threads of the team it is in
 * (the tiles' own region, or a team that shares) */
static void my_units(const Wide *g, const Plan *p)
{
#ifdef _OPENMP
    const int64_t nt = omp_get_num_threads() < SLOTS ? omp_get_num_threads() : SLOTS, t = omp_get_thread_num();
#else
    const int64_t nt = 1, t = 0;
#endif
    const int64_t q = p->units / nt, r = p->units % nt;
    const int64_t lo = t >= nt ? p->units : t < r ? t * (q + 1) : r + t * q;
    const int64_t hi = t >= nt ? p->units : lo + (t < r ? q + 1 : q);
    for (int64_t u = lo; u < hi; u++)
        unit(g, p, u);
}

/* C_i = alpha op(A_i) op(B_i) + beta C_i, C preset to bias + add first where either is given (beta 1 then).
 * Inside a team that shares, each thread its units (no fork, no barrier: codegen/team.c places them); the
 * tiling is the shape's, so the bits are those of the own region's. */
static void widened(float *c, const uint16_t *a, const uint16_t *b, const float *bias, const float *add,
                    int64_t batch, int64_t sa, int64_t sb, int64_t m, int64_t n, int64_t k, int ta, int tb,
                    double alpha, double beta, int f16)
{
    if (batch <= 0 || m <= 0 || n <= 0)
        return;
    if (k <= 0) { /* beta is 1 where there is a preset: C = bias + add exactly (one split, so no race in a team) */
        if (bias || add)
            epilogue_c_f32(c, bias, add, batch * m, n);
        else
            scale_c_f32(c, batch * m * n, beta);
        return;
    }
    check_dims(m, n, k);
    if (sb == 0 && !ta && sa == m * k && batch * m <= INT_MAX) /* shared B: one tall GEMM, as k_matmul_f32 */
        m *= batch, batch = 1;
    Wide g = {.c = c, .bias = bias, .add = add, .a = a, .b = b, .sa = sa, .sb = sb, .m = m, .n = n, .k = k,
              .lda = ta ? m : k, .ldb = tb ? k : n, .ta = ta, .tb = tb, .f16 = f16, .alpha = alpha, .beta = beta};
    int64_t tm, tn, tr, tc;
    tiles(batch, m, n, &tm, &tn, &tr, &tc);
    const int team = team_slots(), nt = team ? team : unit_threads(batch * tm * tn, SLOTS);
    const Plan p = plan(&g, batch, nt);
    if (team) {
        my_units(&g, &p);
        return;
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t u = 0; u < p.units; u++)
        unit(&g, &p, u);
}

void k_matmul_widened_16(float *c, const uint16_t *a, const uint16_t *b, int64_t batch, int64_t sa, int64_t sb,
                         int64_t m, int64_t n, int64_t k, int ta, int tb, double alpha, double beta, int f16)
{
    widened(c, a, b, NULL, NULL, batch, sa, sb, m, n, k, ta, tb, alpha, beta, f16);
}

void k_matmul_add_widened_16(float *c, const uint16_t *a, const uint16_t *b, const float *bias, const float *add,
                             double alpha, int64_t batch, int64_t sa, int64_t sb, int64_t m, int64_t n, int64_t k,
                             int ta, int tb, int f16)
{
    widened(c, a, b, bias, add, batch, sa, sb, m, n, k, ta, tb, alpha, bias || add ? 1.0 : 0.0, f16);
}

/* y = round16(bias + add), or 0, over rows [lo, hi): a MatMulAdd stored in 16 bits with k 0 (the preset, a GEMM
 * that adds nothing and k_cast's rounding) */
static void preset_16(void *ctx, int64_t lo, int64_t hi)
{
    const Wide *g = ctx;
    for (int64_t r = lo; r < hi; r++)
        for (int64_t j = 0; j < g->n; j++) {
            float v = g->add ? g->add[r * g->n + j] : 0.0f;
            v = g->bias ? v + g->bias[j] : v;
            g->y[r * g->n + j] = g->f16 ? k_f16_from_f32(v) : k_bf16_from_f32(v);
        }
}

/* the blocks of k_matmul_add_rows_16 on every thread of a team (the call's own region, or the step's that
 * shares), each thread its units of each block (my_units).  A unit's tiles are preset, computed and rounded into
 * y by the one thread, so blocks of one plan (all but a shorter last one) give each thread the same tiles of w
 * and need no barrier between them; a block whose tiling differs waits for the one before it to be done */
static void rows_blocks(const Wide *g0, int64_t wrows, int64_t rows, int nt)
{
    int64_t last = 0; /* the rows of the block before */
    for (int64_t r0 = 0; r0 < rows; r0 += wrows) {
        Wide g = *g0;
        g.y += r0 * g.n, g.a += r0 * g.k, g.add = g.add ? g.add + r0 * g.n : NULL;
        g.m = rows - r0 < wrows ? rows - r0 : wrows;
        const Plan p = plan(&g, 1, nt);
        if (last && last != g.m) {
#pragma omp barrier
        }
        last = g.m;
        my_units(&g, &p);
    }
}

/* k_matmul_add_rows_bf16's widened path: every block's tiles preset, computed and rounded into y in one
 * parallel region (or the step's team's share), where the step made a GEMM, a preset and a cast region a
 * block.  Each element gets the arithmetic of the preset, the GEMM's tile and k_cast. */
void k_matmul_add_rows_16(uint16_t *y, float *w, int64_t wrows, const uint16_t *a, const uint16_t *b,
                          const float *bias, const float *add, double alpha, int64_t rows, int64_t n, int64_t k,
                          int tb, int f16)
{
    if (rows <= 0 || n <= 0)
        return;
    if (wrows <= 0) {
        fprintf(stderr, "fsdpc kernels/c: k_matmul_add_rows_16 given a scratch of %lld rows\n", (long long)wrows);
        abort();
    }
    Wide g = {.c = w, .y = y, .bias = bias, .add = add, .a = a, .b = b, .n = n, .k = k, .lda = k,
              .ldb = tb ? k : n, .tb = tb, .f16 = f16, .alpha = alpha, .beta = bias || add ? 1.0 : 0.0};
    if (k <= 0) { /* y = bias + add (or 0), rounded */
        par_range(preset_16, &g, rows, n);
        return;
    }
    check_dims(wrows, n, k);
    const int team = team_slots();
    if (team) {
        rows_blocks(&g, wrows, rows, team);
        return;
    }
    int64_t tm, tn, tr, tc;
    tiles(1, rows < wrows ? rows : wrows, n, &tm, &tn, &tr, &tc);
    const int nt = unit_threads(tm * tn, SLOTS);
#pragma omp parallel num_threads(nt)
    {
#ifdef _OPENMP
        rows_blocks(&g, wrows, rows, omp_get_num_threads());
#else
        rows_blocks(&g, wrows, rows, 1);
#endif
    }
}

void k_matmul_add_rows_f16(uint16_t *y, float *w, int64_t wrows, const uint16_t *a, const uint16_t *b,
                           const float *bias, const float *add, double alpha, int64_t rows, int64_t n, int64_t k,
                           int tb)
{
    k_matmul_add_rows_16(y, w, wrows, a, b, bias, add, alpha, rows, n, k, tb, 1);
}

void k_matmul_epilogue_f32(float *c, const float *bias, const float *add, int64_t rows, int64_t n)
{
    epilogue_c_f32(c, bias, add, rows, n);
}

void k_matmul_f16(float *c, const uint16_t *a, const uint16_t *b, int64_t batch, int64_t sa, int64_t sb,
                  int64_t m, int64_t n, int64_t k, int ta, int tb, double beta)
{
    k_matmul_widened_16(c, a, b, batch, sa, sb, m, n, k, ta, tb, 1.0, beta, 1);
}

void k_matmul_add_f16(float *c, const uint16_t *a, const uint16_t *b, const float *bias, const float *add,
                      double alpha, int64_t batch, int64_t sa, int64_t sb, int64_t m, int64_t n, int64_t k, int ta,
                      int tb)
{
    k_matmul_add_widened_16(c, a, b, bias, add, alpha, batch, sa, sb, m, n, k, ta, tb, 1);
}
