/* attn_cuda.cu — kernels/cuda/attn.cu's attention kernels on a real GPU:
 * checked against a float64 reference, then timed at GPT-2-small's shape.
 * Not part of the build (nvcc, not NVRTC; fsdpc needs no GPU):
 *
 *   nvcc -std=c++17 -O2 -arch=sm_90 -I kernels/cuda bench/attn_cuda.cu -o attn_cuda
 *   ./attn_cuda          (on the GPU machine; the binary links cudart statically)
 *
 * check lines: the largest |got - want| / (1 + |want|) of y, lse, dq, dk, dv
 * for float32 and the bfloat16 / float16 instances (q, k, v rounded to them,
 * the reference computed from the rounded values in float64) on a causal
 * problem and one with a random bias, d and dv past one 64-wide chunk.
 * float32 lands near 1e-6; bf16 near 5e-3, f16 near 5e-4 (P, dY and dS
 * rounded as GEMM operands).  time lines: the forward and the backward (the
 * dq kernel's share beside it) at 96 problems (batch 8 x 12 heads) of
 * t = s = 1024, d 64, in ms over 5 runs after a warm-up, with TFLOP/s
 * counting 4 t s d (half of it under the causal mask) forward and 2.5
 * times that backward.  Seen on an H100 SXM (2026-11-26), causal: f32 1.1 ms
 * forward, 4.3 ms backward; bf16 1.0 / 3.5 ms; no mask f32 1.5 / 6.6 ms.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common.cuh"
#include "attn.cu"

/* the float32 templates as kernels (kernels.def stamps them in the device program) */
extern "C" __global__ void fwd_f32(float *y, float *l, const float *q, const float *k, const float *v,
                                   const float *b, KDims p, double sc)
{
    k_attention<float>(y, l, q, k, v, b, p, sc);
}
extern "C" __global__ void gq_f32(float *dq, const float *dy, const float *q, const float *k, const float *v,
                                  const float *b, const float *y, const float *l, KDims p, double sc)
{
    k_attention_grad_q<float>(dq, dy, q, k, v, b, y, l, p, sc);
}
extern "C" __global__ void gkv_f32(float *dk, float *dv, const float *dy, const float *q, const float *k,
                                   const float *v, const float *b, const float *y, const float *l, KDims p,
                                   double sc)
{
    k_attention_grad_kv<float>(dk, dv, dy, q, k, v, b, y, l, p, sc);
}

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "attn_cuda: %s: %s\n", #x, cudaGetErrorString(e_));                    \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

enum { F32, BF16, F16 };
static const char *const kind_name[] = {"f32", "bf16", "f16"};

struct Prob {
    int64_t batch, t, s, d, dv;
    int mask; /* 0 no bias, 1 causal, 2 random with 30 % -inf */
};

