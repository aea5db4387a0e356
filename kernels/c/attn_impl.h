/* attn_impl.h — typed bodies of attn.c and attn_bf16.c, included once per
 * kernel with defined:
 *   T                 the scores' type, and that of lse, bias, dbias and every sum
 *   O                 the type of q, kt, v (the GEMM operands), y, dy and the
 *                     gradients dq, dkt, dval: T itself, or uint16_t
 *   S                 the name suffix (f32, f64, bf16, f16)
 *   KM(fn)            fn's version for T (expf for float)
 *   K_SLOT(t,s,d,dv)  the elements of T of one thread's workspace slot
 *   K_ROUND(x)        (16-bit only) x of type T rounded to O
 *   K_WIDEN(x)        (16-bit only) x of type O widened to T
 * and a function KFN(attn_gemm)(ta, tb, m, n, k, alpha, a, lda, b, ldb,
 * beta, c, ldc, w, wn): C (m x n, ldc, of T) = alpha op(A) op(B) + beta C on
 * operands of O, row-major, w (wn elements of T) its scratch.  With K_ROUND
 * the tile's P (in the forward exp(s - max), unnormalised: y = (P V) / sum,
 * as kernels/cuda/attn.cu computes) and dS are rounded to O before they
 * enter a GEMM (dY is one already); y, dq, dkt and dval are computed in T
 * in the slot (dkt and dval summed there over a K/V problem's query
 * problems) and rounded once as they are stored: the bits of the float32
 * results followed by a Cast.  The slot holds P or dS rounded, the GEMMs'
 * scratch and those T results after the scores and their gradient
 * (kernels.h: k_attention_slot_16).  With a dropout (drop > 0) the forward
 * multiplies each row of P by its keep flags / (1 - drop) after its sum (so
 * lse is the undropped softmax's), and the backward draws the same flags
 * (philox.h) for dS = P (dP keep / (1 - drop) - rowsum(dY Y)) and the
 * dropped P of dV += P^T dY.  No include guard on purpose. */
#ifndef K_ATTN_DROP_CHUNK
#define K_ATTN_DROP_CHUNK 256 /* keep flags drawn at a time, on the stack */
#endif
#ifdef K_ROUND
#define K_OUT(x) K_ROUND(x)
#else
#define K_OUT(x) (x)
#endif

/* a thread's part of the workspace: scores and their gradient (R s of T each); with K_ROUND also P or dS
 * rounded (R s of O), the GEMMs' scratch (wn of T), a tile of y or dq (R max(d, dv) of T), a K/V problem's
 * dkt and dval (d s and s dv of T) and a tile's dY and Y widened (2 R dv of T) */
typedef struct {
    T *sc, *dp, *w, *yq, *dk, *dv, *wy;
    O *p;
    int64_t wn;
} KFN(AttnSlot);

/* this thread's slot of ws (the kernel's t, s, d, dv) */
static KFN(AttnSlot) KFN(attn_slot)(T *ws, int64_t t, int64_t s, int64_t d, int64_t dv)
{
    const int64_t R = k_attention_rows(t);
    (void)d, (void)dv; /* only a 16-bit slot depends on them */
#ifdef _OPENMP
    ws += (int64_t)omp_get_thread_num() * K_SLOT(t, s, d, dv);
#endif
    KFN(AttnSlot) sl = {.sc = ws, .dp = ws + R * s};
#ifdef K_ROUND
    sl.p = (O *)(ws + 2 * R * s);
    sl.w = ws + 2 * R * s + (R * s + 1) / 2;
    sl.wn = k_attention_gemm_scratch(t, s, d, dv);
    sl.yq = sl.w + sl.wn;
    sl.dk = sl.yq + R * (d > dv ? d : dv);
    sl.dv = sl.dk + d * s;
    sl.wy = sl.dv + s * dv;
#endif
    return sl;
}

