/* kernels.h — reference CPU kernels (C11), called by the generated step.
 *
 * Every kernel exists for float (_f32) and double (_f64); the two are stamped
 * from one body with a type macro.  Shapes are int64 element counts, tensors
 * are dense row-major unless strides are given.  Kernels never allocate and
 * never fail, except where a return value says so.
 */
#ifndef FSDPC_KERNELS_H
#define FSDPC_KERNELS_H

#include <stdint.h>

enum { K_ADD, K_SUB, K_MUL, K_DIV };     /* k_binary ops */
enum { K_RELU, K_TANH, K_SIGMOID };      /* k_unary / k_unary_grad ops */

#define K_DECLARE(T, S)                                                              \
/* y[idx] = a[idx . sa] OP b[idx . sb] for every idx of shape (rank dims);          \
 * y is dense; a stride of 0 broadcasts that dim. rank 0 = one element. */          \
void k_binary_##S(int op, T *y, const T *a, const T *b, int rank,                   \
                  const int64_t *shape, const int64_t *sa, const int64_t *sb);       \
void k_unary_##S(int op, T *y, const T *x, int64_t n);                              \
/* dx = dy * f'(.) written from the forward OUTPUT y */                              \
void k_unary_grad_##S(int op, T *dx, const T *dy, const T *y, int64_t n);           \
void k_scale_##S(T *y, const T *x, double alpha, int64_t n);                        \
void k_fill_##S(T *y, double v, int64_t n);                                          \
/* for i < batch: C_i = op(A_i) op(B_i) + beta C_i, op(A_i) is m x k, op(B_i) k x n;  \
 * A_i = a + i*sa, B_i = b + i*sb (0 = shared), C_i = c + i*m*n (dense).             \
 * ta: A_i is stored k x m; tb: B_i is stored n x k. */                              \
void k_matmul_##S(T *c, const T *a, const T *b, int64_t batch, int64_t sa,          \
                  int64_t sb, int64_t m, int64_t n, int64_t k, int ta, int tb,       \
                  double beta);                                                      \
/* y = transpose(x, perm): y.shape[i] = xshape[perm[i]] */                          \
void k_transpose_##S(T *y, const T *x, int rank, const int64_t *xshape,             \
                     const int64_t *perm);                                           \
/* y = sum of x over the dims where yshape[i] == 1 != xshape[i] (same rank) */       \
void k_reduce_sum_to_##S(T *y, const T *x, int rank, const int64_t *xshape,         \
                         const int64_t *yshape);                                     \
/* loss[0] = mean((p - t)^2) over n */                                               \
void k_mse_##S(T *loss, const T *p, const T *t, int64_t n);                         \
/* dp = dloss[0] * 2 (p - t) / n */                                                   \
void k_mse_grad_##S(T *dp, const T *dloss, const T *p, const T *t, int64_t n);      \
/* loss[0] = mean over rows of logsumexp(x_r) - x_r[label_r]; returns -1, or the     \
 * first row whose label is outside [0, classes) (loss then unwritten) */            \
int64_t k_cross_entropy_##S(T *loss, const T *x, const int64_t *labels,              \
                            int64_t rows, int64_t classes);                          \
/* dx = dloss[0] * (softmax(x_r) - onehot(label_r)) / rows */                        \
void k_cross_entropy_grad_##S(T *dx, const T *dloss, const T *x,                     \
                              const int64_t *labels, int64_t rows, int64_t classes); \
/* PyTorch AdamW: p *= 1 - lr wd; m,v moments; p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps), \
 * bc = 1 - beta^step */                                                             \
void k_adamw_##S(T *p, const T *g, T *m, T *v, int64_t n, double lr, double beta1,  \
                 double beta2, double eps, double wd, int64_t step);                 \
/* PyTorch SGD: g += wd p; buf = momentum buf + g (buf = g at step 1); p -= lr buf;  \
 * momentum 0: p -= lr g and buf is untouched (may be NULL) */                       \
void k_sgd_##S(T *p, const T *g, T *buf, int64_t n, double lr, double momentum,      \
               double wd, int64_t step);

K_DECLARE(float, f32)
K_DECLARE(double, f64)
#undef K_DECLARE

#endif
