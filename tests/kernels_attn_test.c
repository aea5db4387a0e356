/* kernels_attn_test.c — checks kernels/c's fused attention (attn.c,
 * attn_bf16.c: passes/attention.c's FusedAttention) and its backward:
 * float32 and float64 against naive loops (one row at a time, straight from
 * the definition) and float64 central finite differences of the float64
 * forward (ktest.h); the bfloat16 / float16 kernels of --precision bf16 /
 * fp16 against float64 loops on the same rounded q, kt, v, within the 16-bit
 * roundings and not closer, and the same bits from 1 thread as from the
 * team; the causal band computed (K_ATTN_CAUSAL) bit for bit as the same
 * band given as a bias; grouped-query attention (kvrep: query problem b reading
 * K/V problem b / kvrep) in every precision, the K/V gradients summed over their
 * query problems in one order (1 thread = a team of 4, bit for bit); the heads
 * layout (q, k, v, y and their gradients read and written in the projections'
 * [B, t, H, d]) bit for bit as the dense one, and q, k, v read out of one packed
 * tensor and dq, dk, dv written into one (KAttnLd's row strides) bit for bit as
 * the heads layout's separate tensors.
 */
#include "ktest.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* ---- fused attention ---------------------------------------------------- */

typedef struct {
    int64_t batch, t, s, d, dv, nbias, brep, kvrep;
    int flags;
    double scale, *ws, *lse;
} AttnCtx;

/* y (batch t dv) of the FD forward: in = q, kt, v, bias (NULL: none) */
static void attn_fwd(void *ctx, double *const *in, double *y)
{
    const AttnCtx *c = ctx;
    k_attention_f64(y, c->lse, in[0], in[1], c->flags, in[2], in[3], c->batch, c->t, c->s, c->d, c->dv, c->nbias,
                    c->brep, c->kvrep, 0, c->scale, 0.0, 0, 0, 0, c->ws, NULL);
}

/* The outputs of k_attention and k_attention_grad (y, lse, dq, dkt, dval, dbias: already computed by the caller on
 * the inputs put in q .. dy) the same bits from 1 thread as from a team of 4: the backward's K/V problems sum their
 * query problems' dkt, dval (and dbias) in one order.  dbias NULL: none wanted. */
static void attn_threads_check(int dt, Buf *q, Buf *kt, Buf *v, Buf *bias, Buf *dy, Buf *y, Buf *lse, Buf *dq, Buf *dkt,
                               Buf *dval, Buf *dbias, int64_t batch, int64_t t, int64_t s, int64_t d, int64_t dv,
                               int64_t nbias, int64_t brep, int64_t kvrep, int flags, Buf *ws)
{
#ifdef _OPENMP
    const size_t es = dt == F32 ? sizeof(float) : sizeof(double);
    Buf *out[6] = {y, lse, dq, dkt, dval, dbias};
    void *team[6];
    static const char *const part[] = {"y", "lse", "dq", "dkt", "dval", "dbias"};
    const double scale = 1 / sqrt((double)d);
    for (int run = 0; run < 2; run++) {
        const int before = ktest_team(run ? 1 : 4);
        KCALL(k_attention, vp(dt, y), vp(dt, lse), vp(dt, q), vp(dt, kt), flags, vp(dt, v), bias ? vp(dt, bias) : NULL,
              batch, t, s, d, dv, nbias, brep, kvrep, 0, scale, 0.0, 0, 0, 0, vp(dt, ws), NULL);
        KCALL(k_attention_grad, vp(dt, dq), vp(dt, dkt), vp(dt, dval), bias ? vp(dt, dbias) : NULL, vp(dt, dy),
              vp(dt, q), vp(dt, kt), flags, vp(dt, v), bias ? vp(dt, bias) : NULL, vp(dt, y), vp(dt, lse), batch, t, s,
              d, dv, nbias, brep, kvrep, 0, scale, 0.0, 0, 0, 0, vp(dt, ws), NULL);
        ktest_team(before);
        for (int k = 0; k < 6; k++) {
            const size_t n = (size_t)(k == 5 && !bias ? 0 : out[k]->n) * es;
            if (!run) {
                team[k] = xalloc(n + 1, 1);
                memcpy(team[k], vp(dt, out[k]), n);
                continue;
            }
            CTX("k_attention %s on 1 thread and on 4: batch %lld t %lld s %lld kvrep %lld flags %d", part[k],
                (long long)batch, (long long)t, (long long)s, (long long)kvrep, flags);
            check_bytes(dt, vp(dt, out[k]), team[k], n);
            free(team[k]);
        }
    }
#else
    (void)dt, (void)q, (void)kt, (void)v, (void)bias, (void)dy, (void)y, (void)lse, (void)dq, (void)dkt, (void)dval;
    (void)dbias, (void)batch, (void)t, (void)s, (void)d, (void)dv, (void)nbias, (void)brep, (void)kvrep, (void)flags;
    (void)ws;
#endif
}

/* bias kinds: 0 none, 1 causal (0 / -inf, the diagonal offset s - t), 2 random
 * with -inf entries and one row all -inf (its y row is NaN, or 0 with K_ATTN_ZERO:
 * then it stays for the backward, whose gradients there are 0); flags: K_ATTN_KROW
 * (the keys as rows, s x d, instead of transposed, d x s), K_ATTN_ZERO.  With a
 * bias its gradient dbias too, by finite differences like the others.  kvrep: batch
 * / kvrep K/V problems, problem b reading b / kvrep (grouped-query attention; the
 * finite differences of a shared K/V sum its query problems' gradients); then also
 * the same bits from 1 thread as from a team of 4. */