/* x (n elements) as a GEMM operand: rounded into buf with K_ROUND, else x itself */
static const O *KFN(attn_operand)(const T *x, int64_t n, O *buf)
{
#ifdef K_ROUND
    for (int64_t i = 0; i < n; i++)
        buf[i] = K_ROUND(x[i]);
    return buf;
#else
    (void)n, (void)buf;
    return x;
#endif
}

/* the columns a tile of r rows from row i0 needs: up to its rows' last
 * finite bias entry, or under K_ATTN_CAUSAL the last row's last key (all s
 * without either, and all s when every entry is masked, so that such rows
 * compute the NaN softmax gives) */
static int64_t KFN(attn_cols)(const T *bias, int flags, int64_t i0, int64_t r, int64_t t, int64_t s)
{
    if (flags & K_ATTN_CAUSAL) {
        const int64_t n = i0 + r + s - t;
        return n > 0 && n < s ? n : s;
    }
    if (!bias)
        return s;
    int64_t n = 0;
    for (int64_t i = 0; i < r; i++) {
        int64_t j = s;
        while (j > n && bias[i * s + j - 1] == -(T)INFINITY)
            j--;
        n = j > n ? j : n;
    }
    return n ? n : s;
}

/* How far along its tile row (of n columns) query q takes exp: under K_ATTN_CAUSAL up to its last visible key,
 * rounded up to a multiple of 16 (so the elements before it take a loop's vector body as a full row's do, and
 * the band gives the bias's bits), else n; the columns after it are masked: P 0, written as such.  Not computing
 * exp(-inf) there is the point: libmvec's vector expf takes a slow scalar path for lanes out of its range (the
 * forward at T 256, d 64: 3.2 -> 2.6 ms).  A row that sees no key at all keeps the whole row (NaN, as the bias). */
static int64_t KFN(attn_exp_end)(int flags, int64_t q, int64_t n, int64_t t, int64_t s)
{
    const int64_t hi = q + s - t; /* the last key query q sees */
    if (!(flags & K_ATTN_CAUSAL) || hi < 0)
        return n;
    const int64_t e = (hi + 16) / 16 * 16;
    return e < n ? e : n;
}

/* The columns [*lo, *hi] of a row's first e (attn_exp_end's) that query q sees: under K_ATTN_CAUSAL its band
 * (attn_scores wrote -inf around it), else all e.  The exp loops take exp(0) on the lanes outside it and write 0
 * there after, exp(-inf - m)'s value for the row's finite statistic m (its max, or lse): libmvec's expf computes
 * a lane of -inf on its slow path, one scalar expf call each (7.5 a row on average at the band's edge in the GPT
 * 256/6/256/8: 0.7 M calls a step); each lane's result depends on that lane alone, so the bits are unchanged.  A
 * row whose m is not finite (it sees no key, or only -inf scores) keeps all e: its NaN spreads as before. */
static void KFN(attn_band)(int flags, int64_t q, int64_t e, int64_t t, int64_t s, T m, int64_t *lo, int64_t *hi)
{
    const int64_t h = q + s - t, w = flags >> K_ATTN_WINDOW_SHIFT;
    *lo = 0, *hi = e - 1;
    if (!(flags & K_ATTN_CAUSAL) || h < 0 || !isfinite(m))
        return;
    *hi = h < e - 1 ? h : e - 1;
    *lo = w && h - w + 1 > 0 ? h - w + 1 : 0;
}

/* the attention dropout on query row q of problem b (n columns of its P, from key 0): each element times its keep
 * flag / (1 - ratio), the flag of flat index (b t + q) s + j that the fused Dropout node drew (philox.h) */
static void KFN(attn_drop_row)(T *row, int64_t n, const KDrop *dr, int64_t b, int64_t q, int64_t t, int64_t s)
{
    const T sc = (T)1 / (T)(1 - dr->ratio);
    const int64_t base = (b * t + q) * s;
    uint8_t m[K_ATTN_DROP_CHUNK];
    for (int64_t j0 = 0; j0 < n; j0 += K_ATTN_DROP_CHUNK) {
        const int64_t w = n - j0 < K_ATTN_DROP_CHUNK ? n - j0 : K_ATTN_DROP_CHUNK;
        philox_keep(m, base + j0, base + j0 + w, dr->ratio, dr->seed, dr->stream, dr->step);
        for (int64_t j = 0; j < w; j++)
            row[j0 + j] = m[j] ? row[j0 + j] * sc : (T)0;
    }
}

