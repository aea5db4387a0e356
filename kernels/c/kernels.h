/* kernels.h — reference CPU kernels (C11), called by the generated step.
 *
 * Conventions (all kernels unless a comment says otherwise):
 * - Arithmetic kernels exist for float (_f32) and double (_f64), stamped from
 *   one body per source file with a type macro.  Pure data-movement kernels
 *   (k_copy_strided, k_where, k_gather, k_trilu) take the element size in
 *   bytes (esize 1, 2, 4 or 8) instead and serve every dtype.
 * - Shapes and strides are int64 element counts; tensors are dense row-major
 *   unless strides are given.  A stride of 0 broadcasts that dim.
 * - Outputs are written, never accumulated into, except by kernels named
 *   *accum* or where the comment says "+=".  An output that the contract does
 *   not name as aliasable must not overlap any input.
 * - Kernels never allocate.  Scratch memory comes from the caller (conv2d:
 *   k_conv2d_workspace elements).  Kernels never fail, except where a return
 *   value says so; a broken contract (bad op code, impossible shape) aborts
 *   with a message.
 * - Reductions (sums, means, variances, norm statistics) accumulate in
 *   double for both dtypes; scalar parameters passed as double are rounded to
 *   the tensor dtype first where PyTorch does the same.
 * - Kernels parallelise with OpenMP only when built with -fopenmp; results
 *   do not depend on the thread count.
 * - K_TWIN(f) after a declaration says that k_f has a twin on the cuda
 *   target, kc_f in kernels/cuda/launch.c, with the same parameters and
 *   contract on device pointers (K_TWIN_T(f, S): the typed k_f_S).  Empty
 *   here; kernels/cuda/kc_map.h and tests/kernels_cuda_test.cc define it
 *   before including this header, so this file is the one list of the
 *   twins: a kernel op declared here with its K_TWIN needs no other
 *   declaration on either target.
 */
#ifndef FSDPC_KERNELS_H
#define FSDPC_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "fused.h"

/* Below this many elements a thread team costs more than it saves (the
 * kernels' par_range, the generated step's fused loops).  A test build may
 * define it as 1 to split even tiny kernels across threads. */
#ifndef K_PAR_MIN
#define K_PAR_MIN ((int64_t)1 << 16)
#endif

/* The threads of the team running the caller: 1 outside a parallel region (or built without OpenMP).  The
 * generated step's loops with column sums split into as many column tiles (codegen/emit_fused.c). */
#ifdef _OPENMP
#include <omp.h>
static inline int64_t k_team_threads(void) { return omp_get_num_threads(); }
#else
static inline int64_t k_team_threads(void) { return 1; }
#endif

/* k_binary ops (K_ADD, ..., K_POW, K_POW_DA, K_POW_DB) and k_unary /
 * k_unary_grad ops (K_RELU, ..., K_SOFTPLUS; p0, p1 are the op's parameters,
 * unused: 0): the rows of fused.h's KF_BINARY and KF_UNARY, where each op's
 * math is written.  POW follows C pow (a negative base with an integral
 * exponent is fine), with b == 2 and b == 3 computed as a*a and a*a*a like
 * PyTorch.  Gradients follow PyTorch's derivatives.yaml, reading x or y as
 * torch does. */
#define K_CODE_(code, ...) K_##code = KF_##code,
enum { KF_BINARY(K_CODE_) K_BINARY_COUNT };
enum { KF_UNARY(K_CODE_) K_UNARY_COUNT };
#undef K_CODE_

enum { K_EQ, K_LT, K_GT, K_LE, K_GE };  /* k_compare ops: a OP b */

/* element types for k_cast.  BOOL and U8 are both one byte; casting TO bool
 * gives x != 0 (NaN -> 1), to u8 the integer value.  BF16 is bfloat16 stored
 * as its 16 bits (uint16_t): the top half of a float32.  F16 is IEEE binary16
 * (float16) stored as its 16 bits.  I8 .. U64: the narrow integers a model's
 * inputs may hold (kernels/cuda/common.cuh repeats this list). */
enum { K_DT_F32, K_DT_F64, K_DT_I64, K_DT_I32, K_DT_U8, K_DT_BOOL, K_DT_BF16, K_DT_F16,
       K_DT_I8, K_DT_I16, K_DT_U16, K_DT_U32, K_DT_U64 };

enum { K_PAD_CONSTANT, K_PAD_REFLECT, K_PAD_EDGE };  /* k_pad modes (ONNX Pad) */

/* k_reduce ops.  Over zero elements: SUM 0, MEAN NaN, MAX -inf, MIN +inf,
 * PROD 1.  MAX / MIN propagate NaN (torch.amax / amin). */
enum { K_RSUM, K_RMEAN, K_RMAX, K_RMIN, K_RPROD };

/* k_nll_loss reductions (ONNX NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss
 * "none", "sum", "mean") */
enum { K_LOSS_NONE, K_LOSS_SUM, K_LOSS_MEAN };

/* 2-D convolution geometry, NCHW.  x: n x c x h x w; w: m x c/groups x kh x kw;
 * y: n x m x oh x ow with oh = (h + pt + pb - dh (kh - 1) - 1) / sh + 1 (ow alike;
 * the kernels check it).  ONNX pads [pt, pl, pb, pr]; auto_pad must already be
 * resolved into explicit pads by the caller. */
typedef struct {
    int64_t n, c, h, w;       /* input */
    int64_t m, kh, kw;        /* output channels, kernel */
    int64_t oh, ow;           /* output */
    int64_t sh, sw, dh, dw;   /* strides, dilations (>= 1) */
    int64_t pt, pl, pb, pr;   /* pads: top, left, bottom, right (>= 0) */
    int64_t groups;           /* divides c and m; c == m == groups is depthwise */
} KConv2d;

/* 2-D pooling geometry, NCHW: x n x c x h x w, y n x c x oh x ow, one kernel
 * window kh x kw per output.  oh, ow come from k_pool_out_dim (which applies
 * ceil_mode); windows hanging over the end are clipped, not an error. */
typedef struct {
    int64_t n, c, h, w;
    int64_t kh, kw, oh, ow;
    int64_t sh, sw, dh, dw;   /* strides, dilations (>= 1) */
    int64_t pt, pl, pb, pr;   /* pads (>= 0) */
    int count_include_pad;    /* AveragePool: divisor counts padding taps */
} KPool2d;

/* k_attention's row strides, in elements, of q, k, v, y (dy shares y's) and of the gradients dq, dk, dv, for the
 * heads layout (heads > 0): 0 takes the dense heads layout's, heads w (k_attention_ld); another is a tensor whose
 * rows hold more than this operand, as GPT-2's c_attn output [B, t, 3 C] holds q, k and v side by side at
 * offsets 0, C, 2 C (passes/pack.c), so that no copy splits them or concatenates their gradients.  NULL: all 0 */
typedef struct {
    int64_t q, k, v, y, dq, dk, dv;
} KAttnLd;

#ifndef K_TWIN
#define K_TWIN(f)
#endif
#ifndef K_TWIN_T
#define K_TWIN_T(f, S) K_TWIN(f##_##S)
#endif

#define K_DECLARE(T, S)                                                                 \
/* ---- ew.c --------------------------------------------------------------- */         \
/* y[idx] = a[idx . sa] OP b[idx . sb] for every idx of shape (rank dims);              \
 * y is dense; a stride of 0 broadcasts that dim. rank 0 = one element.  y may          \
 * alias a or b when that operand is dense over the same shape. */                      \
void k_binary_##S(int op, T *y, const T *a, const T *b, int rank,                       \
                  const int64_t *shape, const int64_t *sa, const int64_t *sb);          \
K_TWIN_T(binary, S)                                                                     \
/* y = op(x) over n elements (see the op enum for p0, p1); y may alias x */             \
void k_unary_##S(int op, T *y, const T *x, int64_t n, double p0, double p1);            \
K_TWIN_T(unary, S)                                                                      \
/* dx = dy * op'(.) from the forward input x and output y (either may be NULL           \
 * when the op's rule does not read it: see the op enum); dx may alias dy */            \
void k_unary_grad_##S(int op, T *dx, const T *dy, const T *x, const T *y,               \
                      int64_t n, double p0, double p1);                                 \
K_TWIN_T(unary_grad, S)                                                                 \
void k_scale_##S(T *y, const T *x, double alpha, int64_t n);                            \
K_TWIN_T(scale, S)                                                                      \
void k_fill_##S(T *y, double v, int64_t n);                                             \
K_TWIN_T(fill, S)                                                                       \
/* y[idx] = a[idx . sa] OP b[idx . sb] as uint8 0/1, y dense (as k_binary) */           \
void k_compare_##S(int op, uint8_t *y, const T *a, const T *b, int rank,                \
                   const int64_t *shape, const int64_t *sa, const int64_t *sb);         \
K_TWIN_T(compare, S)                                                                    \
/* Where's backward over y's dense shape: da = c ? dy : 0, db = c ? 0 : dy, with        \
 * c[idx . sc]; either output may be NULL.  Reduce each to its operand's shape          \
 * with k_reduce_sum_to afterwards. */                                                  \
