/* common.cuh — what every kernels/cuda .cu file shares: integer types,
 * device mirrors of the host structs and enums, index helpers, block
 * reductions, the grid-wide combine of per-block partials, Philox.
 *
 * How the sources are built.  fsdpc hands NVRTC one translation unit, the
 * library: this header (as "common.cuh"), kernels/c/fused.h, every .cu file
 * in alphabetical order, then kc_args.h, stamp.cu and kernels.def, which
 * stamp the float and double instances of the typed kernels (templates),
 * compiled with --std=c++17 -default-device for each --arch (a model's
 * fused kernels are a second program: this header, fused.h and them).  So the .cu
 * files never include each other, and nothing here may need a host header:
 * NVRTC has no <stdint.h> or <math.h>, the integer types are defined below
 * and the math is CUDA's builtin expf, logf, erff, ...  The same sources
 * also compile as plain C++ in the host emulation (kernels/cuda/emu.h, the
 * sources gathered by emu_kernels.h for runtime/cuemu_kc.cc, whose object
 * tests/kernels_cuda_test.cc links), which includes this header inside a namespace after defining the CUDA built-ins; KC_GLOBAL is
 * how a kernel is declared (extern "C" __global__ on the device, a plain
 * function in the emulation, where the kernels/c names are taken).
 *
 * Mirrors.  KDims, KcStepParams (kc.h), KConv2d, KPool2d and the op enums
 * (kernels/c/kernels.h) are copied here field for field, value for value;
 * the emulation test static_asserts that every layout and value agrees.
 * The elementwise math is not mirrored: kernels/c/fused.h, which comes
 * second in the program, is the one table of it for both targets.
 *
 * Conventions of the kernels (see kernels.def for the list):
 * - 1-D grids and blocks.  Elementwise kernels are grid-stride loops, so any
 *   grid works; the index type I is uint32_t when the element count is
 *   below 2^31 (cheap division) and int64_t otherwise.
 * - Kernels that reduce with block_reduce need blockDim.x a multiple of 32
 *   (at most 1024) and every thread of the block to reach it.
 * - Deterministic: no float atomics; every sum runs in an order fixed by
 *   the launch geometry alone.  Sums accumulate in double, like kernels/c,
 *   but attn.cu's tiles, which sum in T (float32 like kernels/c's sgemm).
 * - Kernels that combine per-block partials into one scalar (grid_combine)
 *   must run with at most KC_GRID_PARTIALS blocks and never concurrently
 *   with each other (the step runs its kernels on one stream).
 */
#ifndef FSDPC_COMMON_CUH
#define FSDPC_COMMON_CUH

#if defined(__CUDACC_RTC__)
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#else
#include <stdint.h>
#endif

#ifndef KC_GLOBAL
#define KC_GLOBAL extern "C" __global__
#endif
#define KC_DEV static __device__ __forceinline__

#define KC_INT32_LIMIT 2147483647LL
#define KC_FULL_MASK 0xffffffffu

/* ---- mirrors of kc.h and kernels/c/kernels.h ----------------------------- */

#define KC_MAX_RANK 8
#define KC_GRID_PARTIALS 1024
#define KC_COL_PARTIALS (1 << 18)
#define KC_GATHER_SLOTS (1 << 18)
#define KC_GATHER_THREADS 1024
#define KC_ATTN_BLOCK 128 /* threads of the attention kernels (attn.cu): 16 x 8 */
#define KC_ATTN_BM 64     /* attn.cu's float32 tiles (float64 halves them): query rows per block, */
#define KC_ATTN_DK 64     /* the chunk of d and dv, */
#define KC_ATTN_KBM 64    /* keys per block of the dk, dv kernel */
#define KC_ATTN_KVREP_SHIFT 32 /* kvrep - 1's place in the attention kernels' flags slot of KDims */
typedef struct {
    int64_t d[KC_MAX_RANK];
} KDims;