/* the backward's dS of query row q of problem b with the dropout: dS = P (dP keep / (1 - ratio) - dd) into dp,
 * and P into P keep / (1 - ratio) (the dropped P the forward multiplied V by, for dV) */
static void KFN(attn_drop_grad_row)(T *p, T *dp, T dd, int64_t n, const KDrop *dr, int64_t b, int64_t q, int64_t t,
                                    int64_t s)
{
    const T sc = (T)1 / (T)(1 - dr->ratio);
    const int64_t base = (b * t + q) * s;
    uint8_t m[K_ATTN_DROP_CHUNK];
    for (int64_t j0 = 0; j0 < n; j0 += K_ATTN_DROP_CHUNK) {
        const int64_t w = n - j0 < K_ATTN_DROP_CHUNK ? n - j0 : K_ATTN_DROP_CHUNK;
        philox_keep(m, base + j0, base + j0 + w, dr->ratio, dr->seed, dr->stream, dr->step);
        for (int64_t j = 0; j < w; j++) {
            const T pj = p[j0 + j];
            dp[j0 + j] = pj * ((m[j] ? dp[j0 + j] * sc : (T)0) - dd);
            p[j0 + j] = m[j] ? pj * sc : (T)0;
        }
    }
}

/* S (r x n) = scale Q K[:n]^T + bias: the scores of the tile of rows i0.. (Q's rows ldq apart; K as kt, d x s, or
 * krow: s x d, its rows ldk apart); under K_ATTN_CAUSAL -inf outside the band (kernels.h) */
static void KFN(attn_scores)(const KFN(AttnSlot) *sl, const O *q, int64_t ldq, const O *kt, int64_t ldk, int flags,
                             const T *bias, int64_t i0, int64_t r, int64_t n, int64_t t, int64_t s, int64_t d,
                             double scale)
{
    T *sc = sl->sc;
    KFN(attn_gemm)(0, flags & K_ATTN_KROW, r, n, d, scale, q, ldq, kt, flags & K_ATTN_KROW ? ldk : s, 0.0, sc, n,
                   sl->w, sl->wn);
    if (bias)
        for (int64_t i = 0; i < r; i++)
            for (int64_t j = 0; j < n; j++)
                sc[i * n + j] += bias[i * s + j];
    if (flags & K_ATTN_CAUSAL) {
        const int64_t w = flags >> K_ATTN_WINDOW_SHIFT;
        for (int64_t i = 0; i < r; i++) { /* -inf before lo and after hi: only the masked entries are written */
            const int64_t hi = i0 + i + s - t, lo = w ? hi - w + 1 : 0; /* the keys row i0 + i sees */
            const int64_t below = lo < 0 ? 0 : lo < n ? lo : n, above = hi + 1 < below ? below : hi + 1;
            for (int64_t j = 0; j < below; j++)
                sc[i * n + j] = -(T)INFINITY;
            for (int64_t j = above; j < n; j++)
                sc[i * n + j] = -(T)INFINITY;
        }
    }
}

