/* gather.cu — Gather along one axis (any dtype) and its backward for
 * float32 and float64: the twins of kernels/c/gather.c.
 *
 * x is outer x axis x inner; every index selects a row of inner elements.
 * The forward is a grid-stride copy of y's elements.  It cannot validate
 * every index before writing (that would need a grid-wide barrier), so the
 * threads first check the indices (a grid-stride pass over idx) and record
 * each bad one's position in the check slot with atomicMin over unsigned
 * (the runtime's -1 is the largest value, so the smallest bad position
 * wins, as kernels/c's first bad index); the copy skips bad indices, and
 * the runtime then fails the step.
 *
 * The backward adds dy's rows into dx at the selected rows; a repeated
 * index adds twice.  dx is zeroed first (the launcher's kc_memset), then
 * each thread owns a set of dx elements (a column, split by row into
 * buckets for parallelism) and adds the indices that land in its elements
 * in ascending order: deterministic, no atomics, and every element's float
 * sum is kernels/c's, in kernels/c's order.  Which indices those are, one
 * block lists first (k_gather_lists: each bucket's positions in ascending
 * order, in kc_glist), so that a thread walks only its own bucket's list
 * (an embedding's gradient: 8192 tokens over 1024 buckets, 8 each); an
 * index list too long for kc_glist makes every thread walk all indices
 * (k_gather_grad).
 */

/* the bucket of index i (-1: out of range), for k_gather_lists */
KC_DEV int gather_bucket(const int64_t *idx, int64_t i, int64_t axis, int64_t buckets)
{
    const int64_t k = idx[i] < 0 ? idx[i] + axis : idx[i];
    return k >= 0 && k < axis ? (int)(k & (buckets - 1)) : -1;
}

/* one block of KC_GATHER_THREADS threads (buckets at most that many):
 * kc_glist[b] (b <= buckets) = the first slot of bucket b's list, and
 * kc_glist[buckets + 1 + that ...] the positions i (ascending) of the valid
 * indices whose row k has k mod buckets == b.  The indices' buckets are
 * staged in shared memory a piece at a time (the threads read them there,
 * not each all of idx from global memory); thread t counts bucket t's,
 * the block's exclusive scan of the counts places the lists, and a second
 * pass writes them. */
#define KC_GATHER_STAGE 4096
KC_GLOBAL void k_gather_lists(const int64_t *idx, int64_t nidx, int64_t axis, int64_t buckets)
{
    __shared__ int64_t sum[KC_GATHER_THREADS];
    __shared__ int stage[KC_GATHER_STAGE];
    const int t = threadIdx.x;
    int *list = kc_glist + buckets + 1;
    int64_t mine = 0, at = 0;
    for (int pass = 0; pass < 2; pass++) { /* count, then write */
        for (int64_t i0 = 0; i0 < nidx; i0 += KC_GATHER_STAGE) {
            const int n = nidx - i0 < KC_GATHER_STAGE ? (int)(nidx - i0) : KC_GATHER_STAGE;
            __syncthreads();
            for (int j = t; j < n; j += KC_GATHER_THREADS)
                stage[j] = gather_bucket(idx, i0 + j, axis, buckets);
            __syncthreads();
            for (int j = 0; j < n; j++)
                if (stage[j] == t) {
                    if (pass)
                        list[at++] = (int)(i0 + j);
                    else
                        mine++;
                }
        }
        if (pass)
            break;
        sum[t] = mine;
        __syncthreads();
        for (int s = 1; s < KC_GATHER_THREADS; s *= 2) { /* inclusive scan */
            const int64_t v = t >= s ? sum[t - s] : 0;
            __syncthreads();
            sum[t] += v;
            __syncthreads();
        }
        at = sum[t] - mine; /* bucket t's list, from here */
        if (t < buckets)
            kc_glist[t] = (int)at;
        if (t == KC_GATHER_THREADS - 1)
            kc_glist[buckets] = (int)sum[t];
    }
}

/* dx (zeroed) [o][idx[i]][c] += dy[o][i][c] for bucket b's list (k_gather_lists),
 * thread (b, o, c), c fastest */
template <typename T> KC_DEV void k_gather_grad_lists(T *dx, const T *dy, const int64_t *idx, int64_t outer,
                                                      int64_t axis, int64_t inner, int64_t nidx, int64_t buckets)
{
    const int *list = kc_glist + buckets + 1;
    for (int64_t t = kc_first<int64_t>(); t < buckets * outer * inner; t += kc_stride<int64_t>()) {
        const int64_t c = t % inner, o = t / inner % outer, b = t / (inner * outer);
        T *dxo = dx + o * axis * inner + c;
        const T *dyo = dy + o * nidx * inner + c;
        for (int j = kc_glist[b]; j < kc_glist[b + 1]; j++) {
            const int64_t i = list[j], k = idx[i] < 0 ? idx[i] + axis : idx[i];
            dxo[k * inner] += dyo[i * inner];
        }
    }
}