typedef struct {
    double lr, beta1, beta2, eps, weight_decay, momentum;
    double clip_norm;
    int64_t step;
    int64_t micro, accum;
    double loss_scale;
    int64_t opt_step;
} KcStepParams;

typedef struct {
    int64_t n, c, h, w;
    int64_t m, kh, kw;
    int64_t oh, ow;
    int64_t sh, sw, dh, dw;
    int64_t pt, pl, pb, pr;
    int64_t groups;
} KConv2d;

typedef struct {
    int64_t n, c, h, w;
    int64_t kh, kw, oh, ow;
    int64_t sh, sw, dh, dw;
    int64_t pt, pl, pb, pr;
    int count_include_pad;
} KPool2d;

/* the k_binary and k_unary op codes are fused.h's (KF_ADD, KF_RELU, ...),
 * which the program has right after this header */
enum { K_EQ, K_LT, K_GT, K_LE, K_GE };
enum { K_DT_F32, K_DT_F64, K_DT_I64, K_DT_I32, K_DT_U8, K_DT_BOOL, K_DT_BF16, K_DT_F16,
       K_DT_I8, K_DT_I16, K_DT_U16, K_DT_U32, K_DT_U64 }; /* kernels/c/kernels.h's */
enum { K_PAD_CONSTANT, K_PAD_REFLECT, K_PAD_EDGE };
enum { K_RSUM, K_RMEAN, K_RMAX, K_RMIN, K_RPROD };
enum { K_LOSS_NONE, K_LOSS_SUM, K_LOSS_MEAN };

/* ---- scalars ----------------------------------------------------------- */

#define KC_INFF __int_as_float(0x7f800000)
#define KC_INF __longlong_as_double(0x7ff0000000000000LL)
#define KC_NANF __int_as_float(0x7fc00000)
#define KC_NAN __longlong_as_double(0x7ff8000000000000LL)
#define KC_DBL_MAX 1.7976931348623157e308

/* the math of the typed kernels (templates over T, float or double):
 * expf for float, exp for double, ... */
KC_DEV float kc_exp(float x) { return expf(x); }
KC_DEV double kc_exp(double x) { return exp(x); }
KC_DEV float kc_sqrt(float x) { return sqrtf(x); }
KC_DEV double kc_sqrt(double x) { return sqrt(x); }
KC_DEV float kc_fabs(float x) { return fabsf(x); }
KC_DEV double kc_fabs(double x) { return fabs(x); }
/* infinity and the quiet NaN in T (double's, rounded: exact) */
template <typename T> KC_DEV T kc_inf() { return (T)KC_INF; }
template <typename T> KC_DEV T kc_nan() { return (T)KC_NAN; }

KC_DEV int64_t kc_min64(int64_t a, int64_t b) { return a < b ? a : b; }
KC_DEV int64_t kc_max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* max / min that let a NaN in and keep it (torch.amax, kernels/c red_max) */
template <typename T> KC_DEV T kc_nanmax(T acc, T v) { return v > acc || v != v ? v : acc; }
template <typename T> KC_DEV T kc_nanmin(T acc, T v) { return v < acc || v != v ? v : acc; }