/* the forward's units [u0, u1) (a unit: a problem's tile of R query rows) on the calling thread, in its slot */
static void KFN(attn_units)(int64_t u0, int64_t u1, O *y, T *lse, const O *q, const O *kt, int flags, const O *v,
                            const T *bias, int64_t t, int64_t s, int64_t d, int64_t dv, int64_t nbias, int64_t brep,
                            int64_t kvrep, int64_t heads, double scale, const KDrop *dr, T *ws, const KAttnLd *L)
{
    const int zero = flags & K_ATTN_ZERO;
    const int64_t R = k_attention_rows(t), tiles = (t + R - 1) / R, hkv = heads / kvrep;
    const int64_t ldq = L->q, ldy = L->y, ldk = L->k, ldv = L->v;
    for (int64_t u = u0; u < u1; u++) {
        const KFN(AttnSlot) sl = KFN(attn_slot)(ws, t, s, d, dv);
        T *sc = sl.sc;
        const int64_t b = u / tiles, i0 = u % tiles * R;
        const int64_t r = t - i0 < R ? t - i0 : R;
        const T *bb = bias ? bias + (b / brep % nbias) * t * s + i0 * s : NULL;
        O *yt = y + k_attention_at(b, t, heads, dv, ldy) + i0 * ldy;
        T *lt = lse + b * t + i0;
        if (s <= 0) { /* nothing to attend to: softmax of nothing */
            for (int64_t i = 0; i < r; i++)
                for (int64_t c = 0; c < dv; c++)
                    yt[i * ldy + c] = K_OUT((T)NAN);
            for (int64_t i = 0; i < r; i++)
                lt[i] = -(T)INFINITY;
            continue;
        }
        const int64_t n = KFN(attn_cols)(bb, flags, i0, r, t, s);
        const int64_t kb = b / kvrep; /* the K/V problem */
        KFN(attn_scores)(&sl, q + k_attention_at(b, t, heads, d, ldq) + i0 * ldq, ldq,
                         kt + k_attention_at(kb, s, hkv, d, ldk), ldk, flags, bb, i0, r, n, t, s, d, scale);
        T sums[K_ATTN_ROWS]; /* each row's softmax denominator, applied to y after P V */
        for (int64_t i = 0; i < r; i++) { /* each loop vectorised (omp simd: the sums in lanes of T) */
            T *row = sc + i * n, mx = -(T)INFINITY, sum = 0;
            sums[i] = 1;
#pragma omp simd reduction(max : mx)
            for (int64_t j = 0; j < n; j++) /* a NaN passes by here and makes the sum NaN */
                mx = row[j] > mx ? row[j] : mx;
            if (zero && mx == -(T)INFINITY) { /* a row that sees nothing: y 0 (the GEMM's), lse -inf */
                memset(row, 0, sizeof(T) * (size_t)n);
                lt[i] = mx;
                continue;
            }
            const int64_t e = KFN(attn_exp_end)(flags, i0 + i, n, t, s);
            int64_t lo, hi;
            KFN(attn_band)(flags, i0 + i, e, t, s, mx, &lo, &hi);
#pragma omp simd
            for (int64_t j = 0; j < e; j++)
                row[j] = KM(exp)(j >= lo && j <= hi ? row[j] - mx : 0);
            for (int64_t j = 0; j < lo; j++)
                row[j] = 0;
            for (int64_t j = hi + 1; j < n; j++)
                row[j] = 0;
#pragma omp simd reduction(+ : sum)
            for (int64_t j = 0; j < n; j++)
                sum += row[j];
            sums[i] = sum;
            lt[i] = (T)((double)mx + log((double)sum));
            if (dr->ratio > 0) /* after the sum: the softmax is the undropped one's */
                KFN(attn_drop_row)(row, n, dr, b, i0 + i, t, s);
        }
        /* y = (P V) / sum with P unnormalised, as attn.cu (and FlashAttention) computes: a 16-bit P is
         * exp(s - max) rounded, the same operand on both targets */
#ifdef K_ROUND
        T *yo = sl.yq; /* y's tile in T, rounded into y once divided */
        const int64_t ldo = dv;
#else
        T *yo = yt;
        const int64_t ldo = ldy;
#endif
        KFN(attn_gemm)(0, 0, r, dv, n, 1.0, KFN(attn_operand)(sc, r * n, sl.p), n,
                       v + k_attention_at(kb, s, hkv, dv, ldv), ldv, 0.0, yo, ldo, sl.w, sl.wn);
        for (int64_t i = 0; i < r; i++)
            for (int64_t c = 0; c < dv; c++)
                yt[i * ldy + c] = K_OUT(yo[i * ldo + c] / sums[i]);
    }
}

