/* attn.cu — fused attention (FusedAttention), forward and backward: the
 * twins of kernels/c/attn.c, tiled as FlashAttention-2 on the GPU's terms.
 *
 * Nothing of size t x s is stored.  The problem's dims travel as a KDims
 * (KC_ATTN_*: batch, t, s, d, dv, nbias with brep, heads, flags with kvrep;
 * see kernels.h k_attention).  Query problem b reads K/V problem b / kvrep
 * (grouped-query attention's kv heads, read in place).  With heads H, q, k,
 * v, y and their gradients are in the projections' layout (problem b: head
 * b % H of row b / H, rows H d apart: attn_row); else each problem dense.  A score is scale (q_i . k_j) + bias_ij, the dot product
 * summed in T.  Every kernel runs KC_ATTN_BLOCK = 128 threads as a 16 x 8
 * grid: thread (ty, tx) = (threadIdx / 8, threadIdx % 8) holds rows ty R ..
 * ty R + R-1 of a tile and its columns tx, tx + 8, ... (strided, so that a
 * warp's shared-memory reads hit 8 consecutive words and broadcast), and a
 * row's 8 threads are consecutive lanes of one warp, which reduce the row
 * (max, sum) by three xor shuffles.  Operands are staged in shared memory
 * zero-padded to whole tiles, k-major with an odd leading dimension (no
 * bank conflicts on the transposed stores); attn_mma is the one register-
 * tiled product every contraction uses.  Tiles (AttnTile; float64 halves
 * the float32 sizes, kc.h mirrors them for the launchers):
 *  forward (k_attention)   a block per (problem, 64 query rows, 64 output
 *      columns): the key tiles of 32 in order, S = scale Q Kt + bias over d
 *      in chunks of 64 (Q staged once when d <= 64), the online softmax per
 *      row (running max m and sum l; p = exp(s - m), the older sums rescaled
 *      by exp(m_old - m)), P to shared memory, O += P V in registers; then
 *      y = O / l, lse = m + log l.  Shared: Q 64x65, K 64x33, V 32x65, P
 *      64x33 floats = 41 KB.
 *  k_attention_grad_q  a block per (problem, 64 query rows, 64 columns of
 *      dq): D_i = dy_i . y_i, then per key tile P = exp(S - lse), dP = dY
 *      V^T (over dv in chunks), dS = P (dP - D) to shared memory and dQ +=
 *      dS K in registers; dq = scale dQ.  Shared: Q or dY 64x65, K, V^T, dS
 *      64x33 = 41 KB.
 *  k_attention_grad_kv  a block per (K/V problem, 64 keys, a 64-column chunk
 *      of dk and of dv): the query tiles of 16 of its kvrep query problems
 *      in order (so a group's sum has one order), S^T, P^T and dP^T as
 *      above with the keys as rows (K and V^T staged once when d, dv <= 64),
 *      dV += P^T dY and dK += dS^T Q in registers; dkt = scale dK.  Shared:
 *      K, V^T 64x65, Q^T, dY^T 64x17, P^T (then dS^T) 64x17 = 45.5 KB.
 * (float64: 32 query rows, 32 keys per step, chunks of 32, 32 keys per kv
 * block: 33 / 33 / 30 KB.)  All static, under the 48 KB a block gets
 * without opt-in: 4 to 5 blocks (16 to 20 warps) per H100 multiprocessor,
 * fewer where the ~170 registers a thread of the backward holds bind.
 * The contraction's chunks run in an order that ends with the block's own
 * output chunk, so the operand the last product needs is still staged.  A
 * key tile (or, in the kv kernel, query tile) whose bias entries are all
 * -inf for the block's rows is skipped (the masked half of a causal bias):
 * its p are 0, which changes nothing.  A row whose max stays -inf has p 0
 * throughout; at the end it gives NaN (as softmax does), or with
 * KC_ATTN_ZERO y 0, lse -inf and p 0 in the backward (ONNX Attention).
 *  k_attention_grad_bias  (only when the bias wants a gradient: a learned
 *      bias; rare) a block per row i of a bias slice c, a thread per key j:
 *      dbias_cij = the sum of ds_ij over the problems b reading slice c, in
 *      increasing b, each score recomputed from global memory.
 * Every sum runs in an order fixed by the launch geometry (the shuffles are
 * butterflies: every lane gets the same bits): deterministic, no atomics.
 * Sums accumulate in T (float for float32 and the low types).
 *
 * Types.  The f32 / f64 kernels are templates stamped by kernels.def.  The
 * low-precision instances (k_attention_bf16, _f16, ...) take q, kt, v, y,
 * dy and write y, dq, dkt, dv as bfloat16 / float16 bits (each rounded once
 * from the float32 result as it is stored), lse, the bias and dbias float32;
 * they run the same templates with AttnTy<KcBf16> / <KcF16>: q, kt, v and dY
 * are staged as they are and every other GEMM operand rounded to the low
 * type (P before P V and dV += P^T dY, dS in dQ and dK); the softmax
 * statistics, D and the sums stay float32.  Their products run on the tensor cores
 * (attn_mma_tc: nvcuda::wmma 16x16x16 fragments with float accumulators,
 * each warp taking the product's 16 x 16 tiles in turn, stored to a 64x68
 * float scratch from which each thread adds its entries to its registers, so
 * the softmax rescaling stays the float32 code's), with operands as bits in
 * rows padded by 8 (wmma's ldm, 16-byte rows off the same banks): shared
 * 41 / 41 / 44 KB with the 17 KB scratch.  Below sm_80 (no bf16 wmma) they
 * widen to float in shared memory and take the float32 path.
 */

#define KC_ATTN_BATCH 0
#define KC_ATTN_T 1
#define KC_ATTN_S 2
#define KC_ATTN_D 3
#define KC_ATTN_DV 4
#define KC_ATTN_BIAS 5  /* nbias in the low 32 bits, brep above (launch.c attn_dims) */
#define KC_ATTN_HEADS 6 /* 0: each problem's rows dense; H: [.., rows, H, d] (kernels.h k_attention's heads) */
/* K_ATTN_KROW | K_ATTN_ZERO | K_ATTN_CAUSAL | window << K_ATTN_WINDOW_SHIFT (kernels.h) in the low 32 bits,
 * kvrep - 1 from KC_ATTN_KVREP_SHIFT (kc.h) on (KDims has no ninth slot; 0 there: each problem its own K, V) */
#define KC_ATTN_FLAGS 7
#define KC_ATTN_KROW_BIT 1
#define KC_ATTN_ZERO_BIT 2
#define KC_ATTN_CAUSAL_BIT 4
#define KC_ATTN_WINDOW_SHIFT 8