void k_where_grad_##S(T *da, T *db, const uint8_t *c, const T *dy, int rank,            \
                      const int64_t *shape, const int64_t *sc);                         \
K_TWIN_T(where_grad, S)                                                                 \
/* ---- copy.c ------------------------------------------------------------- */         \
/* y = transpose(x, perm): y.shape[i] = xshape[perm[i]] */                              \
void k_transpose_##S(T *y, const T *x, int rank, const int64_t *xshape,                 \
                     const int64_t *perm);                                              \
K_TWIN_T(transpose, S)                                                                  \
/* y[yoff + idx . ys] += x[xoff + idx . xs] for every idx of shape, in row-major        \
 * idx order (serial, so y elements hit twice, ys 0, sum deterministically).            \
 * Backward of Slice / Split / Concat parts and strided views; y must not overlap x.    \
 * (For Expand / Tile backward k_reduce_sum_to is faster.) */                           \
void k_accum_strided_##S(int rank, const int64_t *shape, T *y, int64_t yoff,            \
                         const int64_t *ys, const T *x, int64_t xoff,                   \
                         const int64_t *xs);                                            \
/* ONNX Pad: y.shape[d] = xshape[d] + pads[d] + pads[rank + d] (pads in ONNX order:     \
 * all begins, then all ends; negative = crop).  Outside x: CONSTANT writes value,      \
 * EDGE repeats the border, REFLECT mirrors without repeating it (repeatedly, as        \
 * numpy, if a pad exceeds the dim).  EDGE / REFLECT need non-empty dims. */            \
void k_pad_##S(int mode, T *y, const T *x, int rank, const int64_t *xshape,             \
               const int64_t *pads, double value);                                      \
K_TWIN_T(pad, S)                                                                        \
/* Pad's backward: dx (xshape, written) = sum of dy over the y elements that read       \
 * each x element. */                                                                   \
void k_pad_grad_##S(int mode, T *dx, const T *dy, int rank, const int64_t *xshape,      \
                    const int64_t *pads);                                               \
K_TWIN_T(pad_grad, S)                                                                   \
/* ---- matmul.c ----------------------------------------------------------- */         \
/* for i < batch: C_i = op(A_i) op(B_i) + beta C_i, op(A_i) is m x k, op(B_i) k x n;    \
 * A_i = a + i*sa, B_i = b + i*sb (0 = shared), C_i = c + i*m*n (dense).                \
 * ta: A_i is stored k x m; tb: B_i is stored n x k.  beta 0 never reads C. */          \
void k_matmul_##S(T *c, const T *a, const T *b, int64_t batch, int64_t sa,              \
                  int64_t sb, int64_t m, int64_t n, int64_t k, int ta, int tb,          \
                  double beta);                                                         \
K_TWIN_T(matmul, S)                                                                     \
/* a MatMulAdd: C_i = alpha op(A_i) op(B_i) + bias (n values, each row; NULL: none)    \
 * + ADD_i (dense like C_i, may be c itself; NULL: none) */                             \
void k_matmul_add_##S(T *c, const T *a, const T *b, const T *bias, const T *add,        \
                      double alpha, int64_t batch, int64_t sa, int64_t sb, int64_t m,   \
                      int64_t n, int64_t k, int ta, int tb);                            \
K_TWIN_T(matmul_add, S)                                                                 \
/* ---- reduce.c ----------------------------------------------------------- */         \
/* y = sum of x over the dims where yshape[i] == 1 != xshape[i] (same rank) */          \
void k_reduce_sum_to_##S(T *y, const T *x, int rank, const int64_t *xshape,             \
                         const int64_t *yshape);                                        \
K_TWIN_T(reduce_sum_to, S)                                                              \
/* ReduceSum / Mean / Max / Min / Prod: same shape convention as k_reduce_sum_to (reduced      \
 * dims have yshape 1; keepdims is only a matter of the caller's y shape) */            \
void k_reduce_##S(int op, T *y, const T *x, int rank, const int64_t *xshape,            \
                  const int64_t *yshape);                                               \
K_TWIN_T(reduce, S)                                                                     \
/* ReduceMax / ReduceMin backward as torch.amax / amin: the gradient of each group      \
 * is split evenly among the x elements equal to its y:                                 \
 * dx = x == y ? dy / count(x == y in the group) : 0 (y, dy have yshape). */            \
void k_reduce_max_grad_##S(T *dx, const T *dy, const T *x, const T *y, int rank,        \
                           const int64_t *xshape, const int64_t *yshape);               \
K_TWIN_T(reduce_max_grad, S)                                                            \
/* ReduceProd backward: dx = dy * the product of the other x of its group, zeros        \
 * included (no division by x); dy has yshape. */                                       \
void k_reduce_prod_grad_##S(T *dx, const T *dy, const T *x, int rank,                   \
                            const int64_t *xshape, const int64_t *yshape);              \
K_TWIN_T(reduce_prod_grad, S)                                                           \
/* Softmax (is_log 0) or LogSoftmax (is_log 1) over the middle dim of x viewed as       \
 * outer x axis x inner (ONNX opset 13 axis a: outer = prod dims < a, inner =           \
 * prod dims > a).  Max-shifted, sums in double.  y may alias x. */                     \
void k_softmax_##S(int is_log, T *y, const T *x, int64_t outer, int64_t axis,           \
                   int64_t inner);                                                      \
K_TWIN_T(softmax, S)                                                                    \
/* backward from the forward output y: softmax dx = y (dy - sum(dy y));                 \
 * log-softmax dx = dy - exp(y) sum(dy).  dx may alias dy. */                           \
void k_softmax_grad_##S(int is_log, T *dx, const T *dy, const T *y, int64_t outer,      \
                        int64_t axis, int64_t inner);                                   \
K_TWIN_T(softmax_grad, S)                                                               \
/* ONNX Range: y[i] = start + i delta (in double), i < n; the caller computes           \
 * n = max(ceil((limit - start) / delta), 0) */                                         \
void k_range_##S(T *y, double start, double delta, int64_t n);                          \
K_TWIN_T(range, S)                                                                      \
/* ---- norm.c ------------------------------------------------------------- */         \
/* LayerNormalization, x viewed as outer x inner (inner = prod of dims >= axis):        \
 * per row r: mean[r], invstd[r] = 1/sqrt(var + eps) (biased var, in double),           \
 * y = (x - mean) invstd scale + bias; scale, bias have inner elements and may be       \
 * NULL (1, 0).  mean, invstd (outer elements each) may be NULL when not needed.        \
 * y may alias x. */                                                                    \
void k_layernorm_##S(T *y, T *mean, T *invstd, const T *x, const T *scale,              \
                     const T *bias, int64_t outer, int64_t inner, double eps);          \
K_TWIN_T(layernorm, S)                                                                  \
/* backward from the saved mean/invstd: dx (outer x inner), dscale, dbias (inner;      \
 * all written, each NULL to skip).  scale may be NULL (1).  dx may alias dy. */        \
void k_layernorm_grad_##S(T *dx, T *dscale, T *dbias, const T *dy, const T *x,          \
                          const T *mean, const T *invstd, const T *scale,               \
                          int64_t outer, int64_t inner);                                \
K_TWIN_T(layernorm_grad, S)                                                             \
/* BatchNormalization, training mode, x n x c x l (NCHW: l = h w; N x C: l = 1).        \
 * Per channel: batch mean and biased var over n l (double) normalise x:                \
 * y = (x - mean) invstd scale + bias, invstd = 1/sqrt(var + eps); saves mean,          \
 * invstd (c each, NULL to skip).  Running stats, ONNX convention (momentum is the      \
 * weight of the OLD value; torch momentum 0.1 exports as 0.9):                         \
 *   rm_out = momentum rm_in + (1 - momentum) mean                                      \
 *   rv_out = momentum rv_in + (1 - momentum) var n l / (n l - 1)   (UNBIASED, as       \
 *   torch.nn.BatchNorm2d; the ONNX spec text uses the biased var).                     \
 * rm_out / rv_out NULL: no update; they may alias rm_in / rv_in.  scale, bias NULL:    \
 * 1, 0.  y may alias x.  n l == 1 makes rv_out NaN (torch raises instead). */          \
void k_batchnorm_train_##S(T *y, T *mean, T *invstd, T *rm_out, T *rv_out,              \
                           const T *x, const T *scale, const T *bias,                   \
                           const T *rm_in, const T *rv_in, int64_t n, int64_t c,        \
                           int64_t l, double eps, double momentum);                     \
K_TWIN_T(batchnorm_train, S)                                                            \
/* training-mode backward: dx, dscale, dbias (c; NULL to skip) from the saved mean      \
 * and invstd.  dx may alias dy. */                                                     \
void k_batchnorm_grad_##S(T *dx, T *dscale, T *dbias, const T *dy, const T *x,          \
                          const T *mean, const T *invstd, const T *scale,               \
                          int64_t n, int64_t c, int64_t l);                             \
K_TWIN_T(batchnorm_grad, S)                                                             \
/* inference form: y = (x - mean) / sqrt(var + eps) scale + bias per channel.           \
 * y may alias x. */                                                                    \