/* heads against the other dims: a layout the kernels can index (kernels.h), or abort; then the operands' row
 * strides (ld's, each 0 taking the dense layout's; without K_ATTN_KROW kt's rows are s wide) */
static KAttnLd KFN(attn_layout)(int flags, int64_t batch, int64_t s, int64_t d, int64_t dv, int64_t kvrep,
                                     int64_t heads, const KAttnLd *ld)
{
    if (heads < 0 || (heads && (!(flags & K_ATTN_KROW) || kvrep < 1 || heads % kvrep || batch % heads)))
        die("k_attention: heads is not a layout of the problems (it needs K_ATTN_KROW, kvrep dividing heads, heads "
            "dividing batch)");
    const int64_t hkv = heads ? heads / kvrep : 0, wq = k_attention_ld(heads, d), wy = k_attention_ld(heads, dv);
    const int64_t wk = flags & K_ATTN_KROW ? k_attention_ld(hkv, d) : s, wv = k_attention_ld(hkv, dv);
    const KAttnLd z = {0}, *l = ld ? ld : &z;
    const KAttnLd r = {l->q ? l->q : wq, l->k ? l->k : wk, l->v ? l->v : wv, l->y ? l->y : wy,
                       l->dq ? l->dq : wq, l->dk ? l->dk : wk, l->dv ? l->dv : wv};
    if ((!heads && memcmp(l, &z, sizeof z)) || r.q < wq || r.k < wk || r.v < wv || r.y < wy || r.dq < wq ||
        r.dk < wk || r.dv < wv)
        die("k_attention: row strides (KAttnLd) need heads and at least the rows' widths");
    return r;
}

void KFN(k_attention)(O *y, T *lse, const O *q, const O *kt, int flags, const O *v, const T *bias, int64_t batch,
                      int64_t t, int64_t s, int64_t d, int64_t dv, int64_t nbias, int64_t brep, int64_t kvrep,
                      int64_t heads, double scale, double drop, uint64_t seed, uint32_t stream, uint32_t step, T *ws,
                      const KAttnLd *ld)
{
    const KDrop dr = {drop, seed, stream, step};
    const KAttnLd L = KFN(attn_layout)(flags, batch, s, d, dv, kvrep, heads, ld);
    if (batch <= 0 || t <= 0 || dv <= 0)
        return;
    const int64_t R = k_attention_rows(t), units = batch * ((t + R - 1) / R);
    int64_t lo, hi;
    if (attn_share(units, &lo, &hi)) { /* inside a team that shares: this thread's units */
        KFN(attn_units)(lo, hi, y, lse, q, kt, flags, v, bias, t, s, d, dv, nbias, brep, kvrep, heads, scale, &dr,
                        ws, &L);
        return;
    }
    const int nt = attn_threads(units);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t u = 0; u < units; u++)
        KFN(attn_units)(u, u + 1, y, lse, q, kt, flags, v, bias, t, s, d, dv, nbias, brep, kvrep, heads, scale,
                        &dr, ws, &L);
}

/* problem b's gradients in the slot sl: dq of b written, dS^T Q and P^T dY added to dkt and dval of its K/V problem
 * b / kvrep (set to 0 first by the group's first problem, b % kvrep == 0: the group's problems run in increasing b
 * on one thread; with K_ROUND summed in the slot and rounded into dkt and dval by its last); dbt: dbias of b's bias
 * slice (t x s) to add dS to, or NULL */
