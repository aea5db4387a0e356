/* walk.h — private helpers shared by the kernels/c sources (not installed,
 * not for callers of kernels.h).
 *
 * A Walk describes a strided index space: a list of dims, each with a length
 * and the element stride of up to three operands (a, b, c) along it.
 * walk_push drops size-1 dims and merges a dim into the previous one when
 * that one steps exactly over it in every operand, so [2,3,4] + [2,3,4]
 * becomes one flat dim of 24 and [2,3,4] + [4] becomes [6, 4] (b strides 0,
 * 1): the common cases collapse to a rank-1 or rank-2 walk.  Kernels then
 * pop the innermost dim, run it with a tight loop specialised on its
 * strides, and advance the outer dims like an odometer (walk_next).  A Walk
 * can be started at any linear position (walk_seek), which is how kernels
 * split their output across OpenMP threads (par_range).  Inside the step's
 * team that shares (k_share, codegen/team.c) par_range, team_share,
 * K_PAR_FOR, attn_share and par_sum give each thread its share with no fork.
 *
 * Everything here is static inline so a source that does not use a helper
 * does not warn; KFN(name) pastes the dtype suffix S onto a name for the
 * *_impl.h bodies that each source includes once per dtype.
 */
#ifndef FSDPC_KERNELS_WALK_H
#define FSDPC_KERNELS_WALK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#define KCAT_(a, b) a##_##b
#define KCAT(a, b) KCAT_(a, b)
#define KFN(name) KCAT(name, S)

/* Most dims a Walk holds after merging; ONNX models in practice stay <= 8. */
#define K_MAX_RANK 16
/* Columns reduced at once with double accumulators on the stack. */
#define K_TILE 256
/* Lanes of a row's sums in its own type (LayerNorm, softmax): 16 floats, one
 * AVX-512 register (two AVX2 ones); combined in double at the end. */
#define K_LANES 16
/* A softmax row's block: its max and exp sum are taken from cache. */
#define K_SM_BLOCK 512

/* Internal bug (a caller broke a kernel's contract): say so and abort, also
 * in release builds, rather than write out of bounds. */
static inline void die(const char *msg)
{
    fprintf(stderr, "fsdpc kernels/c: %s\n", msg);
    abort();
}

typedef struct {
    int rank;
    int64_t shape[K_MAX_RANK];
    int64_t sa[K_MAX_RANK], sb[K_MAX_RANK], sc[K_MAX_RANK];  /* operand strides */
    int64_t idx[K_MAX_RANK];
    int64_t oa, ob, oc;  /* offsets of the current index */
} Walk;

/* Appends dim (n, sa, sb, sc) as the new innermost dim, merging it into the
 * previous one when that one steps exactly over n of these in all operands. */
static inline void walk_push3(Walk *w, int64_t n, int64_t sa, int64_t sb, int64_t sc)
{
    int r = w->rank;
    if (n == 1)
        return;
    if (r > 0 && w->sa[r - 1] == sa * n && w->sb[r - 1] == sb * n && w->sc[r - 1] == sc * n) {
        w->shape[r - 1] *= n;
        w->sa[r - 1] = sa;
        w->sb[r - 1] = sb;
        w->sc[r - 1] = sc;
        return;
    }
    if (r == K_MAX_RANK)
        die("rank above 16 after merging dims");
    w->shape[r] = n;
    w->sa[r] = sa;
    w->sb[r] = sb;
    w->sc[r] = sc;
    w->rank = r + 1;
}

static inline void walk_push(Walk *w, int64_t n, int64_t sa, int64_t sb)
{
    walk_push3(w, n, sa, sb, 0);
}

/* Removes the innermost dim and returns its length and strides; an empty
 * walk yields a single element (length 1, strides 0). */
static inline int64_t walk_pop3(Walk *w, int64_t *sa, int64_t *sb, int64_t *sc)
{
    if (w->rank == 0) {
        *sa = *sb = *sc = 0;
        return 1;
    }
    w->rank--;
    *sa = w->sa[w->rank];
    *sb = w->sb[w->rank];
    *sc = w->sc[w->rank];
    return w->shape[w->rank];
}

static inline int64_t walk_pop(Walk *w, int64_t *sa, int64_t *sb)
{
    int64_t sc;
    return walk_pop3(w, sa, sb, &sc);
}

/* Removes dim d, returning its length and its a, b strides. */
static inline int64_t walk_remove(Walk *w, int d, int64_t *sa, int64_t *sb)
{
    int64_t n = w->shape[d];
    *sa = w->sa[d];
    *sb = w->sb[d];
    w->rank--;
    for (int e = d; e < w->rank; e++) {
        w->shape[e] = w->shape[e + 1];
        w->sa[e] = w->sa[e + 1];
        w->sb[e] = w->sb[e + 1];
        w->sc[e] = w->sc[e + 1];
    }
    return n;
}