void k_batchnorm_infer_##S(T *y, const T *x, const T *scale, const T *bias,             \
                           const T *mean, const T *var, int64_t n, int64_t c,           \
                           int64_t l, double eps);                                      \
K_TWIN_T(batchnorm_infer, S)                                                            \
/* The ONNX spec's running variance for a BatchNormalization that trains in an          \
 * --eval build: rv_out = momentum rv_in + (1 - momentum) (1 / invstd^2 - eps), the     \
 * biased batch variance recovered from k_batchnorm_train's saved invstd (in double;    \
 * c channels).  rv_out may alias rv_in. */                                             \
void k_bn_running_var_##S(T *rv_out, const T *rv_in, const T *invstd, int64_t c,        \
                          double eps, double momentum);                                 \
K_TWIN_T(bn_running_var, S)                                                             \
/* ---- conv.c ------------------------------------------------------------- */         \
/* y = conv2d(x, w) + b (b: m elements, NULL for none); ws: k_conv2d_workspace(p)       \
 * elements of T (NULL when that is 0).  GEMMs through k_matmul (CBLAS). */             \
void k_conv2d_##S(const KConv2d *p, T *y, const T *x, const T *w, const T *b,           \
                  T *ws);                                                               \
K_TWIN_T(conv2d, S)                                                                     \
/* dx (written) from dy and w */                                                        \
void k_conv2d_grad_x_##S(const KConv2d *p, T *dx, const T *dy, const T *w, T *ws);      \
K_TWIN_T(conv2d_grad_x, S)                                                              \
/* dw (written) from dy and x */                                                        \
void k_conv2d_grad_w_##S(const KConv2d *p, T *dw, const T *dy, const T *x, T *ws);      \
K_TWIN_T(conv2d_grad_w, S)                                                              \
/* db[m] = sum of dy over n, oh, ow (written) */                                        \
void k_conv2d_grad_b_##S(const KConv2d *p, T *db, const T *dy);                         \
K_TWIN_T(conv2d_grad_b, S)                                                              \
/* MaxPool: y = max over each window's in-bounds taps (padding never wins; NaN          \
 * propagates as torch); arg[] (int64, y's shape) = index ih w + iw within its          \
 * (n, c) plane of the first maximum, as torch's indices (-1: empty window). */         \
void k_maxpool2d_##S(const KPool2d *p, T *y, int64_t *arg, const T *x);                 \
K_TWIN_T(maxpool2d, S)                                                                  \
/* dx (written) = scatter-add of dy to the saved arg positions */                       \
void k_maxpool2d_grad_##S(const KPool2d *p, T *dx, const T *dy, const int64_t *arg);    \
K_TWIN_T(maxpool2d_grad, S)                                                             \
/* AveragePool: sum of in-bounds taps / divisor; divisor = taps inside the padded       \
 * extent [-pt, h + pb) x [-pl, w + pr) if count_include_pad, else in-bounds taps       \
 * (torch avg_pool2d; ceil_mode windows are clipped at the padded extent) */            \
void k_avgpool2d_##S(const KPool2d *p, T *y, const T *x);                               \
K_TWIN_T(avgpool2d, S)                                                                  \
void k_avgpool2d_grad_##S(const KPool2d *p, T *dx, const T *dy);                        \
K_TWIN_T(avgpool2d_grad, S)                                                             \
/* GlobalAveragePool: y[nc] = mean of x[nc][0..hw); backward dx = dy / hw */            \
void k_global_avgpool_##S(T *y, const T *x, int64_t nc, int64_t hw);                    \
K_TWIN_T(global_avgpool, S)                                                             \
void k_global_avgpool_grad_##S(T *dx, const T *dy, int64_t nc, int64_t hw);             \
K_TWIN_T(global_avgpool_grad, S)                                                        \
/* ---- gather.c ----------------------------------------------------------- */         \
/* Gather's backward (embedding backward): dx (outer x axis x inner, zeroed here        \
 * then +=) dx[o][idx[i]][:] += dy[o][i][:] in ascending i (deterministic);             \
 * negative indices wrap; out-of-range ones (k_gather rejected them) are skipped. */    \
void k_gather_grad_##S(T *dx, const T *dy, const int64_t *idx, int64_t outer,           \
                       int64_t axis, int64_t inner, int64_t nidx);                      \
K_TWIN_T(gather_grad, S)                                                                \
/* GatherElements' backward, ScatterElements' scatter-add: dx (xshape, zeroed here)     \
 * [m with m[axis] = idx[m]] += dy[m], m in ascending order along the axis              \
 * (deterministic); shapes as k_gather_elements.  Returns -1, or the position of the    \
 * first index outside [-xshape[axis], xshape[axis]) (dx then unwritten). */            \
int64_t k_gather_elements_grad_##S(T *dx, const T *dy, const int64_t *idx, int rank,   \
                                   const int64_t *shape, const int64_t *xshape, int axis); \
K_TWIN_T(gather_elements_grad, S)                                                       \
/* ---- random.c ----------------------------------------------------------- */         \
/* Dropout, training: mask[i] = u(seed, stream, step, i) >= ratio (uint8 0/1, NULL      \
 * to skip), y = x mask s with s = 1 / (T)(1 - ratio) in T (as torch).  u: Philox       \
 * (see k_philox4x32_10), so the mask depends only on (seed, stream, step, i):          \
 * not on threads, and a recomputed forward gets the same mask.  ratio 0: y = x         \
 * exactly, mask all 1; ratio >= 1: y = 0, mask all 0.  y may alias x. */               \
void k_dropout_##S(T *y, uint8_t *mask, const T *x, int64_t n, double ratio,            \
                   uint64_t seed, uint32_t stream, uint32_t step);                      \
K_TWIN_T(dropout, S)                                                                    \
/* dx = dy mask s (ratio >= 1: 0).  dx may alias dy. */                                 \
void k_dropout_grad_##S(T *dx, const T *dy, const uint8_t *mask, int64_t n,             \
                        double ratio);                                                  \
K_TWIN_T(dropout_grad, S)                                                               \
/* ---- loss.c ------------------------------------------------------------- */         \
/* loss[0] = mean((p - t)^2) over n */                                                  \
void k_mse_##S(T *loss, const T *p, const T *t, int64_t n);                             \
K_TWIN_T(mse, S)                                                                        \
/* dp = dloss[0] * 2 (p - t) / n */                                                     \
void k_mse_grad_##S(T *dp, const T *dloss, const T *p, const T *t, int64_t n);          \
K_TWIN_T(mse_grad, S)                                                                   \
/* loss[0] = mean over rows of logsumexp(x_r) - x_r[label_r]; returns -1, or the        \
 * first row whose label is outside [0, classes) (loss then unwritten) */               \
int64_t k_cross_entropy_##S(T *loss, const T *x, const int64_t *labels,                 \
                            int64_t rows, int64_t classes);                             \
K_TWIN_T(cross_entropy, S)                                                              \
/* dx = dloss[0] * (softmax(x_r) - onehot(label_r)) / rows */                           \
void k_cross_entropy_grad_##S(T *dx, const T *dloss, const T *x,                        \
                              const int64_t *labels, int64_t rows, int64_t classes);    \
K_TWIN_T(cross_entropy_grad, S)                                                         \
/* NegativeLogLikelihoodLoss on log-probabilities lp (n x c x d; d = product of         \
 * the dims after the classes, 1 for n x c) and labels (n x d).  Position i has         \
 * label l = labels[i]; it is ignored when has_ignore and l == ignore_index, else       \
 * w = weights ? weights[l] : 1 and v = -w lp[i / d][l][i % d].  reduction              \
 * K_LOSS_NONE: loss[i] = v (0 where ignored); K_LOSS_SUM: loss[0] = sum of v;          \
 * K_LOSS_MEAN: loss[0] = sum of v / sum of w (NaN when all are ignored); sums in       \
 * double.  Returns -1, or the first position whose label is neither ignored nor        \
 * in [0, c) (loss then unwritten). */                                                  \
int64_t k_nll_loss_##S(T *loss, const T *lp, const int64_t *labels, const T *weights,   \
                       int64_t n, int64_t c, int64_t d, int reduction, int has_ignore,  \
                       int64_t ignore_index);                                           \
K_TWIN_T(nll_loss, S)                                                                   \
/* its backward, all of dx (n x c x d) written: dx = dx_in (NULL: 0), then at each      \
 * counted position dx[i / d][l][i % d] -= w g / ws with g = dloss[i] (NONE) or         \
 * dloss[0], ws = sum of w (MEAN) or 1.  dloss NULL: dx = dx_in or 0 only.              \
 * Labels outside [0, c) are skipped.  dx may alias dx_in. */                           \
void k_nll_loss_grad_##S(T *dx, const T *dx_in, const T *dloss, const int64_t *labels,  \
                         const T *weights, int64_t n, int64_t c, int64_t d,             \
                         int reduction, int has_ignore, int64_t ignore_index);          \