static void KFN(attn_grad_problem)(int64_t b, O *dq, O *dkt, O *dval, T *dbt, const O *dy, const O *q, const O *kt,
                                   int flags, const O *v, const T *bias, const O *y, const T *lse, int64_t t, int64_t s,
                                   int64_t d, int64_t dv, int64_t nbias, int64_t brep, int64_t kvrep, int64_t heads,
                                   double scale, const KDrop *dr, const KFN(AttnSlot) *sl, const KAttnLd *L)
{
    const int krow = flags & K_ATTN_KROW, zero = flags & K_ATTN_ZERO;
    const int64_t R = k_attention_rows(t), kb = b / kvrep, hkv = heads / kvrep;
    const int64_t ldq = L->q, ldy = L->y, ldk = L->k, ldv = L->v, lddq = L->dq, lddk = L->dk, lddv = L->dv;
    const int64_t krows = krow ? s : d, kw = krow ? d : s; /* a K problem's rows and their width */
    const int64_t koff = k_attention_at(kb, krows, hkv, kw, ldk), voff = k_attention_at(kb, s, hkv, dv, ldv);
    const int64_t dkoff = k_attention_at(kb, krows, hkv, kw, lddk), dvoff = k_attention_at(kb, s, hkv, dv, lddv);
#ifdef K_ROUND
    T *sc = sl->sc, *dp = sl->dp, *dktb = sl->dk, *dvb = sl->dv;
    const int64_t ldkb = kw, ldvb = dv, ldyw = dv, ldqo = d; /* the slot's, dense */
#else
    T *sc = sl->sc, *dp = sl->dp, *dktb = dkt + dkoff, *dvb = dval + dvoff;
    const int64_t ldkb = lddk, ldvb = lddv, ldyw = ldy, ldqo = lddq;
#endif
    const O *ktb = kt + koff, *vb = v + voff;
    if (b % kvrep == 0) {
        for (int64_t j = 0; j < krows; j++)
            memset(dktb + j * ldkb, 0, sizeof(T) * (size_t)kw);
        for (int64_t j = 0; j < s; j++)
            memset(dvb + j * ldvb, 0, sizeof(T) * (size_t)dv);
    }
    for (int64_t i0 = 0; i0 < t; i0 += R) {
        const int64_t r = t - i0 < R ? t - i0 : R;
        const T *bb = bias ? bias + (b / brep % nbias) * t * s + i0 * s : NULL;
        const O *qt = q + k_attention_at(b, t, heads, d, ldq) + i0 * ldq;
        const int64_t yoff = k_attention_at(b, t, heads, dv, ldy) + i0 * ldy;
        const O *dyt = dy + yoff, *yt = y + yoff;
        const T *lt = lse + b * t + i0;
        O *dqt = dq + k_attention_at(b, t, heads, d, lddq) + i0 * lddq;
        if (s <= 0 || d <= 0) {
            for (int64_t i = 0; i < r; i++)
                for (int64_t c = 0; c < d; c++)
                    dqt[i * lddq + c] = K_OUT((T)0);
            continue;
        }
        const int64_t n = KFN(attn_cols)(bb, flags, i0, r, t, s);
        KFN(attn_scores)(sl, qt, ldq, ktb, ldk, flags, bb, i0, r, n, t, s, d, scale);
        for (int64_t i = 0; i < r; i++) { /* P from the saved row statistic (0 in a row that sees nothing) */
            T *row = sc + i * n;
            const T l = lt[i];
            if (zero && l == -(T)INFINITY)
                memset(row, 0, sizeof(T) * (size_t)n);
            else {
                const int64_t e = KFN(attn_exp_end)(flags, i0 + i, n, t, s);
                int64_t lo, hi;
                KFN(attn_band)(flags, i0 + i, e, t, s, l, &lo, &hi);
                for (int64_t j = 0; j < e; j++)
                    row[j] = KM(exp)(j >= lo && j <= hi ? row[j] - l : 0);
                for (int64_t j = 0; j < lo; j++)
                    row[j] = 0;
                for (int64_t j = hi + 1; j < n; j++)
                    row[j] = 0;
            }
        }
        if (dv > 0) /* dP = dY V^T */
            KFN(attn_gemm)(0, 1, r, n, dv, 1.0, dyt, ldy, vb, ldv, 0.0, dp, n, sl->w, sl->wn);
        else
            memset(dp, 0, sizeof(T) * (size_t)(r * n));
#ifdef K_ROUND
        /* dY and Y widened into the slot first: the row sums below then vectorise (and so sum) as float32
         * operands' do, the bits of float32 dY and Y */
        T *dyw = sl->wy, *yw = sl->wy + r * dv;
        for (int64_t i = 0; i < r; i++)
            for (int64_t c = 0; c < dv; c++)
                dyw[i * dv + c] = K_WIDEN(dyt[i * ldy + c]), yw[i * dv + c] = K_WIDEN(yt[i * ldy + c]);
#else
        const T *dyw = dyt, *yw = yt;
#endif
        for (int64_t i = 0; i < r; i++) { /* dS = P (dP - rowsum(dY Y)); with the dropout dP keep / (1 - ratio) */
            T dd = 0;
#pragma omp simd reduction(+ : dd)
            for (int64_t c = 0; c < dv; c++)
                dd += dyw[i * ldyw + c] * yw[i * ldyw + c];
            if (dr->ratio > 0) {
                KFN(attn_drop_grad_row)(sc + i * n, dp + i * n, dd, n, dr, b, i0 + i, t, s);
                continue;
            }
            for (int64_t j = 0; j < n; j++)
                dp[i * n + j] = sc[i * n + j] * (dp[i * n + j] - dd);
        }
        if (dv > 0) /* dV += P^T dY (P the dropped one with the dropout) */
            KFN(attn_gemm)(1, 0, n, dv, r, 1.0, KFN(attn_operand)(sc, r * n, sl->p), n, dyt, ldy, 1.0, dvb, ldvb,
                           sl->w, sl->wn);
        if (dbt) /* dbias += dS: the bias is added after the scaling; columns past n have P = 0 */
            for (int64_t i = 0; i < r; i++)
                for (int64_t j = 0; j < n; j++)
                    dbt[(i0 + i) * s + j] += dp[i * n + j];
        const O *dso = KFN(attn_operand)(dp, r * n, sl->p); /* P's rounding is spent: dS takes its place */
#ifdef K_ROUND
        T *dqo = sl->yq; /* dq's tile in T, rounded into dq */
#else
        T *dqo = dqt;
#endif
        if (krow) { /* dQ = scale dS K, dK += scale dS^T Q */
            KFN(attn_gemm)(0, 0, r, d, n, scale, dso, n, ktb, ldk, 0.0, dqo, ldqo, sl->w, sl->wn);
            KFN(attn_gemm)(1, 0, n, d, r, scale, dso, n, qt, ldq, 1.0, dktb, ldkb, sl->w, sl->wn);
        } else { /* dQ = scale dS Kt^T, dKt += scale Q^T dS */
            KFN(attn_gemm)(0, 1, r, d, n, scale, dso, n, ktb, s, 0.0, dqo, ldqo, sl->w, sl->wn);
            KFN(attn_gemm)(1, 0, d, n, r, scale, qt, ldq, dso, n, 1.0, dktb, ldkb, sl->w, sl->wn);
        }
#ifdef K_ROUND
        for (int64_t i = 0; i < r; i++)
            for (int64_t c = 0; c < d; c++)
                dqt[i * lddq + c] = K_ROUND(dqo[i * d + c]);
#endif
    }
#ifdef K_ROUND
    if (b % kvrep == kvrep - 1) { /* the group's last problem: its sums rounded into dkt and dval */
        O *dko = dkt + dkoff, *dvo = dval + dvoff;
        for (int64_t j = 0; j < krows; j++)
            for (int64_t c = 0; c < kw; c++)
                dko[j * lddk + c] = K_ROUND(dktb[j * kw + c]);
        for (int64_t j = 0; j < s; j++)
            for (int64_t c = 0; c < dv; c++)
                dvo[j * lddv + c] = K_ROUND(dvb[j * dv + c]);
    }
#endif
}