/* ---- element types ------------------------------------------------------- */

/* The 16-bit instances multiply on the tensor cores (nvcuda::wmma, bf16 from
 * sm_80 on) where the arch has them: KC_ATTN_TC.  The host emulation
 * (kernels/cuda/emu.h) has its own wmma; elsewhere they run on the CUDA cores. */
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define KC_ATTN_TC 1
#else
#define KC_ATTN_TC 0
#endif
#if defined(__CUDACC_RTC__) && KC_ATTN_TC
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#endif

struct KcBf16 {}; /* tags: q, kt and v hold bfloat16 / float16 bits */
struct KcF16 {};

/* E: the element of q, kt, v, y, dy and dq, dkt, dv; T: of lse, the bias,
 * dbias and the sums; S: of the GEMM operands staged in shared memory, PAD
 * their rows' padding, TC whether attn_mma takes the tensor cores (W: wmma's
 * element type).  in() widens an E to T, out() rounds a T to an E, op()
 * rounds a T as a GEMM operand; st() stages an E and stt() a T as a GEMM
 * operand (both exact but for the rounding). */
template <typename L> struct AttnTy {
    typedef L T;
    typedef L E;
    typedef L S;
    enum { PAD = 1, TC = 0 };
    KC_DEV T in(E x) { return x; }
    KC_DEV E out(T x) { return x; }
    KC_DEV T op(T x) { return x; }
    KC_DEV S st(E x) { return x; }
    KC_DEV S stt(T x) { return x; }
};
/* a 16-bit type's bits widened to float and a float rounded to them */
template <typename L> struct AttnBits;
template <> struct AttnBits<KcBf16> {
    KC_DEV float wide(uint16_t x) { return kc_bf16_to_f32(x); }
    KC_DEV uint16_t narrow(float x) { return kc_bf16_from_f32(x); }
};
template <> struct AttnBits<KcF16> {
    KC_DEV float wide(uint16_t x) { return kc_f16_to_f32(x); }
    KC_DEV uint16_t narrow(float x) { return kc_f16_from_f32(x); }
};
#if KC_ATTN_TC
/* bits in shared memory, rows padded to a multiple of 8 elements (wmma's ldm) */
template <typename L, typename W> struct AttnLow {
    typedef float T;
    typedef uint16_t E;
    typedef uint16_t S;
    typedef W Wmma;
    enum { PAD = 8, TC = 1 };
    KC_DEV float in(uint16_t x) { return AttnBits<L>::wide(x); }
    KC_DEV uint16_t out(float x) { return AttnBits<L>::narrow(x); }
    KC_DEV float op(float x) { return AttnBits<L>::wide(AttnBits<L>::narrow(x)); }
    KC_DEV uint16_t st(uint16_t x) { return x; }
    KC_DEV uint16_t stt(float x) { return AttnBits<L>::narrow(x); }
};
template <> struct AttnTy<KcBf16> : AttnLow<KcBf16, __nv_bfloat16> {};
template <> struct AttnTy<KcF16> : AttnLow<KcF16, __half> {};
#else
/* widened to float in shared memory */
template <typename L> struct AttnLow {
    typedef float T;
    typedef uint16_t E;
    typedef float S;
    enum { PAD = 1, TC = 0 };
    KC_DEV float in(uint16_t x) { return AttnBits<L>::wide(x); }
    KC_DEV uint16_t out(float x) { return AttnBits<L>::narrow(x); }
    KC_DEV float op(float x) { return AttnBits<L>::wide(AttnBits<L>::narrow(x)); }
    KC_DEV float st(uint16_t x) { return AttnBits<L>::wide(x); }
    KC_DEV float stt(float x) { return op(x); }
};
template <> struct AttnTy<KcBf16> : AttnLow<KcBf16> {};
template <> struct AttnTy<KcF16> : AttnLow<KcF16> {};
#endif
/* attn_stage's conversion: an E (q, kt, v, dy) */
template <typename L> struct AttnSt {
    KC_DEV typename AttnTy<L>::S in(typename AttnTy<L>::E x) { return AttnTy<L>::st(x); }
};

/* tile sizes: query rows per block (BM), keys per step (BN), the chunk of d
 * and dv (DK); the kv kernel's keys per block (KBM) and queries per step
 * (KBN); float64 halves all but KBN (48 KB of static shared memory) */
template <typename T> struct AttnTile {
    enum {
        H = sizeof(T) / 4,
        BM = KC_ATTN_BM / H,
        BN = 32,
        DK = KC_ATTN_DK / H,
        KBM = KC_ATTN_KBM / H,
        KBN = 16,
    };
};

/* ---- helpers ------------------------------------------------------------- */

/* dst(r, c) = Cv::in(src[r rs + c cs]) for r < R, c < C: 0 outside rv x cv;
 * dst(r, c) is dst[r dr + c dc].  Consecutive threads take consecutive c. */
template <typename Cv, int R, int C, typename T, typename E>
KC_DEV void attn_stage(T *dst, int dr, int dc, const E *src, int64_t rs, int64_t cs, int64_t rv, int64_t cv)
{
#pragma unroll 4
    for (int e = threadIdx.x; e < R * C; e += KC_ATTN_BLOCK) {
        const int r = e / C, c = e % C;
        dst[r * dr + c * dc] = r < rv && c < cv ? Cv::in(src[r * rs + c * cs]) : (T)0;
    }
}

/* acc[i][c] += sum over k < K of A(k, ty R + i) B(k, tx + 8 c), from shared
 * memory: A(k, r) = a[k AK + r AR], B(k, c) = b[k BK + c BC], on the CUDA
 * cores (each thread its R x C entries) */
template <int R, int C, int K, int AK, int AR, int BK, int BC, typename T, typename S>
KC_DEV void attn_mma_simt(T (&acc)[R][C], const S *a, const S *b)
{
    const int ty = threadIdx.x >> 3, tx = threadIdx.x & 7;
#pragma unroll 4
    for (int k = 0; k < K; k++) {
        T av[R], bv[C];
#pragma unroll
        for (int i = 0; i < R; i++)
            av[i] = a[k * AK + (ty * R + i) * AR];
#pragma unroll
        for (int c = 0; c < C; c++)
            bv[c] = b[k * BK + (tx + 8 * c) * BC];
#pragma unroll
        for (int i = 0; i < R; i++)
#pragma unroll
            for (int c = 0; c < C; c++)
                acc[i][c] += av[i] * bv[c];
    }
}

