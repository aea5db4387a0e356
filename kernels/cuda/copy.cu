/* copy.cu — layout kernels, the twins of kernels/c/copy.c: strided copy
 * (Slice, Split, Concat, Expand, Tile, and transposes read in rows), a
 * tiled transpose, Pad and its backward.
 *
 * k_copy_strided is a grid-stride loop over the merged index space the
 * launcher builds (destinations are distinct, so any split is safe).  A
 * transpose whose innermost output dim is strided in x would read one
 * element per 32-byte sector that way; k_transpose_tiled_f32 instead moves
 * 32 x 32 tiles through shared memory: it reads x along the dim that is
 * contiguous in x and writes y along y's contiguous dim, both coalesced.
 *
 * Pad's forward maps each y element to its source per dim (pad_src, the
 * same rule as kernels/c).  Its backward gathers: each dx element sums the
 * dy elements that read it.  Per dim those form an interval (CONSTANT,
 * EDGE) or two arithmetic progressions (REFLECT); walking them as an
 * odometer visits dy in row-major order, the order kernels/c adds in, so
 * the float sums agree bit for bit and no atomics are needed.
 */

/* ---- k_copy_strided ------------------------------------------------------ */

template <typename U, typename I>
KC_DEV void copy_loop(U *y, const U *x, I n, int rank, const KDims &shape, const KDims &ys,
                      const KDims &xs)
{
    for (I i = kc_first<I>(); i < n; i += kc_stride<I>()) {
        int64_t oy, ox, unused;
        kc_offsets(i, rank, shape, ys, xs, xs, oy, ox, unused);
        y[oy] = x[ox];
    }
}

template <typename I>
KC_DEV void copy_esize(int esize, void *y, const void *x, I n, int rank, const KDims &shape,
                       const KDims &ys, const KDims &xs)
{
    switch (esize) {
    case 1: copy_loop((uint8_t *)y, (const uint8_t *)x, n, rank, shape, ys, xs); break;
    case 2: copy_loop((uint16_t *)y, (const uint16_t *)x, n, rank, shape, ys, xs); break;
    case 4: copy_loop((uint32_t *)y, (const uint32_t *)x, n, rank, shape, ys, xs); break;
    default: copy_loop((uint64_t *)y, (const uint64_t *)x, n, rank, shape, ys, xs); break;
    }
}

/* y[idx . ys] = x[idx . xs] for the n positions of shape; y and x already
 * point at element yoff / xoff */
KC_GLOBAL void k_copy_strided(int esize, void *y, const void *x, int64_t n, int rank, KDims shape,
                              KDims ys, KDims xs)
{
    if (n <= KC_INT32_LIMIT)
        copy_esize<uint32_t>(esize, y, x, (uint32_t)n, rank, shape, ys, xs);
    else
        copy_esize<int64_t>(esize, y, x, n, rank, shape, ys, xs);
}

/* ---- k_transpose_tiled_f32 ------------------------------------------------- */

#define KC_TILE 32

/* For each batch position b (bshape, with x strides bxs and y strides bys)
 * y[b][q * yq + l] = x[b][q + l * ix], q < nq, l < nl: tiles of 32 q x 32 l,
 * blockDim 256 (32 x 8 threads), grid-stride over tiles. */
template <typename T> KC_DEV void k_transpose_tiled(T *y, const T *x, int64_t nq, int64_t nl, int64_t ix,
                                                    int64_t yq, int64_t nbatch, int brank, KDims bshape, KDims bxs,
                                                    KDims bys)
{
    __shared__ T tile[KC_TILE][KC_TILE + 1]; /* [l][q], padded against bank conflicts */
    const int tx = threadIdx.x % KC_TILE, ty = threadIdx.x / KC_TILE, rows = blockDim.x / KC_TILE;
    const int64_t tq = (nq + KC_TILE - 1) / KC_TILE, tl = (nl + KC_TILE - 1) / KC_TILE;
    for (int64_t t = blockIdx.x; t < nbatch * tq * tl; t += gridDim.x) {
        const int64_t b = t / (tq * tl), q0 = t / tl % tq * KC_TILE, l0 = t % tl * KC_TILE;
        int64_t xb, yb, unused;
        kc_offsets(b, brank, bshape, bxs, bys, bys, xb, yb, unused);
        for (int r = ty; r < KC_TILE; r += rows) /* threads along q: x contiguous */
            if (q0 + tx < nq && l0 + r < nl)
                tile[r][tx] = x[xb + q0 + tx + (l0 + r) * ix];
        __syncthreads();
        for (int r = ty; r < KC_TILE; r += rows) /* threads along l: y contiguous */
            if (q0 + r < nq && l0 + tx < nl)
                y[yb + (q0 + r) * yq + l0 + tx] = tile[tx][r];
        __syncthreads();
    }
}

