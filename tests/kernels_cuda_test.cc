/* kernels_cuda_test.cc — runs the CUDA target's kernels without a GPU and
 * checks every kc_ launcher against its kernels/c twin (ctest
 * kernels_cuda_emu).
 *
 * How it works.  kernels/cuda's sources are compiled as C++ inside
 * namespace dev, on top of kernels/cuda/emu.h (fibers for threads, barriers,
 * shuffles), by runtime/cuemu_kc.cc: the emulated runtime's kernel table,
 * whose object this test links.  This file provides what the runtime
 * provides on a GPU:
 *   kc_launch      dispatches on the kernel id to that table's kernel (its
 *                  name checked against kc_names), which unpacks the
 *                  arguments by the kernel's own parameter types (each
 *                  kernels.def row's types matched against the definition
 *                  at compile time, in cuemu_kc.cc);
 *   kc_gemm_f32    a reference loop (double accumulation), kc_gemm_bf16
 *                  the same on bfloat16 operands; kc_gemm_add the same
 *                  with the addend as C and the bias added after, or left
 *                  to the launcher (returning 0) when emu_no_bias_epilogue,
 *                  as a GPU does for a shape no cuBLASLt algorithm takes;
 *   kc_memcpy / kc_memset, kc_num_sms() = 3, kc_step_params(),
 *   kc_next_check  host memory ("device" memory is host memory here).
 * launch.c is linked unchanged (libfsdpc_kernels_cuda), kernels/c too
 * (libfsdpc_kernels), and each test calls a kc_ function and its k_ twin on
 * the same random inputs: shapes with odd sizes, rank 0 and 1, broadcasting,
 * more elements than one block and than one grid (3 SMs hold 24 blocks of
 * 256), aliasing where the contract allows it.  The tests of kernels of an
 * element type are templates run for float and for double (k_X / kc_X
 * without a suffix pick the _f32 or _f64 function by the argument types).
 * Floats must agree to 1e-5 relative (|a - b| <= 1e-5 (1 + |b|)), doubles
 * to 1e-12; the optimizers, the squared norm (float32) and gradient
 * accumulation exactly; copies, masks, integers, indices
 * and the check slots must agree exactly; the bfloat16 / float16 attention
 * (no kernels/c twin yet) agrees with a float64 reference of the same
 * rounded inputs within 3e-2 / 4e-3.  A failing check prints what it
 * was and where; the exit status is 1 if any failed.
 */
#include "emu.h"

#include <numeric>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

/* k_f / kc_f without the suffix: the _f32 or _f64 function, by the
 * argument types (a float * and a double * never both fit), so one test
 * template checks both */
#define OVERLOAD(f, S)                                                                             \
    template <typename... A> static auto k_##f(A... a) -> decltype(k_##f##_##S(a...))           \
    {                                                                                              \
        return k_##f##_##S(a...);                                                                  \
    }                                                                                              \
    template <typename... A> static auto kc_##f(A... a) -> decltype(kc_##f##_##S(a...))         \
    {                                                                                              \
        return kc_##f##_##S(a...);                                                                 \
    }
/* the kc_ twins (launch.c): kernels.h's K_TWIN marks declare each with its
 * k_ twin's type, and each typed pair gets its two overloads */
#define K_TWIN(f) decltype(k_##f) kc_##f;
#define K_TWIN_T(f, S) K_TWIN(f##_##S) } OVERLOAD(f, S) extern "C" {
extern "C" {
#include "kc.h"
#include "kernels.h"
}

/* ---- the device code, as C++ ------------------------------------------------ */

/* the kernels: the emulated runtime's table (runtime/cuemu_kc.cc, linked as its object), in kernels.def order,
 * as KC_ ids are; here common.cuh alone, in a namespace of its own (its __device__ arrays are the table's
 * object's in dev), for the checks of its mirrors below */
#include "fused.h"
namespace mirror {
#include "common.cuh"
}
#include "cuemu_kernel.h"

namespace dev {

static void dispatch(int id, unsigned grid, unsigned block, void **args)
{
    if (id < 0 || id >= cuemu_kc_nkernels || strcmp(cuemu_kc_kernels[id].name, kc_names[id])) {
        fprintf(stderr, "kc_launch: unknown kernel id %d\n", id);
        abort();
    }
    cuemu_kc_kernels[id].run(args, grid, block, 0);
}
} // namespace dev

/* the mirrors in common.cuh must match kc.h and kernels.h byte for byte */
#define SAME_FIELD(T, f) static_assert(offsetof(T, f) == offsetof(mirror::T, f), #T "." #f)
static_assert(sizeof(KDims) == sizeof(mirror::KDims) && KC_MAX_RANK == 8, "KDims");
static_assert(sizeof(KcStepParams) == sizeof(mirror::KcStepParams), "KcStepParams");
SAME_FIELD(KcStepParams, lr);
SAME_FIELD(KcStepParams, momentum);
SAME_FIELD(KcStepParams, clip_norm);
SAME_FIELD(KcStepParams, step);
SAME_FIELD(KcStepParams, micro);
SAME_FIELD(KcStepParams, accum);
SAME_FIELD(KcStepParams, loss_scale);
SAME_FIELD(KcStepParams, opt_step);
static_assert(sizeof(KConv2d) == sizeof(mirror::KConv2d), "KConv2d");
SAME_FIELD(KConv2d, n);
SAME_FIELD(KConv2d, m);
SAME_FIELD(KConv2d, oh);
SAME_FIELD(KConv2d, sh);
SAME_FIELD(KConv2d, pt);
SAME_FIELD(KConv2d, groups);
static_assert(sizeof(KPool2d) == sizeof(mirror::KPool2d), "KPool2d");
SAME_FIELD(KPool2d, kh);
SAME_FIELD(KPool2d, oh);
SAME_FIELD(KPool2d, pr);
SAME_FIELD(KPool2d, count_include_pad);
/* KC_MAX_RANK and KC_GRID_PARTIALS are macros of both kc.h and common.cuh:
 * a different value is a redefinition, which -Werror stops */
#define SAME_ENUM(e) static_assert((int)e == (int)mirror::e, #e);
#define ENUMS(X)                                                                                   \
    X(K_EQ) X(K_LT) X(K_GT) X(K_LE) X(K_GE) X(K_DT_F32)  \
    X(K_DT_F64) X(K_DT_I64) X(K_DT_I32) X(K_DT_U8) X(K_DT_BOOL) X(K_DT_BF16) X(K_PAD_CONSTANT)    \
    X(K_PAD_REFLECT) X(K_PAD_EDGE) X(K_RSUM) X(K_RMEAN) X(K_RMAX) X(K_RMIN) X(K_LOSS_NONE)        \
    X(K_LOSS_SUM) X(K_LOSS_MEAN)
ENUMS(SAME_ENUM)
/* (attn.cu's flag bits against kernels.h's: runtime/cuemu_kc.cc, which compiles attn.cu) */
/* the attention window below kvrep in KDims' flags slot (launch.c attn_dims) */
static_assert(K_ATTN_WINDOW_MAX << K_ATTN_WINDOW_SHIFT <= (int64_t)1 << (KC_ATTN_KVREP_SHIFT - 1), "attention window");

/* ---- the runtime's side, emulated --------------------------------------------------- */

static KcStepParams step_params;
static bool emu_no_bias_epilogue;
static int64_t check_slot[16];
static int next_slot;

/* C_i = op(A_i) op(B_i) + beta C_i in double, each operand element read as
 * a float by value() */
template <typename C_, typename T, typename V>
static void gemm_ref(C_ *c, const T *a, const T *b, int64_t batch, int64_t sa, int64_t sb, int64_t m,
                     int64_t n, int64_t k, int ta, int tb, double beta, V value, double alpha = 1)
{
    for (int64_t i = 0; i < batch; i++) {
        const T *A = a + i * sa, *B = b + i * sb;
        C_ *C = c + i * m * n;
        for (int64_t r = 0; r < m; r++)
            for (int64_t q = 0; q < n; q++) {
                double s = 0;
                for (int64_t l = 0; l < k; l++)
                    s += (double)value(A[ta ? l * m + r : r * k + l]) * value(B[tb ? q * k + l : l * n + q]);
                C[r * n + q] = (C_)(beta == 0 ? alpha * s : alpha * s + beta * C[r * n + q]);
            }
    }
}

/* the addend, the GEMM and the bias in C's type C_ */
template <typename C_, typename T, typename V>
static int gemm_add_ref(C_ *c, const T *a, const T *b, const C_ *bias, const C_ *add, double alpha, int64_t batch,
                        int64_t sa, int64_t sb, int64_t m, int64_t n, int64_t k, int ta, int tb, V value)
{
    if (add && add != c)
        memmove(c, add, sizeof(C_) * (size_t)(batch * m * n));
    gemm_ref(c, a, b, batch, sa, sb, m, n, k, ta, tb, add ? 1.0 : 0.0, value, alpha);
    if (!bias || emu_no_bias_epilogue)
        return !bias;
    for (int64_t r = 0; r < batch * m; r++)
        for (int64_t q = 0; q < n; q++)
            c[r * n + q] += bias[q];
    return 1;
}

extern "C" {
void kc_launch(int kernel, unsigned grid, unsigned block, unsigned smem, void **args)
{
    if (smem != 0) {
        fprintf(stderr, "kc_launch: dynamic shared memory is not emulated\n");
        abort();
    }
    dev::dispatch(kernel, grid, block, args);
}
int kc_num_sms(void) { return 3; }
const KcStepParams *kc_step_params(void) { return &step_params; }
int64_t *kc_next_check(void) { return &check_slot[next_slot++ % 16]; }
void kc_memcpy(void *dst, const void *src, int64_t bytes) { memmove(dst, src, (size_t)bytes); }
void kc_memset(void *dst, int byte, int64_t bytes) { memset(dst, byte, (size_t)bytes); }

void kc_gemm_f32(float *c, const float *a, const float *b, int64_t batch, int64_t sa, int64_t sb,
                 int64_t m, int64_t n, int64_t k, int ta, int tb, double beta)
{
    gemm_ref(c, a, b, batch, sa, sb, m, n, k, ta, tb, beta, [](float v) { return v; });
}
void kc_gemm_f64(double *c, const double *a, const double *b, int64_t batch, int64_t sa, int64_t sb,
                 int64_t m, int64_t n, int64_t k, int ta, int tb, double beta)
{
    gemm_ref(c, a, b, batch, sa, sb, m, n, k, ta, tb, beta, [](double v) { return v; });
}
void kc_gemm_bf16(float *c, const uint16_t *a, const uint16_t *b, int64_t batch, int64_t sa, int64_t sb,
                  int64_t m, int64_t n, int64_t k, int ta, int tb, double beta)
{
    gemm_ref(c, a, b, batch, sa, sb, m, n, k, ta, tb, beta, k_bf16_to_f32);
}
void kc_gemm_f16(float *c, const uint16_t *a, const uint16_t *b, int64_t batch, int64_t sa, int64_t sb,
                 int64_t m, int64_t n, int64_t k, int ta, int tb, double beta)
{
    gemm_ref(c, a, b, batch, sa, sb, m, n, k, ta, tb, beta, k_f16_to_f32);
}
int kc_gemm_add(int type, void *c, const void *a, const void *b, const void *bias, const void *add,
                double alpha, int64_t batch, int64_t sa, int64_t sb, int64_t m, int64_t n, int64_t k, int ta, int tb)
{
    const uint16_t *a16 = (const uint16_t *)a, *b16 = (const uint16_t *)b;
    float *cf = (float *)c;
    const float *bf = (const float *)bias, *af = (const float *)add;
    switch (type) {
    case KC_GEMM_F32:
        return gemm_add_ref(cf, (const float *)a, (const float *)b, bf, af, alpha, batch, sa, sb, m, n, k, ta, tb,
                            [](float v) { return v; });
    case KC_GEMM_F64:
        return gemm_add_ref((double *)c, (const double *)a, (const double *)b, (const double *)bias,
                            (const double *)add, alpha, batch, sa, sb, m, n, k, ta, tb, [](double v) { return v; });
    default:
        return gemm_add_ref(cf, a16, b16, bf, af, alpha, batch, sa, sb, m, n, k, ta, tb,
                            type == KC_GEMM_BF16 ? k_bf16_to_f32 : k_f16_to_f32);
    }
}
}


/* ---- checks and inputs ------------------------------------------------------------- */

static int checks, failures;
static char what[256];
#define CTX(...) snprintf(what, sizeof what, __VA_ARGS__)

/* |got - want| <= tol (1 + |want|); tol 0: equal (NaN matches NaN) */
template <typename T> static void check_f(const T *got, const T *want, int64_t n, double tol)
{
    checks++;
    for (int64_t i = 0; i < n; i++) {
        const double g = got[i], w = want[i];
        const bool ok = std::isnan(w) ? std::isnan(g) : g == w || fabs(g - w) <= tol * (1 + fabs(w));
        if (!ok) {
            printf("FAIL %s at %lld: expected %.9g, actual %.9g\n", what, (long long)i, w, g);
            failures++;
            return;
        }
    }
}

static void check_bytes(const void *got, const void *want, size_t n)
{
    checks++;
    for (size_t i = 0; i < n; i++)
        if (((const uint8_t *)got)[i] != ((const uint8_t *)want)[i]) {
            printf("FAIL %s at byte %zu: expected %u, actual %u\n", what, i, ((const uint8_t *)want)[i],
                   ((const uint8_t *)got)[i]);
            failures++;
            return;
        }
}

static void check_int(int64_t got, int64_t want)
{
    checks++;
    if (got != want) {
        printf("FAIL %s: expected %lld, actual %lld\n", what, (long long)want, (long long)got);
        failures++;
    }
}