static void attn_case(int dt, int64_t batch, int64_t t, int64_t s, int64_t d, int64_t dv, int kind, int64_t nbias,
                      int64_t brep, int64_t kvrep, int flags)
{
    const int krow = flags & K_ATTN_KROW, zero = (flags & K_ATTN_ZERO) != 0;
    const double scale = 1 / sqrt((double)d);
    const int64_t nkv = batch / kvrep;
    Buf q = buf_new(batch * t * d), kt = buf_new(nkv * d * s), v = buf_new(nkv * s * dv);
    Buf bias = buf_new(kind ? nbias * t * s : 1), y = buf_new(batch * t * dv), lse = buf_new(batch * t);
    Buf want = buf_new(batch * t * dv), wlse = buf_new(batch * t), w = buf_new(batch * t * dv);
    Buf dq = buf_new(batch * t * d), dkt = buf_new(nkv * d * s), dval = buf_new(nkv * s * dv);
    Buf ws = buf_new(k_attention_workspace(batch, t, s)), dbias = buf_new(kind ? nbias * t * s : 1);
    fill_rnd(&q, -2, 2), fill_rnd(&kt, -2, 2), fill_rnd(&v, -1, 1), fill_rnd(&w, -1, 1);
    for (int64_t i = 0; i < bias.n && kind; i++) {
        const int64_t r = i / s % t, j = i % s;
        bias.d[i] = kind == 1 ? (j > r + s - t ? -INFINITY : 0) : rnd(0, 1) < 0.3 ? -INFINITY : rnd(-1, 1);
    }
    if (kind == 2)
        for (int64_t j = 0; j < s; j++)
            bias.d[(t / 2) * s + j] = -INFINITY; /* row t/2 of bias 0 masks everything */
    for (int64_t b = 0; b < batch; b++)
        for (int64_t i = 0; i < t; i++) {
            double sc[512], mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < s; j++) {
                double a = 0;
                for (int64_t k = 0; k < d; k++)
                    a += q.d[(b * t + i) * d + k] * kt.d[b / kvrep * d * s + (krow ? j * d + k : k * s + j)];
                sc[j] = scale * a + (kind ? bias.d[(b / brep % nbias) * t * s + i * s + j] : 0);
                mx = fmax(mx, sc[j]);
            }
            for (int64_t j = 0; j < s; j++)
                sum += exp(sc[j] - mx);
            wlse.d[b * t + i] = mx == -INFINITY ? (zero ? -INFINITY : NAN) : mx + log(sum);
            for (int64_t c = 0; c < dv; c++) {
                double a = 0;
                for (int64_t j = 0; j < s; j++)
                    a += exp(sc[j] - mx) / sum * v.d[b / kvrep * s * dv + j * dv + c];
                want.d[(b * t + i) * dv + c] = mx == -INFINITY ? (zero ? 0 : NAN) : a;
            }
        }
    PUT(&q, &kt, &v, &bias, &w);
    const void *bp = kind ? V(bias) : NULL;
    CTX("k_attention batch %lld t %lld s %lld d %lld dv %lld bias %d kvrep %lld flags %d", (long long)batch,
        (long long)t, (long long)s, (long long)d, (long long)dv, kind, (long long)kvrep, flags);
    KCALL(k_attention, V(y), V(lse), V(q), V(kt), flags, V(v), bp, batch, t, s, d, dv, nbias, brep, kvrep, 0, scale, 0.0, 0, 0, 0,
          V(ws), NULL);
    GET(&y, &lse);
    check(dt, y.d, want.d, y.n, tol(dt));
    for (int64_t i = 0; i < lse.n; i++) /* an all -inf row: NaN, as its softmax (or -inf, exactly) */
        if (isnan(wlse.d[i]) || (zero && wlse.d[i] == -INFINITY)) {
            checks++;
            if (!(zero ? lse.d[i] == -INFINITY : isnan(lse.d[i])))
                failures++, printf("FAIL %s: lse[%lld] = %g\n", what, (long long)i, lse.d[i]);
            lse.d[i] = wlse.d[i] = 0;
        }
    check(dt, lse.d, wlse.d, lse.n, tol(dt));
    if (kind == 2 && !zero) /* the rest is finite differences around finite values */
        for (int64_t j = 0; j < s; j++)
            bias.d[(t / 2) * s + j] = 0, put(dt, &bias);
    KCALL(k_attention, V(y), V(lse), V(q), V(kt), flags, V(v), bp, batch, t, s, d, dv, nbias, brep, kvrep, 0, scale, 0.0, 0, 0, 0,
          V(ws), NULL);
    KCALL(k_attention_grad, V(dq), V(dkt), V(dval), kind ? V(dbias) : NULL, V(w), V(q), V(kt), flags, V(v), bp, V(y),
          V(lse), batch, t, s, d, dv, nbias, brep, kvrep, 0, scale, 0.0, 0, 0, 0, V(ws), NULL);
    if (kvrep > 1)
        attn_threads_check(dt, &q, &kt, &v, kind ? &bias : NULL, &w, &y, &lse, &dq, &dkt, &dval, &dbias, batch, t, s,
                           d, dv, nbias, brep, kvrep, flags, &ws);
    GET(&dq, &dkt, &dval, &dbias);
    AttnCtx c = {batch, t, s, d, dv, nbias, brep, kvrep, flags, scale, ws.d, lse.d};
    double *in[4] = {q.d, kt.d, v.d, kind ? bias.d : NULL};
    CTX("k_attention_grad dq, batch %lld t %lld s %lld bias %d", (long long)batch, (long long)t, (long long)s, kind);
    check_fd(dt, attn_fwd, &c, in, 0, q.n, w.d, y.n, dq.d);
    CTX("k_attention_grad dkt, batch %lld t %lld s %lld bias %d", (long long)batch, (long long)t, (long long)s, kind);
    check_fd(dt, attn_fwd, &c, in, 1, kt.n, w.d, y.n, dkt.d);
    CTX("k_attention_grad dv, batch %lld t %lld s %lld bias %d", (long long)batch, (long long)t, (long long)s, kind);
    check_fd(dt, attn_fwd, &c, in, 2, v.n, w.d, y.n, dval.d);
    if (kind) {
        CTX("k_attention_grad dbias, batch %lld t %lld s %lld bias %d flags %d", (long long)batch, (long long)t,
            (long long)s, kind, flags);
        check_fd(dt, attn_fwd, &c, in, 3, bias.n, w.d, y.n, dbias.d);
    }
    buf_free(&dbias), buf_free(&q), buf_free(&kt), buf_free(&v), buf_free(&bias), buf_free(&y), buf_free(&lse), buf_free(&want);
    buf_free(&wlse), buf_free(&w), buf_free(&dq), buf_free(&dkt), buf_free(&dval), buf_free(&ws);
}

static void test_attention(int dt)
{
    for (int krow = 0; krow < 2; krow++) {
        attn_case(dt, 3, 5, 5, 4, 3, 0, 1, 1, 1, krow);
        attn_case(dt, 2, 70, 70, 8, 8, 1, 1, 1, 1, krow);  /* causal, two tiles, the second partial */
        attn_case(dt, 6, 9, 13, 5, 7, 2, 2, 3, 1, krow);   /* bias of problem b: (b / 3) % 2 */
        attn_case(dt, 4, 40, 130, 3, 2, 1, 4, 1, 1, krow); /* s > t: causal offset s - t, tiles narrower than s */
        attn_case(dt, 6, 9, 13, 5, 7, 2, 2, 3, 1, krow | K_ATTN_ZERO); /* the all -inf row gives 0 */
        attn_case(dt, 4, 70, 9, 4, 3, 2, 2, 1, 1, krow | K_ATTN_ZERO); /* two tiles, two bias slices, repeated */
        /* grouped-query attention: K/V problem b / kvrep */
        attn_case(dt, 8, 7, 9, 4, 3, 0, 1, 1, 4, krow);                /* 2 K/V problems, 4 query heads each */
        attn_case(dt, 4, 70, 70, 4, 3, 1, 1, 1, 2, krow);              /* causal, two tiles */
        attn_case(dt, 8, 9, 13, 5, 7, 2, 2, 4, 2, krow | K_ATTN_ZERO); /* a padding bias per batch (brep 4) */
        attn_case(dt, 6, 5, 7, 3, 4, 2, 6, 1, 3, krow);   /* a learned bias per head: dbias across the groups */
        attn_case(dt, 6, 5, 7, 3, 4, 0, 1, 1, 6, krow);   /* multi-query: one K/V problem for all */
    }
}