K_TWIN_T(nll_loss_grad, S)                                                              \
/* ---- attn.c ------------------------------------------------------------- */         \
/* Fused attention (passes/attention.c's FusedAttention) over batch problems: for       \
 * each b, S = scale Q_b K_b^T + bias (Q_b t x d; the keys as kt, Kt_b d x s, or with   \
 * krow as rows, K_b s x d; bias t x s of problem b's bias (b / brep) % nbias, NULL     \
 * for none; -inf masks),                                                               \
 * P = softmax over each row of S, y_b = P V_b (V_b s x dv, y_b t x dv), lse[b t + i]   \
 * = the row's log-sum-exp (max + log sum exp(S - max), the sum in double).  K_b and    \
 * V_b are K/V problem b / kvrep: kt and v hold batch / kvrep problems (kvrep >= 1      \
 * divides batch; grouped-query attention's kv heads, each read by kvrep consecutive    \
 * query heads and never repeated in memory).  A row                                    \
 * of -inf gives NaN, as softmax does, or with K_ATTN_ZERO in flags y 0 and lse -inf    \
 * (and no gradient: ONNX Attention's row that attends nothing).  flags: K_ATTN_KROW,   \
 * K_ATTN_ZERO, K_ATTN_CAUSAL (with no bias).  ws: k_attention_workspace(batch, t, s)   \
 * elements of T.  heads 0: each problem's q, k (or kt), v, y dense ([batch, t, d] ..); \
 * heads h > 0 (with K_ATTN_KROW; kvrep divides h): the projections' layout, q and y    \
 * [batch / h, t, h, d], k and v [.., s, h / kvrep, d], problem b being head b % h of   \
 * row b / h (k_attention_at: no copy to or from the heads; lse stays [batch, t]); ld:   \
 * the rows' strides there (KAttnLd; NULL: the dense heads layout's).                    \
 * drop > 0: attention dropout, y = (P o keep / (1 - drop)) V with element (b, i, j)'s  \
 * keep flag k_dropout's for flat index (b t + i) s + j under (seed, stream, step)      \
 * (philox.h: the Dropout node passes/attention.c fused draws the same; lse is the      \
 * undropped softmax's); drop 0: none (then seed, stream, step are not read).  */       \
void k_attention_##S(T *y, T *lse, const T *q, const T *kt, int flags, const T *v,     \
                     const T *bias, int64_t batch, int64_t t, int64_t s, int64_t d,      \
                     int64_t dv, int64_t nbias, int64_t brep, int64_t kvrep,             \
                     int64_t heads, double scale, double drop, uint64_t seed,           \
                     uint32_t stream, uint32_t step, T *ws, const KAttnLd *ld);         \
K_TWIN_T(attention, S)                                                                  \
/* its backward from the saved y and lse: dq, dkt (kt's layout), dval (V's gradient;    \
 * all written), P recomputed tile by tile as exp(S - lse); dkt and dval of a K/V       \
 * problem sum its kvrep query problems' in increasing order; dbias (nbias x t x s,     \
 * NULL: not wanted) = the sum of dS over the problems reading each bias slice, in      \
 * increasing problem order; dy, dq, dkt, dval in y's, q's, kt's, v's layout (heads);  \
 * drop, seed, stream, step: the forward's (the keep flags drawn again, not stored) */  \
void k_attention_grad_##S(T *dq, T *dkt, T *dval, T *dbias, const T *dy, const T *q,    \
                          const T *kt, int flags, const T *v, const T *bias, const T *y, \
                          const T *lse,                                                  \
                          int64_t batch, int64_t t, int64_t s, int64_t d, int64_t dv,    \
                          int64_t nbias, int64_t brep, int64_t kvrep, int64_t heads,    \
                          double scale, double drop, uint64_t seed, uint32_t stream,    \
                          uint32_t step, T *ws, const KAttnLd *ld);                     \
K_TWIN_T(attention_grad, S)                                                             \
/* ---- optim.c ------------------------------------------------------------ */         \
/* Both updates run only at the last micro-step of a step (micro == accum - 1; --accum; \
 * otherwise they return at once).  They first clip: with clip > 0 the gradient is      \
 * g * (T)k_clip_coef(gsq[0], clip), gsq[0] the squared norm of the whole gradient      \
 * (clip 0: g as it is, gsq may be NULL).  Loss scaling (--precision fp16): scale > 0   \
 * is the loss scale S, g holds S times the gradient and gsq[0] the squared norm of the \
 * unscaled one (never NULL then); otherwise g is multiplied by coef * (T)(1/S), one    \
 * factor (scale 0: no loss scaling).  A non-finite gsq[0] (a NaN or inf gradient, an   \
 * fp16 overflow, a non-finite loss: k_nan_unless_finite) skips the update, nothing     \
 * written.                                                                             \
 * PyTorch AdamW: p *= 1 - lr wd; m,v moments; p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps),\
 * bc = 1 - beta^step.  l2: PyTorch Adam instead: g += wd p before the moments, no     \
 * p *= 1 - lr wd.  The rate is lr * lr_mult (a param group's factor, --lr-mult) */     \
void k_adamw_##S(T *p, const T *g, T *m, T *v, int64_t n, double lr, double beta1,      \
                 double beta2, double eps, double wd, int l2, double lr_mult,          \
                 int64_t step, const T *gsq, double clip, double scale, int64_t micro,  \
                 int64_t accum);                                                        \
K_TWIN_T(adamw, S)                                                                      \
/* PyTorch SGD: g += wd p; buf = momentum buf + g (buf = g at step 1); p -= lr buf      \
 * (nesterov: p -= lr (g + momentum buf)); momentum 0: p -= lr g and buf is untouched   \
 * (may be NULL); the rate lr * lr_mult */                                              \
void k_sgd_##S(T *p, const T *g, T *buf, int64_t n, double lr, double momentum,         \
               double wd, int nesterov, double lr_mult, int64_t step, const T *gsq,     \
               double clip, double scale, int64_t micro, int64_t accum);               \
K_TWIN_T(sgd, S)                                                                        \
/* gradient accumulation (--accum): y = x at micro-step 0, y += x after it */           \
void k_grad_accum_##S(T *y, const T *x, int64_t n, int64_t micro);                      \
K_TWIN_T(grad_accum, S)                                                                 \
/* y[0] = sum of x[i]^2 (accumulated in double), plus y[0] when accumulate */           \
void k_sum_squares_##S(T *y, const T *x, int64_t n, int accumulate);                    \
K_TWIN_T(sum_squares, S)

K_DECLARE(float, f32)
K_DECLARE(double, f64)
#undef K_DECLARE

/* torch.nn.utils.clip_grad_norm_'s factor: max_norm / (norm + 1e-6) clamped to at
 * most 1 (NaN stays NaN), norm = sqrt(gsq); clip <= 0: 1 (no clipping) */
static inline double k_clip_coef(double gsq, double clip)
{
    if (!(clip > 0))
        return 1;
    double c = clip / (__builtin_sqrt(gsq) + 1e-6);
    return c > 1 ? 1 : c;
}

/* ---- loss scaling (--precision fp16; optim.c) ---------------------------- */

/* the backward's seed d loss / d loss scaled by the loss scale: y[i] = (float)(scale /
 * accum), n elements (--accum averages the micro-steps) */
void k_loss_seed_f32(float *y, int64_t n, double scale, int64_t accum);
K_TWIN(loss_seed_f32)
/* the squared norm of S times the gradient into the gradient's: y[0] = (float)(y[0] /
 * scale^2), computed in double (S a power of two: exact) */
void k_unscale_sq_f32(float *y, double scale);
K_TWIN(unscale_sq_f32)

/* ---- non-finite steps (optim.c) ------------------------------------------ */

/* the gradient norm's guard: y[0] = NaN when x[0] is not finite, else y[0] as
 * it is; y, x scalars of dtype K_DT_F32 or K_DT_F64 (the squared norm, the
 * loss), so that a step with a non-finite loss updates nothing */
void k_nan_unless_finite(int ydt, void *y, int xdt, const void *x);
K_TWIN(nan_unless_finite)

/* ---- bfloat16 (--precision bf16) ---------------------------------------- */

/* float -> bfloat16 bits, rounded to nearest even; infinities stay, a NaN
 * stays a (quiet) NaN of the same sign.  bfloat16 -> float is exact. */
static inline uint16_t k_bf16_from_f32(float f)
{
    union { float f; uint32_t u; } x = {f};
    if ((x.u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x.u >> 16) | 0x0040u);
    return (uint16_t)((x.u + 0x7fffu + ((x.u >> 16) & 1u)) >> 16);
}
static inline float k_bf16_to_f32(uint16_t h)
{
    union { uint32_t u; float f; } x = {(uint32_t)h << 16};
    return x.f;
}
/* f rounded to bfloat16 and widened back, k_bf16_to_f32(k_bf16_from_f32(f))
 * bit for bit, in 32-bit lanes: a vectorised loop (the fused loops' rounding
 * of each intermediate) needs no narrowing to 16 bits and widening back */
static inline float k_bf16_round(float f)
{
    union { float f; uint32_t u; } x = {f};
    x.u = (x.u & 0x7fffffffu) > 0x7f800000u ? (x.u | 0x00400000u) & 0xffff0000u
                                             : (x.u + 0x7fffu + ((x.u >> 16) & 1u)) & 0xffff0000u;
    return x.f;
}
/* the bfloat16 bits of a float that is a bfloat16 number (k_bf16_to_f32's inverse, NaN payloads kept;
 * k_bf16_from_f32's bits there, without its rounding): the fused loops' index into a table of a unary op at
 * every bfloat16 value, and their store of a value k_bf16_round made (codegen/emit_fused.c) */
