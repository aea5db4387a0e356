/* conv_dnnl.c — 2-D convolutions (forward, data gradient, weight gradient)
 * on oneDNN's convolution primitives, float32 or with 16-bit inputs.
 *
 * How it works.  k_conv2d_dnnl runs one KConv2d in one direction as a
 * oneDNN convolution on the caller's plain buffers (x, y, dx, dy: nchw;
 * w, dw: oihw, goihw with groups; bias 1-D).  The inputs (x, w, dy) are
 * float32, bfloat16 or float16, the results and the bias float32.  The
 * primitive reads its inputs in bfloat16 where oneDNN computes it natively
 * (k_bf16_isa_native: AVX512-BF16), else in float32: the reorders that stage
 * the operands widen them (exact).  The primitive is created the first time
 * a geometry, direction and dtype are seen and cached (a table searched by
 * value: a ResNet has a few dozen), so a step creates nothing after its
 * first run.  Where the layout is K_CONV_DNNL_BLOCKED the primitive picks its
 * own layouts (format "any": blocked nChw16c-style on AVX-512) and each
 * operand whose layout differs from the plain one is reordered into a
 * staging buffer before the call (inputs) or out of one after it (outputs);
 * with K_CONV_DNNL_PLAIN the primitive works on the plain layouts directly.
 *
 * Memory.  Every primitive runs in oneDNN's user-managed scratchpad mode: its
 * scratchpad and its staging buffers live in one buffer of this file, shared
 * by all the cached primitives (one runs at a time) and grown to the largest
 * need when a primitive is created — k_conv2d_dnnl_bytes says how large; the
 * executable prints it (runtime/rt.c) since the compiler cannot know oneDNN's
 * choice.  Nothing is allocated once every geometry of the step has run.
 *
 * Threads.  Debian's oneDNN is the OpenMP build: a primitive runs on the
 * calling thread's OpenMP team (omp_get_max_threads threads), the team the
 * other kernels and OpenBLAS use.  The cache is guarded by a mutex; the step
 * calls convolutions from one thread.
 *
 * Failures (oneDNN out of memory, an unsupported geometry that the choice
 * should have kept from here) are one line naming the call, then abort: the
 * geometry was checked long before.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

#include "kernels.h"

#if DNNL_CPU_RUNTIME != DNNL_RUNTIME_OMP
#error "fsdpc needs oneDNN's OpenMP build (Debian's libdnnl-dev): its convolutions must run on the kernels' team"
#endif

enum { MAXARG = 5 }; /* fwd: x, w, b, y, scratchpad; bwd_w: x, dy, dw, db, scratchpad */

typedef struct {
    int arg;              /* DNNL_ARG_SRC, ... */
    int out;              /* written by the primitive */
    dnnl_memory_t user;   /* the caller's plain buffer (handle set per call) */
    dnnl_memory_t inner;  /* the primitive's layout, in the shared buffer; NULL: runs on user */
    dnnl_primitive_t re;  /* user -> inner (inputs) or inner -> user (outputs) */
    size_t off;           /* inner's offset in the shared buffer */
} Operand;

typedef struct {
    KConv2d p;
    int dir, layout, bias, dt; /* the key: geometry, K_CONV_*, K_CONV_DNNL_*, bias given, K_DT_* of the inputs */
    dnnl_primitive_t prim;
    Operand op[MAXARG];
    int nop;
    dnnl_memory_t pad;      /* the scratchpad, at offset 0 of the shared buffer; NULL: none */
    size_t need;            /* bytes of the shared buffer it uses */
    char impl[64];          /* oneDNN's implementation name */
} Entry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t engine;
static dnnl_stream_t stream;
static Entry *cache;
static int ncache, capcache;
static char *shared;        /* the scratchpads and staging buffers */
static size_t nshared;

/* a oneDNN status check: one line naming the call, then abort */
static void ok(dnnl_status_t st, const char *what)
{
    if (st != dnnl_success) {
        fprintf(stderr, "fsdpc kernels/c: oneDNN %s failed: %s\n", what, dnnl_status2str(st));
        abort();
    }
}