/* ---- fused attention on 16-bit operands ---------------------------------- */

/* An attention problem set with its float64 reference: q, kt, v, dy hold the values of the 16-bit q16, kt16,
 * v16, dy16 (rounded once, so the reference reads what the kernel reads), bias (NULL: none); the reference
 * computes in double without rounding anything else. */
typedef struct {
    int64_t batch, t, s, d, dv, nbias, brep, kvrep; /* kt, v: batch / kvrep problems, b reading b / kvrep */
    int flags, f16;
    double scale, *q, *kt, *v, *bias, *dy;
    uint16_t *q16, *kt16, *v16, *dy16;
} Attn16;

/* the float64 forward and backward of a (y, lse; dq, dkt in kt's layout, dval, dbias nbias t s) */
static void ref_attention_16(const Attn16 *a, double *y, double *lse, double *dq, double *dkt, double *dval,
                             double *dbias)
{
    const int64_t t = a->t, s = a->s, d = a->d, dv = a->dv;
    const int krow = a->flags & K_ATTN_KROW, zero = (a->flags & K_ATTN_ZERO) != 0;
    double *p = xalloc((size_t)s, sizeof(double));
    memset(dq, 0, sizeof(double) * (size_t)(a->batch * t * d));
    memset(dkt, 0, sizeof(double) * (size_t)(a->batch / a->kvrep * d * s));
    memset(dval, 0, sizeof(double) * (size_t)(a->batch / a->kvrep * s * dv));
    memset(dbias, 0, sizeof(double) * (size_t)(a->nbias * t * s));
    for (int64_t b = 0; b < a->batch; b++)
        for (int64_t i = 0; i < t; i++) {
            const double *qi = a->q + (b * t + i) * d, *dyi = a->dy + (b * t + i) * dv;
            const int64_t bs = (b / a->brep % a->nbias) * t * s + i * s, kb = b / a->kvrep;
            double mx = -INFINITY, sum = 0, dd = 0;
            for (int64_t j = 0; j < s; j++) {
                double sc = 0;
                for (int64_t k = 0; k < d; k++)
                    sc += qi[k] * a->kt[kb * d * s + (krow ? j * d + k : k * s + j)];
                p[j] = a->scale * sc + (a->bias ? a->bias[bs + j] : 0);
                mx = fmax(mx, p[j]);
            }
            for (int64_t j = 0; j < s; j++)
                sum += exp(p[j] - mx);
            lse[b * t + i] = mx == -INFINITY ? (zero ? -INFINITY : NAN) : mx + log(sum);
            for (int64_t j = 0; j < s; j++)
                p[j] = mx == -INFINITY ? (zero ? 0 : NAN) : exp(p[j] - mx) / sum;
            for (int64_t c = 0; c < dv; c++) {
                double acc = 0;
                for (int64_t j = 0; j < s; j++)
                    acc += p[j] * a->v[kb * s * dv + j * dv + c];
                y[(b * t + i) * dv + c] = acc;
                dd += dyi[c] * acc;
            }
            for (int64_t j = 0; j < s; j++) {
                double dp = 0;
                for (int64_t c = 0; c < dv; c++) {
                    dp += dyi[c] * a->v[kb * s * dv + j * dv + c];
                    dval[kb * s * dv + j * dv + c] += p[j] * dyi[c];
                }
                const double ds = p[j] * (dp - dd);
                if (a->bias)
                    dbias[bs + j] += ds;
                for (int64_t k = 0; k < d; k++) {
                    const int64_t kj = kb * d * s + (krow ? j * d + k : k * s + j);
                    dq[(b * t + i) * d + k] += a->scale * ds * a->kt[kj];
                    dkt[kj] += a->scale * ds * qi[k];
                }
            }
        }
    free(p);
}

/* x (n values, drawn in [lo, hi)) rounded to the problem's 16-bit type: the bits into h, their values into x */
static void round_16(int f16, double *x, uint16_t *h, int64_t n, double lo, double hi)
{
    for (int64_t i = 0; i < n; i++) {
        const float f = (float)rnd(lo, hi);
        h[i] = f16 ? k_f16_from_f32(f) : k_bf16_from_f32(f);
        x[i] = f16 ? k_f16_to_f32(h[i]) : k_bf16_to_f32(h[i]);
    }
}

/* got (float) against want: NaN exactly where want has one, the same infinities, and the rest within tol of
 * want norm-wise (||got - want|| / ||want||: the 16-bit roundings of P, dY and dS are relative errors of
 * about 2^-9 (bfloat16) or 2^-12 (float16) per element, in sums of both signs), but at least floor from it:
 * the roundings are there (float32 throughout would be about 1e-7 away) */
static void check_rel(const float *got, const double *want, int64_t n, double tol, double floor)
{
    double e = 0, w = 0;
    checks++;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(want[i]) || isinf(want[i])) {
            if (isnan(want[i]) ? !isnan(got[i]) : got[i] != want[i]) {
                printf("FAIL %s at %lld: expected %g, actual %g\n", what, (long long)i, want[i], got[i]);
                failures++;
                return;
            }
            continue;
        }
        e += (got[i] - want[i]) * (got[i] - want[i]), w += want[i] * want[i];
    }
    if (!(sqrt(e) <= tol * sqrt(w) && sqrt(e) >= floor * sqrt(w))) {
        printf("FAIL %s: ||got - want|| / ||want|| = %.3g, not in [%.3g, %.3g]\n", what,
               sqrt(e / (w > 0 ? w : 1)), floor, tol);
        failures++;
    }
}

/* the kernels' outputs of one run, widened to float (y, dq, dkt, dval are 16-bit) */
typedef struct {
    float *y, *lse, *dq, *dkt, *dval, *dbias;
} Attn16Out;

/* n 16-bit values of the problem's type widened into a new float array; h freed */
static float *widen_16(int f16, uint16_t *h, int64_t n)
{
    float *x = xalloc((size_t)n, 4);
    for (int64_t i = 0; i < n; i++)
        x[i] = f16 ? k_f16_to_f32(h[i]) : k_bf16_to_f32(h[i]);
    free(h);
    return x;
}