#if KC_ATTN_TC
/* the tensor cores' product tile (at most 64 x 64 floats, rows padded to 68) */
#define KC_ATTN_SCRATCH (64 * 68)
KC_DEV float *attn_scratch()
{
    __shared__ __align__(32) float sc[KC_ATTN_SCRATCH];
    return sc;
}

template <bool C, typename A, typename B> struct AttnIf {
    typedef A type;
};
template <typename A, typename B> struct AttnIf<false, A, B> {
    typedef B type;
};

/* attn_mma_simt's product on the tensor cores: the M x N tile (M = 16 R, N =
 * 8 C) in 16 x 16 fragments, the block's warps taking them in turn, each
 * summing K / 16 products of 16 x 16 x 16 fragments in float; stored to
 * attn_scratch, from which each thread adds its entries to acc.  A and B are
 * wmma-loadable (one of each pair of strides 1, the other a multiple of 8). */
template <typename W, int R, int C, int K, int AK, int AR, int BK, int BC, typename T>
KC_DEV void attn_mma_tc(T (&acc)[R][C], const uint16_t *a, const uint16_t *b)
{
    using namespace nvcuda;
    enum { M = 16 * R, N = 8 * C, LD = N + 4 };
    static_assert(M % 16 == 0 && N % 16 == 0 && K % 16 == 0 && M * LD <= KC_ATTN_SCRATCH, "attn_mma_tc: tile");
    static_assert((AK == 1 || AR == 1) && (BK == 1 || BC == 1), "attn_mma_tc: a layout wmma loads");
    typedef typename AttnIf<AR == 1, wmma::col_major, wmma::row_major>::type LA;
    typedef typename AttnIf<BC == 1, wmma::row_major, wmma::col_major>::type LB;
    float *sc = attn_scratch();
    for (int f = threadIdx.x >> 5; f < (M / 16) * (N / 16); f += KC_ATTN_BLOCK / 32) {
        const int fm = f / (N / 16) * 16, fn = f % (N / 16) * 16;
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
        wmma::fill_fragment(fc, 0.0f);
#pragma unroll
        for (int k = 0; k < K; k += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, W, LA> fa;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, W, LB> fb;
            wmma::load_matrix_sync(fa, (const W *)(a + k * AK + fm * AR), AR == 1 ? AK : AR);
            wmma::load_matrix_sync(fb, (const W *)(b + k * BK + fn * BC), BC == 1 ? BK : BC);
            wmma::mma_sync(fc, fa, fb, fc);
        }
        wmma::store_matrix_sync(sc + fm * LD + fn, fc, LD, wmma::mem_row_major);
    }
    __syncthreads();
    const int ty = threadIdx.x >> 3, tx = threadIdx.x & 7;
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int c = 0; c < C; c++)
            acc[i][c] += sc[(ty * R + i) * LD + tx + 8 * c];
    __syncthreads(); /* before the next product's stores */
}
#endif

/* acc += the product (attn_mma_simt's contract) of the instance L's staged
 * operands: on the tensor cores where AttnTy<L>::TC, else on the CUDA cores.
 * Every thread of the block calls it. */
template <typename L, int R, int C, int K, int AK, int AR, int BK, int BC, typename T, typename S>
KC_DEV void attn_mma(T (&acc)[R][C], const S *a, const S *b)
{
#if KC_ATTN_TC
    if constexpr (AttnTy<L>::TC)
        attn_mma_tc<typename AttnTy<L>::Wmma, R, C, K, AK, AR, BK, BC>(acc, a, b);
    else
#endif
        attn_mma_simt<R, C, K, AK, AR, BK, BC>(acc, a, b);
}

template <int R, int C, typename T> KC_DEV void attn_zero(T (&acc)[R][C])
{
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int c = 0; c < C; c++)
            acc[i][c] = 0;
}

/* the op-reduction of v over a row's 8 lanes (a butterfly: the same in each) */
template <typename T, typename F> KC_DEV T attn_row_reduce(T v, F op)
{
#pragma unroll
    for (int o = 4; o > 0; o >>= 1)
        v = op(v, __shfl_xor_sync(KC_FULL_MASK, v, o));
    return v;
}

/* whether any thread of the block passes true (every thread calls it) */
KC_DEV bool attn_any(bool v) { return block_reduce((int)v, 0, KcMax()) != 0; }

/* the bias layout: problem b reads slice (b / brep) % nbias */
KC_DEV int64_t attn_nbias(const KDims &p) { return p.d[KC_ATTN_BIAS] & 0xffffffff; }
KC_DEV int64_t attn_brep(const KDims &p) { return p.d[KC_ATTN_BIAS] >> 32; }

/* problem b's bias slice from row i0 on, or NULL */
template <typename T> KC_DEV const T *attn_bias_at(const T *bias, int64_t b, int64_t i0, const KDims &p)
{
    const int64_t t = p.d[KC_ATTN_T], s = p.d[KC_ATTN_S];
    return bias ? bias + (b / attn_brep(p) % attn_nbias(p)) * t * s + i0 * s : (const T *)0;
}

/* the query problems that read one K/V problem (kvrep: grouped-query attention, K/V problem b / kvrep) */
KC_DEV int64_t attn_kvrep(const KDims &p) { return (p.d[KC_ATTN_FLAGS] >> KC_ATTN_KVREP_SHIFT) + 1; }

/* q's heads (0: dense problems) and k's and v's */
KC_DEV int64_t attn_heads(const KDims &p) { return p.d[KC_ATTN_HEADS]; }
KC_DEV int64_t attn_kvheads(const KDims &p) { return p.d[KC_ATTN_HEADS] / attn_kvrep(p); }

/* row i of problem b in a tensor of problems of rows x w with heads h (kernels.h k_attention_at), and the rows'
 * stride */
KC_DEV int64_t attn_row(int64_t h, int64_t b, int64_t rows, int64_t w, int64_t i)
{
    return h ? ((b / h * rows + i) * h + b % h) * w : (b * rows + i) * w;
}
KC_DEV int64_t attn_ld(int64_t h, int64_t w) { return h ? h * w : w; }

/* The causal band (K_ATTN_CAUSAL, passes/attention.c): query i sees key j
 * where j <= i + s - t and, with a window w, j > i + s - t - w; no tensor
 * holds it.  A tile's position: its first query and key, and whether its
 * rows are the keys (the kv kernel) or the queries. */
typedef struct {
    bool on;
    int64_t off, w; /* s - t; the window, 0: none */
    int64_t q0, k0;
    bool keys_rows;
} AttnBand;