static void *xrealloc(void *q, size_t n)
{
    void *r = realloc(q, n);
    if (!r) {
        fprintf(stderr, "fsdpc kernels/c: out of memory for oneDNN's convolution cache (%zu bytes)\n", n);
        abort();
    }
    return r;
}

static void start(void)
{
    if (!engine) {
        ok(dnnl_engine_create(&engine, dnnl_cpu, 0), "dnnl_engine_create");
        ok(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags), "dnnl_stream_create");
    }
}

/* plain descriptors of the geometry's tensors; tag any: the primitive's choice */
static void md(dnnl_memory_desc_t *d, int nd, const int64_t *dims, int any, dnnl_format_tag_t plain,
               dnnl_data_type_t dt)
{
    dnnl_dims_t full = {0};  /* the prototype takes a whole dnnl_dims_t */
    memcpy(full, dims, (size_t)nd * sizeof *dims);
    ok(dnnl_memory_desc_init_by_tag(d, nd, full, dt, any ? dnnl_format_tag_any : plain), "memory_desc_init");
}

typedef struct {
    dnnl_memory_desc_t x, w, b, y;
} Descs;

/* the descriptors of direction dir's operands: its inputs (fwd x, w; bwd_x dy, w;
 * bwd_w x, dy) of dtype in, its outputs and the bias float32 */
static void descs(const KConv2d *p, int dir, int any, dnnl_data_type_t in, Descs *d)
{
    const int64_t g = p->groups, xd[4] = {p->n, p->c, p->h, p->w}, yd[4] = {p->n, p->m, p->oh, p->ow};
    const int64_t wd[5] = {g, p->m / g, p->c / g, p->kh, p->kw}, bd[1] = {p->m};
    const dnnl_data_type_t xt = dir == K_CONV_BWD_X ? dnnl_f32 : in, yt = dir == K_CONV_FWD ? dnnl_f32 : in;
    const dnnl_data_type_t wt = dir == K_CONV_BWD_W ? dnnl_f32 : in;
    md(&d->x, 4, xd, any, dnnl_nchw, xt);
    md(&d->y, 4, yd, any, dnnl_nchw, yt);
    if (g == 1)
        md(&d->w, 4, wd + 1, any, dnnl_oihw, wt);
    else
        md(&d->w, 5, wd, any, dnnl_goihw, wt);
    md(&d->b, 1, bd, 0, dnnl_x, dnnl_f32);
}

/* the convolution's op descriptor for direction dir (bias: with one) */
static void op_desc(const KConv2d *p, int dir, int bias, const Descs *d, dnnl_convolution_desc_t *cd)
{
    /* dnnl_dims_t (DNNL_MAX_NDIMS): the prototypes take whole arrays, two entries used */
    const dnnl_dims_t st = {p->sh, p->sw}, di = {p->dh - 1, p->dw - 1}, pl = {p->pt, p->pl}, pr = {p->pb, p->pr};
    const dnnl_alg_kind_t a = dnnl_convolution_direct;
    if (dir == K_CONV_FWD)
        ok(dnnl_dilated_convolution_forward_desc_init(cd, dnnl_forward_training, a, &d->x, &d->w,
                                                      bias ? &d->b : NULL, &d->y, st, di, pl, pr),
           "convolution_forward_desc_init");
    else if (dir == K_CONV_BWD_X)
        ok(dnnl_dilated_convolution_backward_data_desc_init(cd, a, &d->x, &d->w, &d->y, st, di, pl, pr),
           "convolution_backward_data_desc_init");
    else
        ok(dnnl_dilated_convolution_backward_weights_desc_init(cd, a, &d->x, &d->w, bias ? &d->b : NULL, &d->y, st,
                                                               di, pl, pr),
           "convolution_backward_weights_desc_init");
}

/* the primitive descriptor of (p, dir) in user-scratchpad mode, its inputs
 * of dtype in; the backward ones with a forward hint, as oneDNN asks */