/* The dim whose stride in operand a is sa, or -1. */
static inline int walk_find_a(const Walk *w, int64_t sa)
{
    for (int d = 0; d < w->rank; d++)
        if (w->sa[d] == sa)
            return d;
    return -1;
}

/* Positions the walk at linear (row-major) index pos. */
static inline void walk_seek(Walk *w, int64_t pos)
{
    w->oa = w->ob = w->oc = 0;
    for (int d = w->rank - 1; d >= 0; d--) {
        w->idx[d] = pos % w->shape[d];
        pos /= w->shape[d];
        w->oa += w->idx[d] * w->sa[d];
        w->ob += w->idx[d] * w->sb[d];
        w->oc += w->idx[d] * w->sc[d];
    }
}

/* Advances one step; returns 0 when it wrapped back to the start. */
static inline int walk_next(Walk *w)
{
    for (int d = w->rank - 1; d >= 0; d--) {
        w->oa += w->sa[d];
        w->ob += w->sb[d];
        w->oc += w->sc[d];
        if (++w->idx[d] < w->shape[d])
            return 1;
        w->oa -= w->sa[d] * w->shape[d];
        w->ob -= w->sb[d] * w->shape[d];
        w->oc -= w->sc[d] * w->shape[d];
        w->idx[d] = 0;
    }
    return 0;
}

static inline int64_t numel(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < rank; d++)
        n *= shape[d];
    return n;
}

/* Dense row-major stride of dim d. */
static inline int64_t dense_stride(int rank, const int64_t *shape, int d)
{
    return numel(rank - d - 1, shape + d + 1);
}

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* set by k_share (copy.c): this thread is one of a team the generated step runs a run of nodes in */
extern _Thread_local int k_sharing;

/* Inside a team that shares (k_share): 1, and this thread's share [lo, hi) of total units (each unit_elems
 * elements; all of them thread 0's where the total is under K_PAR_MIN), each share a multiple of align units
 * but the last; elsewhere 0.  par_range's split, and a GEMM's rows (matmul_impl.h) */
static inline int team_share(int64_t total, int64_t unit_elems, int64_t align, int64_t *lo, int64_t *hi)
{
#ifdef _OPENMP
    if (k_sharing && omp_in_parallel()) {
        int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
        if (total * unit_elems < K_PAR_MIN)
            nt = 1;
        int64_t chunk = ((total + nt - 1) / nt + align - 1) / align * align;
        *lo = min64(t * chunk, total), *hi = min64(*lo + chunk, total);
        return 1;
    }
#else
    (void)total, (void)unit_elems, (void)align;
#endif
    *lo = *hi = 0;
    return 0;
}

/* A loop `for (int64_t i = 0; i < n; i++) body` of independent iterations: outside a team that shares, its own
 * region where n is K_PAR_MIN or more (`omp parallel for schedule(static)`); inside one (k_share), an orphaned
 * `omp for schedule(static) nowait` of the team, the same split as that region's on as many threads (so the
 * same bits), or thread 0 alone where n is under K_PAR_MIN (as the region would not have split it).  No barrier
 * at the end: the caller (the step's run, codegen/team.c) places them. */
static inline int par_loop_split(int64_t n)
{
#ifdef _OPENMP
    return k_sharing && omp_in_parallel() ? (n >= K_PAR_MIN ? 1 : omp_get_thread_num() == 0 ? 0 : -1) : 0;
#else
    (void)n;
    return 0;
#endif
}
#define K_PAR_FOR(n, body)                                                                 \
    do {                                                                                   \
        const int split_ = par_loop_split(n);                                              \
        if (split_ > 0) {                                                                  \
            _Pragma("omp for schedule(static) nowait")                                     \
            for (int64_t i = 0; i < (n); i++) body;                                        \
        } else if (split_ == 0) {                                                          \
            _Pragma("omp parallel for schedule(static) if ((n) >= K_PAR_MIN)")             \
            for (int64_t i = 0; i < (n); i++) body;                                        \
        }                                                                                  \
    } while (0)

/* Runs f(ctx, lo, hi) over work units [0, total), split across threads when
 * the elements touched (unit_elems per unit) make a thread team pay.  Inside
 * a team that shares (k_share), each thread runs its own share (thread 0 all
 * of a small range) with no fork and no barrier: the caller calls it on
 * every thread of the team and places the barriers. */
static inline void par_range(void (*f)(void *, int64_t, int64_t), void *ctx,
                             int64_t total, int64_t unit_elems)
{
#ifdef _OPENMP
    int64_t mine_lo, mine_hi;
    if (team_share(total, unit_elems, 1, &mine_lo, &mine_hi)) {
        if (mine_lo < mine_hi)
            f(ctx, mine_lo, mine_hi);
        return;
    }
    if (total * unit_elems >= K_PAR_MIN && total > 1 && omp_get_max_threads() > 1 &&
        !omp_in_parallel()) {
#pragma omp parallel
        {
            int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
            int64_t chunk = (total + nt - 1) / nt;
            int64_t lo = min64(t * chunk, total), hi = min64(lo + chunk, total);
            if (lo < hi)
                f(ctx, lo, hi);
        }
        return;
    }
#else
    (void)unit_elems;
#endif
    f(ctx, 0, total);
}

