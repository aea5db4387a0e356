/* attn.cu — fused attention (FusedAttention), forward and backward: the
 * twins of kernels/c/attn.c, by the same algorithm on the GPU's terms.
 *
 * Nothing of size t x s is stored.  The problem's dims travel as a KDims
 * (KC_ATTN_*: batch, t, s, d, dv, nbias, brep, flags; see kernels.h
 * k_attention).  A score is q_i . k_j (the sum in double) times scale,
 * rounded to T, plus the bias.
 *  forward     a block per query row: the row max and the sum of exp (the
 *              scores computed once for them), then the keys blockDim at a
 *              time: each thread computes one key's p = exp(score - max) /
 *              sum into shared memory, and thread c adds sum_j p_j v_jc to
 *              y_ic; lse = max + log(sum);
 *  k_attention_grad_q   a block per query row: D = dy_i . y_i, then the keys
 *              in chunks: ds_j = p_j (dy_i . v_j - D), p_j = exp(score -
 *              lse_i), and dq_ic += scale sum_j ds_j k_jc;
 *  k_attention_grad_kv  a block per key: the query rows in chunks, each
 *              thread one row's p, ds (its D recomputed), then dv_jc +=
 *              sum_i p_i dy_ic and dk_jc += scale sum_i ds_i q_ic;
 *  k_attention_grad_bias  (only when the bias wants a gradient) a block per
 *              row i of a bias slice c, a thread per key j: dbias_cij = the
 *              sum of ds_ij over the problems b reading slice c, in
 *              increasing b (D recomputed per problem).
 * With KC_ATTN_ZERO in the flags a row whose scores are all -inf gives y 0,
 * lse -inf and p 0 in the backward (ONNX Attention); without, NaN.
 * Every sum runs in an order fixed by the launch geometry: deterministic,
 * no atomics.  Typed kernels: templates stamped for float and double
 * (kernels.def).
 */

#define KC_ATTN_BATCH 0
#define KC_ATTN_T 1
#define KC_ATTN_S 2
#define KC_ATTN_D 3
#define KC_ATTN_DV 4
#define KC_ATTN_NBIAS 5
#define KC_ATTN_BREP 6
#define KC_ATTN_FLAGS 7 /* K_ATTN_KROW | K_ATTN_ZERO (kernels.h) */
#define KC_ATTN_KROW_BIT 1
#define KC_ATTN_ZERO_BIT 2

/* score of query row qi (d) against key j of problem b's keys kb, plus the row's bias (NULL: none) */
template <typename T>
KC_DEV T attn_score(const T *qi, const T *kb, const T *brow, int64_t j, const KDims &p, double scale)
{
    const int64_t d = p.d[KC_ATTN_D], s = p.d[KC_ATTN_S];
    const bool krow = (p.d[KC_ATTN_FLAGS] & KC_ATTN_KROW_BIT) != 0;
    double a = 0;
    for (int64_t k = 0; k < d; k++)
        a += (double)qi[k] * (double)kb[krow ? j * d + k : k * s + j];
    T v = (T)(scale * a);
    return brow ? v + brow[j] : v;
}

/* problem b's bias row i, or NULL */
template <typename T> KC_DEV const T *attn_bias_row(const T *bias, int64_t b, int64_t i, const KDims &p)
{
    const int64_t t = p.d[KC_ATTN_T], s = p.d[KC_ATTN_S];
    return bias ? bias + (b / p.d[KC_ATTN_BREP] % p.d[KC_ATTN_NBIAS]) * t * s + i * s : (const T *)0;
}

/* p = exp(score - lse): 0 in a row that sees nothing under KC_ATTN_ZERO */
template <typename T> KC_DEV T attn_prob(T score, T lse, const KDims &p)
{
    return (p.d[KC_ATTN_FLAGS] & KC_ATTN_ZERO_BIT) && lse == -kc_inf<T>() ? (T)0 : kc_exp(score - lse);
}

template <typename T> KC_DEV double attn_dot(const T *a, const T *b, int64_t n)
{
    double s = 0;
    for (int64_t k = 0; k < n; k++)
        s += (double)a[k] * (double)b[k];
    return s;
}