static inline uint16_t k_bf16_bits(float f)
{
    union { float f; uint32_t u; } x = {f};
    return (uint16_t)(x.u >> 16);
}
/* k_matmul with bfloat16 operands and a float32 result, accumulated in
 * float32 (the contract of a mixed-precision GEMM: every product of two
 * bfloat16 values is exact in float32); otherwise as k_matmul_f32.
 * matmul_bf16.c: oneDNN's bf16 GEMM where the CPU has AVX512-BF16, else
 * k_matmul_widened_16. */
void k_matmul_bf16(float *c, const uint16_t *a, const uint16_t *b, int64_t batch, int64_t sa,
                   int64_t sb, int64_t m, int64_t n, int64_t k, int ta, int tb, double beta);
K_TWIN(matmul_bf16)
/* k_matmul_add with bfloat16 operands and a float32 result, bias and addend */
void k_matmul_add_bf16(float *c, const uint16_t *a, const uint16_t *b, const float *bias, const float *add,
                       double alpha, int64_t batch, int64_t sa, int64_t sb, int64_t m, int64_t n, int64_t k, int ta,
                       int tb);
K_TWIN(matmul_add_bf16)
/* k_matmul's 16-bit GEMM through k_gemm_f32 on widened operands (f16:
 * float16, else bfloat16), C = alpha op(A) op(B) + beta C: k_matmul_f16's
 * path, and k_matmul_bf16's where oneDNN has no native bf16 GEMM */
void k_matmul_widened_16(float *c, const uint16_t *a, const uint16_t *b, int64_t batch, int64_t sa, int64_t sb,
                         int64_t m, int64_t n, int64_t k, int ta, int tb, double alpha, double beta, int f16);
/* k_matmul_add on 16-bit operands, widened as k_matmul_widened_16 (f16: float16, else bfloat16), C preset to
 * bias + add tile by tile by the thread computing the tile (in the GEMM's own parallel region, or the step's team
 * that shares): k_matmul_add_f16's path, and k_matmul_add_bf16's where oneDNN has no native bf16 GEMM */
void k_matmul_add_widened_16(float *c, const uint16_t *a, const uint16_t *b, const float *bias, const float *add,
                             double alpha, int64_t batch, int64_t sa, int64_t sb, int64_t m, int64_t n, int64_t k,
                             int ta, int tb, int f16);
/* A MatMulAdd whose result is stored in bfloat16 (passes/fuse.c's gemm_low_out): y (rows x n) = alpha A
 * op(B) + bias (each row) + add, rounded once, computed wrows rows at a time in the float32 scratch w
 * (wrows x n): A rows x k, B n x k (tb) or k x n; bias, add may be NULL.  The bits of k_matmul_add_bf16 into
 * w and a k_cast of it, block by block (the native GEMM does just that; the widened one rounds each tile into
 * y as it is done, one parallel region for the call: k_matmul_add_rows_16; in a team that shares, k_share, each
 * thread its rows of each block or its tiles) */
void k_matmul_add_rows_bf16(uint16_t *y, float *w, int64_t wrows, const uint16_t *a, const uint16_t *b,
                            const float *bias, const float *add, double alpha, int64_t rows, int64_t n, int64_t k,
                            int tb);
/* k_matmul_add_rows_bf16 of float16 operands and y (always widened) */
void k_matmul_add_rows_f16(uint16_t *y, float *w, int64_t wrows, const uint16_t *a, const uint16_t *b,
                           const float *bias, const float *add, double alpha, int64_t rows, int64_t n, int64_t k,
                           int tb);
/* the widened path of both (f16: float16, else bfloat16) */
void k_matmul_add_rows_16(uint16_t *y, float *w, int64_t wrows, const uint16_t *a, const uint16_t *b,
                          const float *bias, const float *add, double alpha, int64_t rows, int64_t n, int64_t k,
                          int tb, int f16);
/* The widening's blocks: op(A) in K_WIDE_BM x K_WIDE_BK, op(B) in K_WIDE_BK x
 * K_WIDE_BN; the floats an m x n x k GEMM widens into at once. */
#define K_WIDE_BM 512
#define K_WIDE_BN 512
#define K_WIDE_BK 256
static inline int64_t k_gemm_widened_scratch(int64_t m, int64_t n, int64_t k)
{
    m = m < 0 ? 0 : m < K_WIDE_BM ? m : K_WIDE_BM;
    n = n < 0 ? 0 : n < K_WIDE_BN ? n : K_WIDE_BN;
    k = k < 0 ? 0 : k < K_WIDE_BK ? k : K_WIDE_BK;
    return m * k + k * n;
}
/* One GEMM of 16-bit operands with leading dimensions, row-major: op(A)
 * m x k (a, lda), op(B) k x n (b, ldb), C m x n (c, ldc) = alpha op(A)
 * op(B) + beta C, accumulated in float32; beta 0 never reads C.  Through
 * k_gemm_f32 on blocks widened into w (wn floats, at least
 * k_gemm_widened_scratch(m, n, k)).  k_matmul_widened_16's tiles, one per
 * thread of its team; the fused attention's (kernels/c/attn.c), one per
 * thread of its team, each with its own w. */
void k_gemm_widened_16(float *c, int64_t ldc, const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb,
                       int64_t m, int64_t n, int64_t k, int ta, int tb, double alpha, double beta, int f16, float *w,
                       int64_t wn);
/* k_gemm_widened_16 on bfloat16 operands, through oneDNN's bf16 GEMM where
 * it is native (w unused), else widened (matmul_bf16.c) */
void k_gemm_bf16(float *c, int64_t ldc, const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, int64_t m,
                 int64_t n, int64_t k, int ta, int tb, double alpha, double beta, float *w, int64_t wn);
/* Does oneDNN compute bfloat16 GEMMs natively at ISA `isa` (its
 * dnnl_get_effective_cpu_isa(): the CPU's, capped by DNNL_MAX_CPU_ISA)?  Yes
 * from avx512_core_bf16 (AVX512-BF16's vdpbf16ps; AMX above it) up; below it
 * k_matmul_bf16 widens.  The one rule matmul_bf16.c's choice and the
 * compiler's --precision bf16 note (codegen/notes.c) follow; the value is
 * dnnl_cpu_isa_avx512_core_bf16 (matmul_bf16.c asserts it). */
#define K_DNNL_ISA_AVX512_CORE_BF16 0xe7u
static inline int k_bf16_isa_native(unsigned isa)
{
    return (isa & K_DNNL_ISA_AVX512_CORE_BF16) == K_DNNL_ISA_AVX512_CORE_BF16;
}
/* k_cross_entropy_f32 and its gradient on 16-bit logits (loss.c): x and dx bfloat16 / float16 bits, the loss
 * and dloss float32, every sum in double */
int64_t k_cross_entropy_bf16(float *loss, const uint16_t *x, const int64_t *labels, int64_t rows, int64_t classes);
K_TWIN(cross_entropy_bf16)
void k_cross_entropy_grad_bf16(uint16_t *dx, const float *dloss, const uint16_t *x, const int64_t *labels,
                               int64_t rows, int64_t classes);
K_TWIN(cross_entropy_grad_bf16)
int64_t k_cross_entropy_f16(float *loss, const uint16_t *x, const int64_t *labels, int64_t rows, int64_t classes);
K_TWIN(cross_entropy_f16)
void k_cross_entropy_grad_f16(uint16_t *dx, const float *dloss, const uint16_t *x, const int64_t *labels,
                              int64_t rows, int64_t classes);
K_TWIN(cross_entropy_grad_f16)
/* 1: k_matmul_bf16 / k_gemm_bf16 run oneDNN's native bf16 GEMM on this CPU;
 * 0: they widen to float32 (k_bf16_isa_native, decided once) */
int k_bf16_gemm_native(void);
/* k_layernorm_f32 of bfloat16 x into bfloat16 y (norm.c: --precision bf16's
 * LayerNorm of a bfloat16 residual whose result only GEMMs read), mean,
 * invstd, scale and bias float32: x widened as loaded, every step in float32,
 * y rounded once as stored (the bits of Casts around k_layernorm_f32) */
void k_layernorm_bf16(uint16_t *y, float *mean, float *invstd, const uint16_t *x, const float *scale,
                      const float *bias, int64_t outer, int64_t inner, double eps);
K_TWIN(layernorm_bf16)
/* k_layernorm_grad_f32 of bfloat16 x (norm.c: --precision bf16's LayerNorm
 * backward on the cpu target, where x is stored bfloat16: the residual),
 * a bfloat16 x, dy, dx and the rest float32: x widened as loaded, so the bits
 * of a Cast of x to float32 and k_layernorm_grad_f32, without the float32
 * copy.  No cuda twin: the cuda target's LayerNorm backward reads float32 x
 * (passes/precision.c) */
void k_layernorm_grad_bf16(float *dx, float *dscale, float *dbias, const float *dy, const uint16_t *x,
                           const float *mean, const float *invstd, const float *scale, int64_t outer, int64_t inner);