/* the backward's units [u0, u1) (k_attention_grad's) on the calling thread, in its slot */
static void KFN(attn_grad_units)(int64_t u0, int64_t u1, O *dq, O *dkt, O *dval, T *dbias, const O *dy, const O *q,
                                 const O *kt, int flags, const O *v, const T *bias, const O *y, const T *lse,
                                 int64_t batch, int64_t t, int64_t s, int64_t d, int64_t dv, int64_t nbias,
                                 int64_t brep, int64_t kvrep, int64_t heads, double scale, const KDrop *dr, T *ws,
                                 const KAttnLd *L)
{
    const int alone = dbias && brep % kvrep != 0;
    for (int64_t u = u0; u < u1; u++) {
        const KFN(AttnSlot) sl = KFN(attn_slot)(ws, t, s, d, dv);
        if (!dbias) {
            for (int64_t b = u * kvrep; b < (u + 1) * kvrep; b++)
                KFN(attn_grad_problem)(b, dq, dkt, dval, NULL, dy, q, kt, flags, v, bias, y, lse, t, s, d, dv, nbias,
                                       brep, kvrep, heads, scale, dr, &sl, L);
            continue;
        }
        if (alone) {
            memset(dbias, 0, sizeof(T) * (size_t)(nbias * t * s));
            for (int64_t b = 0; b < batch; b++)
                KFN(attn_grad_problem)(b, dq, dkt, dval, dbias + (b / brep % nbias) * t * s, dy, q, kt, flags, v,
                                       bias, y, lse, t, s, d, dv, nbias, brep, kvrep, heads, scale, dr, &sl, L);
            continue;
        }
        T *dbt = dbias + u * t * s;
        memset(dbt, 0, sizeof(T) * (size_t)(t * s));
        for (int64_t m = 0; m < batch / (nbias * brep); m++)
            for (int64_t rp = 0; rp < brep; rp++)
                KFN(attn_grad_problem)((m * nbias + u) * brep + rp, dq, dkt, dval, dbt, dy, q, kt, flags, v, bias, y,
                                       lse, t, s, d, dv, nbias, brep, kvrep, heads, scale, dr, &sl, L);
    }
}