/* combining functors for the reductions */
struct KcSum {
    template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct KcMax {
    template <typename T> __device__ T operator()(T a, T b) const { return kc_nanmax(a, b); }
};
struct KcMin {
    template <typename T> __device__ T operator()(T a, T b) const { return kc_nanmin(a, b); }
};
struct KcProd {
    template <typename T> __device__ T operator()(T a, T b) const { return a * b; }
};

/* ---- bfloat16 and float16 (their uint16_t bits) ------------------------ */

/* kernels.h's k_bf16_from_f32 bit for bit: NVRTC cannot include kernels.h,
 * and CUDA's __float2bfloat16_rn needs cuda_bf16.h and gives a canonical
 * NaN (0x7fff), where the CPU keeps the sign.  Adding 0x7fff plus the
 * lowest kept bit rounds to nearest even; a carry out of the mantissa steps
 * the exponent, up to infinity past bfloat16's largest finite value.  A NaN
 * is handled first because that addition could carry it into an infinity. */
KC_DEV uint16_t kc_bf16_from_f32(float f)
{
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* exact: bfloat16 is the top half of a float */
KC_DEV float kc_bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* kernels.h's k_f16_from_f32 bit for bit (CUDA's __float2half_rn needs
 * cuda_fp16.h and makes NaNs canonical): round to nearest even, 65520 and
 * above to infinity, subnormal halves below 2^-14, a quiet NaN of the same
 * sign keeping the top of its payload */
KC_DEV uint16_t kc_f16_from_f32(float f)
{
    const uint32_t u = __float_as_uint(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) {
        const uint32_t r = a - 0x38000000u;
        return (uint16_t)(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
    }
    if (a <= 0x33000000u)
        return (uint16_t)sign;
    const uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126u - (a >> 23);
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    q += (rem > half || (rem == half && (q & 1u))) ? 1u : 0u;
    return (uint16_t)(sign | q);
}

/* exact, NaN payloads kept (kernels.h's k_f16_to_f32) */
KC_DEV float kc_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu)
        return __uint_as_float(sign | 0x7f800000u | (m << 13));
    if (e)
        return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
    return __uint_as_float(sign | __float_as_uint((float)m * 5.9604644775390625e-8f)); /* m 2^-24 */
}

/* An element type's storage E, widened (in: exact) and rounded back (out): X itself, or (the tags KcIoBf16 /
 * KcIoF16: the 16-bit instances of the reduction and LayerNorm templates) bfloat16 / float16 bits */
struct KcIoBf16 {};
struct KcIoF16 {};
template <typename X> struct KcIo {
    typedef X E;
    KC_DEV X in(X v) { return v; }
    KC_DEV X out(X v) { return v; }
};
template <> struct KcIo<KcIoBf16> {
    typedef uint16_t E;
    KC_DEV float in(uint16_t v) { return kc_bf16_to_f32(v); }
    KC_DEV uint16_t out(float v) { return kc_bf16_from_f32(v); }
};
template <> struct KcIo<KcIoF16> {
    typedef uint16_t E;
    KC_DEV float in(uint16_t v) { return kc_f16_to_f32(v); }
    KC_DEV uint16_t out(float v) { return kc_f16_from_f32(v); }
};

/* ---- indices ------------------------------------------------------------- */

/* first index of this thread and the grid-stride step */
template <typename I> KC_DEV I kc_first() { return (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; }
template <typename I> KC_DEV I kc_stride() { return (I)gridDim.x * (I)blockDim.x; }

/* Offsets in up to three operands of row-major position i over shape
 * (rank dims, each operand with its own strides; rank 0 = one element).
 * Operands a caller does not need can repeat a stride array: the unused
 * sums are dead code after inlining. */
template <typename I>
KC_DEV void kc_offsets(I i, int rank, const KDims &shape, const KDims &s0, const KDims &s1,
                       const KDims &s2, int64_t &o0, int64_t &o1, int64_t &o2)
{
    o0 = o1 = o2 = 0;
    if (rank == 1) {
        o0 = (int64_t)i * s0.d[0];
        o1 = (int64_t)i * s1.d[0];
        o2 = (int64_t)i * s2.d[0];
        return;
    }
#pragma unroll
    for (int d = KC_MAX_RANK - 1; d >= 0; d--)
        if (d < rank) {
            const I n = (I)shape.d[d], q = i / n, r = i - q * n;
            o0 += (int64_t)r * s0.d[d];
            o1 += (int64_t)r * s1.d[d];
            o2 += (int64_t)r * s2.d[d];
            i = q;
        }
}

template <typename I> KC_DEV int64_t kc_offset1(I i, int rank, const KDims &shape, const KDims &st)
{
    int64_t o, u1, u2;
    kc_offsets(i, rank, shape, st, st, st, o, u1, u2);
    return o;
}

/* ---- reductions ---------------------------------------------------------- */

template <typename T, typename F> KC_DEV T warp_reduce(T v, F op)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = op(v, __shfl_xor_sync(KC_FULL_MASK, v, o));
    return v;
}