static dnnl_primitive_desc_t prim_desc(const KConv2d *p, int dir, int any, int bias, dnnl_data_type_t in)
{
    Descs d, fd;
    dnnl_convolution_desc_t cd, fcd;
    dnnl_primitive_attr_t attr;
    dnnl_primitive_desc_t pd, hint = NULL;
    descs(p, dir, any, in, &d);
    ok(dnnl_primitive_attr_create(&attr), "primitive_attr_create");
    ok(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), "set_scratchpad_mode");
    if (dir != K_CONV_FWD) {
        descs(p, K_CONV_FWD, any, in, &fd);
        op_desc(p, K_CONV_FWD, bias, &fd, &fcd);
        ok(dnnl_primitive_desc_create(&hint, &fcd, NULL, engine, NULL), "primitive_desc_create (forward hint)");
    }
    op_desc(p, dir, bias, &d, &cd);
    ok(dnnl_primitive_desc_create(&pd, &cd, attr, engine, hint), "primitive_desc_create (convolution)");
    if (hint)
        dnnl_primitive_desc_destroy(hint);
    dnnl_primitive_attr_destroy(attr);
    return pd;
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* operand arg of entry e: its plain descriptor `plain`, the primitive's from pd;
 * where they differ, a staging memory at e->need and a reorder */
static void operand(Entry *e, dnnl_primitive_desc_t pd, int arg, int out, const dnnl_memory_desc_t *plain)
{
    Operand *o = &e->op[e->nop++];
    const dnnl_memory_desc_t *want = dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, arg);
    o->arg = arg;
    o->out = out;
    ok(dnnl_memory_create(&o->user, plain, engine, DNNL_MEMORY_NONE), "memory_create");
    if (dnnl_memory_desc_equal(want, plain))
        return;
    dnnl_primitive_desc_t rd;
    o->off = e->need;
    e->need = align64(e->need + dnnl_memory_desc_get_size(want));
    ok(dnnl_memory_create(&o->inner, want, engine, DNNL_MEMORY_NONE), "memory_create");
    ok(dnnl_reorder_primitive_desc_create(&rd, out ? want : plain, engine, out ? plain : want, engine, NULL),
       "reorder_primitive_desc_create");
    ok(dnnl_primitive_create(&o->re, rd), "primitive_create (reorder)");
    dnnl_primitive_desc_destroy(rd);
}

/* oneDNN's dtype of the inputs of dtype dt (K_DT_*) */
static dnnl_data_type_t user_dt(int dt) { return dt == K_DT_BF16 ? dnnl_bf16 : dt == K_DT_F16 ? dnnl_f16 : dnnl_f32; }

/* the dtype the primitive reads its inputs in: bfloat16 where oneDNN computes
 * it natively (k_bf16_isa_native, as the GEMMs), else float32, the operands
 * widened by their reorders (exact) */
static dnnl_data_type_t compute_dt(int dt)
{
    return dt == K_DT_BF16 && k_bf16_isa_native((unsigned)dnnl_get_effective_cpu_isa()) ? dnnl_bf16 : dnnl_f32;
}