static Attn16Out attn16_run(const Attn16 *a, float *ws)
{
    const int64_t bt = a->batch * a->t, ns = a->nbias * a->t * a->s;
    const int64_t nk = a->batch / a->kvrep * a->d * a->s, nv = a->batch / a->kvrep * a->s * a->dv;
    Attn16Out o = {NULL, xalloc((size_t)bt, 4), NULL, NULL, NULL, xalloc((size_t)ns, 4)};
    uint16_t *y = xalloc((size_t)(bt * a->dv), 2), *dq = xalloc((size_t)(bt * a->d), 2);
    uint16_t *dkt = xalloc((size_t)nk, 2), *dval = xalloc((size_t)nv, 2);
    float *bias = a->bias ? xalloc((size_t)ns, 4) : NULL;
    for (int64_t i = 0; bias && i < ns; i++)
        bias[i] = (float)a->bias[i];
    (a->f16 ? k_attention_f16 : k_attention_bf16)(y, o.lse, a->q16, a->kt16, a->flags, a->v16, bias, a->batch,
                                                  a->t, a->s, a->d, a->dv, a->nbias, a->brep, a->kvrep, 0, a->scale, 0.0, 0, 0, 0, ws,
                                                  NULL);
    (a->f16 ? k_attention_grad_f16 : k_attention_grad_bf16)(
        dq, dkt, dval, bias ? o.dbias : NULL, a->dy16, a->q16, a->kt16, a->flags, a->v16, bias, y, o.lse,
        a->batch, a->t, a->s, a->d, a->dv, a->nbias, a->brep, a->kvrep, 0, a->scale, 0.0, 0, 0, 0, ws, NULL);
    o.y = widen_16(a->f16, y, bt * a->dv), o.dq = widen_16(a->f16, dq, bt * a->d);
    o.dkt = widen_16(a->f16, dkt, nk), o.dval = widen_16(a->f16, dval, nv);
    free(bias);
    return o;
}

static void attn16_free(Attn16Out *o)
{
    free(o->y), free(o->lse), free(o->dq), free(o->dkt), free(o->dval), free(o->dbias);
}

/* k_attention_bf16 / _f16 (f16) and their backward against ref_attention_16, bias kinds as attn_case (with
 * kind 2 and without K_ATTN_ZERO the all -inf row is unmasked for the backward, whose reference would be NaN);
 * and the same bits from one thread as from the team */
static void attn16_case(int f16, int64_t batch, int64_t t, int64_t s, int64_t d, int64_t dv, int kind, int64_t nbias,
                        int64_t brep, int64_t kvrep, int flags)
{
    const double tl = f16 ? 2e-3 : 1.5e-2;
    Attn16 a = {batch, t, s, d, dv, nbias, brep, kvrep, flags, f16, 1 / sqrt((double)d), NULL, NULL, NULL, NULL, NULL,
                NULL, NULL, NULL, NULL};
    const int64_t nq = batch * t * d, nk = batch / kvrep * d * s, nv = batch / kvrep * s * dv, ns = nbias * t * s;
    a.q = xalloc((size_t)nq, 8), a.kt = xalloc((size_t)nk, 8), a.v = xalloc((size_t)nv, 8);
    a.q16 = xalloc((size_t)nq, 2), a.kt16 = xalloc((size_t)nk, 2), a.v16 = xalloc((size_t)nv, 2);
    a.dy = xalloc((size_t)(batch * t * dv), 8), a.dy16 = xalloc((size_t)(batch * t * dv), 2);
    round_16(f16, a.q, a.q16, nq, -2, 2), round_16(f16, a.kt, a.kt16, nk, -2, 2), round_16(f16, a.v, a.v16, nv, -1, 1);
    round_16(f16, a.dy, a.dy16, batch * t * dv, -1, 1);
    if (kind) {
        a.bias = xalloc((size_t)ns, 8);
        for (int64_t i = 0; i < ns; i++) {
            const int64_t r = i / s % t, j = i % s;
            a.bias[i] = kind == 1 ? (j > r + s - t ? -INFINITY : 0) : rnd(0, 1) < 0.3 ? -INFINITY : rnd(-1, 1);
        }
        for (int64_t j = 0; kind == 2 && j < s; j++)
            a.bias[(t / 2) * s + j] = (flags & K_ATTN_ZERO) ? -INFINITY : 0; /* bias 0's row t/2 */
    }
    const int64_t nb = batch * t;
    double *y = xalloc((size_t)(nb * dv), 8), *lse = xalloc((size_t)nb, 8), *dq = xalloc((size_t)nq, 8);
    double *dkt = xalloc((size_t)nk, 8), *dval = xalloc((size_t)nv, 8), *dbias = xalloc((size_t)ns, 8);
    ref_attention_16(&a, y, lse, dq, dkt, dval, dbias);
    float *ws = xalloc((size_t)k_attention_workspace_16(batch, t, s, d, dv), 4);
#ifdef _OPENMP
    const int before = omp_get_max_threads();
    if (kvrep > 1) /* the K/V problems' sums over their query problems on a real team, whatever OMP_NUM_THREADS */
        ktest_team(4);
    Attn16Out o = attn16_run(&a, ws);
    ktest_team(before);
#else
    Attn16Out o = attn16_run(&a, ws);
#endif
    const char *name = f16 ? "k_attention_f16" : "k_attention_bf16";
    static const char *const part[] = {"y", "lse", "dq", "dkt", "dval", "dbias"};
    const float *got[] = {o.y, o.lse, o.dq, o.dkt, o.dval, o.dbias};
    const double *want[] = {y, lse, dq, dkt, dval, dbias};
    const int64_t len[] = {nb * dv, nb, nq, nk, nv, kind ? ns : 0};
    for (int k = 0; k < 6; k++) {
        CTX("%s %s: batch %lld t %lld s %lld d %lld dv %lld bias %d nbias %lld brep %lld kvrep %lld flags %d", name,
            part[k], (long long)batch, (long long)t, (long long)s, (long long)d, (long long)dv, kind, (long long)nbias,
            (long long)brep, (long long)kvrep, flags);
        check_rel(got[k], want[k], len[k], k == 1 ? 1e-5 : tl, k == 1 || k == 5 ? 0 : tl / 50); /* lse: float32 */
    }
#ifdef _OPENMP
    const int team = ktest_team(1); /* against the team got's run had (kvrep cases: a team of 4, below) */
    Attn16Out one = attn16_run(&a, ws);
    ktest_team(team);
    const float *alone[] = {one.y, one.lse, one.dq, one.dkt, one.dval, one.dbias};
    for (int k = 0; k < 6; k++) {
        CTX("%s %s on 1 thread and on %d: batch %lld t %lld s %lld bias %d kvrep %lld flags %d", name, part[k],
            kvrep > 1 ? 4 : team, (long long)batch, (long long)t, (long long)s, kind, (long long)kvrep, flags);
        check_bytes(F32, alone[k], got[k], sizeof(float) * (size_t)len[k]);
    }
    attn16_free(&one);
#endif
    attn16_free(&o);
    free(ws), free(y), free(lse), free(dq), free(dkt), free(dval), free(dbias);
    free(a.q), free(a.kt), free(a.v), free(a.q16), free(a.kt16), free(a.v16), free(a.dy), free(a.dy16), free(a.bias);
}