KC_DEV AttnBand attn_band(const KDims &p, int64_t q0, int64_t k0, bool keys_rows)
{
    const int64_t f = p.d[KC_ATTN_FLAGS];
    return AttnBand{(f & KC_ATTN_CAUSAL_BIT) != 0, p.d[KC_ATTN_S] - p.d[KC_ATTN_T],
                    (f & (((int64_t)1 << KC_ATTN_KVREP_SHIFT) - 1)) >> KC_ATTN_WINDOW_SHIFT, q0, k0, keys_rows};
}

/* The bias of this thread's entries of a tile into bt (rows ty R + i, columns
 * tx + 8 c; entry (r, c) at bb[r rs + c cs]): -inf outside rv x cv and
 * outside the band, 0 with no bias.  Returns whether any entry of the block
 * is finite (or NaN); with neither bias nor band, true without a barrier. */
template <int R, int C, typename T>
KC_DEV bool attn_bias_tile(T (&bt)[R][C], const T *bb, int64_t rs, int64_t cs, int64_t rv, int64_t cv,
                           const AttnBand &bd)
{
    const int ty = threadIdx.x >> 3, tx = threadIdx.x & 7;
    bool live = false;
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int c = 0; c < C; c++) {
            const int r = ty * R + i, cc = tx + 8 * c;
            bool in = r < rv && cc < cv;
            if (bd.on) {
                const int64_t qi = bd.q0 + (bd.keys_rows ? cc : r), kj = bd.k0 + (bd.keys_rows ? r : cc);
                in = in && kj <= qi + bd.off && (bd.w == 0 || kj > qi + bd.off - bd.w);
            }
            bt[i][c] = !in ? -kc_inf<T>() : bb ? bb[r * rs + cc * cs] : (T)0;
            live = live || (in && bt[i][c] != -kc_inf<T>());
        }
    return bb || bd.on ? attn_any(live) : true;
}

/* p = exp(score - lse): 0 in a row that sees nothing under KC_ATTN_ZERO */
template <typename T> KC_DEV T attn_prob(T score, T lse, const KDims &p)
{
    return (p.d[KC_ATTN_FLAGS] & KC_ATTN_ZERO_BIT) && lse == -kc_inf<T>() ? (T)0 : kc_exp(score - lse);
}

/* D = dy_r . y_r for this thread's rows r = ty R + i (< rv) of dy and y (rows ld apart): each lane
 * sums columns tx, tx + 8, ..., then the row's lanes */
template <typename L, int R, typename T>
KC_DEV void attn_rowdot(T (&dd)[R], const typename AttnTy<L>::E *dy, const typename AttnTy<L>::E *y, int64_t ld,
                        int64_t rv, int64_t dv)
{
    const int ty = threadIdx.x >> 3, tx = threadIdx.x & 7;
#pragma unroll
    for (int i = 0; i < R; i++) {
        T a = 0;
        if (ty * R + i < rv)
            for (int64_t c = tx; c < dv; c += 8)
                a += AttnTy<L>::in(dy[(ty * R + i) * ld + c]) * AttnTy<L>::in(y[(ty * R + i) * ld + c]);
        dd[i] = attn_row_reduce(a, KcSum());
    }
}

/* ---- forward ------------------------------------------------------------- */

/* the online softmax of a tile's scores sc (R rows of C entries): updates
 * the rows' max m and sum l, rescales o, and leaves p (rounded to the GEMM
 * operand type) in ps (row r at ps[r ld]) */
template <typename L, int R, int C, int CD, typename T, typename S>
KC_DEV void attn_online(T (&sc)[R][C], T (&m)[R], T (&l)[R], T (&o)[R][CD], S *ps, int ld)
{
    const int ty = threadIdx.x >> 3, tx = threadIdx.x & 7;
#pragma unroll
    for (int i = 0; i < R; i++) {
        T mx = -kc_inf<T>();
#pragma unroll
        for (int c = 0; c < C; c++)
            mx = kc_nanmax(mx, sc[i][c]);
        const T mn = kc_nanmax(m[i], attn_row_reduce(mx, KcMax()));
        const bool none = mn == -kc_inf<T>(); /* nothing seen yet: p 0, the sums stay 0 */
        T sum = 0;
#pragma unroll
        for (int c = 0; c < C; c++) {
            const T e = none ? (T)0 : kc_exp(sc[i][c] - mn);
            sum += e;
            ps[(ty * R + i) * ld + tx + 8 * c] = AttnTy<L>::stt(e);
        }
        const T alpha = none ? (T)1 : kc_exp(m[i] - mn);
        l[i] = l[i] * alpha + attn_row_reduce(sum, KcSum());
        m[i] = mn;
#pragma unroll
        for (int c = 0; c < CD; c++)
            o[i][c] *= alpha;
    }
}

/* y and lse of the block's rows (ty R + i < rv of y's rows, ld apart, and of lse's), its columns c0 + tx + 8 c */
template <typename L, int R, int CD, typename T>
KC_DEV void attn_store(typename AttnTy<L>::E *y, int64_t ld, T *lse, const T (&o)[R][CD], const T (&m)[R],
                       const T (&l)[R], int64_t rv, int64_t c0, const KDims &p)
{
    const int ty = threadIdx.x >> 3, tx = threadIdx.x & 7;
    const int64_t s = p.d[KC_ATTN_S], dv = p.d[KC_ATTN_DV];
    const bool zero = (p.d[KC_ATTN_FLAGS] & KC_ATTN_ZERO_BIT) != 0;
#pragma unroll
    for (int i = 0; i < R; i++) {
        const int64_t row = ty * R + i;
        if (row >= rv)
            continue;
        const bool none = m[i] == -kc_inf<T>(); /* no key at all, or all masked */
        const T yz = s > 0 && none && zero ? (T)0 : kc_nan<T>();
#pragma unroll
        for (int c = 0; c < CD; c++)
            if (c0 + tx + 8 * c < dv)
                y[row * ld + c0 + tx + 8 * c] = AttnTy<L>::out(s > 0 && !none ? o[i][c] / l[i] : yz);
        if (c0 == 0 && tx == 0)
            lse[row] = s == 0 || (none && zero) ? -kc_inf<T>()
                       : none                   ? kc_nan<T>()
                                                : (T)((double)m[i] + log((double)l[i]));
    }
}