static uint64_t seed = 88172645463325252ull;
static double uni(double lo, double hi)
{
    seed ^= seed >> 12, seed ^= seed << 25, seed ^= seed >> 27;
    return lo + (hi - lo) * (double)((seed * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
}

/* x rounded to the kind's type: its bits and its value */
static float round_to(int kind, float x, uint16_t *bits)
{
    if (kind == BF16) {
        __nv_bfloat16 h = __float2bfloat16_rn(x);
        memcpy(bits, &h, 2);
        return __bfloat162float(h);
    }
    if (kind == F16) {
        __half h = __float2half_rn(x);
        memcpy(bits, &h, 2);
        return __half2float(h);
    }
    return x;
}

template <typename X> static X *upload(const std::vector<X> &v)
{
    X *p;
    CK(cudaMalloc(&p, sizeof(X) * std::max<size_t>(v.size(), 1)));
    CK(cudaMemcpy(p, v.data(), sizeof(X) * v.size(), cudaMemcpyHostToDevice));
    return p;
}
static std::vector<float> download(const float *p, int64_t n)
{
    std::vector<float> v((size_t)n);
    CK(cudaMemcpy(v.data(), p, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost));
    return v;
}

/* n 16-bit values of the kind's type, widened */
static std::vector<float> download16(int kind, const uint16_t *p, int64_t n)
{
    std::vector<uint16_t> h((size_t)n);
    CK(cudaMemcpy(h.data(), p, 2 * (size_t)n, cudaMemcpyDeviceToHost));
    std::vector<float> v((size_t)n);
    for (int64_t i = 0; i < n; i++) {
        if (kind == BF16) {
            __nv_bfloat16 b;
            memcpy(&b, &h[i], 2);
            v[i] = __bfloat162float(b);
        } else {
            __half b;
            memcpy(&b, &h[i], 2);
            v[i] = __half2float(b);
        }
    }
    return v;
}

/* a problem's inputs (kt layout: d x s per problem) and outputs, host and device */
struct Data {
    Prob P;
    int kind;
    std::vector<float> q, k, v, dy, bias; /* q, k, v: the rounded values */
    std::vector<uint16_t> q16, k16, v16, dy16;
    float *dq_, *dk_, *dv_, *y_, *l_, *dy_, *b_, *qf, *kf, *vf;
    uint16_t *qh, *kh, *vh, *dyh, *yh, *dqh, *dkh, *dvh; /* the 16-bit kinds' dy, y and gradients */
    KDims p;
    unsigned gf, gq, gkv;
};

static void fill(int kind, std::vector<float> &x, std::vector<uint16_t> &h, double lo, double hi)
{
    for (size_t i = 0; i < x.size(); i++)
        x[i] = round_to(kind, (float)uni(lo, hi), &h[i]);
}

static Data make(const Prob &P, int kind)
{
    Data D;
    D.P = P, D.kind = kind;
    const int64_t nq = P.batch * P.t * P.d, nk = P.batch * P.s * P.d, nv = P.batch * P.s * P.dv;
    D.q.resize(nq), D.k.resize(nk), D.v.resize(nv), D.q16.resize(nq), D.k16.resize(nk), D.v16.resize(nv);
    fill(kind, D.q, D.q16, -2, 2), fill(kind, D.k, D.k16, -2, 2), fill(kind, D.v, D.v16, -1, 1);
    D.dy.resize(P.batch * P.t * P.dv), D.dy16.resize(P.batch * P.t * P.dv);
    fill(kind, D.dy, D.dy16, -1, 1);
    D.bias.resize(P.t * P.s);
    for (int64_t i = 0; i < P.t; i++)
        for (int64_t j = 0; j < P.s; j++)
            D.bias[i * P.s + j] = P.mask == 1 ? (j > i + P.s - P.t ? -INFINITY : 0.f)
                                              : uni(0, 1) < 0.3 ? -INFINITY : (float)uni(-1, 1);
    D.qf = upload(D.q), D.kf = upload(D.k), D.vf = upload(D.v);
    D.qh = upload(D.q16), D.kh = upload(D.k16), D.vh = upload(D.v16);
    D.dy_ = upload(D.dy), D.dyh = upload(D.dy16), D.b_ = P.mask ? upload(D.bias) : nullptr;
    CK(cudaMalloc(&D.yh, 2 * P.batch * P.t * P.dv));
    CK(cudaMalloc(&D.dqh, 2 * nq));
    CK(cudaMalloc(&D.dkh, 2 * nk));
    CK(cudaMalloc(&D.dvh, 2 * nv));
    CK(cudaMalloc(&D.y_, 4 * P.batch * P.t * P.dv));
    CK(cudaMalloc(&D.l_, 4 * P.batch * P.t));
    CK(cudaMalloc(&D.dq_, 4 * nq));
    CK(cudaMalloc(&D.dk_, 4 * nk));
    CK(cudaMalloc(&D.dv_, 4 * nv));
    memset(&D.p, 0, sizeof D.p);
    const int64_t d[8] = {P.batch, P.t, P.s, P.d, P.dv, 1 | (int64_t)1 << 32, 0, 0}; /* nbias | brep << 32, heads */
    memcpy(D.p.d, d, sizeof d);
    /* launch.c's attn_grid for float32 tiles */
    const int64_t tiles = (P.t + 63) / 64, nkd = (P.d + 63) / 64, nvd = (P.dv + 63) / 64;
    D.gf = (unsigned)(P.batch * tiles * nvd), D.gq = (unsigned)(P.batch * tiles * nkd);
    D.gkv = (unsigned)(P.batch * ((P.s + 63) / 64) * std::max(nkd, nvd));
    return D;
}

static void forward(const Data &D, double scale)
{
    if (D.kind == F32)
        fwd_f32<<<D.gf, 128>>>(D.y_, D.l_, D.qf, D.kf, D.vf, D.b_, D.p, scale);
    else if (D.kind == BF16)
        k_attention_bf16<<<D.gf, 128>>>(D.yh, D.l_, D.qh, D.kh, D.vh, D.b_, D.p, scale);
    else
        k_attention_f16<<<D.gf, 128>>>(D.yh, D.l_, D.qh, D.kh, D.vh, D.b_, D.p, scale);
}

static void backward_q(const Data &D, double scale)
{
    if (D.kind == F32)
        gq_f32<<<D.gq, 128>>>(D.dq_, D.dy_, D.qf, D.kf, D.vf, D.b_, D.y_, D.l_, D.p, scale);
    else if (D.kind == BF16)
        k_attention_grad_q_bf16<<<D.gq, 128>>>(D.dqh, D.dyh, D.qh, D.kh, D.vh, D.b_, D.yh, D.l_, D.p, scale);
    else
        k_attention_grad_q_f16<<<D.gq, 128>>>(D.dqh, D.dyh, D.qh, D.kh, D.vh, D.b_, D.yh, D.l_, D.p, scale);
}

static void backward_kv(const Data &D, double scale)
{
    if (D.kind == F32)
        gkv_f32<<<D.gkv, 128>>>(D.dk_, D.dv_, D.dy_, D.qf, D.kf, D.vf, D.b_, D.y_, D.l_, D.p, scale);
    else if (D.kind == BF16)
        k_attention_grad_kv_bf16<<<D.gkv, 128>>>(D.dkh, D.dvh, D.dyh, D.qh, D.kh, D.vh, D.b_, D.yh, D.l_, D.p,
                                                 scale);
    else
        k_attention_grad_kv_f16<<<D.gkv, 128>>>(D.dkh, D.dvh, D.dyh, D.qh, D.kh, D.vh, D.b_, D.yh, D.l_, D.p,
                                                scale);
}

/* float64 attention of D's rounded inputs: y, lse, dq, dk, dv (no row sees nothing in these problems) */
static void reference(const Data &D, double scale, std::vector<double> (&out)[5])
{
    const Prob &P = D.P;
    out[0].assign(D.dy.size(), 0), out[1].assign(P.batch * P.t, 0), out[2].assign(D.q.size(), 0);
    out[3].assign(D.k.size(), 0), out[4].assign(D.v.size(), 0);
    std::vector<double> pr(P.s);
    for (int64_t b = 0; b < P.batch; b++)
        for (int64_t i = 0; i < P.t; i++) {
            const int64_t row = b * P.t + i;
            const float *kb = D.k.data() + b * P.d * P.s, *vb = D.v.data() + b * P.s * P.dv;
            double mx = -INFINITY, sum = 0, dd = 0;
            for (int64_t j = 0; j < P.s; j++) {
                double a = 0;
                for (int64_t e = 0; e < P.d; e++)
                    a += (double)D.q[row * P.d + e] * kb[e * P.s + j];
                pr[j] = scale * a + (P.mask ? D.bias[i * P.s + j] : 0);
                mx = std::max(mx, pr[j]);
            }
            for (int64_t j = 0; j < P.s; j++)
                sum += pr[j] = exp(pr[j] - mx);
            out[1][row] = mx + log(sum);
            for (int64_t j = 0; j < P.s; j++)
                for (int64_t e = 0; e < P.dv; e++)
                    out[0][row * P.dv + e] += pr[j] / sum * vb[j * P.dv + e];
            for (int64_t e = 0; e < P.dv; e++)
                dd += D.dy[row * P.dv + e] * out[0][row * P.dv + e];
            for (int64_t j = 0; j < P.s; j++) {
                double dp = 0;
                for (int64_t e = 0; e < P.dv; e++) {
                    dp += (double)D.dy[row * P.dv + e] * vb[j * P.dv + e];
                    out[4][(b * P.s + j) * P.dv + e] += pr[j] / sum * D.dy[row * P.dv + e];
                }
                const double ds = pr[j] / sum * (dp - dd);
                for (int64_t e = 0; e < P.d; e++) {
                    out[2][row * P.d + e] += scale * ds * kb[e * P.s + j];
                    out[3][b * P.d * P.s + e * P.s + j] += scale * ds * D.q[row * P.d + e];
                }
            }
        }
}

static double max_err(const std::vector<float> &got, const std::vector<double> &want)
{
    double m = 0;
    for (size_t i = 0; i < want.size(); i++) {
        const double e = fabs(got[i] - want[i]) / (1 + fabs(want[i]));
        m = e > m || e != e ? e : m;
    }
    return m;
}

static void check(const Prob &P, int kind)
{
    const Data D = make(P, kind);
    const double scale = 1 / sqrt((double)P.d);
    forward(D, scale);
    backward_q(D, scale);
    backward_kv(D, scale);
    CK(cudaDeviceSynchronize());
    std::vector<double> want[5];
    reference(D, scale, want);
    float *got[5] = {D.y_, D.l_, D.dq_, D.dk_, D.dv_};
    const uint16_t *got16[5] = {D.yh, nullptr, D.dqh, D.dkh, D.dvh}; /* the 16-bit kinds' */
    printf("check %-4s batch %lld t %lld s %lld d %lld dv %lld %s: max rel err", kind_name[kind], (long long)P.batch,
           (long long)P.t, (long long)P.s, (long long)P.d, (long long)P.dv, P.mask == 1 ? "causal" : "random bias");
    const char *name[5] = {"y", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 5; i++)
        printf(" %s %.2e", name[i],
               max_err(kind == F32 || !got16[i] ? download(got[i], (int64_t)want[i].size())
                                                : download16(kind, got16[i], (int64_t)want[i].size()),
                       want[i]));
    printf("\n");
}

static float elapsed(void (*f)(const Data &, double), void (*g)(const Data &, double), const Data &D, double sc)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float ms = 0;
    for (int r = 0; r < 6; r++) { /* the first a warm-up */
        CK(cudaEventRecord(a));
        f(D, sc);
        if (g)
            g(D, sc);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float x;
        CK(cudaEventElapsedTime(&x, a, b));
        ms += r ? x : 0;
    }
    return ms / 5;
}

static void timing(const Prob &P, int kind)
{
    const Data D = make(P, kind);
    const double scale = 1 / sqrt((double)P.d), flop = 4.0 * P.batch * P.t * P.s * P.d * (P.mask == 1 ? 0.5 : 1);
    forward(D, scale);
    const float tf = elapsed(forward, nullptr, D, scale), tb = elapsed(backward_q, backward_kv, D, scale);
    const float tq = elapsed(backward_q, nullptr, D, scale);
    CK(cudaGetLastError());
    printf("time  %-4s batch %lld t %lld d %lld %s: forward %.3f ms (%.1f TFLOP/s), backward %.3f ms (%.1f TFLOP/s; "
           "dq kernel %.3f ms)\n", kind_name[kind], (long long)P.batch, (long long)P.t, (long long)P.d,
           P.mask == 1 ? "causal" : "no mask", tf, flop / tf * 1e-9, tb, 2.5 * flop / tb * 1e-9, tq);
}

int main()
{
    const Prob small[] = {{3, 150, 150, 64, 64, 1}, {2, 70, 90, 100, 130, 2}};
    for (int kind = F32; kind <= F16; kind++)
        for (const Prob &P : small)
            check(P, kind);
    for (int kind = F32; kind <= F16; kind++)
        timing({96, 1024, 1024, 64, 64, 1}, kind);
    timing({96, 1024, 1024, 64, 64, 0}, F32);
    return 0;
}