/* ---- k_pad, k_pad_grad --------------------------------------------------- */

/* source index along a dim of length n for padded position j (output index
 * minus the begin pad), or -1 where a CONSTANT pad covers it */
KC_DEV int64_t pad_src(int mode, int64_t j, int64_t n)
{
    if (j >= 0 && j < n)
        return j;
    if (mode == K_PAD_CONSTANT)
        return -1;
    if (mode == K_PAD_EDGE)
        return j < 0 ? 0 : n - 1;
    const int64_t p = 2 * (n - 1); /* REFLECT: the pattern's period */
    if (p == 0)
        return 0;
    j %= p;
    if (j < 0)
        j += p;
    return j < n ? j : p - j;
}

/* y (yshape, dense) from x (xshape, dense); pb = the begin pads (negative:
 * crop) */
template <typename T> KC_DEV void k_pad(int mode, T *y, const T *x, int64_t n, int rank, KDims yshape,
                                        KDims xshape, KDims pb, T value)
{
    for (int64_t i = kc_first<int64_t>(); i < n; i += kc_stride<int64_t>()) {
        int64_t rest = i, off = 0, xs = 1;
        bool inside = true;
#pragma unroll
        for (int d = KC_MAX_RANK - 1; d >= 0; d--)
            if (d < rank) {
                const int64_t j = rest % yshape.d[d], s = pad_src(mode, j - pb.d[d], xshape.d[d]);
                rest /= yshape.d[d];
                inside = inside && s >= 0;
                off += s * xs;
                xs *= xshape.d[d];
            }
        y[i] = inside ? x[off] : value;
    }
}

/* The smallest y index j' >= j along one dim (length ny, begin pad pb, x
 * length n) whose source is x index s, or ny if there is none. */
KC_DEV int64_t pad_next(int mode, int64_t s, int64_t n, int64_t pb, int64_t ny, int64_t j)
{
    if (mode == K_PAD_CONSTANT) {
        const int64_t k = s + pb;
        return k >= j && k < ny ? k : ny;
    }
    if (mode == K_PAD_EDGE) { /* one interval: the border also collects the padding */
        const int64_t lo = s == 0 ? 0 : s + pb, hi = s == n - 1 ? ny - 1 : s + pb;
        const int64_t k = kc_max64(j, lo);
        return k <= hi && k < ny ? k : ny;
    }
    const int64_t p = 2 * (n - 1); /* REFLECT: t = j - pb congruent to s or -s mod p */
    if (p == 0)
        return j < ny ? j : ny;
    const int64_t t = j - pb, r1 = s, r2 = (p - s) % p;
    const int64_t d1 = ((r1 - t) % p + p) % p, d2 = ((r2 - t) % p + p) % p;
    const int64_t k = j + kc_min64(d1, d2);
    return k < ny ? k : ny;
}

/* dx (xshape, written) = sum of dy (yshape) over the y elements whose source
 * is each dx element, in y's row-major order */
template <typename T> KC_DEV void k_pad_grad(int mode, T *dx, const T *dy, int64_t n, int rank, KDims xshape,
                                             KDims yshape, KDims pb)
{
    for (int64_t i = kc_first<int64_t>(); i < n; i += kc_stride<int64_t>()) {
        int64_t s[KC_MAX_RANK], j[KC_MAX_RANK], rest = i;
        bool any = true;
        for (int d = rank - 1; d >= 0; d--) {
            s[d] = rest % xshape.d[d];
            rest /= xshape.d[d];
        }
        for (int d = 0; d < rank; d++) {
            j[d] = pad_next(mode, s[d], xshape.d[d], pb.d[d], yshape.d[d], 0);
            any = any && j[d] < yshape.d[d];
        }
        T acc = (T)0;
        while (any) {
            int64_t off = 0;
            for (int d = 0; d < rank; d++)
                off = off * yshape.d[d] + j[d];
            acc += dy[off];
            int d = rank - 1; /* advance the odometer, innermost first */
            for (; d >= 0; d--) {
                j[d] = pad_next(mode, s[d], xshape.d[d], pb.d[d], yshape.d[d], j[d] + 1);
                if (j[d] < yshape.d[d])
                    break;
                j[d] = pad_next(mode, s[d], xshape.d[d], pb.d[d], yshape.d[d], 0);
            }
            any = d >= 0;
        }
        dx[i] = acc;
    }
}