/* k_reduce_sum_to_f32 of bfloat16 x (reduce.c: a bias gradient of a bfloat16 dY
 * under --precision bf16): each element widened as it is loaded, so the same
 * bits as a Cast to float32 and k_reduce_sum_to_f32 */
void k_reduce_sum_to_bf16(float *y, const uint16_t *x, int rank, const int64_t *xshape, const int64_t *yshape);
K_TWIN(reduce_sum_to_bf16)
/* k_attention_f32 and its backward with q, kt, v, y, dy and the gradients dq,
 * dkt, dval in bfloat16 (attn_bf16.c), as flash attention computes: the
 * scores, the softmax statistics and every sum in float32; every GEMM on
 * 16-bit operands (S = Q Kt; P rounded for P V; in the backward dP = dY V^T,
 * P and dS rounded for dV += P^T dY, dQ = scale dS K, dKt += scale Q^T dS);
 * y, dq, dkt and dval computed in float32 and rounded once as stored (the
 * bits of float32 results and a Cast), dy and y widened where they are
 * summed.  lse, the bias and dbias are float32.
 * ws: k_attention_workspace_16(batch, t, s, d, dv) floats. */
void k_attention_bf16(uint16_t *y, float *lse, const uint16_t *q, const uint16_t *kt, int flags, const uint16_t *v,
                      const float *bias, int64_t batch, int64_t t, int64_t s, int64_t d, int64_t dv, int64_t nbias,
                      int64_t brep, int64_t kvrep, int64_t heads, double scale, double drop, uint64_t seed,
                      uint32_t stream, uint32_t step, float *ws, const KAttnLd *ld);
K_TWIN(attention_bf16)
void k_attention_grad_bf16(uint16_t *dq, uint16_t *dkt, uint16_t *dval, float *dbias, const uint16_t *dy,
                           const uint16_t *q, const uint16_t *kt, int flags, const uint16_t *v, const float *bias,
                           const uint16_t *y, const float *lse, int64_t batch, int64_t t, int64_t s, int64_t d, int64_t dv,
                           int64_t nbias, int64_t brep, int64_t kvrep, int64_t heads, double scale,
                           double drop, uint64_t seed, uint32_t stream, uint32_t step, float *ws,
                          const KAttnLd *ld);
K_TWIN(attention_grad_bf16)
/* C = bias (each row) + add over rows x n: the C a MatMulAdd's beta-1 GEMM
 * adds into (add may be c itself) */
void k_matmul_epilogue_f32(float *c, const float *bias, const float *add, int64_t rows, int64_t n);

/* ---- float16 (--precision fp16) ------------------------------------------ */

/* float -> IEEE binary16 bits, rounded to nearest even: above the largest
 * half (65504) a value rounds to infinity from 65520 on, below 2^-14 to a
 * subnormal half (multiples of 2^-24), below 2^-25 to a signed zero; a NaN
 * stays a quiet NaN of the same sign with the top of its payload.  Plain C:
 * no _Float16, no F16C. */
static inline uint16_t k_f16_from_f32(float f)
{
    union { float f; uint32_t u; } x = {f};
    uint32_t sign = (x.u >> 16) & 0x8000u, a = x.u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* >= 65520, infinity included */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* a normal half: rebias the exponent (127 -> 15), round 13 bits off */
        uint32_t r = a - 0x38000000u;
        return (uint16_t)(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
    }
    if (a <= 0x33000000u) /* at most 2^-25, half the smallest subnormal: the tie goes to zero */
        return (uint16_t)sign;
    /* a subnormal half: round(value / 2^-24), value = m 2^(e-150) */
    uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126u - (a >> 23); /* 14..24 */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    q += rem > half || (rem == half && (q & 1u));
    return (uint16_t)(sign | q); /* q = 1024 is the smallest normal half, as it should be */
}
/* IEEE binary16 bits -> float: exact (NaN payloads kept) */
static inline float k_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    union { uint32_t u; float f; } x;
    if (e == 0x1fu)
        x.u = sign | 0x7f800000u | (m << 13);
    else if (e)
        x.u = sign | ((e + 112u) << 23) | (m << 13);
    else { /* zero or subnormal: m 2^-24, exact in float */
        x.f = (float)m * 0x1p-24f;
        x.u |= sign;
    }
    return x.f;
}
/* k_matmul with float16 operands and a float32 result, accumulated in
 * float32 (every product of two float16 values is exact in float32); as
 * k_matmul_bf16 otherwise */
void k_matmul_f16(float *c, const uint16_t *a, const uint16_t *b, int64_t batch, int64_t sa,
                  int64_t sb, int64_t m, int64_t n, int64_t k, int ta, int tb, double beta);
K_TWIN(matmul_f16)
/* k_matmul_add with float16 operands */
void k_matmul_add_f16(float *c, const uint16_t *a, const uint16_t *b, const float *bias, const float *add,
                      double alpha, int64_t batch, int64_t sa, int64_t sb, int64_t m, int64_t n, int64_t k, int ta,
                      int tb);
K_TWIN(matmul_add_f16)
/* k_layernorm_bf16 of float16 x and y */
void k_layernorm_f16(uint16_t *y, float *mean, float *invstd, const uint16_t *x, const float *scale,
                     const float *bias, int64_t outer, int64_t inner, double eps);
K_TWIN(layernorm_f16)
/* k_layernorm_grad_bf16 of float16 x */
void k_layernorm_grad_f16(float *dx, float *dscale, float *dbias, const float *dy, const uint16_t *x,
                          const float *mean, const float *invstd, const float *scale, int64_t outer, int64_t inner);
/* k_reduce_sum_to_bf16 of float16 x */
void k_reduce_sum_to_f16(float *y, const uint16_t *x, int rank, const int64_t *xshape, const int64_t *yshape);
K_TWIN(reduce_sum_to_f16)
/* k_attention_bf16 and its backward with q, kt, v in float16 (attn.c; the
 * GEMMs widened: k_gemm_widened_16) */
void k_attention_f16(uint16_t *y, float *lse, const uint16_t *q, const uint16_t *kt, int flags, const uint16_t *v,
                     const float *bias, int64_t batch, int64_t t, int64_t s, int64_t d, int64_t dv, int64_t nbias,
                     int64_t brep, int64_t kvrep, int64_t heads, double scale, double drop, uint64_t seed,
                     uint32_t stream, uint32_t step, float *ws, const KAttnLd *ld);
K_TWIN(attention_f16)
void k_attention_grad_f16(uint16_t *dq, uint16_t *dkt, uint16_t *dval, float *dbias, const uint16_t *dy,
                          const uint16_t *q, const uint16_t *kt, int flags, const uint16_t *v, const float *bias,
                          const uint16_t *y, const float *lse, int64_t batch, int64_t t, int64_t s, int64_t d, int64_t dv,
                          int64_t nbias, int64_t brep, int64_t kvrep, int64_t heads, double scale,
                          double drop, uint64_t seed, uint32_t stream, uint32_t step, float *ws,
                          const KAttnLd *ld);
K_TWIN(attention_grad_f16)

/* ---- threads -------------------------------------------------------------
 * The kernels' team: OpenMP for the kernels and the generated step's loops,
 * OpenBLAS's own threads for GEMMs.  k_threads sets each count that is not
 * fixed by its environment variable (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS),
 * writes what each ended up as and why into why[0..cap), and returns the
 * GEMMs' count (OpenBLAS's). */
int k_threads(int n, char *why, size_t cap);
/* the team's counts as they are (OpenMP's, OpenBLAS's), and set whatever the environment says (the start-up
 * probe of the GEMM libraries runs on one thread, then puts them back) */
void k_team_get(int *omp, int *blas);
void k_team_set(int omp, int blas);
/* narrows [*lo, *hi) to this thread's static share of it inside a parallel region (the generated step runs several
 * calls of an elementwise kernel, each on its share, in one team); outside one, leaves it whole */
void k_team_share(int64_t *lo, int64_t *hi);
/* k_share(1) on every thread of a parallel region: the kernels called next that share (k_copy_strided,
 * k_transpose_*, k_binary, k_reduce_sum_to, k_layernorm, k_layernorm_grad, the float32 GEMMs and fused attention,
 * k_unary, k_cross_entropy, k_sum_squares, ...: codegen/team.c's list) each do this thread's share of their work,
 * with no fork (the caller places the barriers the data needs: the step's runs of nodes in one team,
 * codegen/team.c; a sum's one value is written by the first thread); k_share(0) before the region ends */
void k_share(int on);
/* the name of the kernels OpenBLAS runs on this CPU (openblas_get_corename: its own choice, or OPENBLAS_CORETYPE's;
 * its "Haswell" and "Zen" kernels sum differently on different thread counts) */
const char *k_blas_kernels(void);

/* ---- the float32 GEMM's library (matmul.c) --------------------------------
 * Every float32 GEMM runs on one library for the whole process: OpenBLAS
 * (the default) or oneDNN, set by k_gemm_use once before any step (the
 * executable measures both at start-up: runtime/dev_host.c).  float64 GEMMs
 * are OpenBLAS's whatever the choice. */