template <typename L>
KC_DEV void attn_forward(typename AttnTy<L>::E *y, typename AttnTy<L>::T *lse, const typename AttnTy<L>::E *q,
                         const typename AttnTy<L>::E *kt, const typename AttnTy<L>::E *v,
                         const typename AttnTy<L>::T *bias, const KDims &p, double scale)
{
    typedef AttnTy<L> Ty;
    typedef typename Ty::T T;
    typedef typename Ty::S S;
    constexpr int BM = AttnTile<T>::BM, BN = AttnTile<T>::BN, DK = AttnTile<T>::DK;
    constexpr int R = BM / 16, C = BN / 8, CD = DK / 8, P = Ty::PAD;
    __shared__ __align__(32) S qs[DK * (BM + P)], ks[DK * (BN + P)], vs[BN * (DK + P)], ps[BM * (BN + P)];
    const int64_t t = p.d[KC_ATTN_T], s = p.d[KC_ATTN_S], d = p.d[KC_ATTN_D], dv = p.d[KC_ATTN_DV];
    const bool krow = (p.d[KC_ATTN_FLAGS] & KC_ATTN_KROW_BIT) != 0;
    const int64_t tiles = (t + BM - 1) / BM, nkd = (d + DK - 1) / DK, nvd = (dv + DK - 1) / DK;
    const int64_t H = attn_heads(p), hk = attn_kvheads(p), ldq = attn_ld(H, d), ldk = attn_ld(hk, d);
    const int64_t ldv = attn_ld(hk, dv);
    const T sc_ = (T)scale;
    for (int64_t u = blockIdx.x; u < p.d[KC_ATTN_BATCH] * tiles * nvd; u += gridDim.x) {
        /* the last query tiles first: under a causal mask they see the most keys (the longest first) */
        const int64_t nb = p.d[KC_ATTN_BATCH] * nvd, i0 = (tiles - 1 - u / nb) * BM, b = u % nb / nvd;
        const int64_t c0 = u % nvd * DK;
        const int64_t rv = kc_min64(BM, t - i0), cv = kc_min64(DK, dv - c0);
        const int64_t g = b / attn_kvrep(p); /* the K/V problem */
        const typename Ty::E *qb = q + attn_row(H, b, t, d, i0), *kb = kt + attn_row(hk, g, s, d, 0);
        const typename Ty::E *vb = v + attn_row(hk, g, s, dv, 0);
        const T *bb = attn_bias_at(bias, b, i0, p);
        T m[R], l[R], o[R][CD];
        for (int i = 0; i < R; i++)
            m[i] = -kc_inf<T>(), l[i] = 0;
        attn_zero(o);
        __syncthreads(); /* the previous unit's readers of qs are done */
        if (nkd == 1) /* Q^T staged once */
            attn_stage<AttnSt<L>, BM, DK>(qs, 1, BM + P, qb, ldq, 1, rv, d);
        for (int64_t j0 = 0; j0 < s; j0 += BN) {
            const int64_t jv = kc_min64(BN, s - j0);
            T sc[R][C];
            if (!attn_bias_tile(sc, bb ? bb + j0 : bb, s, 1, rv, jv, attn_band(p, i0, j0, false)))
                continue;
            T acc[R][C];
            attn_zero(acc);
            __syncthreads(); /* the previous tile's readers of ks, vs, ps are done */
            for (int64_t kc = 0; kc < nkd; kc++) {
                if (kc)
                    __syncthreads();
                if (nkd > 1)
                    attn_stage<AttnSt<L>, BM, DK>(qs, 1, BM + P, qb + kc * DK, ldq, 1, rv, d - kc * DK);
                if (krow) /* K rows j, columns k */
                    attn_stage<AttnSt<L>, BN, DK>(ks, 1, BN + P, kb + j0 * ldk + kc * DK, ldk, 1, jv, d - kc * DK);
                else
                    attn_stage<AttnSt<L>, DK, BN>(ks, BN + P, 1, kb + kc * DK * s + j0, s, 1, d - kc * DK, jv);
                __syncthreads();
                attn_mma<L, R, C, DK, BM + P, 1, BN + P, 1>(acc, qs, ks);
            }
#pragma unroll
            for (int i = 0; i < R; i++)
#pragma unroll
                for (int c = 0; c < C; c++)
                    sc[i][c] += acc[i][c] * sc_;
            attn_online<L>(sc, m, l, o, ps, BN + P);
            attn_stage<AttnSt<L>, BN, DK>(vs, DK + P, 1, vb + j0 * ldv + c0, ldv, 1, jv, cv);
            __syncthreads();
            attn_mma<L, R, CD, BN, 1, BN + P, DK + P, 1>(o, ps, vs);
        }
        attn_store<L>(y + attn_row(H, b, t, dv, i0), attn_ld(H, dv), lse + b * t + i0, o, m, l, rv, c0, p);
    }
}

template <typename T>
KC_DEV void k_attention(T *y, T *lse, const T *q, const T *kt, const T *v, const T *bias, KDims p, double scale)
{
    attn_forward<T>(y, lse, q, kt, v, bias, p, scale);
}

/* ---- backward: dq -------------------------------------------------------- */