static void test_attention_16(int dt)
{
    for (int f16 = 0; dt == F32 && f16 < 2; f16++)
        for (int krow = 0; krow < 2; krow++) {
            attn16_case(f16, 3, 5, 5, 4, 3, 0, 1, 1, 1, krow);
            attn16_case(f16, 2, 70, 70, 16, 8, 1, 1, 1, 1, krow);  /* causal, two tiles, the second partial */
            attn16_case(f16, 6, 9, 13, 5, 7, 2, 2, 3, 1, krow);    /* a learned bias of problem b: (b / 3) % 2 */
            attn16_case(f16, 4, 40, 130, 3, 2, 1, 4, 1, 1, krow);  /* s > t: causal offset s - t */
            attn16_case(f16, 6, 9, 13, 5, 7, 2, 2, 3, 1, krow | K_ATTN_ZERO); /* the all -inf row gives 0 */
            attn16_case(f16, 4, 70, 9, 4, 3, 2, 2, 1, 1, krow | K_ATTN_ZERO); /* two tiles, two bias slices */
            attn16_case(f16, 2, 70, 600, 64, 40, 1, 1, 1, 1, krow); /* past the widening's blocks (512, 256) */
            /* grouped-query attention: K/V problem b / kvrep */
            attn16_case(f16, 8, 70, 70, 16, 8, 1, 1, 1, 4, krow);               /* causal, 4 query heads a K/V */
            attn16_case(f16, 8, 9, 13, 5, 7, 2, 2, 4, 2, krow | K_ATTN_ZERO);   /* a padding bias (brep 4) */
            attn16_case(f16, 6, 9, 13, 5, 7, 2, 6, 1, 3, krow);                 /* a learned bias per head */
            attn16_case(f16, 6, 40, 50, 8, 8, 0, 1, 1, 6, krow);                /* multi-query */
        }
}

/* ---- attention dropout ------------------------------------------------------ */

/* k_attention's dropout (drop 0.1) against the unfused composition it replaces: P = softmax (in double), the keep
 * flags k_dropout_f64 draws on the [batch, t, s] P under the same seed, stream and step (so the same flags, not
 * just the same rate), y = (P keep / 0.9) V; the backward by hand from the same flags: dV = Pd^T dY, dP = (dY V^T)
 * keep / 0.9, dS = P (dP - rowsum(P dP)), dQ = scale dS Kt^T, dKt = scale Q^T dS.  float32 and float64 within
 * their rounding; no bias or causal, one tile or two.  And a validation pass (drop 0) gives the undropped y. */
static void attn_drop_case(int dt, int64_t batch, int64_t t, int64_t s, int64_t d, int64_t dv, int flags)
{
    const double scale = 1 / sqrt((double)d), ratio = 0.1, inv = 1 / (1 - ratio);
    const uint64_t seed = 0x1234567890abcdefu;
    const uint32_t stream = 0xdeadbeefu, step = 7;
    const int causal = flags & K_ATTN_CAUSAL;
    Buf q = buf_new(batch * t * d), kt = buf_new(batch * d * s), v = buf_new(batch * s * dv);
    Buf y = buf_new(batch * t * dv), lse = buf_new(batch * t), w = buf_new(batch * t * dv);
    Buf dq = buf_new(batch * t * d), dkt = buf_new(batch * d * s), dval = buf_new(batch * s * dv);
    Buf ws = buf_new(k_attention_workspace(batch, t, s));
    double *p = xalloc((size_t)(batch * t * s), 8), *ones = xalloc((size_t)(batch * t * s), 8);
    double *wy = xalloc((size_t)y.n, 8), *wdq = xalloc((size_t)dq.n, 8), *wdkt = xalloc((size_t)dkt.n, 8);
    double *wdv = xalloc((size_t)dval.n, 8), *wundrop = xalloc((size_t)y.n, 8);
    uint8_t *keep = xalloc((size_t)(batch * t * s), 1);
    fill_rnd(&q, -2, 2), fill_rnd(&kt, -2, 2), fill_rnd(&v, -1, 1), fill_rnd(&w, -1, 1);
    for (int64_t i = 0; i < batch * t * s; i++)
        ones[i] = 1;
    k_dropout_f64(ones, keep, ones, batch * t * s, ratio, seed, stream, step); /* the unfused Dropout's flags */
    int64_t dropped = 0;
    for (int64_t i = 0; i < batch * t * s; i++)
        dropped += !keep[i];
    checks++;
    if (dropped < batch * t * s / 20 || dropped > batch * t * s / 5)
        failures++, printf("FAIL k_dropout_f64 dropped %lld of %lld at ratio 0.1\n", (long long)dropped,
                           (long long)(batch * t * s));
    memset(wdq, 0, sizeof(double) * (size_t)dq.n), memset(wdkt, 0, sizeof(double) * (size_t)dkt.n);
    memset(wdv, 0, sizeof(double) * (size_t)dval.n);
    for (int64_t b = 0; b < batch; b++)
        for (int64_t i = 0; i < t; i++) {
            double *pr = p + (b * t + i) * s, mx = -INFINITY, sum = 0, dd = 0, dp[512];
            const uint8_t *kr = keep + (b * t + i) * s;
            for (int64_t j = 0; j < s; j++) {
                double a = 0;
                for (int64_t k = 0; k < d; k++)
                    a += q.d[(b * t + i) * d + k] * kt.d[b * d * s + k * s + j];
                pr[j] = causal && j > i + s - t ? -INFINITY : scale * a;
                mx = fmax(mx, pr[j]);
            }
            for (int64_t j = 0; j < s; j++)
                sum += (pr[j] = exp(pr[j] - mx));
            for (int64_t j = 0; j < s; j++)
                pr[j] /= sum;
            for (int64_t c = 0; c < dv; c++) {
                double a = 0, u = 0;
                for (int64_t j = 0; j < s; j++)
                    a += pr[j] * (kr[j] ? inv : 0) * v.d[b * s * dv + j * dv + c], u += pr[j] * v.d[b * s * dv + j * dv + c];
                wy[(b * t + i) * dv + c] = a, wundrop[(b * t + i) * dv + c] = u;
            }
            for (int64_t j = 0; j < s; j++) { /* dP, then dd = rowsum(P dP) */
                double a = 0;
                for (int64_t c = 0; c < dv; c++)
                    a += w.d[(b * t + i) * dv + c] * v.d[b * s * dv + j * dv + c];
                dp[j] = kr[j] ? a * inv : 0, dd += pr[j] * dp[j];
            }
            for (int64_t j = 0; j < s; j++) {
                const double ds = pr[j] * (dp[j] - dd), pd = kr[j] ? pr[j] * inv : 0;
                for (int64_t k = 0; k < d; k++) {
                    wdq[(b * t + i) * d + k] += scale * ds * kt.d[b * d * s + k * s + j];
                    wdkt[b * d * s + k * s + j] += scale * ds * q.d[(b * t + i) * d + k];
                }
                for (int64_t c = 0; c < dv; c++)
                    wdv[b * s * dv + j * dv + c] += pd * w.d[(b * t + i) * dv + c];
            }
        }
    PUT(&q, &kt, &v, &w);
    CTX("k_attention dropout 0.1 y, batch %lld t %lld s %lld flags %d", (long long)batch, (long long)t, (long long)s,
        flags);
    KCALL(k_attention, V(y), V(lse), V(q), V(kt), flags, V(v), NULL, batch, t, s, d, dv, 1, 1, 1, 0, scale, ratio, seed,
          stream, step, V(ws), NULL);
    KCALL(k_attention_grad, V(dq), V(dkt), V(dval), NULL, V(w), V(q), V(kt), flags, V(v), NULL, V(y), V(lse), batch, t,
          s, d, dv, 1, 1, 1, 0, scale, ratio, seed, stream, step, V(ws), NULL);
    GET(&y, &dq, &dkt, &dval);
    check(dt, y.d, wy, y.n, tol(dt));
    const struct { const char *name; const double *got, *want; int64_t n; } grads[] = {
        {"dq", dq.d, wdq, dq.n}, {"dkt", dkt.d, wdkt, dkt.n}, {"dv", dval.d, wdv, dval.n}};
    for (int i = 0; i < 3; i++) {
        CTX("k_attention_grad dropout 0.1 %s, batch %lld t %lld s %lld flags %d", grads[i].name, (long long)batch,
            (long long)t, (long long)s, flags);
        check(dt, grads[i].got, grads[i].want, grads[i].n, tol(dt));
    }
    CTX("k_attention dropout 0 (validation), batch %lld t %lld s %lld flags %d", (long long)batch, (long long)t,
        (long long)s, flags);
    KCALL(k_attention, V(y), V(lse), V(q), V(kt), flags, V(v), NULL, batch, t, s, d, dv, 1, 1, 1, 0, scale, 0.0, seed,
          stream, step, V(ws), NULL);
    GET(&y);
    check(dt, y.d, wundrop, y.n, tol(dt));
    free(p), free(ones), free(wy), free(wdq), free(wdkt), free(wdv), free(wundrop), free(keep);
    buf_free(&q), buf_free(&kt), buf_free(&v), buf_free(&y), buf_free(&lse), buf_free(&w), buf_free(&dq);
    buf_free(&dkt), buf_free(&dval), buf_free(&ws);
}