enum { K_GEMM_OPENBLAS, K_GEMM_ONEDNN };
void k_gemm_use(int lib);
int k_gemm_lib(void);
const char *k_gemm_name(int lib); /* "OpenBLAS", "oneDNN" */
/* One float32 GEMM, row-major with leading dimensions: op(A) m x k (a,
 * lda), op(B) k x n (b, ldb), C m x n (c, ldc) = alpha op(A) op(B) + beta C;
 * k 0 is C = beta C, beta 0 never reads C.  k_gemm_f32 on the chosen
 * library, k_gemm_f32_on on `lib` (the start-up probe, the tests). */
void k_gemm_f32(float *c, int64_t ldc, const float *a, int64_t lda, const float *b, int64_t ldb, int64_t m,
                int64_t n, int64_t k, int ta, int tb, double alpha, double beta);
void k_gemm_f32_on(int lib, float *c, int64_t ldc, const float *a, int64_t lda, const float *b, int64_t ldb,
                   int64_t m, int64_t n, int64_t k, int ta, int tb, double alpha, double beta);

/* ---- int64 and dtype-generic kernels ------------------------------------ */

/* k_binary on int64 (ops.def's F_I64 rows: K_ADD, K_SUB, K_MUL, K_DIV, K_MIN,
 * K_MAX, K_MOD, K_FMOD; fused.h's kf_binary_i64).  Returns -1, or the
 * position in y of the first element divided by zero (y[i] = 0 there). */
int64_t k_binary_i64(int op, int64_t *y, const int64_t *a, const int64_t *b, int rank,
                     const int64_t *shape, const int64_t *sa, const int64_t *sb);
K_TWIN(binary_i64)
/* k_compare on int64 inputs (same contract as the float ones) */
void k_compare_i64(int op, uint8_t *y, const int64_t *a, const int64_t *b, int rank,
                   const int64_t *shape, const int64_t *sa, const int64_t *sb);
K_TWIN(compare_i64)
/* y[i] = !x[i] (bool: any nonzero byte is true); y may alias x */
void k_not(uint8_t *y, const uint8_t *x, int64_t n);
K_TWIN(not)
/* y = (to) x elementwise, n elements of dtype codes K_DT_*.  float -> float
 * rounds to nearest; float -> int truncates toward zero, NaN gives 0 and
 * out-of-range values saturate (ONNX leaves both undefined); int -> narrower
 * int wraps (two's complement); -> BOOL is x != 0.  y may alias x only when
 * both have the same element size. */
void k_cast(int to, void *y, int from, const void *x, int64_t n);
K_TWIN(cast)
/* ONNX Where: y[idx] = c[idx . sc] ? a[idx . sa] : b[idx . sb] (c: bool bytes,
 * nonzero = true), y dense over shape, every operand broadcast by its strides
 * (0), esize-byte elements. */
void k_where(int esize, void *y, const uint8_t *c, const void *a, const void *b,
             int rank, const int64_t *shape, const int64_t *sc, const int64_t *sa,
             const int64_t *sb);
K_TWIN(where)
/* y[yoff + idx . ys] = x[xoff + idx . xs] for every idx of shape (esize-byte
 * elements; strides may be negative or 0 in x).  The y positions must be
 * distinct (ys is never 0 on a dim of length > 1) and must not overlap x.
 * Slice (any steps: negative step = negative xs, xoff = the first element
 * read), Split parts, Expand (xs 0), Tile (rank 2r: y viewed as
 * [rep0, x0, rep1, x1, ..], x strides [0, xs0, 0, xs1, ..]) and each Concat
 * input (x dense, y = the output's strides, yoff = the input's start along
 * the axis times that axis's stride) are all one call. */
void k_copy_strided(int esize, int rank, const int64_t *shape, void *y, int64_t yoff,
                    const int64_t *ys, const void *x, int64_t xoff, const int64_t *xs);
K_TWIN(copy_strided)
/* Trilu on the last two dims of batch x rows x cols: keep element (i, j) when
 * j - i >= k (upper) or j - i <= k (lower), else 0 (all-zero bytes).  Also its
 * own backward (apply to dy).  y may alias x. */
void k_trilu(int esize, int upper, void *y, const void *x, int64_t batch,
             int64_t rows, int64_t cols, int64_t k);
K_TWIN(trilu)
/* k_range on int64: y[i] = start + i delta, i < n */
void k_range_i64(int64_t *y, int64_t start, int64_t delta, int64_t n);
K_TWIN(range_i64)
/* Gather along an axis: x is outer x axis x inner, idx has nidx int64 entries
 * (any shape, flattened), y is outer x nidx x inner: y[o][i][:] =
 * x[o][idx[i]][:], negative indices counting from the end.  Returns -1, or
 * the position in idx of the first index outside [-axis, axis) (y then
 * unwritten). */
int64_t k_gather(int esize, void *y, const void *x, const int64_t *idx, int64_t outer,
                 int64_t axis, int64_t inner, int64_t nidx);
K_TWIN(gather)
/* GatherElements along an axis: idx (and y) have shape[rank], x has xshape,
 * the same rank with shape[d] <= xshape[d] for d != axis, all contiguous:
 * y[m] = x[m with m[axis] replaced by idx[m]], negative indices counting
 * from the end.  Returns -1, or the position in idx of the first index
 * outside [-xshape[axis], xshape[axis]) (y then unwritten). */
int64_t k_gather_elements(int esize, void *y, const void *x, const int64_t *idx, int rank,
                          const int64_t *shape, const int64_t *xshape, int axis);
K_TWIN(gather_elements)
/* GatherND's / ScatterND's index tuples as positions: idx is batch x nq x k
 * (k <= 8 components indexing dims[0..k)), y is batch x nq: y[b][q] =
 * b span + the row-major offset of the tuple idx[b][q] in dims (span =
 * the product of dims), negative components counting from the end.
 * Returns -1, or the position in idx of the first component outside
 * [-dims[i], dims[i]) (y then unwritten). */
int64_t k_nd_index(int64_t *y, const int64_t *idx, int64_t batch, int64_t nq, int k, const int64_t *dims);
K_TWIN(nd_index)
/* ---- convolution and pooling geometry (host arithmetic, inline: shared by
 * kernels/c, the cuda launchers and the compiler's shape rules) ---------- */

/* Output length of one pooling / convolution dim (torch pooling_output_shape):
 * (in + pb + pe - dilation (k - 1) - 1) / stride + 1, rounded up if ceil_mode,
 * minus one if ceil_mode makes the last window start past in + pb. */
static inline int64_t k_pool_out_dim(int64_t in, int64_t k, int64_t stride, int64_t pb, int64_t pe,
                                     int64_t dilation, int ceil_mode)
{
    int64_t num = in + pb + pe - dilation * (k - 1) - 1, out;
    if (num < 0 || stride <= 0)
        return 0;
    out = (ceil_mode ? (num + stride - 1) / stride : num / stride) + 1;
    /* the last window must start inside the input or the begin padding */
    if (ceil_mode && (out - 1) * stride >= in + pb)
        out--;
    return out;
}

/* k_attention: query rows per tile (at most), and the most threads it splits
 * across; each thread has a workspace slot of 2 k_attention_rows(t) s elements */
#define K_ATTN_ROWS 64
/* k_attention's flags: the keys as rows (s x d, not kt d x s); a row of all -inf scores gives 0, not NaN */
#define K_ATTN_KROW 1
#define K_ATTN_ZERO 2
/* the causal band, computed instead of read from a bias (passes/attention.c): query i sees key j where
 * j <= i + s - t and, with a window w (flags >> K_ATTN_WINDOW_SHIFT, 0: none), j > i + s - t - w */
#define K_ATTN_CAUSAL 4
#define K_ATTN_WINDOW_SHIFT 8
#define K_ATTN_WINDOW_MAX ((int64_t)1 << 22) /* windows the flags can carry */
#define K_ATTN_SLOTS 16
/* the first row of problem p in a tensor of problems of rows x w (heads 0: dense [P, rows, w]; heads h: [P / h,
 * rows, h, w], problem p head p % h, the rows ld apart: h w, or more where they hold other operands too: KAttnLd)
 * and the dense heads layout's stride (k_attention's layouts) */
static inline int64_t k_attention_at(int64_t p, int64_t rows, int64_t heads, int64_t w, int64_t ld)
{
    return heads ? p / heads * rows * ld + p % heads * w : p * rows * w;
}
static inline int64_t k_attention_ld(int64_t heads, int64_t w) { return heads ? heads * w : w; }
static inline int64_t k_attention_rows(int64_t t)
{
    return t < K_ATTN_ROWS ? (t > 0 ? t : 1) : K_ATTN_ROWS;
}
/* the workspace slots k_attention and k_attention_grad use: one per thread
 * that can have work (the forward's tiles; the backward has fewer units) */