template <typename T>
KC_DEV void k_attention(T *y, T *lse, const T *q, const T *kt, const T *v, const T *bias, KDims p, double scale)
{
    __shared__ T pj[KC_ATTN_BLOCK];
    const int64_t t = p.d[KC_ATTN_T], s = p.d[KC_ATTN_S], d = p.d[KC_ATTN_D], dv = p.d[KC_ATTN_DV];
    for (int64_t row = blockIdx.x; row < p.d[KC_ATTN_BATCH] * t; row += gridDim.x) {
        const int64_t b = row / t;
        const T *qi = q + row * d, *kb = kt + b * d * s, *vb = v + b * s * dv, *brow = attn_bias_row(bias, b, row % t, p);
        T *yi = y + row * dv;
        T mx = -kc_inf<T>();
        for (int64_t j = threadIdx.x; j < s; j += blockDim.x)
            mx = kc_nanmax(mx, attn_score(qi, kb, brow, j, p, scale));
        mx = block_reduce(mx, -kc_inf<T>(), KcMax());
        if ((p.d[KC_ATTN_FLAGS] & KC_ATTN_ZERO_BIT) && s > 0 && mx == -kc_inf<T>()) { /* the whole block alike */
            for (int64_t c = threadIdx.x; c < dv; c += blockDim.x)
                yi[c] = 0;
            if (threadIdx.x == 0)
                lse[row] = mx;
            continue;
        }
        double sum = 0;
        for (int64_t j = threadIdx.x; j < s; j += blockDim.x)
            sum += (double)kc_exp(attn_score(qi, kb, brow, j, p, scale) - mx);
        sum = block_sum(sum);
        for (int64_t c = threadIdx.x; c < dv; c += blockDim.x)
            yi[c] = s > 0 ? (T)0 : kc_nan<T>();
        for (int64_t j0 = 0; j0 < s; j0 += blockDim.x) {
            const int64_t j = j0 + threadIdx.x;
            if (j < s)
                pj[threadIdx.x] = (T)((double)kc_exp(attn_score(qi, kb, brow, j, p, scale) - mx) / sum);
            __syncthreads();
            const int64_t nj = s - j0 < (int64_t)blockDim.x ? s - j0 : (int64_t)blockDim.x;
            for (int64_t c = threadIdx.x; c < dv; c += blockDim.x) {
                double a = 0;
                for (int64_t jj = 0; jj < nj; jj++)
                    a += (double)pj[jj] * (double)vb[(j0 + jj) * dv + c];
                yi[c] = (T)((double)yi[c] + a);
            }
            __syncthreads();
        }
        if (threadIdx.x == 0)
            lse[row] = s > 0 ? (T)((double)mx + log(sum)) : -kc_inf<T>();
    }
}

template <typename T>
KC_DEV void k_attention_grad_q(T *dq, const T *dy, const T *q, const T *kt, const T *v, const T *bias, const T *y,
                               const T *lse, KDims p, double scale)
{
    __shared__ T ds[KC_ATTN_BLOCK];
    const int64_t t = p.d[KC_ATTN_T], s = p.d[KC_ATTN_S], d = p.d[KC_ATTN_D], dv = p.d[KC_ATTN_DV];
    const bool krow = (p.d[KC_ATTN_FLAGS] & KC_ATTN_KROW_BIT) != 0;
    for (int64_t row = blockIdx.x; row < p.d[KC_ATTN_BATCH] * t; row += gridDim.x) {
        const int64_t b = row / t;
        const T *qi = q + row * d, *kb = kt + b * d * s, *vb = v + b * s * dv, *brow = attn_bias_row(bias, b, row % t, p);
        const T *dyi = dy + row * dv, *yi = y + row * dv;
        double dd = 0;
        for (int64_t c = threadIdx.x; c < dv; c += blockDim.x)
            dd += (double)dyi[c] * (double)yi[c];
        dd = block_sum(dd);
        T *dqi = dq + row * d;
        for (int64_t c = threadIdx.x; c < d; c += blockDim.x)
            dqi[c] = 0;
        for (int64_t j0 = 0; j0 < s; j0 += blockDim.x) {
            const int64_t j = j0 + threadIdx.x;
            if (j < s) {
                const T pr = attn_prob(attn_score(qi, kb, brow, j, p, scale), lse[row], p);
                ds[threadIdx.x] = pr * (T)(attn_dot(dyi, vb + j * dv, dv) - dd);
            }
            __syncthreads();
            const int64_t nj = s - j0 < (int64_t)blockDim.x ? s - j0 : (int64_t)blockDim.x;
            for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
                double a = 0;
                for (int64_t jj = 0; jj < nj; jj++)
                    a += (double)ds[jj] * (double)kb[krow ? (j0 + jj) * d + c : c * s + j0 + jj];
                dqi[c] = (T)((double)dqi[c] + scale * a);
            }
            __syncthreads();
        }
    }
}