static void test_attention_dropout(int dt)
{
    attn_drop_case(dt, 3, 5, 7, 4, 3, 0);
    attn_drop_case(dt, 2, 70, 70, 8, 6, 0);             /* two tiles */
    attn_drop_case(dt, 2, 70, 70, 8, 8, K_ATTN_CAUSAL); /* the band: P 0 past it, dropped or not */
    attn_drop_case(dt, 2, 40, 300, 8, 8, K_ATTN_CAUSAL); /* rows past K_ATTN_DROP_CHUNK keys */
}

/* ---- the causal band computed (K_ATTN_CAUSAL) ------------------------------ */

/* band_run's attention dropout (0: none): test_attention_drop_layouts runs the band and heads tests with 0.1 too */
static double band_drop;

/* One run of every attention kernel, forward and backward, on band problems: the outputs as bytes. */
typedef struct {
    void *o[5];   /* y, lse, dq, dkt, dval */
    size_t n[5]; /* their bytes */
} BandOut;

/* k_attention_K (K 0 f32, 1 f64, 2 bf16: q, kt, v, dy, y and the gradients bfloat16) with bias (NULL: none), flags,
 * kvrep and heads (the layout: kernels.h) on the fixed inputs */
static BandOut band_run(int K, const double *q, const double *kt, const double *v, const double *dy, const double *bias,
                        int flags, int64_t B, int64_t t, int64_t s, int64_t d, int64_t dv, int64_t kvrep, int64_t heads)
{
    const size_t es = K == 1 ? 8 : 4, is = K == 2 ? 2 : es;
    const int64_t nq = B * t * d, nk = B / kvrep * d * s, nv = B / kvrep * s * dv, ny = B * t * dv, ns = t * s;
    const int64_t nws = K == 2 ? k_attention_workspace_16(B, t, s, d, dv) : k_attention_workspace(B, t, s);
    void *Q = xalloc((size_t)nq, is), *KT = xalloc((size_t)nk, is), *VV = xalloc((size_t)nv, is);
    void *DY = xalloc((size_t)ny, is), *BI = bias ? xalloc((size_t)ns, es) : NULL, *W = xalloc((size_t)nws + 1, es);
    const double *src[5] = {q, kt, v, dy, bias};
    void *dst[5] = {Q, KT, VV, DY, BI};
    const int64_t cnt[5] = {nq, nk, nv, ny, ns};
    for (int a = 0; a < 5; a++)
        for (int64_t i = 0; dst[a] && i < cnt[a]; i++) {
            const int low = K == 2 && a < 4; /* q, kt, v, dy */
            if (low)
                ((uint16_t *)dst[a])[i] = k_bf16_from_f32((float)src[a][i]);
            else if (es == 8)
                ((double *)dst[a])[i] = src[a][i];
            else
                ((float *)dst[a])[i] = (float)src[a][i];
        }
    BandOut r;
    const int64_t n[5] = {ny, B * t, nq, nk, nv};
    for (int a = 0; a < 5; a++) /* y, dq, dkt, dval of the bfloat16 kernels are bfloat16 */
        r.n[a] = (size_t)n[a] * (a == 1 ? es : is), r.o[a] = xalloc((size_t)n[a], a == 1 ? es : is);
    if (K == 0) {
        k_attention_f32(r.o[0], r.o[1], Q, KT, flags, VV, BI, B, t, s, d, dv, 1, 1, kvrep, heads, 0.25, band_drop, 99,
                        5, 3, W, NULL);
        k_attention_grad_f32(r.o[2], r.o[3], r.o[4], NULL, DY, Q, KT, flags, VV, BI, r.o[0], r.o[1], B, t, s, d, dv,
                             1, 1, kvrep, heads, 0.25, band_drop, 99, 5, 3, W, NULL);
    } else if (K == 1) {
        k_attention_f64(r.o[0], r.o[1], Q, KT, flags, VV, BI, B, t, s, d, dv, 1, 1, kvrep, heads, 0.25, band_drop, 99,
                        5, 3, W, NULL);
        k_attention_grad_f64(r.o[2], r.o[3], r.o[4], NULL, DY, Q, KT, flags, VV, BI, r.o[0], r.o[1], B, t, s, d, dv,
                             1, 1, kvrep, heads, 0.25, band_drop, 99, 5, 3, W, NULL);
    } else {
        k_attention_bf16(r.o[0], r.o[1], Q, KT, flags, VV, BI, B, t, s, d, dv, 1, 1, kvrep, heads, 0.25, band_drop, 99,
                        5, 3, W, NULL);
        k_attention_grad_bf16(r.o[2], r.o[3], r.o[4], NULL, DY, Q, KT, flags, VV, BI, r.o[0], r.o[1], B, t, s, d,
                              dv, 1, 1, kvrep, heads, 0.25, band_drop, 99, 5, 3, W, NULL);
    }
    free(Q), free(KT), free(VV), free(DY), free(BI), free(W);
    return r;
}

/* K_ATTN_CAUSAL (no bias; a window w in the flags) gives the bits the same band as a bias of 0 and -inf gives,
 * forward and backward, in float32, float64 and bfloat16, for t = s, t < s, t > s (rows that see nothing, with
 * K_ATTN_ZERO) and sliding windows, both key layouts */