/* a new cache entry for (p, dir, layout, bias, dt) */
static void build(Entry *e)
{
    const int any = e->layout == K_CONV_DNNL_BLOCKED;
    Descs d;
    const char *impl = NULL;
    dnnl_primitive_desc_t pd = prim_desc(&e->p, e->dir, any, e->bias, compute_dt(e->dt));
    descs(&e->p, e->dir, 0, user_dt(e->dt), &d);
    const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    e->need = align64(sp ? dnnl_memory_desc_get_size(sp) : 0);
    if (e->need)
        ok(dnnl_memory_create(&e->pad, sp, engine, DNNL_MEMORY_NONE), "memory_create (scratchpad)");
    if (e->dir == K_CONV_FWD) {
        operand(e, pd, DNNL_ARG_SRC, 0, &d.x);
        operand(e, pd, DNNL_ARG_WEIGHTS, 0, &d.w);
        if (e->bias)
            operand(e, pd, DNNL_ARG_BIAS, 0, &d.b);
        operand(e, pd, DNNL_ARG_DST, 1, &d.y);
    } else if (e->dir == K_CONV_BWD_X) {
        operand(e, pd, DNNL_ARG_DIFF_DST, 0, &d.y);
        operand(e, pd, DNNL_ARG_WEIGHTS, 0, &d.w);
        operand(e, pd, DNNL_ARG_DIFF_SRC, 1, &d.x);
    } else {
        operand(e, pd, DNNL_ARG_SRC, 0, &d.x);
        operand(e, pd, DNNL_ARG_DIFF_DST, 0, &d.y);
        operand(e, pd, DNNL_ARG_DIFF_WEIGHTS, 1, &d.w);
        if (e->bias)
            operand(e, pd, DNNL_ARG_DIFF_BIAS, 1, &d.b);
    }
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    snprintf(e->impl, sizeof e->impl, "%s", impl ? impl : "?");
    ok(dnnl_primitive_create(&e->prim, pd), "primitive_create (convolution)");
    dnnl_primitive_desc_destroy(pd);
    if (e->need > nshared) {
        free(shared);
        shared = aligned_alloc(64, e->need);
        if (!shared) {
            fprintf(stderr, "fsdpc kernels/c: out of memory for oneDNN's convolution buffer (%zu bytes)\n", e->need);
            abort();
        }
        nshared = e->need;
    }
}

/* the cached entry of the key, built on first use (under lock) */
static Entry *entry(const KConv2d *p, int dir, int layout, int bias, int dt)
{
    for (int i = 0; i < ncache; i++) {
        Entry *e = &cache[i];
        if (e->dir == dir && e->layout == layout && e->bias == bias && e->dt == dt && !memcmp(&e->p, p, sizeof *p))
            return e;
    }
    if (ncache == capcache) {
        capcache = capcache ? 2 * capcache : 32;
        cache = xrealloc(cache, (size_t)capcache * sizeof *cache);
    }
    Entry *e = &cache[ncache];
    memset(e, 0, sizeof *e);
    e->p = *p;
    e->dir = dir;
    e->layout = layout;
    e->bias = bias;
    e->dt = dt;
    start();
    build(e);
    ncache++;
    return e;
}