/* The op-reduction of v over the block, returned to every thread.  The
 * order is fixed (a butterfly in each warp, then one over the warps), so
 * the result depends only on blockDim.  Every thread must call it;
 * blockDim.x is a multiple of 32.  Safe to call again right away. */
template <typename T, typename F> KC_DEV T block_reduce(T v, T identity, F op)
{
    __shared__ T part[32];
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    v = warp_reduce(v, op);
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    v = lane < (blockDim.x >> 5) ? part[lane] : identity;
    v = warp_reduce(v, op);
    __syncthreads();
    return v;
}

template <typename T> KC_DEV T block_sum(T v) { return block_reduce(v, (T)0, KcSum()); }

/* Per-block partials of a grid-wide scalar reduction, combined by the block
 * that finishes last (the threadFenceReduction pattern): each block stores
 * its N values, then takes a ticket; the last one sums all blocks' values
 * in block order, so the result is deterministic, and resets the ticket for
 * the next launch (CUDA Graph replays included). */
#define KC_PARTIAL_VALUES 2 /* most values one grid_combine carries */
__device__ double kc_partial[KC_PARTIAL_VALUES * KC_GRID_PARTIALS];
__device__ unsigned int kc_ticket;

/* A column reduction over many rows and few columns (a bias gradient: 8192
 * rows of 768) splits the rows into chunks, a block per (32 columns, chunk),
 * so that the device fills: each chunk's partial sums of value v, column c
 * go to kc_colpart[(v chunks + chunk) n + c] (n columns), and k_cols_fold
 * (reduce.cu) folds them in chunk order.  Same contract as kc_partial: one stream. */
__device__ double kc_colpart[KC_COL_PARTIALS];

/* Gather's backward: the lists of index positions per bucket of dx rows
 * (gather.cu, k_gather_lists); same contract. */
__device__ int kc_glist[KC_GATHER_SLOTS];

/* v[k] (block-reduced, the same in every thread) in; returns true in the
 * last block only, with v[k] = the op-combination over all blocks */
template <int N, typename F> KC_DEV bool grid_combine(double (&v)[N], double identity, F op)
{
    static_assert(N <= KC_PARTIAL_VALUES, "grid_combine: too many values");
    __shared__ unsigned int ticket;
    if (threadIdx.x == 0) {
        for (int k = 0; k < N; k++)
            kc_partial[k * KC_GRID_PARTIALS + blockIdx.x] = v[k];
        __threadfence();
        ticket = atomicAdd(&kc_ticket, 1u);
    }
    __syncthreads();
    if (ticket != gridDim.x - 1)
        return false;
    __threadfence();
    const volatile double *p = kc_partial;
    for (int k = 0; k < N; k++) {
        double a = identity;
        for (unsigned b = threadIdx.x; b < gridDim.x; b += blockDim.x)
            a = op(a, p[k * KC_GRID_PARTIALS + b]);
        v[k] = block_reduce(a, identity, op);
    }
    if (threadIdx.x == 0)
        kc_ticket = 0;
    return true;
}

/* ---- Philox-4x32-10 (kernels/c k_philox4x32_10, bit for bit) ------------- */

KC_DEV void kc_philox(uint32_t c[4], uint32_t k0, uint32_t k1)
{
#pragma unroll
    for (int r = 0; r < 10; r++) {
        const uint32_t hi0 = __umulhi(0xD2511F53u, c[0]), lo0 = 0xD2511F53u * c[0];
        const uint32_t hi1 = __umulhi(0xCD9E8D57u, c[2]), lo1 = 0xCD9E8D57u * c[2];
        c[0] = hi1 ^ c[1] ^ k0;
        c[1] = lo1;
        c[2] = hi0 ^ c[3] ^ k1;
        c[3] = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}

#endif