template <typename T>
KC_DEV void k_attention_grad_kv(T *dkt, T *dval, const T *dy, const T *q, const T *kt, const T *v, const T *bias,
                                const T *y, const T *lse, KDims p, double scale)
{
    __shared__ T pi[KC_ATTN_BLOCK], ds[KC_ATTN_BLOCK];
    const int64_t t = p.d[KC_ATTN_T], s = p.d[KC_ATTN_S], d = p.d[KC_ATTN_D], dv = p.d[KC_ATTN_DV];
    const bool krow = (p.d[KC_ATTN_FLAGS] & KC_ATTN_KROW_BIT) != 0;
    for (int64_t key = blockIdx.x; key < p.d[KC_ATTN_BATCH] * s; key += gridDim.x) {
        const int64_t b = key / s, j = key % s;
        const T *kb = kt + b * d * s, *vj = v + key * dv;
        T *dvj = dval + key * dv, *dkb = dkt + b * d * s;
        for (int64_t c = threadIdx.x; c < dv; c += blockDim.x)
            dvj[c] = 0;
        for (int64_t c = threadIdx.x; c < d; c += blockDim.x)
            dkb[krow ? j * d + c : c * s + j] = 0;
        for (int64_t i0 = 0; i0 < t; i0 += blockDim.x) {
            const int64_t i = i0 + threadIdx.x;
            if (i < t) {
                const int64_t row = b * t + i;
                const T *dyi = dy + row * dv;
                const T pr = attn_prob(attn_score(q + row * d, kb, attn_bias_row(bias, b, i, p), j, p, scale), lse[row], p);
                pi[threadIdx.x] = pr;
                ds[threadIdx.x] = pr * (T)(attn_dot(dyi, vj, dv) - attn_dot(dyi, y + row * dv, dv));
            }
            __syncthreads();
            const int64_t ni = t - i0 < (int64_t)blockDim.x ? t - i0 : (int64_t)blockDim.x;
            for (int64_t c = threadIdx.x; c < dv; c += blockDim.x) {
                double a = 0;
                for (int64_t ii = 0; ii < ni; ii++)
                    a += (double)pi[ii] * (double)dy[(b * t + i0 + ii) * dv + c];
                dvj[c] = (T)((double)dvj[c] + a);
            }
            for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
                double a = 0;
                for (int64_t ii = 0; ii < ni; ii++)
                    a += (double)ds[ii] * (double)q[(b * t + i0 + ii) * d + c];
                T *e = dkb + (krow ? j * d + c : c * s + j);
                *e = (T)((double)*e + scale * a);
            }
            __syncthreads();
        }
    }
}

template <typename T>
KC_DEV void k_attention_grad_bias(T *dbias, const T *dy, const T *q, const T *kt, const T *v, const T *bias,
                                  const T *y, const T *lse, KDims p, double scale)
{
    const int64_t t = p.d[KC_ATTN_T], s = p.d[KC_ATTN_S], d = p.d[KC_ATTN_D], dv = p.d[KC_ATTN_DV];
    const int64_t nbias = p.d[KC_ATTN_NBIAS], brep = p.d[KC_ATTN_BREP], outer = p.d[KC_ATTN_BATCH] / (nbias * brep);
    for (int64_t brow = blockIdx.x; brow < nbias * t; brow += gridDim.x) {
        const int64_t c = brow / t, i = brow % t;
        for (int64_t j = threadIdx.x; j < s; j += blockDim.x) {
            double a = 0;
            for (int64_t m = 0; m < outer; m++)
                for (int64_t r = 0; r < brep; r++) {
                    const int64_t b = (m * nbias + c) * brep + r, row = b * t + i;
                    const T *dyi = dy + row * dv, *vb = v + b * s * dv;
                    const T pr = attn_prob(attn_score(q + row * d, kt + b * d * s, attn_bias_row(bias, b, i, p), j, p,
                                                      scale), lse[row], p);
                    a += (double)(pr * (T)(attn_dot(dyi, vb + j * dv, dv) - attn_dot(dyi, y + row * dv, dv)));
                }
            dbias[brow * s + j] = (T)a;
        }
    }
}