constexpr double TOL = 1e-5;
/* the tolerance of computed (not copied) results in T: float32 TOL, float64 1e-12 */
template <typename T> static constexpr double tol() { return sizeof(T) == 4 ? TOL : 1e-12; }

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double uni(double lo, double hi)
{
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return lo + (hi - lo) * (double)((rng * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
}
static int64_t below(int64_t n) { return (int64_t)uni(0, (double)n) % n; }

template <typename T> using V = std::vector<T>;
using F = V<float>;
template <typename T = float> static V<T> rnd(int64_t n, double lo, double hi)
{
    V<T> v((size_t)n + 1); /* + 1: never a zero-length buffer */
    for (auto &x : v)
        x = (T)uni(lo, hi);
    return v;
}
static int64_t numel(const std::vector<int64_t> &s)
{
    return std::accumulate(s.begin(), s.end(), (int64_t)1, std::multiplies<int64_t>());
}
/* numpy broadcast strides of shape x (right-aligned) over rank r */
static std::vector<int64_t> bstrides(int r, const std::vector<int64_t> &x)
{
    std::vector<int64_t> st((size_t)r + 1, 0);
    int64_t acc = 1;
    for (int d = (int)x.size() - 1; d >= 0; d--) {
        st[(size_t)(d + r - (int)x.size())] = x[(size_t)d] == 1 ? 0 : acc;
        acc *= x[(size_t)d];
    }
    return st;
}
static std::string dims(const std::vector<int64_t> &s)
{
    std::string o = "[";
    for (size_t i = 0; i < s.size(); i++) { /* appends only: GCC 12's -Wrestrict misfires at -O3 on
                                             * const char * + std::string (GCC bug 105651) */
        if (i)
            o += ',';
        o += std::to_string(s[i]);
    }
    return o + "]";
}

/* ---- ew ------------------------------------------------------------------------ */

struct Bcast {
    std::vector<int64_t> y, a, b;
};
static const Bcast bcast_cases[] = {
    {{}, {}, {}},                     /* rank 0 */
    {{7}, {7}, {7}},                  {{7}, {7}, {1}},          {{1}, {1}, {1}},
    {{3, 5}, {3, 5}, {5}},            {{3, 5}, {3, 1}, {1, 5}}, {{2, 3, 4, 5}, {2, 3, 4, 5}, {3, 1, 5}},
    {{4, 1, 3}, {1, 1, 3}, {4, 1, 1}}, {{10007}, {10007}, {10007}}, /* more than a grid */
    {{97, 131}, {97, 131}, {131}},
};

template <typename T> static void test_binary()
{
    for (const Bcast &c : bcast_cases)
        for (int op = K_ADD; op < K_BINARY_COUNT; op++) {
            const int r = (int)c.y.size();
            const int64_t n = numel(c.y);
            auto sa = bstrides(r, c.a), sb = bstrides(r, c.b);
            V<T> a = rnd<T>(numel(c.a), 0.5, 2), b = rnd<T>(numel(c.b), -2, 2), want(n + 1), got(n + 1);
            k_binary(op, want.data(), a.data(), b.data(), r, c.y.data(), sa.data(), sb.data());
            kc_binary(op, got.data(), a.data(), b.data(), r, c.y.data(), sa.data(), sb.data());
            CTX("kc_binary op %d y %s a %s b %s", op, dims(c.y).c_str(), dims(c.a).c_str(), dims(c.b).c_str());
            check_f(got.data(), want.data(), n, tol<T>());
            if (c.a == c.y) { /* y aliasing a */
                CTX("kc_binary op %d in place, y %s", op, dims(c.y).c_str());
                kc_binary(op, a.data(), a.data(), b.data(), r, c.y.data(), sa.data(), sb.data());
                check_f(a.data(), want.data(), n, tol<T>());
            }
        }
}

template <typename T> static void test_compare_where()
{
    for (const Bcast &c : bcast_cases) {
        const int r = (int)c.y.size();
        const int64_t n = numel(c.y), na = numel(c.a), nb = numel(c.b);
        auto sa = bstrides(r, c.a), sb = bstrides(r, c.b);
        V<T> a(na + 1), b(nb + 1);
        std::vector<int64_t> ia(na + 1), ib(nb + 1);
        for (int64_t i = 0; i < na; i++) a[i] = (T)(ia[i] = below(4) - 2); /* ties */
        for (int64_t i = 0; i < nb; i++) b[i] = (T)(ib[i] = below(4) - 2);
        std::vector<uint8_t> want(n + 1), got(n + 1);
        for (int op = K_EQ; op <= K_GE; op++) {
            k_compare(op, want.data(), a.data(), b.data(), r, c.y.data(), sa.data(), sb.data());
            kc_compare(op, got.data(), a.data(), b.data(), r, c.y.data(), sa.data(), sb.data());
            CTX("kc_compare_f32 op %d y %s", op, dims(c.y).c_str());
            check_bytes(got.data(), want.data(), (size_t)n);
            k_compare_i64(op, want.data(), ia.data(), ib.data(), r, c.y.data(), sa.data(), sb.data());
            kc_compare_i64(op, got.data(), ia.data(), ib.data(), r, c.y.data(), sa.data(), sb.data());
            CTX("kc_compare_i64 op %d y %s", op, dims(c.y).c_str());
            check_bytes(got.data(), want.data(), (size_t)n);
        }
        /* int64 index arithmetic; b has zeros: the first position divided by zero comes back */
        std::vector<int64_t> wi(n + 1), gi(n + 1);
        for (int op : {K_ADD, K_SUB, K_MUL, K_DIV, K_MIN, K_MAX, K_MOD, K_FMOD}) {
            check_slot[0] = -1, next_slot = 0;
            const int64_t bad = k_binary_i64(op, wi.data(), ia.data(), ib.data(), r, c.y.data(), sa.data(), sb.data());
            check_int(kc_binary_i64(op, gi.data(), ia.data(), ib.data(), r, c.y.data(), sa.data(), sb.data()), -1);
            CTX("kc_binary_i64 op %d y %s", op, dims(c.y).c_str());
            check_bytes(gi.data(), wi.data(), (size_t)n * sizeof(int64_t));
            check_int(check_slot[0], bad);
            check_int(next_slot, 1);
        }
        /* Where: condition broadcast like a, values like b and y */
        std::vector<uint8_t> cond(na + 1);
        for (auto &v : cond)
            v = (uint8_t)below(3); /* 2 is true too */
        auto sy = bstrides(r, c.y);
        for (int esize : {1, 2, 4, 8}) {
            std::vector<uint8_t> va((size_t)(n + 1) * 8), vb((size_t)(nb + 1) * 8), w((size_t)(n + 1) * 8),
                g((size_t)(n + 1) * 8);
            for (auto &v : va) v = (uint8_t)below(256);
            for (auto &v : vb) v = (uint8_t)below(256);
            k_where(esize, w.data(), cond.data(), va.data(), vb.data(), r, c.y.data(), sa.data(), sy.data(),
                    sb.data());
            kc_where(esize, g.data(), cond.data(), va.data(), vb.data(), r, c.y.data(), sa.data(), sy.data(),
                     sb.data());
            CTX("kc_where esize %d y %s", esize, dims(c.y).c_str());
            check_bytes(g.data(), w.data(), (size_t)(n * esize));
        }
        V<T> dy = rnd<T>(n, -1, 1), wa(n + 1), wb(n + 1), ga(n + 1), gb(n + 1);
        k_where_grad(wa.data(), wb.data(), cond.data(), dy.data(), r, c.y.data(), sa.data());
        kc_where_grad(ga.data(), gb.data(), cond.data(), dy.data(), r, c.y.data(), sa.data());
        CTX("kc_where_grad y %s", dims(c.y).c_str());
        check_f(ga.data(), wa.data(), n, 0);
        check_f(gb.data(), wb.data(), n, 0);
        kc_where_grad(nullptr, gb.data(), cond.data(), dy.data(), r, c.y.data(), sa.data());
        CTX("kc_where_grad db only, y %s", dims(c.y).c_str());
        check_f(gb.data(), wb.data(), n, 0);
    }
}

template <typename T> static void test_unary()
{
    double p[K_UNARY_COUNT][2] = {};
    p[K_LEAKY_RELU][0] = 0.1;
    p[K_ELU][0] = 0.7, p[K_CELU][0] = 1.5, p[K_THRESHOLDED_RELU][0] = 0.5;
    p[K_SELU][0] = 1.6732632423543772, p[K_SELU][1] = 1.0507009873554805;
    p[K_CLIP][0] = -0.5, p[K_CLIP][1] = 0.7;
    p[K_SOFTPLUS][0] = 1, p[K_SOFTPLUS][1] = 20;
    p[K_HARD_SIGMOID][0] = 0.2, p[K_HARD_SIGMOID][1] = 0.5;
    p[K_GELU][0] = 1; /* the tanh form (kernels_ew checks both against libm) */
    for (int64_t n : {1, 1000, 10007})
        for (int op = 0; op < K_UNARY_COUNT; op++) {
            const bool pos = op == K_SQRT || op == K_LOG;
            V<T> x = rnd<T>(n, pos ? 0.1 : -3, 3), dy = rnd<T>(n, -1, 1), y(n + 1), want(n + 1), got(n + 1);
            if (n > 1)
                x[0] = NAN;
            k_unary(op, want.data(), x.data(), n, p[op][0], p[op][1]);
            kc_unary(op, got.data(), x.data(), n, p[op][0], p[op][1]);
            CTX("kc_unary op %d n %lld", op, (long long)n);
            check_f(got.data(), want.data(), n, tol<T>());
            y = want;
            x[0] = 0.5;
            if (op == K_CLIP && n > 2) /* on the bounds themselves, where the gradient stops */
                x[1] = (T)p[op][0], x[2] = (T)p[op][1];
            k_unary(op, y.data(), x.data(), n, p[op][0], p[op][1]);
            k_unary_grad(op, want.data(), dy.data(), x.data(), y.data(), n, p[op][0], p[op][1]);
            kc_unary_grad(op, got.data(), dy.data(), x.data(), y.data(), n, p[op][0], p[op][1]);
            CTX("kc_unary_grad op %d n %lld", op, (long long)n);
            check_f(got.data(), want.data(), n, tol<T>());
            kc_unary_grad(op, dy.data(), dy.data(), x.data(), y.data(), n, p[op][0], p[op][1]);
            CTX("kc_unary_grad op %d, dx aliasing dy", op);
            check_f(dy.data(), want.data(), n, tol<T>());
        }
    const int64_t n = 3001;
    V<T> x = rnd<T>(n, -5, 5), want(n + 1), got(n + 1);
    k_scale(want.data(), x.data(), 0.3, n);
    kc_scale(got.data(), x.data(), 0.3, n);
    CTX("kc_scale");
    check_f(got.data(), want.data(), n, 0);
    k_fill(want.data(), 1.0 / 3, n);
    kc_fill(got.data(), 1.0 / 3, n);
    CTX("kc_fill");
    check_f(got.data(), want.data(), n, 0);
    std::vector<uint8_t> b(n), wn(n), gn(n);
    for (auto &v : b)
        v = (uint8_t)below(3);
    k_not(wn.data(), b.data(), n);
    kc_not(gn.data(), b.data(), n);
    CTX("kc_not");
    check_bytes(gn.data(), wn.data(), (size_t)n);
}

static void test_cast()
{
    static const int size[] = {4, 8, 8, 4, 1, 1, 2, 2, 1, 2, 2, 4, 8}; /* K_DT_F32 .. K_DT_U64 */
    static const double vals[] = {0, -0.0, 1.5, -2.7, 255.9, 256, -1, 3e9, -3e9, 1e19, -1e19, INFINITY, -INFINITY,
                                  NAN, 2, 127, 7.25, 70000, -40000, 1.9e19};
    const int64_t n = 3 * (int64_t)(sizeof vals / sizeof vals[0]);
    for (int from = K_DT_F32; from <= K_DT_U64; from++) {
        std::vector<uint8_t> x((size_t)n * 8);
        for (int64_t i = 0; i < n; i++) { /* every value, and random bits for the integers */
            const double v = vals[i % (n / 3)];
            switch (from) {
            case K_DT_F32: ((float *)x.data())[i] = (float)v; break;
            case K_DT_F64: ((double *)x.data())[i] = v; break;
            case K_DT_BF16: ((uint16_t *)x.data())[i] = k_bf16_from_f32((float)v); break;
            case K_DT_F16: ((uint16_t *)x.data())[i] = k_f16_from_f32((float)v); break;
            case K_DT_I64: case K_DT_U64: ((int64_t *)x.data())[i] = (int64_t)(uni(-1, 1) * 9e18); break;
            case K_DT_I32: ((int32_t *)x.data())[i] = (int32_t)(uni(-1, 1) * 2e9); break;
            default: /* BOOL, U8 .. U32: random bytes */
                for (int b = 0; b < size[from]; b++)
                    x[(size_t)(i * size[from] + b)] = (uint8_t)below(256);
            }
        }
        for (int to = K_DT_F32; to <= K_DT_U64; to++) {
            std::vector<uint8_t> want((size_t)n * 8), got((size_t)n * 8);
            k_cast(to, want.data(), from, x.data(), n);
            kc_cast(to, got.data(), from, x.data(), n);
            CTX("kc_cast %d -> %d", from, to);
            check_bytes(got.data(), want.data(), (size_t)(n * size[to]));
            if (size[to] == size[from]) { /* in place */
                std::vector<uint8_t> inplace = x;
                kc_cast(to, inplace.data(), from, inplace.data(), n);
                CTX("kc_cast %d -> %d in place", from, to);
                check_bytes(inplace.data(), want.data(), (size_t)(n * size[to]));
            }
        }
    }
}

/* bfloat16 casts: the device's twin of k_bf16_from_f32 / k_bf16_to_f32
 * (kernels.h) and its place in k_cast.  Every result is checked against
 * kernels/c's k_cast and against what the contract composes: bits worked
 * out by hand, or, for dtypes other than float32, which meet bfloat16
 * through float32, k_cast to / from K_DT_F32 and the kernels.h helpers. */

static void check_u16(const uint16_t *got, const uint16_t *want, int64_t n)
{
    checks++;
    for (int64_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            printf("FAIL %s at %lld: expected 0x%04x, actual 0x%04x\n", what, (long long)i, want[i], got[i]);
            failures++;
            return;
        }
}

static float f32_of_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* float32 bits -> the bfloat16 bits the contract gives, worked out by hand */
static const uint32_t bf16_round[][2] = {
    {0x3f800000, 0x3f80}, {0xbf800000, 0xbf80}, /* +-1, exact */
    {0x3f808000, 0x3f80}, {0x3f818000, 0x3f82}, /* halfway: down to even, up to even */
    {0xbf808000, 0xbf80}, {0xbf818000, 0xbf82}, /* the same, negative */
    {0x3f808001, 0x3f81}, {0x3f817fff, 0x3f81}, /* just above / below halfway */
    {0x40490fdb, 0x4049},                       /* pi */
    {0x7f800000, 0x7f80}, {0xff800000, 0xff80}, /* +-inf */
    {0x7f7fffff, 0x7f80}, {0xff7fffff, 0xff80}, /* +-float max: rounds to +-inf */
    {0x7f7f7fff, 0x7f7f},                       /* below halfway: bfloat16's max */
    {0x7f7f8000, 0x7f80},                       /* halfway from bfloat16's max (odd) to inf: inf */
    {0x7fc00000, 0x7fc0}, {0xffc00000, 0xffc0}, /* quiet NaNs keep their sign */
    {0x7f800001, 0x7fc0}, {0xff800001, 0xffc0}, /* signalling NaNs are quieted, never inf */
    {0x7f81ffff, 0x7fc1}, {0x7fffffff, 0x7fff}, /* payloads keep their top bits */
    {0x00000000, 0x0000}, {0x80000000, 0x8000}, /* +-0 */
    {0x00000001, 0x0000}, {0x80000001, 0x8000}, /* the smallest denormals: to +-0 */
    {0x00008000, 0x0000}, {0x00018000, 0x0002}, /* denormal ties, to even */
    {0x00010000, 0x0001}, {0x8001ffff, 0x8002}, /* denormals */
    {0x007fffff, 0x0080},                       /* the largest denormal rounds to a normal */
};

/* doubles -> bfloat16 bits by hand: the double first rounds to float */
static const struct {
    double v;
    uint16_t bits;
} bf16_round_f64[] = {
    {1 + 0x1p-8 + 0x1p-30, 0x3f80}, /* float 1 + 2^-8 exactly, then a tie to even (not 0x3f81) */
    {1 + 0x1p-8 + 0x1p-20, 0x3f81}, /* above halfway in float already */
    {1e39, 0x7f80},      {-1e39, 0xff80},  /* beyond float: +-inf */
    {3.4028235e38, 0x7f80},                /* float max, then inf */
    {1e-50, 0x0000},     {-1e-50, 0x8000}, /* below float: +-0 */
    {-0.0, 0x8000},      {INFINITY, 0x7f80}, {-INFINITY, 0xff80},
    {NAN, 0x7fc0},       {-NAN, 0xffc0},
    {-2.75, 0xc030},
};

static void test_cast_bf16()
{
    const int64_t nr = (int64_t)(sizeof bf16_round / sizeof bf16_round[0]);
    std::vector<float> xr(nr);
    std::vector<uint16_t> wr(nr), gr(nr), hr(nr);
    for (int64_t i = 0; i < nr; i++) {
        xr[i] = f32_of_bits(bf16_round[i][0]);
        wr[i] = (uint16_t)bf16_round[i][1];
        hr[i] = k_bf16_from_f32(xr[i]);
    }
    kc_cast(K_DT_BF16, gr.data(), K_DT_F32, xr.data(), nr);
    CTX("kc_cast f32 -> bf16: ties, infinities, NaNs, float max, zeros, denormals");
    check_u16(gr.data(), wr.data(), nr);
    CTX("k_bf16_from_f32 (kernels.h) on the same values");
    check_u16(hr.data(), wr.data(), nr);
    k_cast(K_DT_BF16, hr.data(), K_DT_F32, xr.data(), nr);
    CTX("k_cast (kernels/c) f32 -> bf16 on the same values");
    check_u16(hr.data(), wr.data(), nr);

    const int64_t nd = (int64_t)(sizeof bf16_round_f64 / sizeof bf16_round_f64[0]);
    std::vector<double> xd(nd);
    std::vector<uint16_t> wd(nd), gd(nd);
    for (int64_t i = 0; i < nd; i++)
        xd[i] = bf16_round_f64[i].v, wd[i] = bf16_round_f64[i].bits;
    kc_cast(K_DT_BF16, gd.data(), K_DT_F64, xd.data(), nd);
    CTX("kc_cast f64 -> bf16: through float");
    check_u16(gd.data(), wd.data(), nd);
    k_cast(K_DT_BF16, gd.data(), K_DT_F64, xd.data(), nd);
    CTX("k_cast (kernels/c) f64 -> bf16 on the same values");
    check_u16(gd.data(), wd.data(), nd);

    /* every float class at random, and ties and near-ties in every binade */
    const int64_t n = 30011;
    std::vector<float> xf(n);
    std::vector<uint16_t> want(n), got(n);
    for (int64_t i = 0; i < n; i++) {
        const uint32_t hi = (uint32_t)below(65536) << 16, low[] = {(uint32_t)below(65536), 0x8000, 0x7fff, 0x8001};
        xf[i] = f32_of_bits(hi | low[i % 4]);
        want[i] = k_bf16_from_f32(xf[i]);
    }
    kc_cast(K_DT_BF16, got.data(), K_DT_F32, xf.data(), n);
    CTX("kc_cast f32 -> bf16, %lld random floats", (long long)n);
    check_u16(got.data(), want.data(), n);
    k_cast(K_DT_BF16, want.data(), K_DT_F32, xf.data(), n);
    CTX("kc_cast f32 -> bf16, %lld random floats, against k_cast", (long long)n);
    check_u16(got.data(), want.data(), n);

    /* from bfloat16: all 65536 values; float32 gets the bits << 16 */
    std::vector<uint16_t> h(65536);
    std::vector<uint32_t> wbits(65536);
    std::vector<float> wide(65536);
    for (uint32_t i = 0; i < 65536; i++) {
        h[i] = (uint16_t)i, wbits[i] = i << 16, wide[i] = k_bf16_to_f32((uint16_t)i);
    }
    CTX("k_bf16_to_f32 (kernels.h): the top half of a float");
    check_bytes(wide.data(), wbits.data(), wbits.size() * 4);
    for (int to = K_DT_F32; to <= K_DT_BOOL; to++) {
        static const int size[] = {4, 8, 8, 4, 1, 1};
        std::vector<uint8_t> w(65536 * 8), d(65536 * 8), g(65536 * 8);
        k_cast(to, w.data(), K_DT_F32, wide.data(), 65536);
        k_cast(to, d.data(), K_DT_BF16, h.data(), 65536);
        kc_cast(to, g.data(), K_DT_BF16, h.data(), 65536);
        CTX("kc_cast bf16 -> %d, every bfloat16, against float32 -> %d", to, to);
        check_bytes(g.data(), w.data(), (size_t)65536 * size[to]);
        CTX("kc_cast bf16 -> %d, every bfloat16, against k_cast", to);
        check_bytes(g.data(), d.data(), (size_t)65536 * size[to]);
    }

    /* to bfloat16 from the other dtypes: float32 first, then rounded */
    for (int from = K_DT_F64; from <= K_DT_BOOL; from++) {
        std::vector<uint8_t> x((size_t)n * 8);
        for (int64_t i = 0; i < n; i++)
            switch (from) {
            case K_DT_F64: /* any magnitude a float has, and beyond; a few specials */
                ((double *)x.data())[i] = i < nd ? bf16_round_f64[i].v : uni(-1, 1) * pow(2.0, uni(-160, 160));
                break;
            case K_DT_I64: /* large and near 2^24, where float rounds first */
                ((int64_t *)x.data())[i] = i % 2 ? (int64_t)(uni(-1, 1) * 9e18) : (1 << 24) + below(64) - 32;
                break;
            case K_DT_I32: ((int32_t *)x.data())[i] = (int32_t)(uni(-1, 1) * 2e9); break;
            default: x[(size_t)i] = (uint8_t)below(256);
            }
        std::vector<float> f(n);
        std::vector<uint16_t> w(n), d(n), g(n);
        k_cast(K_DT_F32, f.data(), from, x.data(), n);
        for (int64_t i = 0; i < n; i++)
            w[i] = k_bf16_from_f32(f[i]);
        k_cast(K_DT_BF16, d.data(), from, x.data(), n);
        kc_cast(K_DT_BF16, g.data(), from, x.data(), n);
        CTX("kc_cast %d -> bf16, against %d -> float32 -> bf16", from, from);
        check_u16(g.data(), w.data(), n);
        CTX("kc_cast %d -> bf16, against k_cast", from);
        check_u16(g.data(), d.data(), n);
    }

    /* bfloat16 to itself: the bytes as they are, in place too */
    std::vector<uint16_t> copy(65536, 7);
    kc_cast(K_DT_BF16, copy.data(), K_DT_BF16, h.data(), 65536);
    CTX("kc_cast bf16 -> bf16");
    check_u16(copy.data(), h.data(), 65536);
    kc_cast(K_DT_BF16, copy.data(), K_DT_BF16, copy.data(), 65536);
    CTX("kc_cast bf16 -> bf16 in place");
    check_u16(copy.data(), h.data(), 65536);
}

/* ---- copy ------------------------------------------------------------------------ */

template <typename T> static void test_copy_strided()
{
    struct Case {
        std::vector<int64_t> shape, ys, xs;
        int64_t yoff, xoff, ylen, xlen;
    };
    static const Case cases[] = {
        {{}, {}, {}, 3, 5, 8, 8},                           /* one element */
        {{5}, {1}, {-1}, 0, 4, 5, 5},                        /* reversed slice */
        {{3, 4}, {4, 1}, {0, 1}, 0, 0, 12, 4},               /* Expand of a row */
        {{3, 4}, {10, 1}, {4, 1}, 6, 0, 30, 12},             /* a Concat part */
        {{2, 3, 5}, {15, 5, 1}, {40, -8, 2}, 0, 17, 30, 80}, /* a strided Slice */
        {{4, 50, 70}, {3500, 70, 1}, {0, 70, 1}, 0, 0, 14000, 3500}, /* Tile/Expand, > one grid */
    };
    for (const Case &c : cases)
        for (int es : {1, 2, 4, 8}) {
            std::vector<uint8_t> x((size_t)c.xlen * 8), want((size_t)c.ylen * 8, 7), got((size_t)c.ylen * 8, 7);
            for (auto &v : x)
                v = (uint8_t)below(256);
            const int r = (int)c.shape.size();
            k_copy_strided(es, r, c.shape.data(), want.data(), c.yoff, c.ys.data(), x.data(), c.xoff, c.xs.data());
            kc_copy_strided(es, r, c.shape.data(), got.data(), c.yoff, c.ys.data(), x.data(), c.xoff, c.xs.data());
            CTX("kc_copy_strided esize %d shape %s", es, dims(c.shape).c_str());
            check_bytes(got.data(), want.data(), want.size());
        }
    struct Perm {
        std::vector<int64_t> shape, perm;
    };
    static const Perm tcases[] = {
        {{37, 53}, {1, 0}},          {{4, 5, 6}, {2, 1, 0}},     {{4, 5, 6}, {1, 2, 0}},
        {{4, 5, 6}, {2, 0, 1}},      {{4, 5, 6}, {0, 2, 1}},     {{2, 3, 4, 5}, {0, 2, 1, 3}},
        {{3, 1, 70, 40}, {0, 3, 2, 1}}, {{1, 9}, {1, 0}},        {{130, 3}, {1, 0}},
    };
    for (const Perm &c : tcases) {
        const int64_t n = numel(c.shape);
        V<T> x = rnd<T>(n, -1, 1), want(n + 1), got(n + 1);
        k_transpose(want.data(), x.data(), (int)c.shape.size(), c.shape.data(), c.perm.data());
        kc_transpose(got.data(), x.data(), (int)c.shape.size(), c.shape.data(), c.perm.data());
        CTX("kc_transpose %s perm %s", dims(c.shape).c_str(), dims(c.perm).c_str());
        check_f(got.data(), want.data(), n, 0);
    }
}

template <typename T> static void test_pad()
{
    struct Case {
        std::vector<int64_t> x, pads;
    };
    static const Case cases[] = {
        {{}, {}},                           {{3}, {5, 4}},  /* reflect more than the dim: repeatedly */
        {{3, 4}, {1, 2, 2, 1}},             {{1, 4}, {2, 0, 1, 3}},
        {{2, 3, 5}, {0, 1, 2, 1, 0, 3}},    {{6, 7}, {-1, 2, -2, 1}}, /* crops (constant only) */
        {{2, 40, 60}, {0, 3, 3, 0, 3, 3}},  /* more than a grid */
    };
    for (const Case &c : cases)
        for (int mode = K_PAD_CONSTANT; mode <= K_PAD_EDGE; mode++) {
            bool crop = false;
            for (int64_t p : c.pads)
                crop |= p < 0;
            if (crop && mode != K_PAD_CONSTANT)
                continue;
            const int r = (int)c.x.size();
            std::vector<int64_t> ys(c.x);
            for (int d = 0; d < r; d++)
                ys[d] += c.pads[d] + c.pads[r + d];
            const int64_t nx = numel(c.x), ny = numel(ys);
            V<T> x = rnd<T>(nx, -1, 1), dy = rnd<T>(ny, -1, 1), want(ny + 1), got(ny + 1), wdx(nx + 1), gdx(nx + 1);
            k_pad(mode, want.data(), x.data(), r, c.x.data(), c.pads.data(), 0.25);
            kc_pad(mode, got.data(), x.data(), r, c.x.data(), c.pads.data(), 0.25);
            CTX("kc_pad mode %d x %s pads %s", mode, dims(c.x).c_str(), dims(c.pads).c_str());
            check_f(got.data(), want.data(), ny, 0);
            k_pad_grad(mode, wdx.data(), dy.data(), r, c.x.data(), c.pads.data());
            kc_pad_grad(mode, gdx.data(), dy.data(), r, c.x.data(), c.pads.data());
            CTX("kc_pad_grad mode %d x %s pads %s", mode, dims(c.x).c_str(), dims(c.pads).c_str());
            check_f(gdx.data(), wdx.data(), nx, 0); /* same additions in the same order */
        }
}

/* ---- fused attention ---------------------------------------------------------------- */

/* The attention tests' problems: batch, t x s scores, d, dv; the bias (kind 0: none, 1: causal, 2: random with
 * 30 % -inf and one row all -inf; 3: the causal band computed, K_ATTN_CAUSAL and no bias, 4: the same with a
 * sliding window of 7 keys), its nbias x brep broadcast; K_ATTN_ZERO or not.  attn.cu's tiles are 64 (32
 * for float64) query rows by 32 keys, 64 keys by 16 queries in the dk, dv kernel, d and dv in chunks of 64 (32):
 * the cases cross each, and d, dv > 64 take several chunks.  kvrep (1 when not given): batch / kvrep K/V problems,
 * problem b reading b / kvrep (grouped-query attention; the dk, dv kernel sums a group's query problems). */
struct AttnCase {
    int64_t batch, t, s, d, dv;
    int kind;
    int64_t nbias, brep;
    int zero;
    int64_t kvrep = 1;
};
static const AttnCase attn_cases[] = {{3, 5, 5, 4, 3, 0, 1, 1, 0},     {2, 70, 70, 8, 8, 1, 1, 1, 0},
                                      {6, 9, 13, 5, 7, 2, 2, 3, 0},     {2, 40, 300, 6, 5, 1, 1, 1, 0},
                                      {3, 150, 20, 4, 4, 2, 3, 1, 0},   {6, 9, 13, 5, 7, 2, 2, 3, 1},
                                      {4, 150, 20, 4, 4, 2, 2, 1, 1},   {2, 40, 300, 6, 5, 1, 1, 1, 1},
                                      {2, 33, 45, 70, 130, 1, 1, 1, 0}, {3, 17, 50, 100, 9, 2, 3, 1, 1},
                                      {2, 70, 70, 8, 8, 3, 1, 1, 0},    {2, 40, 300, 6, 5, 3, 1, 1, 0},
                                      {4, 150, 20, 4, 4, 3, 1, 1, 1},   {2, 100, 100, 8, 8, 4, 1, 1, 0},
                                      {2, 33, 90, 6, 5, 4, 1, 1, 0},
                                      /* grouped-query and multi-query attention */
                                      {8, 70, 70, 8, 8, 3, 1, 1, 0, 4},   {6, 9, 13, 5, 7, 2, 2, 3, 1, 3},
                                      {6, 40, 100, 70, 9, 2, 6, 1, 0, 2}, {4, 150, 20, 4, 4, 0, 1, 1, 0, 4}};

/* whether case c's kernels read a bias (kinds 3 and 4 compute theirs), and the flags of its band */
static bool attn_reads_bias(const AttnCase &c) { return c.kind == 1 || c.kind == 2; }
static int attn_band_flags(const AttnCase &c)
{
    return c.kind == 3 ? K_ATTN_CAUSAL : c.kind == 4 ? K_ATTN_CAUSAL | 7 << K_ATTN_WINDOW_SHIFT : 0;
}

/* the bias of case c (kind 1 or 2; the all -inf row in kind 2; kinds 3 and 4: their band as a bias, for the
 * float64 reference) */
template <typename T> static V<T> attn_bias(const AttnCase &c)
{
    V<T> bias(c.kind ? c.nbias * c.t * c.s + 1 : 1);
    for (int64_t i = 0; i + 1 < (int64_t)bias.size() && c.kind; i++) {
        const int64_t r = i / c.s % c.t, j = i % c.s, hi = r + c.s - c.t;
        bias[i] = c.kind == 1 || c.kind == 3 ? (j > hi ? -(T)INFINITY : 0)
                  : c.kind == 4              ? (j > hi || j <= hi - 7 ? -(T)INFINITY : 0)
                  : uni(0, 1) < 0.3          ? -(T)INFINITY
                                             : (T)uni(-1, 1);
    }
    if (c.kind == 2)
        for (int64_t j = 0; j < c.s; j++)
            bias[(c.t / 2) * c.s + j] = -(T)INFINITY; /* a row that sees nothing: NaN */
    return bias;
}

/* kc_attention / kc_attention_grad against kernels/c's on attn_cases (the all -inf row: NaN in both; with
 * K_ATTN_ZERO 0, lse -inf, and kept for the backward, whose gradients there are 0), keys transposed or as
 * rows; with a bias, its gradient dbias too (a bias slice read by several problems) */
template <typename T> static void test_attention()
{
    const double scale = 0.35;
    for (const AttnCase &c : attn_cases)
        for (int krow = 0; krow < 2; krow++) {
            const int flags = krow | (c.zero ? K_ATTN_ZERO : 0) | attn_band_flags(c);
            const int64_t nq = c.batch * c.t * c.d, nk = c.batch / c.kvrep * c.s * c.d;
            const int64_t nv = c.batch / c.kvrep * c.s * c.dv, ny = c.batch * c.t * c.dv, nl = c.batch * c.t;
            V<T> q = rnd<T>(nq, -2, 2), k = rnd<T>(nk, -2, 2), v = rnd<T>(nv, -1, 1), dy = rnd<T>(ny, -1, 1);
            V<T> bias = attn_bias<T>(c);
            const T *bp = attn_reads_bias(c) ? bias.data() : nullptr;
            V<T> wy(ny + 1), gy(ny + 1), wl(nl + 1), gl(nl + 1), ws(k_attention_workspace(c.batch, c.t, c.s) + 1);
            k_attention(wy.data(), wl.data(), q.data(), k.data(), flags, v.data(), bp, c.batch, c.t, c.s, c.d, c.dv,
                        c.nbias, c.brep, c.kvrep, 0, scale, 0.0, 0, 0, 0, ws.data(), nullptr);
            kc_attention(gy.data(), gl.data(), q.data(), k.data(), flags, v.data(), bp, c.batch, c.t, c.s, c.d, c.dv,
                         c.nbias, c.brep, c.kvrep, 0, scale, 0.0, 0, 0, 0, ws.data(), nullptr);
            CTX("kc_attention batch %lld t %lld s %lld bias %d kvrep %lld flags %d", (long long)c.batch,
                (long long)c.t, (long long)c.s, c.kind, (long long)c.kvrep, flags);
            check_f(gy.data(), wy.data(), ny, tol<T>());
            check_f(gl.data(), wl.data(), nl, tol<T>());
            if (c.kind == 2 && !c.zero) /* the backward around finite rows */
                for (int64_t j = 0; j < c.s; j++)
                    bias[(c.t / 2) * c.s + j] = 0;
            k_attention(wy.data(), wl.data(), q.data(), k.data(), flags, v.data(), bp, c.batch, c.t, c.s, c.d, c.dv,
                        c.nbias, c.brep, c.kvrep, 0, scale, 0.0, 0, 0, 0, ws.data(), nullptr);
            const int64_t nb = bp ? c.nbias * c.t * c.s : 0;
            V<T> wdq(nq + 1), gdq(nq + 1, NAN), wdk(nk + 1), gdk(nk + 1, NAN), wdv(nv + 1), gdv(nv + 1, NAN);
            V<T> wdb(nb + 1), gdb(nb + 1, NAN);
            k_attention_grad(wdq.data(), wdk.data(), wdv.data(), bp ? wdb.data() : nullptr, dy.data(), q.data(),
                             k.data(), flags, v.data(), bp, wy.data(), wl.data(), c.batch, c.t, c.s, c.d, c.dv, c.nbias,
                             c.brep, c.kvrep, 0, scale, 0.0, 0, 0, 0, ws.data(), nullptr);
            kc_attention_grad(gdq.data(), gdk.data(), gdv.data(), bp ? gdb.data() : nullptr, dy.data(), q.data(),
                              k.data(), flags, v.data(), bp, wy.data(), wl.data(), c.batch, c.t, c.s, c.d, c.dv,
                              c.nbias, c.brep, c.kvrep, 0, scale, 0.0, 0, 0, 0, ws.data(), nullptr);
            CTX("kc_attention_grad batch %lld t %lld s %lld bias %d kvrep %lld flags %d", (long long)c.batch,
                (long long)c.t, (long long)c.s, c.kind, (long long)c.kvrep, flags);
            check_f(gdq.data(), wdq.data(), nq, tol<T>());
            check_f(gdk.data(), wdk.data(), nk, tol<T>());
            check_f(gdv.data(), wdv.data(), nv, tol<T>());
            check_f(gdb.data(), wdb.data(), nb, tol<T>());
        }
}

/* float64 attention (kernels.h k_attention's contract) of inputs as doubles: y, lse and the gradients dq, dk
 * (in k's layout), dv, dbias (nbias slices) for dy; a row that sees nothing takes K_ATTN_ZERO's y 0, lse -inf
 * and no gradient (the callers give such rows only with K_ATTN_ZERO) */
struct AttnRef {
    V<double> y, lse, dq, dk, dv, db;
};
static AttnRef attn_ref(const AttnCase &c, int flags, const V<double> &q, const V<double> &k, const V<double> &v,
                        const float *bias, const F &dy, double scale)
{
    const int64_t t = c.t, s = c.s, d = c.d, dv = c.dv;
    const bool krow = flags & K_ATTN_KROW;
    AttnRef r{V<double>(c.batch * t * dv), V<double>(c.batch * t), V<double>(c.batch * t * d),
              V<double>(c.batch / c.kvrep * s * d), V<double>(c.batch / c.kvrep * s * dv), V<double>(c.nbias * t * s)};
    V<double> p(s);
    for (int64_t b = 0; b < c.batch; b++)
        for (int64_t i = 0; i < t; i++) {
            const int64_t row = b * t + i, bs = (b / c.brep % c.nbias) * t * s + i * s;
            const int64_t g = b / c.kvrep; /* the K/V problem */
            const double *kb = k.data() + g * d * s, *vb = v.data() + g * s * dv;
            double mx = -INFINITY, sum = 0, dd = 0;
            for (int64_t j = 0; j < s; j++) {
                double a = 0;
                for (int64_t l = 0; l < d; l++)
                    a += q[row * d + l] * kb[krow ? j * d + l : l * s + j];
                p[j] = scale * a + (bias ? bias[bs + j] : 0);
                mx = std::max(mx, p[j]);
            }
            r.lse[row] = mx;
            if (mx == -INFINITY)
                continue;
            for (int64_t j = 0; j < s; j++)
                sum += p[j] = exp(p[j] - mx);
            r.lse[row] = mx + log(sum);
            for (int64_t j = 0; j < s; j++)
                for (int64_t e = 0; e < dv; e++)
                    r.y[row * dv + e] += p[j] / sum * vb[j * dv + e];
            for (int64_t e = 0; e < dv; e++)
                dd += dy[row * dv + e] * r.y[row * dv + e];
            for (int64_t j = 0; j < s; j++) {
                double dp = 0;
                for (int64_t e = 0; e < dv; e++) {
                    dp += dy[row * dv + e] * vb[j * dv + e];
                    r.dv[(g * s + j) * dv + e] += p[j] / sum * dy[row * dv + e];
                }
                const double ds = p[j] / sum * (dp - dd);
                for (int64_t l = 0; l < d; l++) {
                    r.dq[row * d + l] += scale * ds * kb[krow ? j * d + l : l * s + j];
                    r.dk[g * d * s + (krow ? j * d + l : l * s + j)] += scale * ds * q[row * d + l];
                }
                r.db[bs + j] += ds;
            }
        }
    return r;
}

/* n random values in [lo, hi) rounded to bfloat16 or float16: the bits and their values */
static std::pair<std::vector<uint16_t>, V<double>> attn_low(int64_t n, double lo, double hi, bool f16)
{
    std::vector<uint16_t> h((size_t)n + 1);
    V<double> x((size_t)n + 1);
    for (int64_t i = 0; i <= n; i++) {
        h[i] = f16 ? k_f16_from_f32((float)uni(lo, hi)) : k_bf16_from_f32((float)uni(lo, hi));
        x[i] = f16 ? k_f16_to_f32(h[i]) : k_bf16_to_f32(h[i]);
    }
    return {h, x};
}

static F attn_floats(const V<double> &x) { return F(x.begin(), x.end()); }

/* 16-bit bits widened to float, and floats rounded to 16-bit bits */
typedef std::vector<uint16_t> H;
static F attn_wide(const H &h, bool f16)
{
    F x(h.size());
    for (size_t i = 0; i < h.size(); i++)
        x[i] = f16 ? k_f16_to_f32(h[i]) : k_bf16_to_f32(h[i]);
    return x;
}
static H attn_narrow(const F &x, bool f16)
{
    H h(x.size());
    for (size_t i = 0; i < x.size(); i++)
        h[i] = f16 ? k_f16_from_f32(x[i]) : k_bf16_from_f32(x[i]);
    return h;
}

/* kc_attention_bf16 / _f16 and their gradients against attn_ref on the same rounded q, k, v, dy, and against the
 * cpu kernels k_attention_bf16 / _f16, on attn_cases with keys transposed or as rows: y, dq, dk, dv are 16-bit
 * (the backward takes attn_ref's y and lse, y rounded), within the low type's rounding of P, dS and the outputs
 * (relative to 1 + |want|: 3e-2 for bfloat16's 8 bits, 4e-3 for float16's 11) */
static void test_attention_low(bool f16)
{
    const double scale = 0.35, tl = f16 ? 4e-3 : 3e-2;
    for (const AttnCase &c : attn_cases)
        for (int krow = 0; krow < 2; krow++) {
            const int flags = krow | (c.zero ? K_ATTN_ZERO : 0) | attn_band_flags(c);
            const int64_t nq = c.batch * c.t * c.d, nk = c.batch / c.kvrep * c.s * c.d;
            const int64_t nv = c.batch / c.kvrep * c.s * c.dv, ny = c.batch * c.t * c.dv, nl = c.batch * c.t;
            const int64_t nb = attn_reads_bias(c) ? c.nbias * c.t * c.s : 0;
            auto [q16, q] = attn_low(nq, -2, 2, f16);
            auto [k16, k] = attn_low(nk, -2, 2, f16);
            auto [v16, v] = attn_low(nv, -1, 1, f16);
            auto [dy16, dyv] = attn_low(ny, -1, 1, f16);
            F dy = attn_floats(dyv), bias = attn_bias<float>(c);
            if (c.kind == 2 && !c.zero) /* attn_ref's rows that see nothing are K_ATTN_ZERO's */
                for (int64_t j = 0; j < c.s; j++)
                    bias[(c.t / 2) * c.s + j] = 0;
            const float *bp = attn_reads_bias(c) ? bias.data() : nullptr;
            const AttnRef r = attn_ref(c, flags, q, k, v, c.kind ? bias.data() : nullptr, dy, scale); /* the band too */
            const F wy = attn_floats(r.y), wl = attn_floats(r.lse);
            const H wy16 = attn_narrow(wy, f16);
            const uint16_t nan16 = f16 ? 0x7e00 : 0x7fc0; /* what a kernel leaves unwritten shows */
            H gy(ny + 1, nan16), gdq(nq + 1, nan16), gdk(nk + 1, nan16), gdv(nv + 1, nan16);
            F gl(nl + 1), gdb(nb + 1, NAN);
            (f16 ? kc_attention_f16 : kc_attention_bf16)(gy.data(), gl.data(), q16.data(), k16.data(), flags,
                                                         v16.data(), bp, c.batch, c.t, c.s, c.d, c.dv, c.nbias,
                                                         c.brep, c.kvrep, 0, scale, 0.0, 0, 0, 0, nullptr, nullptr);
            CTX("kc_attention_%s batch %lld t %lld s %lld d %lld dv %lld bias %d kvrep %lld flags %d",
                f16 ? "f16" : "bf16", (long long)c.batch, (long long)c.t, (long long)c.s, (long long)c.d,
                (long long)c.dv, c.kind, (long long)c.kvrep, flags);
            check_f(attn_wide(gy, f16).data(), wy.data(), ny, tl);
            check_f(gl.data(), wl.data(), nl, tl);
            (f16 ? kc_attention_grad_f16 : kc_attention_grad_bf16)(
                gdq.data(), gdk.data(), gdv.data(), bp ? gdb.data() : nullptr, dy16.data(), q16.data(), k16.data(),
                flags, v16.data(), bp, wy16.data(), wl.data(), c.batch, c.t, c.s, c.d, c.dv, c.nbias, c.brep,
                c.kvrep, 0, scale, 0.0, 0, 0, 0, nullptr, nullptr);
            CTX("kc_attention_grad_%s batch %lld t %lld s %lld d %lld dv %lld bias %d kvrep %lld flags %d",
                f16 ? "f16" : "bf16", (long long)c.batch, (long long)c.t, (long long)c.s, (long long)c.d,
                (long long)c.dv, c.kind, (long long)c.kvrep, flags);
            check_f(attn_wide(gdq, f16).data(), attn_floats(r.dq).data(), nq, tl);
            check_f(attn_wide(gdk, f16).data(), attn_floats(r.dk).data(), nk, tl);
            check_f(attn_wide(gdv, f16).data(), attn_floats(r.dv).data(), nv, tl);
            check_f(gdb.data(), attn_floats(r.db).data(), nb, tl);
            /* and against the cpu kernel itself (kernels/c, its own tiling and workspace) on the same inputs */
            F ws(k_attention_workspace_16(c.batch, c.t, c.s, c.d, c.dv) + 1), cl(nl + 1), cdb(nb + 1, NAN);
            H cy(ny + 1, nan16), cdq(nq + 1, nan16), cdk(nk + 1, nan16), cdv(nv + 1, nan16);
            (f16 ? k_attention_f16 : k_attention_bf16)(cy.data(), cl.data(), q16.data(), k16.data(), flags,
                                                       v16.data(), bp, c.batch, c.t, c.s, c.d, c.dv, c.nbias,
                                                       c.brep, c.kvrep, 0, scale, 0.0, 0, 0, 0, ws.data(), nullptr);
            (f16 ? k_attention_grad_f16 : k_attention_grad_bf16)(
                cdq.data(), cdk.data(), cdv.data(), bp ? cdb.data() : nullptr, dy16.data(), q16.data(), k16.data(),
                flags, v16.data(), bp, wy16.data(), wl.data(), c.batch, c.t, c.s, c.d, c.dv, c.nbias, c.brep,
                c.kvrep, 0, scale, 0.0, 0, 0, 0, ws.data(), nullptr);
            CTX("kc_attention_%s (and grad) = k_attention_%s, batch %lld t %lld s %lld bias %d kvrep %lld flags %d",
                f16 ? "f16" : "bf16", f16 ? "f16" : "bf16", (long long)c.batch, (long long)c.t, (long long)c.s,
                c.kind, (long long)c.kvrep, flags);
            check_f(attn_wide(gy, f16).data(), attn_wide(cy, f16).data(), ny, tl);
            check_f(gl.data(), cl.data(), nl, tl);
            check_f(attn_wide(gdq, f16).data(), attn_wide(cdq, f16).data(), nq, tl);
            check_f(attn_wide(gdk, f16).data(), attn_wide(cdk, f16).data(), nk, tl);
            check_f(attn_wide(gdv, f16).data(), attn_wide(cdv, f16).data(), nv, tl);
            check_f(gdb.data(), cdb.data(), nb, tl);
        }
}
static void test_attention_bf16() { test_attention_low(false); }
static void test_attention_f16() { test_attention_low(true); }

/* x (problems of rows x w, dense) in the heads layout [B / H, rows, H, w] (back: the other way) */
template <typename E> static V<E> heads_copy(const V<E> &x, int64_t B, int64_t H, int64_t rows, int64_t w, bool back)
{
    V<E> y(x.size());
    for (int64_t p = 0; p < B; p++)
        for (int64_t i = 0; i < rows; i++)
            for (int64_t c = 0; c < w; c++) {
                const int64_t dense = (p * rows + i) * w + c, heads = k_attention_at(p, rows, H, w, H * w) + i * H * w + c;
                y[back ? dense : heads] = x[back ? heads : dense];
            }
    return y;
}

/* kc_attention_f32 / _bf16 and their gradients with heads (q, k, v, y, dy, dq, dk, dv in the projections' layout
 * [B, t, H, d], rows H d apart) give the bits of the dense layout: only the addresses differ; grouped kv heads,
 * d and dv past a chunk, causal with a window and without the band */
static void test_attention_heads()
{
    struct Case {
        int64_t t, s, kvrep, d, dv;
        int band;
    } cases[] = {{70, 70, 1, 8, 8, K_ATTN_CAUSAL}, {40, 100, 2, 70, 9, 0}, {33, 90, 2, 6, 5, K_ATTN_CAUSAL | 7 << 8}};
    const int64_t Bt = 2, H = 4, B = Bt * H;
    for (const Case &c : cases)
        for (int low = 0; low < 2; low++) {
            const int64_t hk = H / c.kvrep, nq = B * c.t * c.d, nk = B / c.kvrep * c.s * c.d;
            const int64_t nv = B / c.kvrep * c.s * c.dv, ny = B * c.t * c.dv;
            const int flags = K_ATTN_KROW | c.band;
            V<float> in[4] = {rnd<float>(nq, -2, 2), rnd<float>(nk, -2, 2), rnd<float>(nv, -1, 1),
                              rnd<float>(ny, -1, 1)}; /* q, k, v, dy */
            V<uint16_t> in16[4];
            for (int a = 0; a < 4; a++)
                for (float x : in[a])
                    in16[a].push_back(k_bf16_from_f32(x));
            const int64_t rows[4] = {c.t, c.s, c.s, c.t}, w[4] = {c.d, c.d, c.dv, c.dv}, hs[4] = {H, hk, hk, H};
            V<float> out[2][5], hin[4];
            V<uint16_t> out16[2][5], hin16[4];
            for (int a = 0; a < 4; a++) {
                hin[a] = heads_copy(in[a], B / (a == 1 || a == 2 ? c.kvrep : 1), hs[a], rows[a], w[a], false);
                hin16[a] = heads_copy(in16[a], B / (a == 1 || a == 2 ? c.kvrep : 1), hs[a], rows[a], w[a], false);
            }
            for (int h = 0; h < 2; h++) { /* dense, then heads */
                const int64_t heads = h ? H : 0;
                const int64_t n[5] = {ny, B * c.t, nq, nk, nv}; /* y, lse, dq, dk, dv */
                for (int o = 0; o < 5; o++)
                    out[h][o].assign(n[o], NAN), out16[h][o].assign(o == 1 ? 0 : n[o], 0);
                if (!low) {
                    const V<float> *x = h ? hin : in;
                    kc_attention_f32(out[h][0].data(), out[h][1].data(), x[0].data(), x[1].data(), flags, x[2].data(),
                                     nullptr, B, c.t, c.s, c.d, c.dv, 1, 1, c.kvrep, heads, 0.3, 0.0, 0, 0, 0, nullptr, nullptr);
                    kc_attention_grad_f32(out[h][2].data(), out[h][3].data(), out[h][4].data(), nullptr, x[3].data(),
                                          x[0].data(), x[1].data(), flags, x[2].data(), nullptr, out[h][0].data(),
                                          out[h][1].data(), B, c.t, c.s, c.d, c.dv, 1, 1, c.kvrep, heads, 0.3, 0.0, 0, 0, 0,
                                          nullptr, nullptr);
                } else {
                    const V<uint16_t> *x = h ? hin16 : in16;
                    kc_attention_bf16(out16[h][0].data(), out[h][1].data(), x[0].data(), x[1].data(), flags,
                                      x[2].data(), nullptr, B, c.t, c.s, c.d, c.dv, 1, 1, c.kvrep, heads, 0.3, 0.0, 0, 0, 0,
                                      nullptr, nullptr);
                    kc_attention_grad_bf16(out16[h][2].data(), out16[h][3].data(), out16[h][4].data(), nullptr,
                                           x[3].data(), x[0].data(), x[1].data(), flags, x[2].data(), nullptr,
                                           out16[h][0].data(), out[h][1].data(), B, c.t, c.s, c.d, c.dv, 1, 1,
                                           c.kvrep, heads, 0.3, 0.0, 0, 0, 0, nullptr, nullptr);
                }
            }
            const int64_t orows[5] = {c.t, 0, c.t, c.s, c.s}, ow[5] = {c.dv, 0, c.d, c.d, c.dv};
            const int64_t oh[5] = {H, 0, H, hk, hk};
            for (int o = 0; o < 5; o++) {
                CTX("kc_attention%s heads %lld t %lld s %lld kvrep %lld d %lld dv %lld flags %d: output %d against "
                    "the dense layout's", low ? "_bf16" : "_f32", (long long)H, (long long)c.t, (long long)c.s,
                    (long long)c.kvrep, (long long)c.d, (long long)c.dv, flags, o);
                const int64_t nb = B / (o >= 3 ? c.kvrep : 1);
                if (o == 1)
                    check_bytes(out[1][1].data(), out[0][1].data(), out[0][1].size() * sizeof(float));
                else if (!low) {
                    const V<float> back = heads_copy(out[1][o], nb, oh[o], orows[o], ow[o], true);
                    check_bytes(back.data(), out[0][o].data(), back.size() * sizeof(float));
                } else {
                    const V<uint16_t> back = heads_copy(out16[1][o], nb, oh[o], orows[o], ow[o], true);
                    check_bytes(back.data(), out16[0][o].data(), back.size() * sizeof(uint16_t));
                }
            }
        }
}

/* kc_cross_entropy_bf16 / _f16 and their gradient against kernels/c's on the same 16-bit logits: the loss within
 * float32 rounding (the two sum the rows in different orders), every gradient element within one step of the
 * 16-bit type (its float32 value may round either way); in place too; a bad label lands in the check slot */
static void test_cross_entropy_low(bool f16)
{
    static const int64_t cases[][2] = {{1, 3}, {7, 11}, {300, 7}, {5, 1500}};
    const double step = f16 ? 1.0 / 1024 : 1.0 / 128;
    for (const auto &c : cases) {
        const int64_t rows = c[0], cls = c[1], n = rows * cls;
        auto [x16, xw] = attn_low(n, -4, 4, f16);
        std::vector<int64_t> lab(rows);
        for (auto &l : lab)
            l = below(cls);
        F gl(1), wl(1), dl = rnd(1, 0.5, 2);
        std::vector<uint16_t> gd(n), wd(n);
        check_slot[0] = -1, next_slot = 0;
        CTX("kc_cross_entropy_%s %lldx%lld", f16 ? "f16" : "bf16", (long long)rows, (long long)cls);
        check_int((f16 ? kc_cross_entropy_f16 : kc_cross_entropy_bf16)(gl.data(), x16.data(), lab.data(), rows, cls), -1);
        check_int((f16 ? k_cross_entropy_f16 : k_cross_entropy_bf16)(wl.data(), x16.data(), lab.data(), rows, cls), -1);
        check_int(check_slot[0], -1);
        check_f(gl.data(), wl.data(), 1, 1e-6);
        (f16 ? kc_cross_entropy_grad_f16 : kc_cross_entropy_grad_bf16)(gd.data(), dl.data(), x16.data(), lab.data(),
                                                                       rows, cls);
        (f16 ? k_cross_entropy_grad_f16 : k_cross_entropy_grad_bf16)(wd.data(), dl.data(), x16.data(), lab.data(),
                                                                     rows, cls);
        auto wide = [f16](uint16_t h) { return f16 ? k_f16_to_f32(h) : k_bf16_to_f32(h); };
        F g(n), w(n);
        for (int64_t i = 0; i < n; i++)
            g[i] = wide(gd[i]), w[i] = wide(wd[i]);
        CTX("kc_cross_entropy_grad_%s %lldx%lld", f16 ? "f16" : "bf16", (long long)rows, (long long)cls);
        check_f(g.data(), w.data(), n, step);
        (f16 ? kc_cross_entropy_grad_f16 : kc_cross_entropy_grad_bf16)(x16.data(), dl.data(), x16.data(), lab.data(),
                                                                       rows, cls);
        CTX("kc_cross_entropy_grad_%s %lldx%lld in place", f16 ? "f16" : "bf16", (long long)rows, (long long)cls);
        check_bytes(x16.data(), gd.data(), (size_t)n * 2);
        lab[rows - 1] = cls;
        check_slot[0] = -1, next_slot = 0;
        (f16 ? kc_cross_entropy_f16 : kc_cross_entropy_bf16)(gl.data(), x16.data(), lab.data(), rows, cls);
        CTX("kc_cross_entropy_%s bad label", f16 ? "f16" : "bf16");
        check_int(check_slot[0], rows - 1);
    }
}
static void test_cross_entropy_bf16() { test_cross_entropy_low(false); }
static void test_cross_entropy_f16() { test_cross_entropy_low(true); }

/* ---- reduce ---------------------------------------------------------------------- */

template <typename T> static void test_reduce()
{
    struct Case {
        std::vector<int64_t> x, y;
    };
    static const Case cases[] = {
        {{5, 7}, {5, 1}},       {{5, 7}, {1, 7}},          {{5, 7}, {1, 1}},     {{2, 3, 4, 5}, {2, 1, 4, 1}},
        {{2, 3, 4, 5}, {1, 3, 1, 5}}, {{3, 1, 4}, {3, 1, 1}}, {{}, {}},           {{6}, {6}},
        {{70001}, {1}},          /* one value, grid-wide */
        {{300, 33}, {300, 1}},  /* more rows than a grid */
        {{2000, 40}, {1, 40}},  /* long columns: chunks of rows, folded by k_cols_fold */
        {{4, 500, 40}, {4, 1, 40}}, /* the same under an outer kept dim */
        {{0, 3}, {1, 3}},       /* empty groups */
    };
    for (const Case &c : cases)
        for (int op = K_RSUM; op <= K_RPROD; op++) {
            const int r = (int)c.x.size();
            const int64_t nx = numel(c.x), ny = numel(c.y);
            /* products near 1 stay finite and nonzero over the long groups */
            V<T> x = op == K_RPROD ? rnd<T>(nx, 0.95, 1.05) : rnd<T>(nx, -1, 1), want(ny + 1), got(ny + 1);
            if (nx > 10 && op >= K_RMAX)
                x[(size_t)(nx / 2)] = NAN; /* propagates */
            k_reduce(op, want.data(), x.data(), r, c.x.data(), c.y.data());
            kc_reduce(op, got.data(), x.data(), r, c.x.data(), c.y.data());
            CTX("kc_reduce op %d x %s y %s", op, dims(c.x).c_str(), dims(c.y).c_str());
            check_f(got.data(), want.data(), ny, tol<T>());
            if (op == K_RSUM) {
                kc_reduce_sum_to(got.data(), x.data(), r, c.x.data(), c.y.data());
                CTX("kc_reduce_sum_to x %s y %s", dims(c.x).c_str(), dims(c.y).c_str());
                check_f(got.data(), want.data(), ny, tol<T>());
            }
            if (op == K_RPROD && nx > 0) { /* the product of the others, at zeros too */
                for (int64_t i = 0; i < nx; i += 5)
                    x[(size_t)i] = 0;
                x[(size_t)(nx / 2)] = -x[(size_t)(nx / 2)];
                V<T> dy = rnd<T>(ny, -1, 1), wdx(nx + 1), gdx(nx + 1);
                k_reduce_prod_grad(wdx.data(), dy.data(), x.data(), r, c.x.data(), c.y.data());
                kc_reduce_prod_grad(gdx.data(), dy.data(), x.data(), r, c.x.data(), c.y.data());
                CTX("kc_reduce_prod_grad x %s y %s", dims(c.x).c_str(), dims(c.y).c_str());
                check_f(gdx.data(), wdx.data(), nx, tol<T>());
            }
            if (op != K_RMAX || nx == 0)
                continue;
            for (int64_t i = 0; i < nx; i++) /* few levels: ties */
                x[i] = (T)below(3);
            V<T> y(ny + 1), dy = rnd<T>(ny, -1, 1), wdx(nx + 1), gdx(nx + 1);
            k_reduce(op, y.data(), x.data(), r, c.x.data(), c.y.data());
            k_reduce_max_grad(wdx.data(), dy.data(), x.data(), y.data(), r, c.x.data(), c.y.data());
            kc_reduce_max_grad(gdx.data(), dy.data(), x.data(), y.data(), r, c.x.data(), c.y.data());
            CTX("kc_reduce_max_grad x %s y %s", dims(c.x).c_str(), dims(c.y).c_str());
            check_f(gdx.data(), wdx.data(), nx, 0);
        }
}

/* kc_layernorm_bf16 / _f16 (16-bit x and y) against kernels/c's on the same bits: y within a step of the 16-bit
 * type (the two take the statistics in different orders, so a value may round either way), mean and invstd within
 * float32 rounding; in place too */
static void test_layernorm_low()
{
    static const int64_t cases[][2] = {{3, 10}, {5, 700}, {300, 8}, {1, 1}, {4, 33}};
    for (int f16 = 0; f16 < 2; f16++)
        for (const auto &c : cases)
            for (int affine = 0; affine < 2; affine++) {
                const int64_t o = c[0], in = c[1], n = o * in;
                auto [x16, xv] = attn_low(n, -2, 3, f16);
                F s = rnd<float>(in, 0.5, 1.5), b = rnd<float>(in, -1, 1), wm(o + 1), gm(o + 1), wi(o + 1), gi(o + 1);
                H wy(n + 1), gy(n + 1, f16 ? 0x7e00 : 0x7fc0);
                const float *sp = affine ? s.data() : nullptr, *bp = affine ? b.data() : nullptr;
                (f16 ? k_layernorm_f16 : k_layernorm_bf16)(wy.data(), wm.data(), wi.data(), x16.data(), sp, bp, o, in,
                                                           1e-5);
                (f16 ? kc_layernorm_f16 : kc_layernorm_bf16)(gy.data(), gm.data(), gi.data(), x16.data(), sp, bp, o,
                                                             in, 1e-5);
                CTX("kc_layernorm_%s %lldx%lld affine %d", f16 ? "f16" : "bf16", (long long)o, (long long)in, affine);
                const double step = f16 ? 1.0 / 1024 : 1.0 / 128;
                check_f(attn_wide(gy, f16).data(), attn_wide(wy, f16).data(), n, step);
                check_f(gm.data(), wm.data(), o, 1e-5);
                check_f(gi.data(), wi.data(), o, 1e-5);
                (f16 ? kc_layernorm_f16 : kc_layernorm_bf16)(x16.data(), nullptr, nullptr, x16.data(), sp, bp, o, in,
                                                             1e-5);
                CTX("kc_layernorm_%s %lldx%lld affine %d in place", f16 ? "f16" : "bf16", (long long)o, (long long)in,
                    affine);
                check_f(attn_wide(x16, f16).data(), attn_wide(gy, f16).data(), n, 0);
            }
}

/* kc_reduce_sum_to_bf16 / _f16 (16-bit x, a bias gradient of a 16-bit dY) against kernels/c's on the same bits:
 * the rows, column (chunked too) and grid-wide layouts; both sum in double, in different orders */
static void test_reduce_sum_to_low()
{
    struct Case {
        std::vector<int64_t> x, y;
    };
    static const Case cases[] = {
        {{5, 7}, {1, 7}},     {{5, 7}, {5, 1}},  {{2, 3, 4, 5}, {1, 3, 1, 5}}, {{70001}, {1}},
        {{2000, 40}, {1, 40}}, {{4, 500, 40}, {4, 1, 40}}, {{0, 3}, {1, 3}},
    };
    for (int f16 = 0; f16 < 2; f16++)
        for (const Case &c : cases) {
            const int r = (int)c.x.size();
            const int64_t nx = numel(c.x), ny = numel(c.y);
            auto [x16, xv] = attn_low(nx, -1, 1, f16);
            F got(ny + 1, NAN), want(ny + 1, NAN);
            (f16 ? k_reduce_sum_to_f16 : k_reduce_sum_to_bf16)(want.data(), x16.data(), r, c.x.data(), c.y.data());
            (f16 ? kc_reduce_sum_to_f16 : kc_reduce_sum_to_bf16)(got.data(), x16.data(), r, c.x.data(), c.y.data());
            CTX("kc_reduce_sum_to_%s x %s y %s", f16 ? "f16" : "bf16", dims(c.x).c_str(), dims(c.y).c_str());
            check_f(got.data(), want.data(), ny, 1e-6);
        }
}

template <typename T> static void test_softmax()
{
    static const int64_t cases[][3] = {{3, 7, 1}, {2, 5, 3}, {2, 4, 300}, {1, 1, 1}, {1, 1, 5},
                                       {6, 1000, 1}, {300, 3, 1}};
    for (const auto &c : cases)
        for (int lg = 0; lg < 2; lg++) {
            const int64_t n = c[0] * c[1] * c[2];
            V<T> x = rnd<T>(n, -4, 4), dy = rnd<T>(n, -1, 1), want(n + 1), got(n + 1), wdx(n + 1), gdx(n + 1);
            x[0] += 1000; /* needs the max shift */
            k_softmax(lg, want.data(), x.data(), c[0], c[1], c[2]);
            kc_softmax(lg, got.data(), x.data(), c[0], c[1], c[2]);
            CTX("kc_softmax log %d %lldx%lldx%lld", lg, (long long)c[0], (long long)c[1], (long long)c[2]);
            check_f(got.data(), want.data(), n, tol<T>());
            kc_softmax(lg, x.data(), x.data(), c[0], c[1], c[2]);
            CTX("kc_softmax log %d in place", lg);
            check_f(x.data(), want.data(), n, tol<T>());
            k_softmax_grad(lg, wdx.data(), dy.data(), want.data(), c[0], c[1], c[2]);
            kc_softmax_grad(lg, gdx.data(), dy.data(), want.data(), c[0], c[1], c[2]);
            CTX("kc_softmax_grad log %d %lldx%lldx%lld", lg, (long long)c[0], (long long)c[1],
                (long long)c[2]);
            check_f(gdx.data(), wdx.data(), n, tol<T>());
            kc_softmax_grad(lg, dy.data(), dy.data(), want.data(), c[0], c[1], c[2]);
            CTX("kc_softmax_grad log %d, dx aliasing dy", lg);
            check_f(dy.data(), wdx.data(), n, tol<T>());
        }
}

template <typename T> static void test_range_trilu()
{
    V<T> want(1001), got(1001);
    k_range(want.data(), -3.5, 0.37, 1000);
    kc_range(got.data(), -3.5, 0.37, 1000);
    CTX("kc_range_f32");
    check_f(got.data(), want.data(), 1000, 0);
    std::vector<int64_t> wi(1000), gi(1000);
    k_range_i64(wi.data(), 7, -3, 1000);
    kc_range_i64(gi.data(), 7, -3, 1000);
    CTX("kc_range_i64");
    check_bytes(gi.data(), wi.data(), 8000);
    for (int es : {1, 4, 8})
        for (int upper = 0; upper < 2; upper++)
            for (int64_t k : {-1, 0, 2, 9}) {
                const int64_t n = 2 * 5 * 7;
                std::vector<uint8_t> x((size_t)n * 8), w((size_t)n * 8), g((size_t)n * 8);
                for (auto &v : x)
                    v = (uint8_t)(1 + below(255));
                k_trilu(es, upper, w.data(), x.data(), 2, 5, 7, k);
                kc_trilu(es, upper, g.data(), x.data(), 2, 5, 7, k);
                CTX("kc_trilu esize %d upper %d k %lld", es, upper, (long long)k);
                check_bytes(g.data(), w.data(), (size_t)(n * es));
                kc_trilu(es, upper, x.data(), x.data(), 2, 5, 7, k);
                CTX("kc_trilu esize %d upper %d k %lld in place", es, upper, (long long)k);
                check_bytes(x.data(), w.data(), (size_t)(n * es));
            }
}

/* ---- norm ------------------------------------------------------------------------ */

template <typename T> static void test_layernorm()
{
    /* 300 x 8, 700 x 40: dscale, dbias in chunks of rows (k_cols_fold) */
    static const int64_t cases[][2] = {{3, 10}, {5, 700}, {300, 8}, {1, 1}, {4, 33}, {700, 40}};
    for (const auto &c : cases)
        for (int affine = 0; affine < 2; affine++) {
            const int64_t o = c[0], in = c[1], n = o * in;
            V<T> x = rnd<T>(n, -2, 3), s = rnd<T>(in, 0.5, 1.5), b = rnd<T>(in, -1, 1), dy = rnd<T>(n, -1, 1);
            V<T> wy(n + 1), gy(n + 1), wm(o + 1), gm(o + 1), wi(o + 1), gi(o + 1);
            const T *sp = affine ? s.data() : nullptr, *bp = affine ? b.data() : nullptr;
            k_layernorm(wy.data(), wm.data(), wi.data(), x.data(), sp, bp, o, in, 1e-5);
            kc_layernorm(gy.data(), gm.data(), gi.data(), x.data(), sp, bp, o, in, 1e-5);
            CTX("kc_layernorm %lldx%lld affine %d", (long long)o, (long long)in, affine);
            check_f(gy.data(), wy.data(), n, tol<T>());
            check_f(gm.data(), wm.data(), o, tol<T>());
            check_f(gi.data(), wi.data(), o, tol<T>());
            V<T> wdx(n + 1), gdx(n + 1), wds(in + 1), gds(in + 1), wdb(in + 1), gdb(in + 1);
            k_layernorm_grad(wdx.data(), wds.data(), wdb.data(), dy.data(), x.data(), wm.data(), wi.data(), sp, o,
                                 in);
            kc_layernorm_grad(gdx.data(), gds.data(), gdb.data(), dy.data(), x.data(), wm.data(), wi.data(), sp,
                                  o, in);
            CTX("kc_layernorm_grad %lldx%lld affine %d", (long long)o, (long long)in, affine);
            check_f(gdx.data(), wdx.data(), n, tol<T>());
            check_f(gds.data(), wds.data(), in, tol<T>());
            check_f(gdb.data(), wdb.data(), in, tol<T>());
            kc_layernorm_grad(dy.data(), nullptr, gdb.data(), dy.data(), x.data(), wm.data(), wi.data(), sp, o,
                                  in);
            CTX("kc_layernorm_grad %lldx%lld, dx aliasing dy, no dscale", (long long)o, (long long)in);
            check_f(dy.data(), wdx.data(), n, tol<T>());
            check_f(gdb.data(), wdb.data(), in, tol<T>());
            kc_layernorm(x.data(), nullptr, nullptr, x.data(), sp, bp, o, in, 1e-5);
            CTX("kc_layernorm %lldx%lld in place", (long long)o, (long long)in);
            check_f(x.data(), wy.data(), n, tol<T>());
        }
}

template <typename T> static void test_batchnorm()
{
    static const int64_t cases[][3] = {{3, 4, 5}, {6, 3, 1}, {2, 3, 1000}, {1, 2, 1}};
    for (const auto &c : cases) {
        const int64_t n = c[0], ch = c[1], l = c[2], t = n * ch * l;
        V<T> x = rnd<T>(t, -2, 3), s = rnd<T>(ch, 0.5, 1.5), b = rnd<T>(ch, -1, 1), rm = rnd<T>(ch, -0.5, 0.5),
          rv = rnd<T>(ch, 0.5, 2), dy = rnd<T>(t, -1, 1);
        V<T> wy(t + 1), gy(t + 1), wm(ch + 1), gm(ch + 1), wi(ch + 1), gi(ch + 1);
        V<T> wrm(ch + 1), grm(ch + 1), wrv(ch + 1), grv(ch + 1);
        k_batchnorm_train(wy.data(), wm.data(), wi.data(), wrm.data(), wrv.data(), x.data(), s.data(), b.data(),
                              rm.data(), rv.data(), n, ch, l, 1e-5, 0.9);
        kc_batchnorm_train(gy.data(), gm.data(), gi.data(), grm.data(), grv.data(), x.data(), s.data(), b.data(),
                               rm.data(), rv.data(), n, ch, l, 1e-5, 0.9);
        CTX("kc_batchnorm_train n=%lld c=%lld l=%lld", (long long)n, (long long)ch, (long long)l);
        check_f(gy.data(), wy.data(), t, tol<T>());
        check_f(gm.data(), wm.data(), ch, tol<T>());
        check_f(gi.data(), wi.data(), ch, tol<T>());
        check_f(grm.data(), wrm.data(), ch, tol<T>());
        check_f(grv.data(), wrv.data(), ch, tol<T>());
        k_bn_running_var(wrv.data(), rv.data(), wi.data(), ch, 1e-5, 0.9);
        kc_bn_running_var(grv.data(), rv.data(), wi.data(), ch, 1e-5, 0.9);
        CTX("kc_bn_running_var c=%lld", (long long)ch);
        check_f(grv.data(), wrv.data(), ch, tol<T>());
        V<T> wdx(t + 1), gdx(t + 1), wds(ch + 1), gds(ch + 1), wdb(ch + 1), gdb(ch + 1);
        k_batchnorm_grad(wdx.data(), wds.data(), wdb.data(), dy.data(), x.data(), wm.data(), wi.data(), s.data(), n,
                             ch, l);
        kc_batchnorm_grad(gdx.data(), gds.data(), gdb.data(), dy.data(), x.data(), wm.data(), wi.data(), s.data(),
                              n, ch, l);
        CTX("kc_batchnorm_grad n=%lld c=%lld l=%lld", (long long)n, (long long)ch, (long long)l);
        check_f(gdx.data(), wdx.data(), t, tol<T>());
        check_f(gds.data(), wds.data(), ch, tol<T>());
        check_f(gdb.data(), wdb.data(), ch, tol<T>());
        kc_batchnorm_grad(dy.data(), nullptr, nullptr, dy.data(), x.data(), wm.data(), wi.data(), s.data(), n, ch,
                              l);
        CTX("kc_batchnorm_grad, dx aliasing dy");
        check_f(dy.data(), wdx.data(), t, tol<T>());
        k_batchnorm_infer(wy.data(), x.data(), s.data(), nullptr, rm.data(), rv.data(), n, ch, l, 1e-5);
        kc_batchnorm_infer(gy.data(), x.data(), s.data(), nullptr, rm.data(), rv.data(), n, ch, l, 1e-5);
        CTX("kc_batchnorm_infer n=%lld c=%lld l=%lld", (long long)n, (long long)ch, (long long)l);
        check_f(gy.data(), wy.data(), t, tol<T>());
    }
}

/* ---- conv and pooling ------------------------------------------------------------- */

/* n c h w, m kh kw, sh sw dh dw, pt pl pb pr, groups (as kernels_nn_test.c) */
static const int64_t conv_cases[][16] = {
    {2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1},   {1, 2, 8, 7, 3, 3, 2, 2, 2, 2, 1, 1, 0, 2, 1, 1},
    {2, 4, 6, 5, 6, 3, 3, 2, 1, 1, 1, 1, 1, 0, 1, 2},   {1, 3, 5, 6, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 3},
    {2, 5, 4, 3, 3, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1},   {1, 4, 5, 5, 2, 1, 1, 2, 2, 1, 1, 0, 0, 0, 0, 2},
    {1, 2, 12, 11, 3, 7, 7, 2, 2, 1, 1, 3, 3, 3, 3, 1}, {3, 4, 3, 3, 2, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2},
};

template <typename T> static void test_conv()
{
    for (const auto &v : conv_cases) {
        KConv2d p = {};
        p.n = v[0], p.c = v[1], p.h = v[2], p.w = v[3], p.m = v[4], p.kh = v[5], p.kw = v[6];
        p.sh = v[7], p.sw = v[8], p.dh = v[9], p.dw = v[10], p.pt = v[11], p.pl = v[12], p.pb = v[13];
        p.pr = v[14], p.groups = v[15];
        p.oh = k_pool_out_dim(p.h, p.kh, p.sh, p.pt, p.pb, p.dh, 0);
        p.ow = k_pool_out_dim(p.w, p.kw, p.sw, p.pl, p.pr, p.dw, 0);
        const int64_t nx = p.n * p.c * p.h * p.w, nw = p.m * (p.c / p.groups) * p.kh * p.kw;
        const int64_t ny = p.n * p.m * p.oh * p.ow, nws = k_conv2d_workspace(&p);
        V<T> x = rnd<T>(nx, -1, 1), w = rnd<T>(nw, -1, 1), b = rnd<T>(p.m, -1, 1), dy = rnd<T>(ny, -1, 1), ws(nws + 1);
        V<T> wy(ny + 1), gy(ny + 1), wdx(nx + 1), gdx(nx + 1, NAN), wdw(nw + 1), gdw(nw + 1, NAN);
        V<T> wdb(p.m + 1), gdb(p.m + 1);
        T *wsp = nws ? ws.data() : nullptr;
        const int64_t *s = v;
        k_conv2d(&p, wy.data(), x.data(), w.data(), b.data(), wsp);
        kc_conv2d(&p, gy.data(), x.data(), w.data(), b.data(), wsp);
        CTX("kc_conv2d case n%lld c%lld %lldx%lld m%lld k%lld groups %lld", (long long)s[0], (long long)s[1],
            (long long)s[2], (long long)s[3], (long long)s[4], (long long)s[5], (long long)s[15]);
        check_f(gy.data(), wy.data(), ny, tol<T>());
        const std::string geom = what;
        k_conv2d_grad_x(&p, wdx.data(), dy.data(), w.data(), wsp);
        kc_conv2d_grad_x(&p, gdx.data(), dy.data(), w.data(), wsp);
        CTX("%s: grad_x", geom.c_str());
        check_f(gdx.data(), wdx.data(), nx, tol<T>());
        k_conv2d_grad_w(&p, wdw.data(), dy.data(), x.data(), wsp);
        kc_conv2d_grad_w(&p, gdw.data(), dy.data(), x.data(), wsp);
        CTX("%s: grad_w", geom.c_str());
        check_f(gdw.data(), wdw.data(), nw, tol<T>());
        k_conv2d_grad_b(&p, wdb.data(), dy.data());
        kc_conv2d_grad_b(&p, gdb.data(), dy.data());
        CTX("%s: grad_b", geom.c_str());
        check_f(gdb.data(), wdb.data(), p.m, tol<T>());
    }
}

/* n c h w, kh kw, sh sw, dh dw, pt pl pb pr, ceil, count_include_pad */
static const int64_t pool_cases[][16] = {
    {2, 3, 8, 8, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 0, 0}, {1, 2, 7, 7, 2, 2, 2, 2, 1, 1, 0, 0, 0, 0, 1, 0},
    {1, 2, 7, 9, 2, 3, 1, 2, 2, 1, 1, 0, 0, 2, 0, 1}, {2, 2, 6, 5, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1},
    {1, 1, 5, 5, 3, 2, 2, 3, 1, 1, 1, 0, 1, 1, 1, 0}, {4, 8, 20, 20, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0},
};

template <typename T> static void test_pool()
{
    for (const auto &v : pool_cases) {
        KPool2d p = {};
        p.n = v[0], p.c = v[1], p.h = v[2], p.w = v[3], p.kh = v[4], p.kw = v[5], p.sh = v[6], p.sw = v[7];
        p.dh = v[8], p.dw = v[9], p.pt = v[10], p.pl = v[11], p.pb = v[12], p.pr = v[13];
        p.count_include_pad = (int)v[15];
        p.oh = k_pool_out_dim(p.h, p.kh, p.sh, p.pt, p.pb, p.dh, (int)v[14]);
        p.ow = k_pool_out_dim(p.w, p.kw, p.sw, p.pl, p.pr, p.dw, (int)v[14]);
        const int64_t nx = p.n * p.c * p.h * p.w, ny = p.n * p.c * p.oh * p.ow;
        V<T> x = rnd<T>(nx, -2, 2), dy = rnd<T>(ny, -1, 1), wy(ny + 1), gy(ny + 1), wdx(nx + 1), gdx(nx + 1, NAN);
        for (int64_t i = 0; i < nx; i += 3)
            x[i] = (T)below(3); /* ties: the first maximum wins */
        std::vector<int64_t> warg(ny + 1), garg(ny + 1);
        k_maxpool2d(&p, wy.data(), warg.data(), x.data());
        kc_maxpool2d(&p, gy.data(), garg.data(), x.data());
        CTX("kc_maxpool2d %lldx%lld -> %lldx%lld", (long long)p.h, (long long)p.w, (long long)p.oh, (long long)p.ow);
        check_f(gy.data(), wy.data(), ny, 0);
        check_bytes(garg.data(), warg.data(), (size_t)ny * 8);
        k_maxpool2d_grad(&p, wdx.data(), dy.data(), warg.data());
        kc_maxpool2d_grad(&p, gdx.data(), dy.data(), warg.data());
        CTX("kc_maxpool2d_grad %lldx%lld -> %lldx%lld", (long long)p.h, (long long)p.w, (long long)p.oh,
            (long long)p.ow);
        check_f(gdx.data(), wdx.data(), nx, 0);
        k_avgpool2d(&p, wy.data(), x.data());
        kc_avgpool2d(&p, gy.data(), x.data());
        CTX("kc_avgpool2d %lldx%lld -> %lldx%lld", (long long)p.h, (long long)p.w, (long long)p.oh, (long long)p.ow);
        check_f(gy.data(), wy.data(), ny, tol<T>());
        k_avgpool2d_grad(&p, wdx.data(), dy.data());
        kc_avgpool2d_grad(&p, gdx.data(), dy.data());
        CTX("kc_avgpool2d_grad %lldx%lld -> %lldx%lld", (long long)p.h, (long long)p.w, (long long)p.oh,
            (long long)p.ow);
        check_f(gdx.data(), wdx.data(), nx, 0);
        const int64_t nc = p.n * p.c, hw = p.h * p.w;
        k_global_avgpool(wy.data(), x.data(), nc, hw);
        kc_global_avgpool(gy.data(), x.data(), nc, hw);
        CTX("kc_global_avgpool %lldx%lld", (long long)nc, (long long)hw);
        check_f(gy.data(), wy.data(), nc, tol<T>());
        k_global_avgpool_grad(wdx.data(), dy.data(), nc, hw);
        kc_global_avgpool_grad(gdx.data(), dy.data(), nc, hw);
        CTX("kc_global_avgpool_grad %lldx%lld", (long long)nc, (long long)hw);
        check_f(gdx.data(), wdx.data(), nx, 0);
    }
}

/* ---- gather, dropout ------------------------------------------------------------------ */

template <typename T> static void test_gather()
{
    /* 9000 indices: k_gather_lists stages them in three pieces; the last: more indices than kc_glist
     * lists (the backward's every-index walk) */
    static const int64_t cases[][4] = {{1, 10, 4, 7},   {3, 5, 1, 6}, {2, 7, 33, 9},
                                       {1, 50, 64, 200}, {2, 3, 0, 4}, {1, 50, 2, 9000}, {1, 3, 1, KC_GATHER_SLOTS}};
    for (const auto &c : cases)
        for (int es : {1, 2, 4, 8}) {
            const int64_t outer = c[0], axis = c[1], inner = c[2], nidx = c[3];
            const int64_t nx = outer * axis * inner, ny = outer * nidx * inner;
            std::vector<int64_t> idx(nidx);
            for (auto &v : idx)
                v = below(2 * axis) - axis; /* negative ones count from the end; repeats */
            std::vector<uint8_t> x((size_t)(nx + 1) * 8), w((size_t)(ny + 1) * 8), g((size_t)(ny + 1) * 8);
            for (auto &v : x)
                v = (uint8_t)below(256);
            check_slot[0] = -1, next_slot = 0;
            CTX("kc_gather esize %d outer %lld axis %lld inner %lld", es, (long long)outer, (long long)axis,
                (long long)inner);
            check_int(k_gather(es, w.data(), x.data(), idx.data(), outer, axis, inner, nidx), -1);
            check_int(kc_gather(es, g.data(), x.data(), idx.data(), outer, axis, inner, nidx), -1);
            check_int(check_slot[0], -1);
            check_bytes(g.data(), w.data(), (size_t)(ny * es));
            idx[nidx - 1] = axis, idx[nidx / 2] = -axis - 1; /* the first bad one must come back */
            check_slot[0] = -1, next_slot = 0;
            CTX("kc_gather bad index, outer %lld inner %lld", (long long)outer, (long long)inner);
            kc_gather(es, g.data(), x.data(), idx.data(), outer, axis, inner, nidx);
            check_int(check_slot[0], k_gather(es, w.data(), x.data(), idx.data(), outer, axis, inner, nidx));
            check_int(next_slot, 1);
            if (es != 4)
                continue;
            idx[nidx - 1] = 0, idx[nidx / 2] = 1;
            V<T> dy = rnd<T>(ny, -1, 1), wdx(nx + 1), gdx(nx + 1, NAN);
            k_gather_grad(wdx.data(), dy.data(), idx.data(), outer, axis, inner, nidx);
            kc_gather_grad(gdx.data(), dy.data(), idx.data(), outer, axis, inner, nidx);
            CTX("kc_gather_grad outer %lld axis %lld inner %lld", (long long)outer, (long long)axis, (long long)inner);
            check_f(gdx.data(), wdx.data(), nx, 0);
        }
}

template <typename T> static void test_gather_elements()
{
    struct Case {
        int rank, axis;
        int64_t xs[4], sh[4];
    };
    static const Case cases[] = {{1, 0, {7}, {12}},           {2, 1, {3, 4}, {2, 6}},
                                 {3, 0, {4, 5, 6}, {3, 2, 6}}, {3, 2, {4, 5, 6}, {3, 2, 6}},
                                 {4, 1, {2, 3, 4, 5}, {2, 6, 4, 5}}, {2, 0, {64, 300}, {50, 300}},
                                 {2, 1, {3, 4}, {0, 5}}};
    for (const auto &c : cases)
        for (int es : {1, 2, 4, 8}) {
            int64_t nx = 1, ny = 1;
            for (int d = 0; d < c.rank; d++)
                nx *= c.xs[d], ny *= c.sh[d];
            const int64_t ax = c.xs[c.axis];
            std::vector<int64_t> idx(ny + 1);
            for (auto &v : idx)
                v = below(2 * ax) - ax; /* negatives, repeats */
            std::vector<uint8_t> x((size_t)(nx + 1) * 8), w((size_t)(ny + 1) * 8), g((size_t)(ny + 1) * 8);
            for (auto &v : x)
                v = (uint8_t)below(256);
            check_slot[0] = -1, next_slot = 0;
            CTX("kc_gather_elements esize %d rank %d axis %d", es, c.rank, c.axis);
            check_int(k_gather_elements(es, w.data(), x.data(), idx.data(), c.rank, c.sh, c.xs, c.axis), -1);
            check_int(kc_gather_elements(es, g.data(), x.data(), idx.data(), c.rank, c.sh, c.xs, c.axis), -1);
            check_int(check_slot[0], -1);
            check_bytes(g.data(), w.data(), (size_t)(ny * es));
            if (ny < 2)
                continue;
            idx[ny - 1] = ax, idx[ny / 2] = -ax - 1; /* the first bad one must come back */
            check_slot[0] = -1, next_slot = 0;
            CTX("kc_gather_elements bad index, rank %d axis %d", c.rank, c.axis);
            kc_gather_elements(es, g.data(), x.data(), idx.data(), c.rank, c.sh, c.xs, c.axis);
            check_int(check_slot[0], k_gather_elements(es, w.data(), x.data(), idx.data(), c.rank, c.sh, c.xs,
                                                       c.axis));
            check_int(next_slot, 1);
            if (es != 4)
                continue;
            idx[ny - 1] = 0, idx[ny / 2] = -1;
            V<T> dy = rnd<T>(ny, -1, 1), wdx(nx + 1), gdx(nx + 1, NAN);
            check_slot[0] = -1, next_slot = 0;
            check_int(k_gather_elements_grad(wdx.data(), dy.data(), idx.data(), c.rank, c.sh, c.xs, c.axis), -1);
            check_int(kc_gather_elements_grad(gdx.data(), dy.data(), idx.data(), c.rank, c.sh, c.xs, c.axis), -1);
            CTX("kc_gather_elements_grad rank %d axis %d", c.rank, c.axis);
            check_f(gdx.data(), wdx.data(), nx, 0);
            check_int(check_slot[0], -1);
            idx[0] = ax; /* ScatterElements' indices are checked here too */
            check_slot[0] = -1, next_slot = 0;
            CTX("kc_gather_elements_grad bad index, rank %d axis %d", c.rank, c.axis);
            kc_gather_elements_grad(gdx.data(), dy.data(), idx.data(), c.rank, c.sh, c.xs, c.axis);
            check_int(check_slot[0], k_gather_elements_grad(wdx.data(), dy.data(), idx.data(), c.rank, c.sh,
                                                                c.xs, c.axis));
            check_int(next_slot, 1);
        }
}

static void test_nd_index()
{
    struct Case {
        int64_t batch, nq;
        int k;
        int64_t dims[3];
    };
    static const Case cases[] = {{1, 7, 1, {9}}, {2, 5, 2, {4, 5}}, {3, 40, 3, {2, 3, 7}}, {1, 0, 2, {3, 3}},
                                 {4, 300, 2, {50, 60}}};
    for (const auto &c : cases) {
        const int64_t n = c.batch * c.nq;
        std::vector<int64_t> idx(n * c.k + 1), w(n + 1, -7), g(n + 1, -7);
        for (int64_t i = 0; i < n * c.k; i++)
            idx[i] = below(2 * c.dims[i % c.k]) - c.dims[i % c.k]; /* negatives count from the end */
        check_slot[0] = -1, next_slot = 0;
        CTX("kc_nd_index batch %lld, %lld tuples of %d", (long long)c.batch, (long long)c.nq, c.k);
        check_int(k_nd_index(w.data(), idx.data(), c.batch, c.nq, c.k, c.dims), -1);
        check_int(kc_nd_index(g.data(), idx.data(), c.batch, c.nq, c.k, c.dims), -1);
        check_int(check_slot[0], -1);
        check_bytes(g.data(), w.data(), (size_t)n * sizeof(int64_t));
        if (n < 2)
            continue;
        idx[n * c.k - 1] = c.dims[c.k - 1], idx[n * c.k / 2] = -c.dims[n * c.k / 2 % c.k] - 1;
        check_slot[0] = -1, next_slot = 0;
        CTX("kc_nd_index bad component, batch %lld, %lld tuples of %d", (long long)c.batch, (long long)c.nq, c.k);
        kc_nd_index(g.data(), idx.data(), c.batch, c.nq, c.k, c.dims);
        check_int(check_slot[0], k_nd_index(w.data(), idx.data(), c.batch, c.nq, c.k, c.dims));
        check_int(next_slot, 1);
    }
}

template <typename T> static void test_dropout()
{
    for (int64_t n : {1, 7, 10007})
        for (double ratio : {0.0, 0.3, 0.9, 1.0}) {
            V<T> x = rnd<T>(n, -1, 1), wy(n + 1), gy(n + 1), dy = rnd<T>(n, -1, 1), wdx(n + 1), gdx(n + 1);
            std::vector<uint8_t> wm(n + 1), gm(n + 1);
            step_params.step = 12;
            k_dropout(wy.data(), wm.data(), x.data(), n, ratio, 0x1234567890abcdefull, 77, 12);
            kc_dropout(gy.data(), gm.data(), x.data(), n, ratio, 0x1234567890abcdefull, 77, 999); /* step ignored */
            CTX("kc_dropout n %lld ratio %g (step from the step params)", (long long)n, ratio);
            check_bytes(gm.data(), wm.data(), (size_t)n);
            check_f(gy.data(), wy.data(), n, 0);
            k_dropout_grad(wdx.data(), dy.data(), wm.data(), n, ratio);
            kc_dropout_grad(gdx.data(), dy.data(), wm.data(), n, ratio);
            CTX("kc_dropout_grad n %lld ratio %g", (long long)n, ratio);
            check_f(gdx.data(), wdx.data(), n, 0);
            kc_dropout(x.data(), nullptr, x.data(), n, ratio, 0x1234567890abcdefull, 77, 0);
            CTX("kc_dropout n %lld ratio %g in place, no mask", (long long)n, ratio);
            check_f(x.data(), wy.data(), n, 0);
        }
}

/* ---- losses, optimizers ------------------------------------------------------------------ */

template <typename T> static void test_mse_ce()
{
    for (int64_t n : {0, 1, 1000, 20011}) {
        V<T> p = rnd<T>(n, -3, 3), t = rnd<T>(n, -3, 3), wl(1), gl(1), dl = rnd<T>(1, 0.5, 2), wd(n + 1), gd(n + 1);
        k_mse(wl.data(), p.data(), t.data(), n);
        kc_mse(gl.data(), p.data(), t.data(), n);
        CTX("kc_mse n %lld", (long long)n);
        check_f(gl.data(), wl.data(), 1, tol<T>());
        k_mse_grad(wd.data(), dl.data(), p.data(), t.data(), n);
        kc_mse_grad(gd.data(), dl.data(), p.data(), t.data(), n);
        CTX("kc_mse_grad n %lld", (long long)n);
        check_f(gd.data(), wd.data(), n, tol<T>());
    }
    static const int64_t cases[][2] = {{1, 3}, {7, 11}, {300, 7}, {5, 1500}};
    for (const auto &c : cases) {
        const int64_t rows = c[0], cls = c[1], n = rows * cls;
        V<T> x = rnd<T>(n, -4, 4), wl(1), gl(1), dl = rnd<T>(1, 0.5, 2), wd(n + 1), gd(n + 1);
        std::vector<int64_t> lab(rows);
        for (auto &l : lab)
            l = below(cls);
        x[0] = 1000;
        check_slot[0] = -1, next_slot = 0;
        CTX("kc_cross_entropy %lldx%lld", (long long)rows, (long long)cls);
        check_int(kc_cross_entropy(gl.data(), x.data(), lab.data(), rows, cls), -1);
        check_int(k_cross_entropy(wl.data(), x.data(), lab.data(), rows, cls), -1);
        check_int(check_slot[0], -1);
        check_f(gl.data(), wl.data(), 1, tol<T>());
        k_cross_entropy_grad(wd.data(), dl.data(), x.data(), lab.data(), rows, cls);
        kc_cross_entropy_grad(gd.data(), dl.data(), x.data(), lab.data(), rows, cls);
        CTX("kc_cross_entropy_grad %lldx%lld", (long long)rows, (long long)cls);
        check_f(gd.data(), wd.data(), n, tol<T>());
        kc_cross_entropy_grad(x.data(), dl.data(), x.data(), lab.data(), rows, cls);
        CTX("kc_cross_entropy_grad %lldx%lld, dx aliasing x", (long long)rows, (long long)cls);
        check_f(x.data(), wd.data(), n, tol<T>());
        lab[rows - 1] = cls, lab[rows / 2] = -1;
        check_slot[0] = -1, next_slot = 0;
        kc_cross_entropy(gl.data(), x.data(), lab.data(), rows, cls);
        CTX("kc_cross_entropy bad label %lldx%lld", (long long)rows, (long long)cls);
        check_int(check_slot[0], k_cross_entropy(wl.data(), x.data(), lab.data(), rows, cls));
    }
}

template <typename T> static void test_nll()
{
    struct Case {
        int64_t n, c, d;
        bool weights, ignore;
        int64_t ii;
    };
    static const Case cases[] = {{5, 4, 1, false, false, 0}, {5, 4, 1, true, false, 0}, {2, 5, 4, false, true, -100},
                                 {4, 5, 2, true, true, 2},   {300, 10, 9, true, true, 3}};
    for (const Case &q : cases)
        for (int red = K_LOSS_NONE; red <= K_LOSS_MEAN; red++) {
            const int64_t m = q.n * q.d, t = m * q.c, ny = red == K_LOSS_NONE ? m : 1;
            V<T> lp = rnd<T>(t, -5, 0), wt = rnd<T>(q.c, 0.5, 2), wl(ny + 1), gl(ny + 1), dl = rnd<T>(ny, -1, 1);
            V<T> extra = rnd<T>(t, -1, 1), wdx(t + 1), gdx(t + 1, NAN);
            std::vector<int64_t> lab(m);
            for (int64_t i = 0; i < m; i++)
                lab[i] = q.ignore && i % 3 == 1 ? q.ii : below(q.c);
            const T *w = q.weights ? wt.data() : nullptr;
            check_slot[0] = -1, next_slot = 0;
            CTX("kc_nll_loss n %lld c %lld d %lld red %d weights %d ignore %d", (long long)q.n, (long long)q.c,
                (long long)q.d, red, q.weights, q.ignore);
            check_int(k_nll_loss(wl.data(), lp.data(), lab.data(), w, q.n, q.c, q.d, red, q.ignore, q.ii), -1);
            check_int(kc_nll_loss(gl.data(), lp.data(), lab.data(), w, q.n, q.c, q.d, red, q.ignore, q.ii), -1);
            check_int(check_slot[0], -1);
            check_f(gl.data(), wl.data(), ny, tol<T>());
            k_nll_loss_grad(wdx.data(), nullptr, dl.data(), lab.data(), w, q.n, q.c, q.d, red, q.ignore, q.ii);
            kc_nll_loss_grad(gdx.data(), nullptr, dl.data(), lab.data(), w, q.n, q.c, q.d, red, q.ignore, q.ii);
            CTX("kc_nll_loss_grad red %d", red);
            check_f(gdx.data(), wdx.data(), t, tol<T>());
            k_nll_loss_grad(wdx.data(), extra.data(), dl.data(), lab.data(), w, q.n, q.c, q.d, red, q.ignore, q.ii);
            kc_nll_loss_grad(extra.data(), extra.data(), dl.data(), lab.data(), w, q.n, q.c, q.d, red, q.ignore,
                                 q.ii);
            CTX("kc_nll_loss_grad onto dx_in, in place, red %d", red);
            check_f(extra.data(), wdx.data(), t, tol<T>());
            kc_nll_loss_grad(gdx.data(), extra.data(), nullptr, lab.data(), w, q.n, q.c, q.d, red, q.ignore, q.ii);
            CTX("kc_nll_loss_grad without dloss, red %d", red);
            check_f(gdx.data(), extra.data(), t, 0);
            lab[m - 1] = q.c, lab[m / 2] = -7; /* bad, unless ignored */
            check_slot[0] = -1, next_slot = 0;
            kc_nll_loss(gl.data(), lp.data(), lab.data(), w, q.n, q.c, q.d, red, q.ignore, q.ii);
            CTX("kc_nll_loss bad label, red %d", red);
            check_int(check_slot[0], k_nll_loss(wl.data(), lp.data(), lab.data(), w, q.n, q.c, q.d, red, q.ignore,
                                                   q.ii));
        }
}

/* The optimizers are compared exactly: on the host the emulated kernel
 * and kernels/c do the same float operations in the same order (only a
 * GPU may contract some into FMAs), so an exact match also pins the clip
 * factor to kernels/c's double arithmetic (for 17 and 1 a factor computed
 * in float would differ).
 *
 * Clipping cases, the clip norm and gsq[0] (the squared gradient norm):
 * off (gsq not read: its NaN would show), a factor well below 1, one just
 * below 1 (2 / (2 + 1e-6)), exactly 1 (the norm below the clip), a NaN
 * norm (NaN passes into every update, as in torch) and an infinite one
 * (factor 0). */
struct Clip {
    double clip;
    float gsq;
};
static const Clip clip_cases[] = {{0.0, NAN}, {1.0, 17.0f}, {2.0, 4.0f}, {100.0, 40.0f}, {1.0, NAN}, {1.0, INFINITY}};

/* --accum's micro-steps: the last of a step updates (1 of 1, 3 of 3); the
 * ones before it must leave p and the moments as they were (the kernel
 * returns at once), whatever clipping would do */
struct Micro {
    int64_t micro, accum;
};
static const Micro micro_cases[] = {{0, 1}, {2, 3}, {0, 3}, {1, 3}};

/* the kc_ result against k_'s, and, when no update is due, against the
 * state before the call, bit for bit (a skipped update writes nothing) */
template <typename T>
static void check_updated(const V<T> &got, const V<T> &want, const V<T> &before, int64_t n, const Micro &u)
{
    check_f(got.data(), want.data(), n, 0);
    if (u.micro != u.accum - 1)
        check_bytes(got.data(), before.data(), before.size() * sizeof(T));
}

template <typename T> static void test_adamw(int64_t n, int step, const V<T> &g, const Clip &q, const Micro &u)
{
    const T gsq = (T)q.gsq;
    step_params = KcStepParams{0.01, 0.9, 0.999, 1e-8, 0.05, 0.0, q.clip, step, u.micro, u.accum, 0.0, step};
    for (int decay = 0; decay < 3; decay++) { /* none, decoupled (AdamW), added to the gradient (Adam) */
        const V<T> p0 = rnd<T>(n, -1, 1), m0 = rnd<T>(n, -0.1, 0.1), v0 = rnd<T>(n, 0, 0.01);
        V<T> p = p0, m = m0, v = v0, p2 = p0, m2 = m0, v2 = v0;
        const double mult = decay == 1 ? 0.5 : 1.0; /* --lr-mult: this part's factor */
        k_adamw(p.data(), g.data(), m.data(), v.data(), n, 0.01, 0.9, 0.999, 1e-8, decay ? 0.05 : 0.0,
                    decay == 2, mult, step, &gsq, q.clip, 0.0, u.micro, u.accum);
        /* 9: the hyper-parameters, the clip norm and the micro-step come from step_params; the weight decay
         * argument only says whether this part decays (--no-decay: 0) */
        kc_adamw(p2.data(), g.data(), m2.data(), v2.data(), n, 9, 9, 9, 9, decay ? 9 : 0, decay == 2, mult, 9,
                     &gsq, 9, 9, 9, 9);
        CTX("kc_adamw n %lld step %d decay %d clip %g gsq %g micro %lld of %lld", (long long)n, step, decay, q.clip,
            q.gsq, (long long)u.micro, (long long)u.accum);
        check_updated(p2, p, p0, n, u);
        check_updated(m2, m, m0, n, u);
        check_updated(v2, v, v0, n, u);
    }
}

template <typename T> static void test_sgd(int64_t n, int step, const V<T> &g, const Clip &q, const Micro &u)
{
    const T gsq = (T)q.gsq;
    for (double mom : {0.0, 0.9})
        for (double wd : {0.0, 0.01})
            for (int nesterov = 0; nesterov < 2; nesterov++) {
            /* the step's decay is 0.01; the argument (0 or not) says whether this part decays */
            step_params = KcStepParams{0.1, 0, 0, 0, 0.01, mom, q.clip, step, u.micro, u.accum, 0.0, step};
            const V<T> p0 = rnd<T>(n, -1, 1), buf0 = rnd<T>(n, -1, 1);
            V<T> p = p0, buf = buf0, p2 = p0, buf2 = buf0;
            const double mult = nesterov ? 0.25 : 1.0; /* --lr-mult */
            k_sgd(p.data(), g.data(), buf.data(), n, 0.1, mom, wd, nesterov, mult, step, &gsq, q.clip, 0.0,
                      u.micro, u.accum);
            kc_sgd(p2.data(), g.data(), buf2.data(), n, 9, 9, wd != 0 ? 9 : 0, nesterov, mult, 9, &gsq, 9, 9, 9,
                       9);
            CTX("kc_sgd n %lld step %d momentum %g wd %g nesterov %d clip %g gsq %g micro %lld of %lld", (long long)n,
                step, mom, wd, nesterov, q.clip, q.gsq, (long long)u.micro, (long long)u.accum);
            check_updated(p2, p, p0, n, u);
            check_updated(buf2, buf, buf0, n, u);
        }
}

template <typename T> static void test_optim()
{
    for (int64_t n : {1, 1000, 10007})
        for (int step = 1; step <= 2; step++)
            for (const Clip &q : clip_cases)
                for (const Micro &u : micro_cases) {
                    const V<T> g = rnd<T>(n, -1, 1);
                    test_adamw(n, step, g, q, u);
                    test_sgd(n, step, g, q, u);
                }
    V<T> a = rnd<T>(2 * 3 * 4, -1, 1), b = rnd<T>(4 * 5, -1, 1), c(2 * 3 * 5 + 1), c2(2 * 3 * 5 + 1);
    k_matmul(c.data(), a.data(), b.data(), 2, 12, 0, 3, 5, 4, 0, 0, 0.0);
    kc_matmul(c2.data(), a.data(), b.data(), 2, 12, 0, 3, 5, 4, 0, 0, 0.0);
    CTX("kc_matmul (kc_gemm_f32)");
    check_f(c2.data(), c.data(), 30, tol<T>());
}

/* kc_grad_accum_f32 against k_grad_accum_f32, bit for bit (one float add
 * each): at micro-step 0 y is overwritten (its NaNs must not survive), at
 * micro-step 2 added to; y's element past n stays as it was.  The host
 * micro passed to kc_ is wrong on purpose: the kernel reads step_params. */
template <typename T> static void test_grad_accum()
{
    for (int64_t n : {0, 1, 7, 1001, 10007})
        for (int64_t micro : {0, 2}) {
            step_params = KcStepParams{};
            step_params.micro = micro, step_params.accum = 3;
            const V<T> x = rnd<T>(n, -2, 2);
            V<T> want = micro == 0 ? V<T>((size_t)n + 1, NAN) : rnd<T>(n, -2, 2), got = want;
            k_grad_accum(want.data(), x.data(), n, micro);
            kc_grad_accum(got.data(), x.data(), n, micro == 0 ? 2 : 0);
            CTX("kc_grad_accum n %lld micro %lld", (long long)n, (long long)micro);
            check_bytes(got.data(), want.data(), want.size() * sizeof(T));
        }
}

/* kc_sum_squares against k_sum_squares: from an empty x (y is still
 * written) to more elements than one grid, y set or added to.  Both sum in
 * double, in different orders, so the double sums may differ in their last
 * bits.  float32: both round to float once, and for these inputs no sum
 * falls close enough to a float rounding boundary to change the float:
 * compared exactly (another input could make it one ulp).  float64: nothing
 * hides those bits, so within 1e-14 relative. */
template <typename T> static void test_sum_squares()
{
    for (int64_t n : {0, 1, 7, 1001, 10007, 200003})
        for (int acc = 0; acc <= 1; acc++) {
            const V<T> x = rnd<T>(n, -2, 2);
            const T y0 = acc ? 3.25 : NAN; /* NaN: accumulate 0 must overwrite it */
            V<T> want{y0}, got{y0};
            k_sum_squares(want.data(), x.data(), n, acc);
            kc_sum_squares(got.data(), x.data(), n, acc);
            CTX("kc_sum_squares n %lld accumulate %d", (long long)n, acc);
            check_f(got.data(), want.data(), 1, sizeof(T) == 4 ? 0 : 1e-14);
        }
}

/* kc_matmul_bf16 (emulated kc_gemm_bf16) on operands rounded to bfloat16,
 * against a double reference built here from op(A) and op(B) spelled out,
 * and against its kernels/c twin k_matmul_bf16; the same for float16
 * (kc_matmul_f16, kc_gemm_f16, k_matmul_f16) when f16 */
static void test_matmul_16(bool f16)
{
    auto round16 = [f16](float x) { return f16 ? k_f16_from_f32(x) : k_bf16_from_f32(x); };
    auto wide = [f16](uint16_t h) { return f16 ? k_f16_to_f32(h) : k_bf16_to_f32(h); };
    const char *name = f16 ? "f16" : "bf16";
    struct Case {
        int64_t batch, m, n, k;
        int ta, tb;
        int64_t sa, sb;
        double beta;
    };
    static const Case cases[] = {
        {1, 3, 5, 4, 0, 0, 0, 0, 0.0},
        {2, 3, 5, 4, 1, 0, 12, 20, 0.0},         /* A stored k x m, both batched */
        {3, 4, 6, 7, 0, 1, 28, 0, 0.0},          /* B stored n x k, shared (sb 0) */
        {2, 5, 3, 6, 1, 1, 31, 19, 1.0},         /* gaps between the batches; C += */
        {4, 7, 2, 9, 0, 0, 63, 0, 0.5},          /* dense A, shared B (one tall GEMM on a GPU) */
        {2, 17, 33, 65, 1, 1, 17 * 65 + 3, 0, 0.0},
    };
    for (const Case &q : cases) {
        const int64_t na = (q.batch - 1) * q.sa + q.m * q.k, nb = (q.batch - 1) * q.sb + q.k * q.n;
        const int64_t nc = q.batch * q.m * q.n;
        std::vector<uint16_t> a(na), b(nb);
        for (auto &v : a)
            v = round16((float)uni(-2, 2));
        for (auto &v : b)
            v = round16((float)uni(-2, 2));
        F c0 = rnd(nc, -1, 1), got = c0, twin = c0, want(nc + 1);
        if (q.beta == 0) /* beta 0 never reads C */
            std::fill(got.begin(), got.end(), NAN);
        for (int64_t i = 0; i < q.batch; i++) {
            std::vector<double> opa(q.m * q.k), opb(q.k * q.n); /* m x k and k x n, row-major */
            for (int64_t r = 0; r < q.m; r++)
                for (int64_t l = 0; l < q.k; l++)
                    opa[r * q.k + l] = wide(a[i * q.sa + (q.ta ? l * q.m + r : r * q.k + l)]);
            for (int64_t l = 0; l < q.k; l++)
                for (int64_t c = 0; c < q.n; c++)
                    opb[l * q.n + c] = wide(b[i * q.sb + (q.tb ? c * q.k + l : l * q.n + c)]);
            for (int64_t r = 0; r < q.m; r++)
                for (int64_t c = 0; c < q.n; c++) {
                    double s = q.beta * c0[i * q.m * q.n + r * q.n + c];
                    for (int64_t l = 0; l < q.k; l++)
                        s += opa[r * q.k + l] * opb[l * q.n + c];
                    want[i * q.m * q.n + r * q.n + c] = (float)s;
                }
        }
        (f16 ? kc_matmul_f16 : kc_matmul_bf16)(got.data(), a.data(), b.data(), q.batch, q.sa, q.sb, q.m, q.n, q.k,
                                               q.ta, q.tb, q.beta);
        CTX("kc_matmul_%s batch %lld m %lld n %lld k %lld ta %d tb %d sa %lld sb %lld beta %g", name,
            (long long)q.batch, (long long)q.m, (long long)q.n, (long long)q.k, q.ta, q.tb, (long long)q.sa,
            (long long)q.sb, q.beta);
        check_f(got.data(), want.data(), nc, TOL);
        (f16 ? k_matmul_f16 : k_matmul_bf16)(twin.data(), a.data(), b.data(), q.batch, q.sa, q.sb, q.m, q.n, q.k,
                                             q.ta, q.tb, q.beta);
        CTX("k_matmul_%s (kernels/c) batch %lld m %lld n %lld k %lld ta %d tb %d", name, (long long)q.batch,
            (long long)q.m, (long long)q.n, (long long)q.k, q.ta, q.tb);
        check_f(got.data(), twin.data(), nc, TOL);
    }
}

/* kc_matmul_add_{f32,bf16,f16} (the GEMM epilogue of a MatMulAdd) against
 * k_matmul_add_* and a double reference: with no epilogue, a bias, an
 * addend, both, and the addend being C itself (in place), alpha 1 or not
 * (1/8: an attention score's scale); the bias in
 * cuBLASLt's epilogue and, as for a shape no algorithm takes, by the
 * launcher's kernel */
static void test_matmul_add()
{
    struct Case {
        int64_t batch, m, n, k;
        int ta, tb;
        int64_t sa, sb;
    };
    static const Case cases[] = {
        {1, 3, 5, 4, 0, 1, 0, 0},
        {3, 4, 6, 7, 0, 1, 28, 0},        /* shared B (a Linear on [B, T, D]): one tall GEMM */
        {2, 5, 3, 6, 1, 0, 30, 18},       /* both batched, A stored k x m */
        {2, 17, 33, 65, 0, 0, 17 * 65, 65 * 33},
    };
    for (int type = KC_GEMM_F32; type <= KC_GEMM_F16; type++)
        for (const Case &q : cases)
            for (int epi = 0; epi < 5; epi++)       /* none, bias, addend, both, addend in place */
                for (int fallback = 0; fallback < 4; fallback++) { /* bit 0: the bias by the launcher, 1: alpha 1/8 */
                    const int64_t na = (q.batch - 1) * q.sa + q.m * q.k, nb = (q.batch - 1) * q.sb + q.k * q.n;
                    const int64_t nc = q.batch * q.m * q.n;
                    F af = rnd(na, -2, 2), bf = rnd(nb, -2, 2), bias = rnd(q.n, -1, 1), add = rnd(nc, -1, 1);
                    std::vector<uint16_t> a16(na), b16(nb);
                    const bool is_bf = type == KC_GEMM_BF16;
                    auto round = [is_bf](float x) { return is_bf ? k_bf16_from_f32(x) : k_f16_from_f32(x); };
                    auto wide = [is_bf](uint16_t h) { return is_bf ? k_bf16_to_f32(h) : k_f16_to_f32(h); };
                    if (type != KC_GEMM_F32)
                        for (int64_t i = 0; i < na + nb; i++) {
                            uint16_t h = round(i < na ? af[i] : bf[i - na]);
                            (i < na ? a16[i] : b16[i - na]) = h;
                            (i < na ? af[i] : bf[i - na]) = wide(h);
                        }
                    const bool has_bias = epi == 1 || epi == 3, has_add = epi >= 2, in_place = epi == 4;
                    const double alpha = fallback & 2 ? 0.125 : 1.0;
                    F want(nc), got = in_place ? add : F(nc, NAN), twin = got;
                    for (int64_t i = 0; i < q.batch; i++)
                        for (int64_t r = 0; r < q.m; r++)
                            for (int64_t c = 0; c < q.n; c++) {
                                double sum = 0;
                                for (int64_t l = 0; l < q.k; l++)
                                    sum += (double)af[i * q.sa + (q.ta ? l * q.m + r : r * q.k + l)] *
                                           bf[i * q.sb + (q.tb ? c * q.k + l : l * q.n + c)];
                                want[(i * q.m + r) * q.n + c] = (float)(alpha * sum + (has_bias ? bias[c] : 0) +
                                                                        (has_add ? add[(i * q.m + r) * q.n + c] : 0));
                            }
                    const float *pb = has_bias ? bias.data() : nullptr;
                    const float *pg = has_add ? (in_place ? got.data() : add.data()) : nullptr;
                    const float *pt = has_add ? (in_place ? twin.data() : add.data()) : nullptr;
                    emu_no_bias_epilogue = fallback & 1;
                    if (type == KC_GEMM_F32) {
                        kc_matmul_add_f32(got.data(), af.data(), bf.data(), pb, pg, alpha, q.batch, q.sa, q.sb, q.m,
                                          q.n, q.k, q.ta, q.tb);
                        k_matmul_add_f32(twin.data(), af.data(), bf.data(), pb, pt, alpha, q.batch, q.sa, q.sb, q.m,
                                         q.n, q.k, q.ta, q.tb);
                    } else {
                        auto kc = type == KC_GEMM_BF16 ? kc_matmul_add_bf16 : kc_matmul_add_f16;
                        auto k = type == KC_GEMM_BF16 ? k_matmul_add_bf16 : k_matmul_add_f16;
                        kc(got.data(), a16.data(), b16.data(), pb, pg, alpha, q.batch, q.sa, q.sb, q.m, q.n, q.k, q.ta,
                           q.tb);
                        k(twin.data(), a16.data(), b16.data(), pb, pt, alpha, q.batch, q.sa, q.sb, q.m, q.n, q.k, q.ta,
                          q.tb);
                    }
                    emu_no_bias_epilogue = false;
                    CTX("kc_matmul_add type %d batch %lld m %lld n %lld k %lld alpha %g bias %d addend %d in place %d "
                        "bias by the launcher %d", type, (long long)q.batch, (long long)q.m, (long long)q.n,
                        (long long)q.k, alpha, has_bias, has_add, in_place, fallback & 1);
                    check_f(got.data(), want.data(), nc, TOL);
                    check_f(twin.data(), want.data(), nc, TOL);
                }
}

/* kc_matmul_add_f64 (emulated kc_gemm_add, KC_GEMM_F64) against a double
 * reference and its kernels/c twin, with the cases of test_matmul_add */
static void test_matmul_add_f64()
{
    static const int64_t cases[][8] = {/* batch m n k ta tb sa sb */
                                       {1, 3, 5, 4, 0, 1, 0, 0},
                                       {3, 4, 6, 7, 0, 1, 28, 0},
                                       {2, 5, 3, 6, 1, 0, 30, 18},
                                       {2, 17, 33, 65, 0, 0, 17 * 65, 65 * 33}};
    for (const auto &q : cases)
        for (int epi = 0; epi < 5; epi++)                      /* none, bias, addend, both, addend in place */
            for (int fallback = 0; fallback < 4; fallback++) { /* bit 0: the bias by the launcher, 1: alpha 1/8 */
                const int64_t batch = q[0], m = q[1], n = q[2], k = q[3], ta = q[4], tb = q[5], sa = q[6], sb = q[7];
                const int64_t na = (batch - 1) * sa + m * k, nb = (batch - 1) * sb + k * n, nc = batch * m * n;
                V<double> a = rnd<double>(na, -2, 2), b = rnd<double>(nb, -2, 2), bias = rnd<double>(n, -1, 1),
                          add = rnd<double>(nc, -1, 1);
                const bool has_bias = epi == 1 || epi == 3, has_add = epi >= 2, in_place = epi == 4;
                const double alpha = fallback & 2 ? 0.125 : 1.0;
                V<double> want(nc), got = in_place ? add : V<double>(nc, NAN), twin = got;
                for (int64_t i = 0; i < batch; i++)
                    for (int64_t r = 0; r < m; r++)
                        for (int64_t c = 0; c < n; c++) {
                            double sum = 0;
                            for (int64_t l = 0; l < k; l++)
                                sum += a[i * sa + (ta ? l * m + r : r * k + l)] * b[i * sb + (tb ? c * k + l : l * n + c)];
                            want[(i * m + r) * n + c] =
                                alpha * sum + (has_bias ? bias[c] : 0) + (has_add ? add[(i * m + r) * n + c] : 0);
                        }
                const double *pb = has_bias ? bias.data() : nullptr;
                const double *pg = has_add ? (in_place ? got.data() : add.data()) : nullptr;
                const double *pt = has_add ? (in_place ? twin.data() : add.data()) : nullptr;
                emu_no_bias_epilogue = fallback & 1;
                kc_matmul_add_f64(got.data(), a.data(), b.data(), pb, pg, alpha, batch, sa, sb, m, n, k, (int)ta,
                                  (int)tb);
                k_matmul_add_f64(twin.data(), a.data(), b.data(), pb, pt, alpha, batch, sa, sb, m, n, k, (int)ta,
                                 (int)tb);
                emu_no_bias_epilogue = false;
                CTX("kc_matmul_add_f64 batch %lld m %lld n %lld k %lld alpha %g bias %d addend %d in place %d bias by "
                    "the launcher %d", (long long)batch, (long long)m, (long long)n, (long long)k, alpha, has_bias,
                    has_add, in_place, fallback & 1);
                check_f(got.data(), want.data(), nc, tol<double>());
                check_f(twin.data(), want.data(), nc, tol<double>());
            }
}

static void test_matmul_bf16() { test_matmul_16(false); }
static void test_matmul_f16() { test_matmul_16(true); }

/* float16 casts: kc_cast against kernels/c's k_cast and the kernels.h
 * helpers: every float16 to float32 (and the other dtypes), and to float16
 * from random floats of every class and from ties and near-ties */
static void test_cast_f16()
{
    std::vector<uint16_t> h(65536);
    std::vector<float> wide(65536);
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i, wide[i] = k_f16_to_f32((uint16_t)i);
    for (int to = K_DT_F32; to <= K_DT_BOOL; to++) {
        static const int size[] = {4, 8, 8, 4, 1, 1};
        std::vector<uint8_t> w(65536 * 8), d(65536 * 8), g(65536 * 8);
        k_cast(to, w.data(), K_DT_F32, wide.data(), 65536);
        k_cast(to, d.data(), K_DT_F16, h.data(), 65536);
        kc_cast(to, g.data(), K_DT_F16, h.data(), 65536);
        CTX("kc_cast f16 -> %d, every float16, against float32 -> %d", to, to);
        check_bytes(g.data(), w.data(), (size_t)65536 * size[to]);
        CTX("kc_cast f16 -> %d, every float16, against k_cast", to);
        check_bytes(g.data(), d.data(), (size_t)65536 * size[to]);
    }
    const int64_t n = 40009;
    std::vector<float> xf(n);
    std::vector<uint16_t> want(n), got(n), twin(n);
    for (int64_t i = 0; i < n; i++) {
        /* a random float, or one near a float16 rounding boundary: 13 low bits at / around the tie */
        const uint32_t r = (uint32_t)below(65536) << 16 | (uint32_t)below(65536);
        const uint32_t low[] = {0x1000, 0x0fff, 0x1001, 0x0000};
        xf[i] = f32_of_bits(i % 5 == 4 ? r : ((r & ~0x1fffu) | low[i % 5]));
        want[i] = k_f16_from_f32(xf[i]);
    }
    kc_cast(K_DT_F16, got.data(), K_DT_F32, xf.data(), n);
    CTX("kc_cast f32 -> f16, %lld floats (ties, near-ties, random)", (long long)n);
    check_u16(got.data(), want.data(), n);
    k_cast(K_DT_F16, twin.data(), K_DT_F32, xf.data(), n);
    CTX("kc_cast f32 -> f16 against k_cast");
    check_u16(got.data(), twin.data(), n);
    std::vector<double> xd(n);
    for (int64_t i = 0; i < n; i++)
        xd[i] = uni(-1, 1) * pow(2.0, uni(-30, 20)), want[i] = k_f16_from_f32((float)xd[i]);
    kc_cast(K_DT_F16, got.data(), K_DT_F64, xd.data(), n);
    CTX("kc_cast f64 -> f16 through float");
    check_u16(got.data(), want.data(), n);
}

/* loss scaling: the seed and the unscaled norm read S from the step params
 * (the host's values are ignored); the updates unscale and skip an overflow
 * like kernels/c's */
static void test_loss_scale()
{
    for (double S : {1.0, 65536.0, 0x1p40})
        for (int64_t accum : {1, 3}) {
            step_params = KcStepParams{};
            step_params.loss_scale = S, step_params.accum = accum;
            F got(1000, NAN), want(1000);
            k_loss_seed_f32(want.data(), 1000, S, accum);
            kc_loss_seed_f32(got.data(), 1000, 9, 9);
            CTX("kc_loss_seed S %g accum %lld", S, (long long)accum);
            check_f(got.data(), want.data(), 1000, 0);
            F y{3.5e9f}, yw{3.5e9f};
            k_unscale_sq_f32(yw.data(), S);
            kc_unscale_sq_f32(y.data(), 9);
            CTX("kc_unscale_sq S %g", S);
            check_f(y.data(), yw.data(), 1, 0);
        }
    const int64_t n = 1000;
    for (float gsq : {0.25f, INFINITY, NAN})
        for (double clip : {0.0, 0.1})
            for (int sgd = 0; sgd < 2; sgd++) {
                step_params = KcStepParams{0.01, 0.9, 0.999, 1e-8, 0.05, 0.9, clip, 7, 0, 1, 1024.0, 3};
                const F g = rnd(n, -1000, 1000), p0 = rnd(n, -1, 1), m0 = rnd(n, -0.1, 0.1), v0 = rnd(n, 0, 0.01);
                F p = p0, m = m0, v = v0, p2 = p0, m2 = m0, v2 = v0;
                if (sgd) {
                    k_sgd_f32(p.data(), g.data(), m.data(), n, 0.01, 0.9, 0.05, 0, 1.0, 3, &gsq, clip, 1024.0, 0, 1);
                    kc_sgd_f32(p2.data(), g.data(), m2.data(), n, 9, 9, 9, 0, 1.0, 9, &gsq, 9, 9, 9, 9);
                } else {
                    k_adamw_f32(p.data(), g.data(), m.data(), v.data(), n, 0.01, 0.9, 0.999, 1e-8, 0.05, 0, 1.0, 3, &gsq, clip,
                                1024.0, 0, 1);
                    kc_adamw_f32(p2.data(), g.data(), m2.data(), v2.data(), n, 9, 9, 9, 9, 9, 0, 1.0, 9, &gsq, 9, 9, 9, 9);
                }
                CTX("kc_%s with loss scale 1024, opt_step 3 (step 7), clip %g, gsq %g", sgd ? "sgd" : "adamw", clip,
                    (double)gsq);
                check_f(p2.data(), p.data(), n, 1e-6);
                check_f(m2.data(), m.data(), n, 1e-6);
                check_f(v2.data(), v.data(), n, 1e-6);
                if (!(gsq < INFINITY)) { /* skipped: nothing written */
                    CTX("kc_%s skips gsq %g", sgd ? "sgd" : "adamw", (double)gsq);
                    check_bytes(p2.data(), p0.data(), p0.size() * sizeof(float));
                    check_bytes(m2.data(), m0.data(), m0.size() * sizeof(float));
                } else {
                    CTX("kc_%s moved p with gsq %g", sgd ? "sgd" : "adamw", (double)gsq);
                    checks++;
                    if (p2 == p0) {
                        printf("FAIL %s\n", what);
                        failures++;
                    }
                }
            }
}

int main()
{
    /* the typed kernels' tests run in float32, then in float64 */
#define BOTH(t) t<float>, t<double>
    static void (*const tests[])() = {
        BOTH(test_binary),  BOTH(test_compare_where), BOTH(test_unary),    test_cast,
        BOTH(test_copy_strided), BOTH(test_pad),      BOTH(test_reduce),   BOTH(test_softmax),
        BOTH(test_range_trilu),  BOTH(test_layernorm), BOTH(test_batchnorm), BOTH(test_conv),
        BOTH(test_pool),    BOTH(test_gather),        BOTH(test_gather_elements), test_nd_index,
        BOTH(test_dropout), BOTH(test_mse_ce),        BOTH(test_nll),      BOTH(test_optim),
        BOTH(test_sum_squares), BOTH(test_grad_accum), test_cast_bf16,     test_matmul_bf16,
        test_cast_f16,      test_matmul_f16,          test_loss_scale,     test_matmul_add,
        test_matmul_add_f64, BOTH(test_attention), test_attention_bf16, test_attention_f16, test_attention_heads,
        test_cross_entropy_bf16, test_cross_entropy_f16, test_reduce_sum_to_low, test_layernorm_low};
#undef BOTH
    for (auto t : tests)
        t();
    printf("kernels_cuda_test: %d checks, %d failed (%ld launches, %ld blocks, %ld threads emulated)\n", checks,
           failures, emu::st.launches, emu::st.blocks, emu::st.threads);
    return failures ? 1 : 0;
}