template <typename L>
KC_DEV void attn_grad_q(typename AttnTy<L>::E *dq, const typename AttnTy<L>::E *dy, const typename AttnTy<L>::E *q,
                        const typename AttnTy<L>::E *kt, const typename AttnTy<L>::E *v,
                        const typename AttnTy<L>::T *bias, const typename AttnTy<L>::E *y,
                        const typename AttnTy<L>::T *lse, const KDims &p, double scale)
{
    typedef AttnTy<L> Ty;
    typedef typename Ty::T T;
    typedef typename Ty::S S;
    constexpr int BM = AttnTile<T>::BM, BN = AttnTile<T>::BN, DK = AttnTile<T>::DK;
    constexpr int R = BM / 16, C = BN / 8, CD = DK / 8, P = Ty::PAD;
    __shared__ __align__(32) S as[DK * (BM + P)], ks[DK * (BN + P)], vt[DK * (BN + P)], dss[BM * (BN + P)];
    const int64_t t = p.d[KC_ATTN_T], s = p.d[KC_ATTN_S], d = p.d[KC_ATTN_D], dv = p.d[KC_ATTN_DV];
    const bool krow = (p.d[KC_ATTN_FLAGS] & KC_ATTN_KROW_BIT) != 0;
    const int64_t tiles = (t + BM - 1) / BM, nkd = (d + DK - 1) / DK, nvd = (dv + DK - 1) / DK;
    const int ty = threadIdx.x >> 3, tx = threadIdx.x & 7;
    const int64_t H = attn_heads(p), hk = attn_kvheads(p), ldq = attn_ld(H, d), ldk = attn_ld(hk, d);
    const int64_t ldv = attn_ld(hk, dv), ldy = attn_ld(H, dv);
    const T sc_ = (T)scale;
    for (int64_t u = blockIdx.x; u < p.d[KC_ATTN_BATCH] * tiles * nkd; u += gridDim.x) {
        const int64_t nb = p.d[KC_ATTN_BATCH] * nkd, i0 = (tiles - 1 - u / nb) * BM, b = u % nb / nkd, qc = u % nkd;
        const int64_t row0 = b * t + i0; /* the last query tiles first, as the forward */
        const int64_t rv = kc_min64(BM, t - i0);
        const int64_t g = b / attn_kvrep(p); /* the K/V problem */
        const typename Ty::E *qb = q + attn_row(H, b, t, d, i0), *kb = kt + attn_row(hk, g, s, d, 0);
        const typename Ty::E *vb = v + attn_row(hk, g, s, dv, 0), *dyb = dy + attn_row(H, b, t, dv, i0);
        const T *bb = attn_bias_at(bias, b, i0, p);
        T dd[R], ls[R], acc[R][CD];
        attn_rowdot<L>(dd, dyb, y + attn_row(H, b, t, dv, i0), ldy, rv, dv);
        for (int i = 0; i < R; i++)
            ls[i] = ty * R + i < rv ? lse[row0 + ty * R + i] : (T)0;
        attn_zero(acc);
        for (int64_t j0 = 0; j0 < s; j0 += BN) {
            const int64_t jv = kc_min64(BN, s - j0);
            T sc[R][C], sa[R][C], dp[R][C];
            if (!attn_bias_tile(sc, bb ? bb + j0 : bb, s, 1, rv, jv, attn_band(p, i0, j0, false)))
                continue;
            attn_zero(sa);
            attn_zero(dp);
            for (int64_t k = 0; k < nkd; k++) { /* S; ends with dq's chunk qc staged in ks */
                const int64_t kc = (qc + 1 + k) % nkd;
                __syncthreads();
                attn_stage<AttnSt<L>, BM, DK>(as, 1, BM + P, qb + kc * DK, ldq, 1, rv, d - kc * DK);
                if (krow)
                    attn_stage<AttnSt<L>, BN, DK>(ks, 1, BN + P, kb + j0 * ldk + kc * DK, ldk, 1, jv, d - kc * DK);
                else
                    attn_stage<AttnSt<L>, DK, BN>(ks, BN + P, 1, kb + kc * DK * s + j0, s, 1, d - kc * DK, jv);
                __syncthreads();
                attn_mma<L, R, C, DK, BM + P, 1, BN + P, 1>(sa, as, ks);
            }
            for (int64_t vc = 0; vc < nvd; vc++) { /* dP = dY V^T */
                __syncthreads();
                attn_stage<AttnSt<L>, BM, DK>(as, 1, BM + P, dyb + vc * DK, ldy, 1, rv, dv - vc * DK);
                attn_stage<AttnSt<L>, BN, DK>(vt, 1, BN + P, vb + j0 * ldv + vc * DK, ldv, 1, jv, dv - vc * DK);
                __syncthreads();
                attn_mma<L, R, C, DK, BM + P, 1, BN + P, 1>(dp, as, vt);
            }
#pragma unroll
            for (int i = 0; i < R; i++)
#pragma unroll
                for (int c = 0; c < C; c++) {
                    const T pr = attn_prob(sa[i][c] * sc_ + sc[i][c], ls[i], p);
                    dss[(ty * R + i) * (BN + P) + tx + 8 * c] = Ty::stt(pr * (dp[i][c] - dd[i]));
                }
            __syncthreads();
            attn_mma<L, R, CD, BN, 1, BN + P, 1, BN + P>(acc, dss, ks); /* dQ += dS K */
            __syncthreads(); /* before the next tile's stores into dss */
        }
#pragma unroll
        for (int i = 0; i < R; i++)
#pragma unroll
            for (int c = 0; c < CD; c++)
                if (ty * R + i < rv && qc * DK + tx + 8 * c < d)
                    dq[attn_row(H, b, t, d, i0) + (ty * R + i) * ldq + qc * DK + tx + 8 * c] =
                        Ty::out(acc[i][c] * sc_);
    }
}

template <typename T>
KC_DEV void k_attention_grad_q(T *dq, const T *dy, const T *q, const T *kt, const T *v, const T *bias, const T *y,
                               const T *lse, KDims p, double scale)
{
    attn_grad_q<T>(dq, dy, q, kt, v, bias, y, lse, p, scale);
}

/* ---- backward: dk, dv ---------------------------------------------------- */

/* the lse and D of the iv queries of dy, y (rows ld apart) and lse into ls, dd (a row's 8 lanes per query) */
template <typename L, typename T>
KC_DEV void attn_query_stats(T *ls, T *dd, const typename AttnTy<L>::E *dy, const typename AttnTy<L>::E *y,
                             int64_t ld, const T *lse, int64_t iv, int64_t dv)
{
    const int ty = threadIdx.x >> 3, tx = threadIdx.x & 7;
    T a = 0;
    if (ty < iv)
        for (int64_t c = tx; c < dv; c += 8)
            a += AttnTy<L>::in(dy[ty * ld + c]) * AttnTy<L>::in(y[ty * ld + c]);
    a = attn_row_reduce(a, KcSum());
    if (tx == 0) {
        dd[ty] = a;
        ls[ty] = ty < iv ? lse[ty] : (T)0;
    }
}