template <typename U, typename I>
KC_DEV void gather_loop(U *y, const U *x, const int64_t *idx, I outer, I axis, I inner, I nidx,
                        int64_t *check)
{
    const I n = outer * nidx * inner;
    for (I i = kc_first<I>(); i < nidx; i += kc_stride<I>()) /* every index, even if y is empty */
        if (idx[i] < -(int64_t)axis || idx[i] >= (int64_t)axis)
            atomicMin((unsigned long long *)check, (unsigned long long)i);
    for (I t = kc_first<I>(); t < n; t += kc_stride<I>()) {
        const I col = t % inner, u = t / inner, i = u % nidx, o = u / nidx;
        int64_t k = idx[i];
        if (k < -(int64_t)axis || k >= (int64_t)axis)
            continue; /* reported above; nothing to read */
        if (k < 0)
            k += (int64_t)axis;
        y[t] = x[((int64_t)o * (int64_t)axis + k) * (int64_t)inner + (int64_t)col];
    }
}

template <typename I>
KC_DEV void gather_esize(int esize, void *y, const void *x, const int64_t *idx, I outer, I axis,
                         I inner, I nidx, int64_t *check)
{
    switch (esize) {
    case 1: gather_loop((uint8_t *)y, (const uint8_t *)x, idx, outer, axis, inner, nidx, check); break;
    case 2: gather_loop((uint16_t *)y, (const uint16_t *)x, idx, outer, axis, inner, nidx, check); break;
    case 4: gather_loop((uint32_t *)y, (const uint32_t *)x, idx, outer, axis, inner, nidx, check); break;
    default: gather_loop((uint64_t *)y, (const uint64_t *)x, idx, outer, axis, inner, nidx, check);
    }
}

/* y[o][i][:] = x[o][idx[i]][:]; the first bad index position goes to check */
KC_GLOBAL void k_gather(int esize, void *y, const void *x, const int64_t *idx, int64_t outer,
                        int64_t axis, int64_t inner, int64_t nidx, int64_t *check)
{
    if (outer * nidx * inner <= KC_INT32_LIMIT && nidx <= KC_INT32_LIMIT && axis <= KC_INT32_LIMIT)
        gather_esize<uint32_t>(esize, y, x, idx, (uint32_t)outer, (uint32_t)axis, (uint32_t)inner,
                               (uint32_t)nidx, check);
    else
        gather_esize<int64_t>(esize, y, x, idx, outer, axis, inner, nidx, check);
}

/* dx (zeroed by the launcher) [o][idx[i]][c] += dy[o][i][c], i ascending.
 * Thread (b, o, c) owns the dx rows k with k mod buckets == b (buckets a
 * power of two) of column c: it walks all indices and adds those landing in
 * its rows, so each dx element is summed by one thread in index order
 * whatever the bucket count.  c varies fastest across a warp, so the warp
 * agrees on every branch and its dy / dx accesses are contiguous. */
template <typename T> KC_DEV void k_gather_grad(T *dx, const T *dy, const int64_t *idx, int64_t outer,
                                                int64_t axis, int64_t inner, int64_t nidx, int64_t buckets)
{
    for (int64_t t = kc_first<int64_t>(); t < buckets * outer * inner; t += kc_stride<int64_t>()) {
        const int64_t c = t % inner, o = t / inner % outer, b = t / (inner * outer);
        T *dxo = dx + o * axis * inner + c;
        const T *dyo = dy + o * nidx * inner + c;
        for (int64_t i = 0; i < nidx; i++) {
            const int64_t k = idx[i] < 0 ? idx[i] + axis : idx[i];
            if (k >= 0 && k < axis && (k & (buckets - 1)) == b)
                dxo[k * inner] += dyo[i * inner];
        }
    }
}

/* GatherElements, kernels/c/gather.c's columns: a thread per column of idx
 * along the axis (one position of idx's other dims), walking it in order.
 * Columns touch disjoint x elements, so the backward (dx zeroed by the
 * launcher) needs no atomics and sums each dx element in kernels/c's order.
 * Bad indices: reported and skipped as k_gather's. */
KC_DEV void column_at(int64_t u, int rank, int axis, const KDims &sh, const KDims &is, const KDims &xs,
                      int64_t &oi, int64_t &ox)
{
    oi = ox = 0;
    for (int d = rank - 1; d >= 0; d--)
        if (d != axis) {
            const int64_t m = u % sh.d[d];
            u /= sh.d[d];
            oi += m * is.d[d], ox += m * xs.d[d];
        }
}