/* The team for n units of work with a scratch slot per thread: at most
 * `slots` threads, never more than the units; 1 inside a team. */
static inline int slot_threads(int64_t n, int slots)
{
#ifdef _OPENMP
    int t = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (t > slots)
        t = slots;
    return n < t ? (int)(n < 1 ? 1 : n) : t;
#else
    (void)n, (void)slots;
    return 1;
#endif
}
/* this thread's slot in such a team */
static inline int slot_of_thread(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}
/* The team for n units of work with a slot each, at most slots threads (the fused attention: attn.c, attn_bf16.c,
 * K_ATTN_SLOTS; the widened GEMMs' tiles: matmul.c).  Never 1 where the
 * kernels' team has 2 or more, even for one unit (the second thread idles): inside an active region OpenBLAS runs
 * each of the tiles' GEMMs on one thread, as on a team of one, so the bits do not depend on the team (OpenBLAS's
 * Haswell kernels, which OPENBLAS_CORETYPE=Haswell selects on some machines of this project's kind, sum
 * differently on several threads: a lone unit's GEMMs on OpenBLAS's threads gave other bits than on one).  A
 * thread without a unit touches no slot. */
static inline int unit_threads(int64_t n, int slots)
{
    int t = slot_threads(n, slots);
#ifdef _OPENMP
    if (t < 2 && !omp_in_parallel() && omp_get_max_threads() > 1)
        t = 2;
#endif
    return t;
}
static inline int attn_threads(int64_t n) { return unit_threads(n, K_ATTN_SLOTS); }
/* Inside a team that shares (k_share): 1, and this thread's units [lo, hi) of n for the fused attention, split as
 * `omp for schedule(static)` splits them over the team's first K_ATTN_SLOTS threads (a slot each; a thread
 * without a unit touches none); elsewhere 0.  A unit's arithmetic does not depend on its thread, nor on the
 * split (attn.c): the bits of the kernel's own region.  Its GEMMs run on the calling thread there as here. */
static inline int attn_share(int64_t n, int64_t *lo, int64_t *hi)
{
#ifdef _OPENMP
    if (k_sharing && omp_in_parallel()) {
        const int64_t nt = omp_get_num_threads() < K_ATTN_SLOTS ? omp_get_num_threads() : K_ATTN_SLOTS;
        const int64_t t = omp_get_thread_num(), q = n / nt, r = n % nt;
        *lo = t >= nt ? n : t < r ? t * (q + 1) : r + t * q;
        *hi = t >= nt ? n : *lo + (t < r ? q + 1 : q);
        return 1;
    }
#else
    (void)n;
#endif
    *lo = *hi = 0;
    return 0;
}

/* Where a kernel inside a team that shares writes a single value every thread computed alike (a sum's result,
 * par_sum's): the first thread alone writes it; 1 outside such a team */
static inline int team_writer(void)
{
#ifdef _OPENMP
    return !(k_sharing && omp_in_parallel()) || omp_get_thread_num() == 0;
#else
    return 1;
#endif
}

/* Blocks of a deterministic sum. */
#define K_SUM_BLOCKS 64

/* The sum over units [0, total) of f(ctx, lo, hi), each call a double sum over its units: K_SUM_BLOCKS
 * blocks whose bounds depend on total only, split across threads when the elements touched (unit_elems per
 * unit) make a team pay, then added in block order, so the result does not depend on the thread count.  Inside
 * a team that shares, its threads take the blocks (through a static array: two barriers) and each returns the
 * sum. */
static inline double par_sum(double (*f)(const void *, int64_t, int64_t), const void *ctx, int64_t total,
                             int64_t unit_elems)
{
    double part[K_SUM_BLOCKS], s = 0;
    const int64_t block = (total + K_SUM_BLOCKS - 1) / K_SUM_BLOCKS;
#ifdef _OPENMP
    if (k_sharing && omp_in_parallel()) { /* inside a team that shares: its threads take the blocks */
        static double team_part[K_SUM_BLOCKS]; /* one team at a time shares (the step's run) */
#pragma omp for schedule(static)
        for (int k = 0; k < K_SUM_BLOCKS; k++)
            team_part[k] = f(ctx, min64(total, k * block), min64(total, (k + 1) * block));
        for (int k = 0; k < K_SUM_BLOCKS; k++) /* every thread the same sum, in block order */
            s += team_part[k];
#pragma omp barrier
        return s;
    }
#endif
#pragma omp parallel for schedule(static) if (total * unit_elems >= K_PAR_MIN)
    for (int k = 0; k < K_SUM_BLOCKS; k++)
        part[k] = f(ctx, min64(total, k * block), min64(total, (k + 1) * block));
    for (int k = 0; k < K_SUM_BLOCKS; k++)
        s += part[k];
    return s;
}

#endif