static void run_reorder(dnnl_primitive_t re, dnnl_memory_t from, dnnl_memory_t to)
{
    dnnl_exec_arg_t a[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    ok(dnnl_primitive_execute(re, stream, 2, a), "reorder execute");
}

/* runs e on the buffers ptr[i] (e->op's order) */
static void execute(Entry *e, void *const *ptr)
{
    dnnl_exec_arg_t a[MAXARG + 1];
    int na = 0;
    for (int i = 0; i < e->nop; i++) {
        Operand *o = &e->op[i];
        ok(dnnl_memory_set_data_handle(o->user, ptr[i]), "memory_set_data_handle");
        if (o->inner) {
            ok(dnnl_memory_set_data_handle(o->inner, shared + o->off), "memory_set_data_handle");
            if (!o->out)
                run_reorder(o->re, o->user, o->inner);
        }
        a[na++] = (dnnl_exec_arg_t){o->arg, o->inner ? o->inner : o->user};
    }
    if (e->pad) {
        ok(dnnl_memory_set_data_handle(e->pad, shared), "memory_set_data_handle");
        a[na++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, e->pad};
    }
    ok(dnnl_primitive_execute(e->prim, stream, na, a), "convolution execute");
    for (int i = 0; i < e->nop; i++)
        if (e->op[i].inner && e->op[i].out)
            run_reorder(e->op[i].re, e->op[i].inner, e->op[i].user);
    ok(dnnl_stream_wait(stream), "stream_wait");
}

void k_conv2d_dnnl(const KConv2d *p, int dir, int layout, int dt, float *out, const void *a, const void *b,
                   const float *bias, float *db)
{
    /* the operands in build()'s order: fwd x, w, [b], y; bwd_x dy, w, dx; bwd_w x, dy, dw, [db] */
    void *ptr[4] = {(void *)a, (void *)b, out, db};
    if (dir == K_CONV_FWD && bias) {
        ptr[2] = (void *)bias;
        ptr[3] = out;
    }
    pthread_mutex_lock(&lock);
    execute(entry(p, dir, layout, dir == K_CONV_FWD ? bias != NULL : dir == K_CONV_BWD_W && db != NULL, dt), ptr);
    pthread_mutex_unlock(&lock);
}

int64_t k_conv2d_dnnl_bytes(void)
{
    pthread_mutex_lock(&lock);
    int64_t n = (int64_t)nshared;
    pthread_mutex_unlock(&lock);
    return n;
}

const char *k_conv2d_dnnl_impl(const KConv2d *p, int dir, int layout, int bias, int dt)
{
    pthread_mutex_lock(&lock);
    const char *s = entry(p, dir, layout, bias, dt)->impl;
    pthread_mutex_unlock(&lock);
    return s;
}

/* ---- the choice --------------------------------------------------------- */

/* FSDPC_CONV: "im2col" (conv.c's path everywhere), "onednn" (oneDNN's
 * blocked primitives everywhere it is allowed), else the measured rule;
 * read once */
static int forced(void)
{
    static _Atomic int mode = -2; /* -2: unread, -1: the rule, 0: im2col, 1: onednn */
    if (mode == -2) {
        const char *s = getenv("FSDPC_CONV");
        mode = s && !strcmp(s, "im2col") ? 0 : s && !strcmp(s, "onednn") ? 1 : -1;
    }
    return mode;
}

/* oneDNN has jitted convolutions here: AVX2 or above (its effective ISA, capped by DNNL_MAX_CPU_ISA) */
static int jitted(void)
{
    static _Atomic int yes = -1;
    if (yes < 0)
        yes = ((unsigned)dnnl_get_effective_cpu_isa() & (unsigned)dnnl_cpu_isa_avx2) == (unsigned)dnnl_cpu_isa_avx2;
    return yes;
}

/* The measured rule (bench/conv_dnnl.c: ResNet-18's convolutions at 112^2,
 * batch 8, 1 thread; Zen 4 at oneDNN's AVX-512 (bf16 and without) and AVX2
 * ISAs), oneDNN's blocked layouts with their reorders counted against
 * im2col + OpenBLAS: 3x3 and larger kernels win in every direction (the
 * forward and data gradient by 1.2-2.3x, depthwise by 3-10x) except
 *  - the data gradient where x has few channels per group (the stem's 3:
 *    oneDNN's blocked dx is 3x slower there; a network input's dx is rarely
 *    asked for anyway),
 *  - the weight gradient on small output planes (7x7 and below: 512 x 512 x
 *    3x3 on 4x4 is 1.2-1.5x slower; 7x7 a tie at AVX-512, 1.1x slower at
 *    AVX2);
 * 1x1 kernels are a GEMM already, and the reorders cost about what the
 * primitive saves (0.5-2x either way by shape and ISA): they stay. */
static int rule(const KConv2d *p, int dir)
{
    const int64_t cg = p->c / p->groups, mg = p->m / p->groups;
    if (cg == 1 && mg == 1)
        return 1; /* depthwise */
    if (p->kh == 1 && p->kw == 1)
        return 0;
    if (dir == K_CONV_BWD_X)
        return cg >= 16;
    if (dir == K_CONV_BWD_W)
        return p->oh * p->ow >= 64;
    return 1;
}

int k_conv2d_dnnl_layout(const KConv2d *p, int dir)
{
    const int f = forced();
    if (f == 0 || !jitted() || p->n <= 0 || p->c <= 0 || p->m <= 0 || p->oh <= 0 || p->ow <= 0)
        return -1;
    return f == 1 || rule(p, dir) ? K_CONV_DNNL_BLOCKED : -1;
}