template <typename U>
KC_DEV void gather_elements_loop(U *y, const U *x, const int64_t *idx, int rank, int axis, int64_t cols,
                                 int64_t axdim, const KDims &sh, const KDims &is, const KDims &xs,
                                 int64_t *check)
{
    const int64_t len = sh.d[axis], istep = is.d[axis], xstep = xs.d[axis];
    for (int64_t i = kc_first<int64_t>(); i < cols * len; i += kc_stride<int64_t>())
        if (idx[i] < -axdim || idx[i] >= axdim)
            atomicMin((unsigned long long *)check, (unsigned long long)i);
    for (int64_t u = kc_first<int64_t>(); u < cols; u += kc_stride<int64_t>()) {
        int64_t oi, ox;
        column_at(u, rank, axis, sh, is, xs, oi, ox);
        for (int64_t a = 0; a < len; a++, oi += istep) {
            int64_t k = idx[oi];
            if (k < -axdim || k >= axdim)
                continue;
            y[oi] = x[ox + (k < 0 ? k + axdim : k) * xstep];
        }
    }
}

/* y[m] = x[m with m[axis] = idx[m]]; the first bad index position goes to check */
KC_GLOBAL void k_gather_elements(int esize, void *y, const void *x, const int64_t *idx, int rank, int axis,
                                 int64_t cols, int64_t axdim, KDims sh, KDims is, KDims xs, int64_t *check)
{
    switch (esize) {
    case 1: gather_elements_loop((uint8_t *)y, (const uint8_t *)x, idx, rank, axis, cols, axdim, sh, is, xs, check); break;
    case 2: gather_elements_loop((uint16_t *)y, (const uint16_t *)x, idx, rank, axis, cols, axdim, sh, is, xs, check); break;
    case 4: gather_elements_loop((uint32_t *)y, (const uint32_t *)x, idx, rank, axis, cols, axdim, sh, is, xs, check); break;
    default: gather_elements_loop((uint64_t *)y, (const uint64_t *)x, idx, rank, axis, cols, axdim, sh, is, xs, check);
    }
}

/* dx (zeroed) [m with m[axis] = idx[m]] += dy[m], along each column in order;
 * ScatterElements' scatter too, so bad indices are reported as k_gather's
 * (and skipped) */
template <typename T> KC_DEV void k_gather_elements_grad(T *dx, const T *dy, const int64_t *idx, int rank, int axis,
                                                         int64_t cols, int64_t axdim, KDims sh, KDims is, KDims xs,
                                                         int64_t *check)
{
    const int64_t len = sh.d[axis], istep = is.d[axis], xstep = xs.d[axis];
    for (int64_t i = kc_first<int64_t>(); i < cols * len; i += kc_stride<int64_t>())
        if (idx[i] < -axdim || idx[i] >= axdim)
            atomicMin((unsigned long long *)check, (unsigned long long)i);
    for (int64_t u = kc_first<int64_t>(); u < cols; u += kc_stride<int64_t>()) {
        int64_t oi, ox;
        column_at(u, rank, axis, sh, is, xs, oi, ox);
        for (int64_t a = 0; a < len; a++, oi += istep) {
            const int64_t k = idx[oi] < 0 ? idx[oi] + axdim : idx[oi];
            if (k >= 0 && k < axdim)
                dx[ox + k * xstep] += dy[oi];
        }
    }
}

/* GatherND's / ScatterND's tuples (kernels/c's k_nd_index): y[t] = (t / nq)
 * span + the tuple's offset in dims; bad components reported as k_gather's,
 * their tuples left unwritten */
KC_GLOBAL void k_nd_index(int64_t *y, const int64_t *idx, int64_t batch, int64_t nq, int k, KDims dims,
                          int64_t *check)
{
    int64_t span = 1;
    for (int i = 0; i < k; i++)
        span *= dims.d[i];
    for (int64_t i = kc_first<int64_t>(); i < batch * nq * k; i += kc_stride<int64_t>())
        if (idx[i] < -dims.d[i % k] || idx[i] >= dims.d[i % k])
            atomicMin((unsigned long long *)check, (unsigned long long)i);
    for (int64_t t = kc_first<int64_t>(); t < batch * nq; t += kc_stride<int64_t>()) {
        const int64_t *p = idx + t * k;
        int64_t off = 0;
        int ok = 1;
        for (int i = 0; i < k; i++) {
            ok &= p[i] >= -dims.d[i] && p[i] < dims.d[i];
            off = off * dims.d[i] + (p[i] < 0 ? p[i] + dims.d[i] : p[i]);
        }
        if (ok)
            y[t] = t / nq * span + off;
    }
}
