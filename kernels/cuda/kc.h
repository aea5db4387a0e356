/* kc.h — the host side of kernels/cuda, shared by the CUDA runtime
 * (runtime/dev_cuda.c), the launchers (kernels/cuda/launch.c) and the host
 * emulation test (tests/kernels_cuda_test.cc).  C11 and C++ compatible.
 *
 * Shape of the CUDA target:
 *   - the .cu files of kernels/cuda hold the device kernels: `extern "C" __global__`,
 *     compiled by NVRTC at fsdpc time (one cubin per --arch, plus PTX) and
 *     embedded in the executable.  kernels.def lists every kernel with its
 *     parameter types, in one place.
 *   - kernels/cuda/launch.c implements the API of kernels/c/kernels.h for
 *     the CUDA target under the prefix kc_ (kc_binary_f32 is k_binary_f32's
 *     twin, same parameters, same contract; pointers are device pointers).
 *     The generated step includes kc_map.h, which maps every k_ name it uses
 *     to its kc_ twin, so one emitter serves both targets.
 *   - Launchers never synchronise with the host.  They pick the geometry and
 *     call kc_launch.  Scalars that change between steps (learning rate,
 *     step counter, --accum's micro-step) are read by the kernels from
 *     kc_step_params(), a device copy the runtime refreshes before every
 *     (micro-)step (so one captured CUDA Graph serves them all); the
 *     launchers ignore the host values passed for them.
 *   - Launchers of kernels that can find bad input (k_gather, the
 *     cross-entropy losses) return -1 at once and have the kernel record the
 *     first bad position in kc_next_check() (an int64 the runtime sets to -1
 *     before each step and reads after it; one slot per checked call, in
 *     call order, each call takes the next slot).
 */
#ifndef FSDPC_KC_H
#define FSDPC_KC_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* small arrays (shapes, strides, permutations) passed to kernels by value */
#define KC_MAX_RANK 8
typedef struct {
    int64_t d[KC_MAX_RANK];
} KDims;

/* Most blocks a kernel that combines per-block partials into one value
 * (the scalar losses, a full reduction) runs with: its partials live in a
 * device array of this many slots (kernels/cuda/common.cuh). */
#define KC_GRID_PARTIALS 1024
/* Doubles in the device array where a column reduction split into chunks of
 * rows keeps each chunk's partial sums (kernels/cuda/common.cuh): the
 * columns times the chunks (times 2 for LayerNorm's dscale and dbias) fit. */
#define KC_COL_PARTIALS (1 << 18)
/* Gather's backward lists the index positions of each bucket of dx rows
 * (at most KC_GATHER_THREADS buckets, listed by one block of that many
 * threads) in a device array of this many ints: buckets + 1 + indices. */
#define KC_GATHER_SLOTS (1 << 18)
#define KC_GATHER_THREADS 1024
/* the attention kernels' block (16 x 8 threads) and their float32 tiles
 * (float64 halves them; attn.cu): query rows per block, the chunk of d
 * and dv, keys per block of the dk, dv kernel */
#define KC_ATTN_BLOCK 128
#define KC_ATTN_BM 64
#define KC_ATTN_DK 64
#define KC_ATTN_KBM 64
/* KDims' flags slot of the attention kernels (attn.cu KC_ATTN_FLAGS): the flags in the low 32 bits, kvrep - 1
 * (query problem b reads K/V problem b / kvrep) from this bit on (mirrored in common.cuh) */
#define KC_ATTN_KVREP_SHIFT 32

/* kernel ids, in kernels.def order */
enum {
#define KC(name, params) KC_##name,
#include "kernels.def"
#undef KC
    KC_COUNT
};
/* "k_binary_f32", ... : the extern "C" names in the .cu files */
extern const char *const kc_names[KC_COUNT];

/* Device-side scalars of the current step, refreshed by the runtime before
 * each step (a host-to-device copy ordered before the step's kernels). */
typedef struct {
    double lr, beta1, beta2, eps, weight_decay, momentum;
    double clip_norm; /* --clip-grad-norm; 0: the optimizers do not clip */
    int64_t step;     /* 1-based */
    int64_t micro;    /* --accum: this micro-step of the step, 0-based */
    int64_t accum;    /* micro-steps per step (the optimizers update at accum - 1) */
    double loss_scale;/* --precision fp16: the loss scale S (0: no loss scaling) */
    int64_t opt_step; /* the optimizers' step count (bias correction, sgd's first step): step, less
                       * the steps fp16 skipped */
} KcStepParams;

/* ---- implemented by the runtime (runtime/dev_cuda.c) or the emulator ---- */

/* launch kernel id on the compute stream; args[i] points at the i-th
 * argument's value, as cudaLaunchKernel takes them */
void kc_launch(int kernel, unsigned grid, unsigned block, unsigned smem, void **args);
/* multiprocessors of the device (for grid sizing) */
int kc_num_sms(void);
/* device pointer to the current step's scalars */
const KcStepParams *kc_step_params(void);
/* device pointer to the next check slot (see above) */
int64_t *kc_next_check(void);
/* the operand types of kc_gemm_add */
typedef enum { KC_GEMM_F32, KC_GEMM_BF16, KC_GEMM_F16, KC_GEMM_F64 } KcGemmType;
/* C_i = op(A_i) op(B_i) + beta C_i, row-major, the contract of k_matmul_f32
 * (kernels.h).  The runtime does it with cuBLASLt. */
void kc_gemm_f32(float *c, const float *a, const float *b, int64_t batch, int64_t sa, int64_t sb,
                 int64_t m, int64_t n, int64_t k, int ta, int tb, double beta);
/* the same in float64 (A, B, C and the sums): the contract of k_matmul_f64 */
void kc_gemm_f64(double *c, const double *a, const double *b, int64_t batch, int64_t sa, int64_t sb,
                 int64_t m, int64_t n, int64_t k, int ta, int tb, double beta);
/* the same with bfloat16 A and B (their uint16_t bits) and a float32 C,
 * accumulated in float32: the contract of k_matmul_bf16 */
void kc_gemm_bf16(float *c, const uint16_t *a, const uint16_t *b, int64_t batch, int64_t sa, int64_t sb,
                  int64_t m, int64_t n, int64_t k, int ta, int tb, double beta);
/* the same with float16 A and B (their uint16_t bits): the contract of k_matmul_f16 */
void kc_gemm_f16(float *c, const uint16_t *a, const uint16_t *b, int64_t batch, int64_t sa, int64_t sb,
                 int64_t m, int64_t n, int64_t k, int ta, int tb, double beta);
/* C_i = alpha op(A_i) op(B_i) + bias + ADD_i (the contract of k_matmul_add_*, with
 * float32, bfloat16 or float16 A and B and a float32 C, bias and ADD, or all of them
 * float64, by type, a KcGemmType): ADD_i through cuBLASLt's C input (beta 1; may be c itself),
 * the bias through its bias epilogue.  Returns 0 when no cuBLASLt algorithm
 * takes the epilogue for this shape: then C holds the rest and the caller
 * adds the bias (1 otherwise, and when bias is NULL). */
int kc_gemm_add(int type, void *c, const void *a, const void *b, const void *bias, const void *add,
                double alpha, int64_t batch, int64_t sa, int64_t sb, int64_t m, int64_t n, int64_t k, int ta, int tb);
/* device-to-device copy / byte fill on the compute stream */
void kc_memcpy(void *dst, const void *src, int64_t bytes);
void kc_memset(void *dst, int byte, int64_t bytes);

#ifdef __cplusplus
}
#endif
#endif