/* The work is split by K/V problem, each running its kvrep query problems in increasing b (so dkt and dval sum
 * them in one order).  With dbias, by bias slice instead: slice c's problems (those with (b / brep) % nbias == c)
 * run in increasing b on one thread, each adding its dS to dbias[c] in that order; where a K/V group may span
 * bias slices (kvrep does not divide brep: a per-head learned bias with grouped kv heads, rare) one thread runs
 * every problem in order.  So dkt, dval and dbias are the same for any thread count. */
void KFN(k_attention_grad)(O *dq, O *dkt, O *dval, T *dbias, const O *dy, const O *q, const O *kt, int flags,
                           const O *v, const T *bias, const O *y, const T *lse, int64_t batch, int64_t t, int64_t s,
                           int64_t d, int64_t dv, int64_t nbias, int64_t brep, int64_t kvrep, int64_t heads,
                           double scale, double drop, uint64_t seed, uint32_t stream, uint32_t step, T *ws,
                           const KAttnLd *ld)
{
    const KDrop dr = {drop, seed, stream, step};
    const KAttnLd L = KFN(attn_layout)(flags, batch, s, d, dv, kvrep, heads, ld);
    if (batch <= 0)
        return;
    const int by_slice = dbias && brep % kvrep == 0, alone = dbias && !by_slice;
    const int64_t units = by_slice ? nbias : alone ? 1 : batch / kvrep;
    int64_t lo, hi;
    if (attn_share(units, &lo, &hi)) { /* inside a team that shares: this thread's units */
        KFN(attn_grad_units)(lo, hi, dq, dkt, dval, dbias, dy, q, kt, flags, v, bias, y, lse, batch, t, s, d, dv,
                             nbias, brep, kvrep, heads, scale, &dr, ws, &L);
        return;
    }
    const int nt = attn_threads(units);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t u = 0; u < units; u++)
        KFN(attn_grad_units)(u, u + 1, dq, dkt, dval, dbias, dy, q, kt, flags, v, bias, y, lse, batch, t, s, d, dv,
                             nbias, brep, kvrep, heads, scale, &dr, ws, &L);
}
#undef K_OUT