template <typename L>
KC_DEV void attn_grad_kv(typename AttnTy<L>::E *dkt, typename AttnTy<L>::E *dval, const typename AttnTy<L>::E *dy,
                         const typename AttnTy<L>::E *q, const typename AttnTy<L>::E *kt,
                         const typename AttnTy<L>::E *v, const typename AttnTy<L>::T *bias,
                         const typename AttnTy<L>::E *y, const typename AttnTy<L>::T *lse, const KDims &p,
                         double scale)
{
    typedef AttnTy<L> Ty;
    typedef typename Ty::T T;
    typedef typename Ty::S S;
    constexpr int BM = AttnTile<T>::KBM, BN = AttnTile<T>::KBN, DK = AttnTile<T>::DK;
    constexpr int R = BM / 16, C = BN / 8, CD = DK / 8, P = Ty::PAD;
    static_assert(BN == 16, "attn_query_stats: a query per row of 8 lanes");
    __shared__ __align__(32) S ks[DK * (BM + P)], vt[DK * (BM + P)], qt[DK * (BN + P)], dyt[DK * (BN + P)];
    __shared__ __align__(32) S pb[BM * (BN + P)];
    __shared__ T ls[BN], dd[BN];
    const int64_t t = p.d[KC_ATTN_T], s = p.d[KC_ATTN_S], d = p.d[KC_ATTN_D], dv = p.d[KC_ATTN_DV];
    const bool krow = (p.d[KC_ATTN_FLAGS] & KC_ATTN_KROW_BIT) != 0;
    const int64_t tiles = (s + BM - 1) / BM, nkd = (d + DK - 1) / DK, nvd = (dv + DK - 1) / DK;
    const int64_t nout = kc_max64(nkd, nvd);
    const int ty = threadIdx.x >> 3, tx = threadIdx.x & 7;
    const T sc_ = (T)scale;
    const int64_t kvrep = attn_kvrep(p), qtiles = (t + BN - 1) / BN;
    const int64_t H = attn_heads(p), hk = attn_kvheads(p), ldq = attn_ld(H, d), ldk = attn_ld(hk, d);
    const int64_t ldv = attn_ld(hk, dv), ldy = attn_ld(H, dv);
    for (int64_t u = blockIdx.x; u < p.d[KC_ATTN_BATCH] / kvrep * tiles * nout; u += gridDim.x) {
        /* the first key tiles first: under a causal mask they see the most queries; g: the K/V problem */
        const int64_t nb = p.d[KC_ATTN_BATCH] / kvrep * nout, j0 = u / nb * BM, g = u % nb / nout, oc = u % nout;
        const int64_t jv = kc_min64(BM, s - j0);
        const typename Ty::E *kb = kt + attn_row(hk, g, s, d, 0), *vb = v + attn_row(hk, g, s, dv, j0);
        T dk[R][CD], dvv[R][CD];
        attn_zero(dk);
        attn_zero(dvv);
        __syncthreads(); /* the previous unit's readers of ks, vt are done */
        if (nkd == 1) /* K staged once: ks(k, j) */
            krow ? attn_stage<AttnSt<L>, BM, DK>(ks, 1, BM + P, kb + j0 * ldk, ldk, 1, jv, d)
                 : attn_stage<AttnSt<L>, DK, BM>(ks, BM + P, 1, kb + j0, s, 1, d, jv);
        if (nvd == 1) /* V^T staged once: vt(c, j) */
            attn_stage<AttnSt<L>, BM, DK>(vt, 1, BM + P, vb, ldv, 1, jv, dv);
        for (int64_t e = 0; e < kvrep * qtiles; e++) { /* the group's query problems b in order, their tiles i0 */
            const int64_t b = g * kvrep + e / qtiles, i0 = e % qtiles * BN;
            const int64_t iv = kc_min64(BN, t - i0);
            const typename Ty::E *qr = q + attn_row(H, b, t, d, i0), *dyr = dy + attn_row(H, b, t, dv, i0);
            const T *bb = attn_bias_at(bias, b, 0, p);
            T sc[R][C], sa[R][C], dp[R][C];
            if (!attn_bias_tile(sc, bb ? bb + i0 * s + j0 : bb, 1, s, jv, iv, attn_band(p, i0, j0, true)))
                continue;
            attn_zero(sa);
            attn_zero(dp);
            __syncthreads(); /* the previous tile's readers of pb, ls, dd, qt, dyt are done */
            attn_query_stats<L>(ls, dd, dyr, y + attn_row(H, b, t, dv, i0), ldy, lse + b * t + i0, iv, dv);
            for (int64_t k = 0; k < nkd; k++) { /* S^T; ends with dk's chunk staged in qt */
                const int64_t kc = (oc + 1 + k) % nkd;
                if (k)
                    __syncthreads();
                if (nkd > 1)
                    krow ? attn_stage<AttnSt<L>, BM, DK>(ks, 1, BM + P, kb + j0 * ldk + kc * DK, ldk, 1, jv,
                                                         d - kc * DK)
                         : attn_stage<AttnSt<L>, DK, BM>(ks, BM + P, 1, kb + kc * DK * s + j0, s, 1, d - kc * DK, jv);
                attn_stage<AttnSt<L>, BN, DK>(qt, 1, BN + P, qr + kc * DK, ldq, 1, iv, d - kc * DK);
                __syncthreads();
                attn_mma<L, R, C, DK, BM + P, 1, BN + P, 1>(sa, ks, qt);
            }
            for (int64_t k = 0; k < nvd; k++) { /* dP^T = V dY^T; ends with dv's chunk staged in dyt */
                const int64_t vc = (oc + 1 + k) % nvd;
                __syncthreads();
                if (nvd > 1)
                    attn_stage<AttnSt<L>, BM, DK>(vt, 1, BM + P, vb + vc * DK, ldv, 1, jv, dv - vc * DK);
                attn_stage<AttnSt<L>, BN, DK>(dyt, 1, BN + P, dyr + vc * DK, ldy, 1, iv, dv - vc * DK);
                __syncthreads();
                attn_mma<L, R, C, DK, BM + P, 1, BN + P, 1>(dp, vt, dyt);
            }
            if (nkd + nvd == 0)
                __syncthreads(); /* ls, dd */
#pragma unroll
            for (int i = 0; i < R; i++)
#pragma unroll
                for (int c = 0; c < C; c++) { /* sa becomes P^T, dp dS^T */
                    sa[i][c] = attn_prob(sa[i][c] * sc_ + sc[i][c], ls[tx + 8 * c], p);
                    dp[i][c] = sa[i][c] * (dp[i][c] - dd[tx + 8 * c]);
                    pb[(ty * R + i) * (BN + P) + tx + 8 * c] = Ty::stt(sa[i][c]);
                }
            __syncthreads();
            if (oc < nvd) /* dV += P^T dY */
                attn_mma<L, R, CD, BN, 1, BN + P, 1, BN + P>(dvv, pb, dyt);
            __syncthreads();
#pragma unroll
            for (int i = 0; i < R; i++)
#pragma unroll
                for (int c = 0; c < C; c++)
                    pb[(ty * R + i) * (BN + P) + tx + 8 * c] = Ty::stt(dp[i][c]);
            __syncthreads();
            if (oc < nkd) /* dK += dS^T Q */
                attn_mma<L, R, CD, BN, 1, BN + P, 1, BN + P>(dk, pb, qt);
        }
#pragma unroll
        for (int i = 0; i < R; i++)
#pragma unroll
            for (int c = 0; c < CD; c++) {
                const int64_t j = j0 + ty * R + i, col = oc * DK + tx + 8 * c;
                if (ty * R + i >= jv)
                    continue;
                if (oc < nvd && col < dv)
                    dval[attn_row(hk, g, s, dv, j) + col] = Ty::out(dvv[i][c]);
                if (oc < nkd && col < d)
                    dkt[krow ? attn_row(hk, g, s, d, j) + col : g * d * s + col * s + j] = Ty::out(dk[i][c] * sc_);
            }
    }
}