static void test_attention_band(int dt)
{
    static const int64_t cases[][4] = {{70, 70, 0, 0}, {40, 130, 0, 0}, {70, 9, 0, 1}, {70, 70, 16, 0}, {33, 50, 7, 0}};
    if (dt != F32)
        return;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int krow = 0; krow < 2; krow++) {
            const int64_t B = 3, t = cases[c][0], s = cases[c][1], w = cases[c][2], d = 8, dv = 6;
            const int base = krow | (cases[c][3] ? K_ATTN_ZERO : 0);
            double *q = xalloc((size_t)(B * t * d), 8), *kt = xalloc((size_t)(B * d * s), 8);
            double *v = xalloc((size_t)(B * s * dv), 8), *dy = xalloc((size_t)(B * t * dv), 8);
            double *bias = xalloc((size_t)(t * s), 8);
            for (int64_t i = 0; i < B * t * d; i++)
                q[i] = rnd(-2, 2);
            for (int64_t i = 0; i < B * d * s; i++)
                kt[i] = rnd(-2, 2);
            for (int64_t i = 0; i < B * s * dv; i++)
                v[i] = rnd(-1, 1);
            for (int64_t i = 0; i < B * t * dv; i++)
                dy[i] = rnd(-1, 1);
            for (int64_t i = 0; i < t; i++)
                for (int64_t j = 0; j < s; j++) {
                    const int64_t hi = i + s - t;
                    bias[i * s + j] = j > hi || (w && j <= hi - w) ? -INFINITY : 0;
                }
            for (int K = 0; K < 3; K++) {
                BandOut a = band_run(K, q, kt, v, dy, bias, base, B, t, s, d, dv, 1, 0);
                BandOut b = band_run(K, q, kt, v, dy, NULL, base | K_ATTN_CAUSAL | (int)w << K_ATTN_WINDOW_SHIFT,
                                     B, t, s, d, dv, 1, 0);
                for (int o = 0; o < 5; o++) {
                    checks++;
                    if (memcmp(a.o[o], b.o[o], a.n[o]))
                        failures++, printf("FAIL k_attention%s K_ATTN_CAUSAL t %lld s %lld window %lld krow %d: "
                                           "output %d differs from the band as a bias\n", K == 0 ? "_f32" : K == 1 ?
                                           "_f64" : "_bf16", (long long)t, (long long)s, (long long)w, krow, o);
                    free(a.o[o]), free(b.o[o]);
                }
            }
            free(q), free(kt), free(v), free(dy), free(bias);
        }
}

/* x (es-byte elements, problems of rows x w: [B H, rows, w]) in the heads layout [B, rows, H, w] (back: the other
 * way), into a new buffer */
static void *heads_copy(const void *x, size_t es, int64_t B, int64_t H, int64_t rows, int64_t w, int back)
{
    char *y = xalloc((size_t)(B * H * rows * w), es);
    for (int64_t p = 0; p < B * H; p++)
        for (int64_t i = 0; i < rows; i++) {
            const int64_t dense = (p * rows + i) * w, heads = k_attention_at(p, rows, H, w, H * w) + i * H * w;
            memcpy(y + (size_t)(back ? dense : heads) * es, (const char *)x + (size_t)(back ? heads : dense) * es,
                   (size_t)w * es);
        }
    return y;
}

/* heads > 0 (q, k, v, y and the gradients in the projections' layout [B, t, H, d], rows H d apart) gives the bits
 * the dense layout gives, forward and backward, in float32, float64 and bfloat16: the same GEMMs with other leading
 * dimensions; with grouped kv heads (kvrep 2), d != dv, causal with a window or not, t < s */
static void test_attention_heads(int dt)
{
    static const int64_t cases[][6] = {/* t, s, window, kvrep, d, dv */
                                       {70, 70, 0, 1, 16, 16}, {40, 50, 0, 2, 8, 6}, {70, 70, 16, 2, 8, 12}};
    if (dt != F32)
        return;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int causal = 0; causal < 2; causal++) {
            const int64_t Bt = 2, H = 4, t = cases[c][0], s = cases[c][1], w = cases[c][2], kvrep = cases[c][3];
            const int64_t d = cases[c][4], dv = cases[c][5], B = Bt * H, Hk = H / kvrep;
            const int flags = K_ATTN_KROW | (causal ? K_ATTN_CAUSAL | (int)w << K_ATTN_WINDOW_SHIFT : 0);
            double *x[4];
            const int64_t n[4] = {B * t * d, B / kvrep * s * d, B / kvrep * s * dv, B * t * dv}; /* q, k, v, dy */
            for (int a = 0; a < 4; a++) {
                x[a] = xalloc((size_t)n[a], 8);
                for (int64_t i = 0; i < n[a]; i++)
                    x[a][i] = rnd(a == 2 ? -1 : -2, a == 2 ? 1 : 2);
            }
            double *hq = heads_copy(x[0], 8, Bt, H, t, d, 0), *hk = heads_copy(x[1], 8, Bt, Hk, s, d, 0);
            double *hv = heads_copy(x[2], 8, Bt, Hk, s, dv, 0), *hdy = heads_copy(x[3], 8, Bt, H, t, dv, 0);
            for (int K = 0; K < 3; K++) {
                const size_t is = K == 1 ? 8 : K == 2 ? 2 : 4;
                BandOut a = band_run(K, x[0], x[1], x[2], x[3], NULL, flags, B, t, s, d, dv, kvrep, 0);
                BandOut b = band_run(K, hq, hk, hv, hdy, NULL, flags, B, t, s, d, dv, kvrep, H);
                /* y, lse (dense in both), dq, dk, dv: b's back in the dense layout */
                const int64_t hs[5] = {H, 0, H, Hk, Hk}, rows[5] = {t, 0, t, s, s}, wd[5] = {dv, 0, d, d, dv};
                for (int o = 0; o < 5; o++) {
                    void *bo = o == 1 ? b.o[o] : heads_copy(b.o[o], is, Bt, hs[o], rows[o], wd[o], 1);
                    checks++;
                    if (memcmp(a.o[o], bo, a.n[o]))
                        failures++, printf("FAIL k_attention%s heads %lld t %lld s %lld kvrep %lld flags %d: output "
                                           "%d differs from the dense layout's\n", K == 0 ? "_f32" : K == 1 ?
                                           "_f64" : "_bf16", (long long)H, (long long)t, (long long)s,
                                           (long long)kvrep, flags, o);
                    if (o != 1)
                        free(bo);
                    free(a.o[o]), free(b.o[o]);
                }
            }
            for (int a = 0; a < 4; a++)
                free(x[a]);
            free(hq), free(hk), free(hv), free(hdy);
        }
}

/* q, k, v read out of one packed [Bt, t, W] tensor (GPT-2's c_attn output: q at column 0, k at H d, v at (H + Hk) d,
 * each row W apart, W leaving 3 columns of padding) and dq, dk, dv written into one such tensor (passes/pack.c's
 * KAttnLd) give the bits of the heads layout's separate tensors, in float32, float64 and bfloat16, and leave the
 * padding as it was: self-attention (t = s), with grouped kv heads or not, causal or not */