static inline int64_t k_attention_slots(int64_t batch, int64_t t)
{
    const int64_t r = k_attention_rows(t), units = batch * ((t + r - 1) / r);
    return units < K_ATTN_SLOTS ? (units > 0 ? units : 0) : K_ATTN_SLOTS;
}
/* a slot of the float32 / float64 kernels: the tile's scores and their gradient, R s elements of T each */
static inline int64_t k_attention_slot(int64_t t, int64_t s)
{
    return 2 * k_attention_rows(t) * (s > 0 ? s : 0);
}
/* elements of T k_attention and k_attention_grad need in ws */
static inline int64_t k_attention_workspace(int64_t batch, int64_t t, int64_t s)
{
    return k_attention_slots(batch, t) * k_attention_slot(t, s);
}
/* the widened GEMM scratch (k_gemm_widened_scratch) of the largest GEMM of the 16-bit kernels' tiles: R query
 * rows, up to s keys (attn_impl.h's six products, dK's in both key layouts; each monotone in s: keep the two in
 * step) */
static inline int64_t k_attention_gemm_scratch(int64_t t, int64_t s, int64_t d, int64_t dv)
{
    const int64_t r = k_attention_rows(t), shapes[7][3] = {
        {r, s, d}, {r, dv, s}, {s, dv, r}, {r, s, dv}, {r, d, s}, {s, d, r}, {d, s, r}}; /* m, n, k */
    int64_t most = 0;
    for (int i = 0; i < 7; i++) {
        const int64_t w = k_gemm_widened_scratch(shapes[i][0], shapes[i][1], shapes[i][2]);
        most = w > most ? w : most;
    }
    return most;
}
/* a slot of the bfloat16 / float16 kernels (k_attention_bf16, ...), in floats: the scores and their gradient
 * (R s each), P or dS rounded to 16 bits (R s halves), the GEMMs' widening scratch, a float32 tile of y or dq
 * (R max(d, dv)), a K/V problem's float32 dkt and dval (d s + s dv) and a tile's dY and Y widened (2 R dv) */
static inline int64_t k_attention_slot_16(int64_t t, int64_t s, int64_t d, int64_t dv)
{
    const int64_t r = k_attention_rows(t);
    s = s > 0 ? s : 0, d = d > 0 ? d : 0, dv = dv > 0 ? dv : 0;
    return 2 * r * s + (r * s + 1) / 2 + k_attention_gemm_scratch(t, s, d, dv) + r * (d > dv ? d : dv) + d * s +
           s * dv + 2 * r * dv;
}
/* floats k_attention_bf16 / _f16 and their backward need in ws */
static inline int64_t k_attention_workspace_16(int64_t batch, int64_t t, int64_t s, int64_t d, int64_t dv)
{
    return k_attention_slots(batch, t) * k_attention_slot_16(t, s, d, dv);
}

/* a 1x1 stride-1 unpadded convolution runs straight on x / dx (no workspace) */
static inline int k_conv2d_is_direct(const KConv2d *p)
{
    return p->kh == 1 && p->kw == 1 && p->sh == 1 && p->sw == 1 && p->pt == 0 && p->pl == 0 &&
           p->pb == 0 && p->pr == 0;
}

/* Elements of T that k_conv2d_* need in ws: c/groups kh kw oh ow, or 0 for a
 * direct convolution. */
static inline int64_t k_conv2d_workspace(const KConv2d *p)
{
    if (k_conv2d_is_direct(p) || p->groups <= 0)
        return 0;
    return p->c / p->groups * p->kh * p->kw * p->oh * p->ow;
}

/* ---- conv_dnnl.c: float32 convolutions on oneDNN's primitives ----------- */
enum { K_CONV_FWD, K_CONV_BWD_X, K_CONV_BWD_W };   /* directions: y, dx, dw (and db) */
enum { K_CONV_DNNL_PLAIN, K_CONV_DNNL_BLOCKED };   /* the primitive on nchw / oihw, or on its own layouts */
/* One convolution of geometry p in direction dir on oneDNN (primitive cached
 * per geometry, direction, layout, bias and dtype), every operand plain (nchw,
 * oihw / goihw):
 *   K_CONV_FWD:   out = y  from a = x,  b = w, bias (m, NULL: none);
 *   K_CONV_BWD_X: out = dx from a = dy, b = w;
 *   K_CONV_BWD_W: out = dw from a = x,  b = dy, and db (m, written; NULL: not computed).
 * a and b hold dt (K_DT_F32, K_DT_BF16 or K_DT_F16); out, bias and db are
 * float32, accumulated in float32.  Results are written.  Scratch comes from
 * the file's own buffer (k_conv2d_dnnl_bytes). */
void k_conv2d_dnnl(const KConv2d *p, int dir, int layout, int dt, float *out, const void *a, const void *b,
                   const float *bias, float *db);
static inline void k_conv2d_dnnl_f32(const KConv2d *p, int dir, int layout, float *out, const float *a,
                                     const float *b, const float *bias, float *db)
{
    k_conv2d_dnnl(p, dir, layout, K_DT_F32, out, a, b, bias, db);
}
/* k_conv2d_f32 and its gradients with 16-bit inputs (x, w, dy: bfloat16 or
 * float16 bits) and float32 results, accumulated in float32, as
 * torch.autocast's convolutions (--precision bf16 / fp16).  Always on oneDNN
 * (conv.c): natively in bfloat16 where the GEMMs are (k_bf16_isa_native),
 * else on float32 primitives whose reorders widen the operands.  ws is
 * unused (the signature is k_conv2d_f32's). */
void k_conv2d_bf16(const KConv2d *p, float *y, const uint16_t *x, const uint16_t *w, const float *b, float *ws);
void k_conv2d_grad_x_bf16(const KConv2d *p, float *dx, const uint16_t *dy, const uint16_t *w, float *ws);
void k_conv2d_grad_w_bf16(const KConv2d *p, float *dw, const uint16_t *dy, const uint16_t *x, float *ws);
void k_conv2d_grad_b_bf16(const KConv2d *p, float *db, const uint16_t *dy);
void k_conv2d_f16(const KConv2d *p, float *y, const uint16_t *x, const uint16_t *w, const float *b, float *ws);
void k_conv2d_grad_x_f16(const KConv2d *p, float *dx, const uint16_t *dy, const uint16_t *w, float *ws);
void k_conv2d_grad_w_f16(const KConv2d *p, float *dw, const uint16_t *dy, const uint16_t *x, float *ws);
void k_conv2d_grad_b_f16(const KConv2d *p, float *db, const uint16_t *dy);
/* The layout k_conv2d_f32 and its gradients run direction dir of p on oneDNN
 * with, or -1: conv.c's im2col + GEMM.  A rule measured per shape class
 * (conv_dnnl.c), taken only where oneDNN jits (AVX2 and up); FSDPC_CONV=im2col
 * or =onednn forces either path (tests). */
int k_conv2d_dnnl_layout(const KConv2d *p, int dir);
/* bytes of the buffer the oneDNN convolutions hold for scratchpads and staging (the largest one's need so far) */
int64_t k_conv2d_dnnl_bytes(void);
/* oneDNN's name for the implementation it runs (p, dir, layout, bias) with */
const char *k_conv2d_dnnl_impl(const KConv2d *p, int dir, int layout, int bias, int dt);

/* NULL, or what is wrong with geometry no caller should produce (the
 * kernels abort with it) */
static inline const char *k_conv2d_bad(const KConv2d *p)
{
    if (p->groups <= 0 || p->c % p->groups || p->m % p->groups)
        return "groups must divide c and m";
    if (p->sh < 1 || p->sw < 1 || p->dh < 1 || p->dw < 1 || p->pt < 0 || p->pl < 0 || p->pb < 0 || p->pr < 0)
        return "strides and dilations must be >= 1, pads >= 0";
    if (p->oh != k_pool_out_dim(p->h, p->kh, p->sh, p->pt, p->pb, p->dh, 0) ||
        p->ow != k_pool_out_dim(p->w, p->kw, p->sw, p->pl, p->pr, p->dw, 0))
        return "oh / ow do not match the geometry";
    return 0;
}

static inline const char *k_pool2d_bad(const KPool2d *p)
{
    if (p->sh < 1 || p->sw < 1 || p->dh < 1 || p->dw < 1 || p->pt < 0 || p->pl < 0 || p->pb < 0 || p->pr < 0)
        return "strides and dilations must be >= 1, pads >= 0";
    if (p->oh < k_pool_out_dim(p->h, p->kh, p->sh, p->pt, p->pb, p->dh, 0) ||
        p->oh > k_pool_out_dim(p->h, p->kh, p->sh, p->pt, p->pb, p->dh, 1) ||
        p->ow < k_pool_out_dim(p->w, p->kw, p->sw, p->pl, p->pr, p->dw, 0) ||
        p->ow > k_pool_out_dim(p->w, p->kw, p->sw, p->pl, p->pr, p->dw, 1))
        return "oh / ow do not match the geometry";
    return 0;
}
/* Philox-4x32-10 (Salmon et al. 2011): out = bijection of ctr under key.
 * k_dropout's u for element i is out[i % 4] / 2^32 with
 * ctr = {i/4 low 32 bits, i/4 high 32 bits, step, stream} and
 * key = {seed low 32 bits, seed high 32 bits}; a CUDA kernel doing the same
 * reproduces the CPU mask bit for bit. */
void k_philox4x32_10(uint32_t out[4], const uint32_t ctr[4], const uint32_t key[2]);

#endif