template <typename T>
KC_DEV void k_attention_grad_kv(T *dkt, T *dval, const T *dy, const T *q, const T *kt, const T *v, const T *bias,
                                const T *y, const T *lse, KDims p, double scale)
{
    attn_grad_kv<T>(dkt, dval, dy, q, kt, v, bias, y, lse, p, scale);
}

/* ---- backward: dbias ----------------------------------------------------- */

/* score of query row qi (d) against key j of problem b's keys kb (rows ld apart), plus the row's bias (NULL: none) */
template <typename L>
KC_DEV typename AttnTy<L>::T attn_score(const typename AttnTy<L>::E *qi, const typename AttnTy<L>::E *kb,
                                        const typename AttnTy<L>::T *brow, int64_t j, const KDims &p, double scale)
{
    const int64_t d = p.d[KC_ATTN_D], s = p.d[KC_ATTN_S], ldk = attn_ld(attn_kvheads(p), d);
    const bool krow = (p.d[KC_ATTN_FLAGS] & KC_ATTN_KROW_BIT) != 0;
    double a = 0;
    for (int64_t k = 0; k < d; k++)
        a += (double)AttnTy<L>::in(qi[k]) * (double)AttnTy<L>::in(kb[krow ? j * ldk + k : k * s + j]);
    const typename AttnTy<L>::T v = (typename AttnTy<L>::T)(scale * a);
    return brow ? v + brow[j] : v;
}

template <typename L>
KC_DEV void attn_grad_bias(typename AttnTy<L>::T *dbias, const typename AttnTy<L>::E *dy,
                           const typename AttnTy<L>::E *q, const typename AttnTy<L>::E *kt,
                           const typename AttnTy<L>::E *v, const typename AttnTy<L>::T *bias,
                           const typename AttnTy<L>::E *y, const typename AttnTy<L>::T *lse, const KDims &p,
                           double scale)
{
    typedef typename AttnTy<L>::T T;
    const int64_t t = p.d[KC_ATTN_T], s = p.d[KC_ATTN_S], d = p.d[KC_ATTN_D], dv = p.d[KC_ATTN_DV];
    const int64_t nbias = attn_nbias(p), brep = attn_brep(p), outer = p.d[KC_ATTN_BATCH] / (nbias * brep);
    const int64_t kvrep = attn_kvrep(p), H = attn_heads(p), hk = attn_kvheads(p);
    for (int64_t brow = blockIdx.x; brow < nbias * t; brow += gridDim.x) {
        const int64_t c = brow / t, i = brow % t;
        for (int64_t j = threadIdx.x; j < s; j += blockDim.x) {
            double a = 0;
            for (int64_t m = 0; m < outer; m++)
                for (int64_t r = 0; r < brep; r++) {
                    const int64_t b = (m * nbias + c) * brep + r, row = b * t + i;
                    const int64_t yr = attn_row(H, b, t, dv, i);
                    const typename AttnTy<L>::E *dyi = dy + yr, *yi = y + yr;
                    const typename AttnTy<L>::E *vj = v + attn_row(hk, b / kvrep, s, dv, j);
                    double dp = 0, dd = 0;
                    for (int64_t k = 0; k < dv; k++) {
                        dp += (double)AttnTy<L>::in(dyi[k]) * (double)AttnTy<L>::in(vj[k]);
                        dd += (double)AttnTy<L>::in(dyi[k]) * (double)AttnTy<L>::in(yi[k]);
                    }
                    const T sc = attn_score<L>(q + attn_row(H, b, t, d, i), kt + attn_row(hk, b / kvrep, s, d, 0),
                                               attn_bias_at(bias, b, i, p), j, p, scale);
                    a += (double)(attn_prob(sc, lse[row], p) * (T)(dp - dd));
                }
            dbias[brow * s + j] = (T)a;
        }
    }
}

template <typename T>
KC_DEV void k_attention_grad_bias(T *dbias, const T *dy, const T *q, const T *kt, const T *v, const T *bias,
                                  const T *y, const T *lse, KDims p, double scale)
{
    attn_grad_bias<T>(dbias, dy, q, kt, v, bias, y, lse, p, scale);
}

/* ---- the bfloat16 and float16 instances (kernels.def's KC rows) ----------- */

#define KC_ATTN_LOW(S, L)                                                                                      \
    KC_GLOBAL void k_attention##S(uint16_t *y, float *lse, const uint16_t *q, const uint16_t *kt, const uint16_t *v,  \
                                  const float *bias, KDims p, double scale)                                    \
    {                                                                                                          \
        attn_forward<L>(y, lse, q, kt, v, bias, p, scale);                                                     \
    }                                                                                                          \
    KC_GLOBAL void k_attention_grad_q##S(uint16_t *dq, const uint16_t *dy, const uint16_t *q, const uint16_t *kt, \
                                         const uint16_t *v, const float *bias, const uint16_t *y, const float *lse, \
                                         KDims p, double scale)                                                \
    {                                                                                                          \
        attn_grad_q<L>(dq, dy, q, kt, v, bias, y, lse, p, scale);                                              \
    }                                                                                                          \
    KC_GLOBAL void k_attention_grad_kv##S(uint16_t *dkt, uint16_t *dval, const uint16_t *dy, const uint16_t *q,  \
                                          const uint16_t *kt, const uint16_t *v, const float *bias,             \
                                          const uint16_t *y, const float *lse, KDims p, double scale)           \
    {                                                                                                          \
        attn_grad_kv<L>(dkt, dval, dy, q, kt, v, bias, y, lse, p, scale);                                      \
    }                                                                                                          \
    KC_GLOBAL void k_attention_grad_bias##S(float *dbias, const uint16_t *dy, const uint16_t *q,               \
                                            const uint16_t *kt, const uint16_t *v, const float *bias,          \
                                            const uint16_t *y,                                                 \
                                            const float *lse, KDims p, double scale)                           \
    {                                                                                                          \
        attn_grad_bias<L>(dbias, dy, q, kt, v, bias, y, lse, p, scale);                                        \
    }
KC_ATTN_LOW(_bf16, KcBf16)
KC_ATTN_LOW(_f16, KcF16)
#undef KC_ATTN_LOW