static void test_attention_packed(int dt)
{
    static const int64_t cases[][3] = {/* t, kvrep, d */ {70, 1, 16}, {40, 2, 8}};
    if (dt != F32)
        return;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int causal = 0; causal < 2; causal++) {
            const int64_t Bt = 2, H = 4, t = cases[c][0], kvrep = cases[c][1], d = cases[c][2], Hk = H / kvrep;
            const int64_t B = Bt * H, W = (H + 2 * Hk) * d + 3, at[3] = {0, H * d, (H + Hk) * d}, w[3] = {H * d, Hk * d, Hk * d};
            const int flags = K_ATTN_KROW | (causal ? K_ATTN_CAUSAL : 0);
            double *x[4];
            const int64_t n[4] = {Bt * t * w[0], Bt * t * w[1], Bt * t * w[2], Bt * t * H * d}; /* q, k, v, dy */
            for (int a = 0; a < 4; a++) {
                x[a] = xalloc((size_t)n[a], 8);
                for (int64_t i = 0; i < n[a]; i++)
                    x[a][i] = rnd(a == 2 ? -1 : -2, a == 2 ? 1 : 2);
            }
            for (int K = 0; K < 3; K++) {
                const size_t is = K == 1 ? 8 : K == 2 ? 2 : 4, es = K == 1 ? 8 : 4;
                BandOut a = band_run(K, x[0], x[1], x[2], x[3], NULL, flags, B, t, t, d, d, kvrep, H);
                /* the packed inputs and gradients: rows of q, k, v side by side, the padding 0x5a bytes */
                char *pk = xalloc((size_t)(Bt * t * W), is), *pg = xalloc((size_t)(Bt * t * W), is);
                char *dy = xalloc((size_t)n[3], is), *y = xalloc((size_t)n[3], is), *lse = xalloc((size_t)(B * t), es);
                memset(pk, 0x5a, (size_t)(Bt * t * W) * is), memset(pg, 0x5a, (size_t)(Bt * t * W) * is);
                for (int a = 0; a < 4; a++)
                    for (int64_t r = 0; r < Bt * t; r++)
                        for (int64_t j = 0; j < (a < 3 ? w[a] : H * d); j++) {
                            const double v = x[a][r * (a < 3 ? w[a] : H * d) + j];
                            char *e = a < 3 ? pk + (size_t)(r * W + at[a] + j) * is : dy + (size_t)(r * H * d + j) * is;
                            if (K == 2) {
                                const uint16_t h = k_bf16_from_f32((float)v);
                                memcpy(e, &h, 2);
                            } else if (K == 1)
                                memcpy(e, &v, 8);
                            else {
                                const float f = (float)v;
                                memcpy(e, &f, 4);
                            }
                        }
                const int64_t nws = K == 2 ? k_attention_workspace_16(B, t, t, d, d) : k_attention_workspace(B, t, t);
                void *ws = xalloc((size_t)nws + 1, es);
                const KAttnLd ld = {W, W, W, 0, W, W, W};
                char *q = pk + at[0] * (int64_t)is, *k = pk + at[1] * (int64_t)is, *v = pk + at[2] * (int64_t)is;
                char *dq = pg + at[0] * (int64_t)is, *dk = pg + at[1] * (int64_t)is, *dv = pg + at[2] * (int64_t)is;
#define PACKED_RUN(S, O, TT)                                                                                          \
    do {                                                                                                           \
        k_attention_##S((O *)y, (TT *)lse, (O *)q, (O *)k, flags, (O *)v, NULL, B, t, t, d, d, 1, 1, kvrep, H, 0.25,  \
                        band_drop, 99, 5, 3, (TT *)ws, &ld);                                                       \
        k_attention_grad_##S((O *)dq, (O *)dk, (O *)dv, NULL, (O *)dy, (O *)q, (O *)k, flags, (O *)v, NULL, (O *)y, \
                             (TT *)lse, B, t, t, d, d, 1, 1, kvrep, H, 0.25, band_drop, 99, 5, 3, (TT *)ws, &ld);  \
    } while (0)
                if (K == 0)
                    PACKED_RUN(f32, float, float);
                else if (K == 1)
                    PACKED_RUN(f64, double, double);
                else
                    PACKED_RUN(bf16, uint16_t, float);
#undef PACKED_RUN
                int bad = memcmp(a.o[0], y, a.n[0]) || memcmp(a.o[1], lse, a.n[1]);
                for (int o = 0; o < 3; o++) /* dq, dk, dv against the heads layout's, row by row */
                    for (int64_t r = 0; r < Bt * t; r++)
                        bad |= memcmp((char *)a.o[2 + o] + (size_t)(r * w[o]) * is, pg + (size_t)(r * W + at[o]) * is,
                                      (size_t)w[o] * is) != 0;
                for (int64_t r = 0; r < Bt * t; r++) /* the padding untouched, in both */
                    for (int64_t j = (H + 2 * Hk) * d; j < W; j++)
                        for (size_t b = 0; b < is; b++)
                            bad |= pk[(size_t)(r * W + j) * is + b] != 0x5a || pg[(size_t)(r * W + j) * is + b] != 0x5a;
                checks++;
                if (bad)
                    failures++, printf("FAIL k_attention%s packed q, k, v (KAttnLd) t %lld kvrep %lld flags %d: not "
                                       "the heads layout's bits, or the padding written\n", K == 0 ? "_f32" : K == 1 ?
                                       "_f64" : "_bf16", (long long)t, (long long)kvrep, flags);
                for (int o = 0; o < 5; o++)
                    free(a.o[o]);
                free(pk), free(pg), free(dy), free(y), free(lse), free(ws);
            }
            for (int a = 0; a < 4; a++)
                free(x[a]);
        }
}

/* the band and heads layout tests with an attention dropout: the causal band computed draws the flags a bias's
 * band draws, and the heads layout those of the dense [B H, t, s] (flat index (b t + i) s + j of problem b = row
 * b / H's head b % H: the [B, H, t, s] tensor's), bit for bit */
static void test_attention_drop_layouts(int dt)
{
    band_drop = 0.1;
    test_attention_band(dt);
    test_attention_heads(dt);
    test_attention_packed(dt);
    band_drop = 0;
}

/* with the argument attention_16: that test alone (kernels_attn_widened runs it on the widened path) */
int main(int argc, char **argv)
{
    static void (*const tests[])(int) = {test_attention, test_attention_16, test_attention_band,
                                          test_attention_heads, test_attention_packed, test_attention_dropout,
                                          test_attention_drop_layouts};
    static void (*const only16[])(int) = {test_attention_16};
    if (argc > 1 && !strcmp(argv[1], "attention_16"))
        return ktest_main("kernels_attn_test attention_16", only16, 1);
    return ktest_main("kernels_attn_test", tests, sizeof tests / sizeof tests[0]);
}
