/* kc_rt.c — the runtime half of kernels/cuda/kc.h: launches, the step's
 * device scalars and check slots, GEMM through cuBLASLt, copies and fills.
 * Everything is enqueued on cu.cur (cu.compute, or a lane's stream inside a
 * collective's job: cuda_check.h), GEMMs included, and nothing here waits for the GPU
 * (but FSDPC_CUDA_SYNC=1, which waits after every launch to name a failing
 * kernel), so every function may be recorded into a CUDA Graph.
 *
 * GEMM, row-major: C_i (m x n) = op(A_i) op(B_i) + beta C_i.  cuBLASLt is
 * column-major, and a row-major X is the column-major X^T, so it computes
 * C^T (n x m) = op(B)^T op(A)^T: its "A" is our B, its "B" our A.
 *   our B stored k x n (tb 0): column-major n x k, ld n, no transpose
 *   our B stored n x k (tb 1): column-major k x n, ld k, transposed
 *   our A stored m x k (ta 0): column-major k x m, ld k, no transpose
 *   our A stored k x m (ta 1): column-major m x k, ld m, transposed
 *   C: column-major n x m, ld n
 * Batches are strided (stride 0 broadcasts one matrix); a shared B with a
 * dense, untransposed A folds the batch into m (one larger GEMM).
 * kc_gemm_f32 multiplies float32 A and B (on TF32 tensor cores unless
 * FSDPC_NO_TF32); kc_gemm_bf16 takes bfloat16 A and B (CUDA_R_16BF) and
 * writes the same float32 C under CUBLAS_COMPUTE_32F (--precision bf16: a
 * product of two bfloat16 values is exact in float32, and the sums stay
 * there); kc_gemm_f16 the same with float16 A and B (CUDA_R_16F, --precision
 * fp16).  kc_gemm_f64 is float64 throughout: A, B, C and the bias, computed
 * under CUBLAS_COMPUTE_64F (a float64 model on the cuda target).  One body
 * serves all four; only the operands' and C's types and sizes differ.
 * kc_gemm_add (a MatMulAdd) is the same GEMM with an epilogue: the addend
 * is cuBLASLt's C input (D = AB + 1 C, C and D of one layout, D may be C)
 * and the bias its CUBLASLT_EPILOGUE_BIAS, a vector over cuBLASLt's rows
 * (our columns) broadcast over the rest and over the batches.  A shape for
 * which no algorithm takes the bias epilogue is planned without it, and
 * the launcher adds the bias with a kernel.
 *
 * Plan cache: descriptors, layouts and the heuristic's algorithm for each
 * distinct (operand type, shape, strides, transposes, pointer alignment,
 * TF32), in a small open-addressing table.  The set is fixed per model, so
 * the eager warm-up step creates every plan and the captured and replayed
 * steps reuse them.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"

/* ------------------------------------------------------------- launches */

void kc_launch(int kernel, unsigned grid, unsigned block, unsigned smem, void **args)
{
    if (!cu.up)
        cu_internal("kc_launch before the GPU was set up");
    if (kernel < 0 || kernel >= cu.nkernel)
        cu_internal("kc_launch: kernel id %d outside [0, %d)", kernel, cu.nkernel);
    if (grid == 0)
        return; /* an empty tensor: nothing to do */
    if (block == 0 || block > 1024 || grid > 0x7fffffffu)
        cu_internal("kernel %s launched with grid %u x block %u", cu_kernel_name(kernel), grid, block);
    if (smem > (unsigned)cu.smem_limit[kernel]) { /* above 48 KiB needs an opt-in per kernel */
        CU_CHECK(cudaFuncSetAttribute((const void *)cu.kernel[kernel], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      (int)smem));
        cu.smem_limit[kernel] = (int)smem;
    }
    dim3 g = {grid, 1, 1}, b = {block, 1, 1};
    cudaError_t e = cudaLaunchKernel((const void *)cu.kernel[kernel], g, b, args, smem, cu.cur);
    if (e != cudaSuccess || cu.sync_debug) {
        char what[160];
        snprintf(what, sizeof what, "cudaLaunchKernel of %s (grid %u, block %u, smem %u)", cu_kernel_name(kernel), grid,
                 block, smem);
        if (e != cudaSuccess)
            cu_fail_cuda(__FILE__, __LINE__, what, e);
        snprintf(what, sizeof what, "kernel %s (grid %u, block %u, smem %u)", cu_kernel_name(kernel), grid, block, smem);
        cu_debug_sync(what);
    }
}

int kc_num_sms(void)
{
    if (!cu.up)
        cu_internal("kc_num_sms before the GPU was set up");
    return cu.sm_count;
}

const KcStepParams *kc_step_params(void)
{
    if (!cu.up)
        cu_internal("kc_step_params before the GPU was set up");
    return cu.params_dev;
}

int64_t *kc_next_check(void)
{
    if (!cu.up)
        cu_internal("kc_next_check before the GPU was set up");
    if (cu.next_check >= cu.ncheck)
        cu_internal("the step takes more device check slots than the model declares (%d)", cu.ncheck);
    return &cu.check_dev[cu.next_check++];
}

/* -------------------------------------------------------- copies and fills */

void kc_memcpy(void *dst, const void *src, int64_t bytes)
{
    if (bytes < 0)
        cu_internal("kc_memcpy of %lld bytes", (long long)bytes);
    if (bytes == 0 || dst == src)
        return;
    CU_CHECK(cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToDevice, cu.cur));
    cu_debug_sync("a device-to-device copy");
}

void kc_memset(void *dst, int byte, int64_t bytes)
{
    if (bytes < 0)
        cu_internal("kc_memset of %lld bytes", (long long)bytes);
    if (bytes == 0)
        return;
    CU_CHECK(cudaMemsetAsync(dst, byte, (size_t)bytes, cu.cur));
    cu_debug_sync("a device fill");
}

void rt_memcpy(void *dst, const void *src, int64_t bytes)
{
    kc_memcpy(dst, src, bytes);
}

void rt_memset(void *dst, int byte, int64_t bytes)
{
    kc_memset(dst, byte, bytes);
}

/* ----------------------------------------------------------------- GEMM */

typedef struct {
    int64_t m, n, k, batch, sa, sb; /* after folding */
    int type;                       /* A and B's cudaDataType_t: CUDA_R_32F, CUDA_R_16BF or CUDA_R_16F (C, D
                                     * and the bias float32), or CUDA_R_64F (all float64) */
    int ta, tb, tf32;
    int bias;                       /* a bias epilogue is wanted */
    int align;                      /* log2 of the byte alignment of A, B, D, C, bias: 4 bits each */
    int no_ws;                      /* for a stream other than cu.compute: no workspace (it is compute's) */
} GemmKey;

typedef struct {
    GemmKey key;
    int used;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc; /* cuBLASLt's A (our B), B (our A), C = D */
    cublasLtMatmulAlgo_t algo;
    size_t ws;
    int bias;                          /* the bias epilogue is in op (else the launcher adds the bias) */
} GemmPlan;

static GemmPlan *g_plan;
static size_t g_cap, g_count; /* g_cap: a power of two, or 0 */

static int key_eq(const GemmKey *x, const GemmKey *y)
{
    return x->m == y->m && x->n == y->n && x->k == y->k && x->batch == y->batch && x->sa == y->sa &&
           x->sb == y->sb && x->type == y->type && x->ta == y->ta && x->tb == y->tb && x->tf32 == y->tf32 &&
           x->bias == y->bias && x->align == y->align && x->no_ws == y->no_ws;
}

static uint64_t key_hash(const GemmKey *k)
{
    uint64_t v[] = {(uint64_t)k->m, (uint64_t)k->n, (uint64_t)k->k, (uint64_t)k->batch, (uint64_t)k->sa,
                    (uint64_t)k->sb, (uint64_t)(k->ta | k->tb << 1 | k->tf32 << 2 | k->bias << 3 | k->no_ws << 4),
                    (uint64_t)k->align, (uint64_t)k->type};
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        h ^= v[i];
        h *= 1099511628211ull;
        h ^= h >> 29;
    }
    return h;
}

/* the slot of key in a table of capacity cap: its plan, or the empty slot to fill */
static GemmPlan *slot_of(GemmPlan *t, size_t cap, const GemmKey *k)
{
    size_t i = (size_t)key_hash(k) & (cap - 1);
    while (t[i].used && !key_eq(&t[i].key, k))
        i = (i + 1) & (cap - 1);
    return &t[i];
}

static void grow(void)
{
    size_t cap = g_cap ? g_cap * 2 : 64;
    GemmPlan *t = calloc(cap, sizeof *t);
    if (!t)
        cu_internal("out of memory for the GEMM plan cache");
    for (size_t i = 0; i < g_cap; i++)
        if (g_plan[i].used)
            *slot_of(t, cap, &g_plan[i].key) = g_plan[i];
    free(g_plan);
    g_plan = t;
    g_cap = cap;
}

/* log2 of the alignment of address p (and of every batch's matrix, when
 * strided by stride_bytes), at most 256 bytes, cuBLASLt's default demand */
static int align_log2(const void *p, int64_t stride_bytes)
{
    uintptr_t x = (uintptr_t)p | (uintptr_t)stride_bytes | (uintptr_t)256;
    int l = 0;
    while (!(x & 1))
        x >>= 1, l++;
    return l;
}

static void layout(cublasLtMatrixLayout_t *l, cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld,
                   int64_t batch, int64_t stride)
{
    LT_CHECK(cublasLtMatrixLayoutCreate(l, type, rows, cols, ld));
    if (batch > 1) {
        int32_t b = (int32_t)batch;
        LT_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b));
        LT_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                  sizeof stride));
    }
}

/* C and D's type (and the bias's, alpha's and beta's) for operands of type t */
static cudaDataType_t out_type(int t)
{
    return t == CUDA_R_64F ? CUDA_R_64F : CUDA_R_32F;
}

/* the operation descriptor: compute type ct, cuBLASLt's A = our B, B = our A;
 * with bias (a pointer with the alignment the plan is for: the heuristic
 * reads it) the bias epilogue, of D's type */
static cublasLtMatmulDesc_t make_op(cublasComputeType_t ct, const GemmKey *k, const void *bias)
{
    cublasLtMatmulDesc_t op;
    LT_CHECK(cublasLtMatmulDescCreate(&op, ct, out_type(k->type)));
    int32_t opa = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (bias) {
        int32_t epi = CUBLASLT_EPILOGUE_BIAS, bt = out_type(k->type);
        LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
        LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    }
    return op;
}

static void make_plan(GemmPlan *p, const GemmKey *k, const void *bias)
{
    memset(p, 0, sizeof *p);
    p->key = *k;
    uint64_t m = (uint64_t)k->m, n = (uint64_t)k->n, kk = (uint64_t)k->k;
    cudaDataType_t t = (cudaDataType_t)k->type;
    if (k->tb)
        layout(&p->la, t, kk, n, k->k, k->batch, k->sb);
    else
        layout(&p->la, t, n, kk, k->n, k->batch, k->sb);
    if (k->ta)
        layout(&p->lb, t, m, kk, k->m, k->batch, k->sa);
    else
        layout(&p->lb, t, kk, m, k->k, k->batch, k->sa);
    layout(&p->lc, out_type(k->type), n, m, k->n, k->batch, k->m * k->n);

    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = k->no_ws ? 0 : cu.ws_bytes;
    /* our A, B, C's alignments; cuBLASLt's A is our B and its B our A */
    uint32_t al_a = 1u << (k->align & 15), al_b = 1u << (k->align >> 4 & 15), al_d = 1u << (k->align >> 8 & 15),
             al_c = 1u << (k->align >> 12 & 15);
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_b,
                                                  sizeof al_b));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_a,
                                                  sizeof al_a));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c,
                                                  sizeof al_c));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d,
                                                  sizeof al_d));
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    cublasStatus_t s = CUBLAS_STATUS_NOT_SUPPORTED;
    /* with the bias epilogue if wanted, then without (the launcher adds the
     * bias); TF32 first (unless FSDPC_NO_TF32): a shape or alignment no TF32
     * kernel takes falls back to exact FP32 rather than ending the run */
    for (int epi = k->bias; epi >= 0 && !p->op; epi--)
        for (int exact = !k->tf32; exact < 2; exact++) {
            p->op = make_op(t == CUDA_R_64F ? CUBLAS_COMPUTE_64F
                            : exact         ? CUBLAS_COMPUTE_32F
                                            : CUBLAS_COMPUTE_32F_FAST_TF32,
                            k, epi ? bias : NULL);
            nres = 0;
            memset(&res, 0, sizeof res);
            s = cublasLtMatmulAlgoGetHeuristic(cu.lt, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &nres);
            if (s == CUBLAS_STATUS_SUCCESS && nres >= 1 && res.state == CUBLAS_STATUS_SUCCESS) {
                p->bias = epi;
                break;
            }
            (void)cublasLtMatmulDescDestroy(p->op);
            p->op = NULL;
        }
    LT_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (!p->op)
        cu_internal("cuBLASLt has no algorithm for the GEMM C[%lld x %lld] = A%s B%s (k %lld, batch %lld, strides "
                    "%lld/%lld, alignment %u/%u/%u/%u B, %s): %s", (long long)k->m, (long long)k->n,
                    k->ta ? "^T" : "", k->tb ? "^T" : "", (long long)k->k, (long long)k->batch, (long long)k->sa,
                    (long long)k->sb, al_a, al_b, al_d, al_c,
                    k->type == CUDA_R_16BF ? "BF16 operands, FP32 compute"
                    : k->type == CUDA_R_16F ? "FP16 operands, FP32 compute"
                    : k->type == CUDA_R_64F ? "FP64"
                    : k->tf32               ? "TF32 or FP32"
                                            : "FP32",
                    cublasLtGetStatusString(s != CUBLAS_STATUS_SUCCESS ? s
                                            : nres < 1                  ? CUBLAS_STATUS_NOT_SUPPORTED
                                                                        : res.state));
    p->algo = res.algo;
    p->ws = res.workspaceSize;
    p->used = 1;
}

/* D = alpha op(A) op(B) + beta C [+ bias] for every kc_gemm_ (fn, for messages): A and B are of type, esize bytes
 * an element; D (d), C (c: d itself unless an addend) and the bias are out_type(type).  Returns 0 when the bias is
 * left to the caller, 1 when it was added (or is NULL). */
static int gemm(const char *fn, cudaDataType_t type, int64_t esize, void *d, const void *c, double alpha,
                double beta, const void *bias, const void *a, const void *b, int64_t batch, int64_t sa, int64_t sb,
                int64_t m, int64_t n, int64_t k, int ta, int tb)
{
    const int64_t dsize = out_type(type) == CUDA_R_64F ? 8 : 4;
    if (!cu.up)
        cu_internal("%s before the GPU was set up", fn);
    if (batch < 0 || m < 0 || n < 0 || k < 0 || sa < 0 || sb < 0)
        cu_internal("%s: batch %lld, m %lld, n %lld, k %lld, strides %lld/%lld", fn, (long long)batch, (long long)m,
                    (long long)n, (long long)k, (long long)sa, (long long)sb);
    if (batch == 0 || m == 0 || n == 0)
        return 1;
    if (k == 0) { /* D = beta C */
        if (beta == 0)
            kc_memset(d, 0, batch * m * n * dsize);
        else if (beta != 1)
            cu_internal("%s with k = 0 and beta %g", fn, beta);
        else if (c != d)
            kc_memcpy(d, c, batch * m * n * dsize);
        return !bias;
    }
    if (batch > 1 && sb == 0 && !ta && sa == m * k) { /* one matrix of batch*m rows */
        m *= batch;
        batch = 1;
    }
    if (batch == 1)
        sa = sb = 0;
    if (batch > 0x7fffffff)
        cu_internal("%s: batch %lld beyond cuBLASLt's int32", fn, (long long)batch);
    GemmKey key;
    memset(&key, 0, sizeof key);
    key.m = m, key.n = n, key.k = k, key.batch = batch, key.sa = sa, key.sb = sb;
    /* TF32 is a choice for float32 operands only (it rounds them to 10
     * mantissa bits); bfloat16 ones, 7 bits, reach the tensor cores as they
     * are under CUBLAS_COMPUTE_32F */
    key.type = type, key.ta = !!ta, key.tb = !!tb, key.tf32 = type == CUDA_R_32F && cu.tf32, key.bias = !!bias;
    key.no_ws = cu.cur != cu.compute;
    /* the alignment an algorithm may assume covers the pointer, the batch
     * stride and the leading dimension (CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_*),
     * in bytes: A and B have the operand type's elements, C and D out_type's */
    int64_t sc = batch > 1 ? m * n : 0, lda = ta ? m : k, ldb = tb ? k : n, ldc = (sc | n) * dsize;
    key.align = align_log2(a, (sa | lda) * esize) | align_log2(b, (sb | ldb) * esize) << 4 | align_log2(d, ldc) << 8 |
                align_log2(c, ldc) << 12 | (bias ? align_log2(bias, 0) << 16 : 0);
    if (2 * (g_count + 1) > g_cap)
        grow();
    GemmPlan *p = slot_of(g_plan, g_cap, &key);
    if (!p->used) {
        make_plan(p, &key, bias);
        g_count++;
    }
    if (p->bias) /* this call's vector (the plan was made for one of the same alignment) */
        LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    float af = (float)alpha, bf = (float)beta; /* the scale type is D's */
    const void *pa = dsize == 8 ? (const void *)&alpha : &af, *pb = dsize == 8 ? (const void *)&beta : &bf;
    /* on cu.cur (a job's lane or the step's stream); the workspace is cu.compute's alone: a plan made for
     * another stream asks for none, so two streams never share it */
    LT_CHECK(cublasLtMatmul(cu.lt, p->op, pa, b, p->la, a, p->lb, pb, c, p->lc, d, p->lc, &p->algo,
                            p->ws ? cu.ws : NULL, p->ws, cu.cur));
    if (cu.sync_debug) {
        char what[200];
        snprintf(what, sizeof what, "the cuBLASLt GEMM (%s) m %lld n %lld k %lld batch %lld", fn, (long long)m,
                 (long long)n, (long long)k, (long long)batch);
        cu_debug_sync(what);
    }
    return p->bias || !bias;
}

void kc_gemm_f32(float *c, const float *a, const float *b, int64_t batch, int64_t sa, int64_t sb, int64_t m,
                 int64_t n, int64_t k, int ta, int tb, double beta)
{
    gemm("kc_gemm_f32", CUDA_R_32F, 4, c, c, 1.0, beta, NULL, a, b, batch, sa, sb, m, n, k, ta, tb);
}

void kc_gemm_f64(double *c, const double *a, const double *b, int64_t batch, int64_t sa, int64_t sb, int64_t m,
                 int64_t n, int64_t k, int ta, int tb, double beta)
{
    gemm("kc_gemm_f64", CUDA_R_64F, 8, c, c, 1.0, beta, NULL, a, b, batch, sa, sb, m, n, k, ta, tb);
}

void kc_gemm_bf16(float *c, const uint16_t *a, const uint16_t *b, int64_t batch, int64_t sa, int64_t sb, int64_t m,
                  int64_t n, int64_t k, int ta, int tb, double beta)
{
    gemm("kc_gemm_bf16", CUDA_R_16BF, 2, c, c, 1.0, beta, NULL, a, b, batch, sa, sb, m, n, k, ta, tb);
}

void kc_gemm_f16(float *c, const uint16_t *a, const uint16_t *b, int64_t batch, int64_t sa, int64_t sb, int64_t m,
                 int64_t n, int64_t k, int ta, int tb, double beta)
{
    gemm("kc_gemm_f16", CUDA_R_16F, 2, c, c, 1.0, beta, NULL, a, b, batch, sa, sb, m, n, k, ta, tb);
}

int kc_gemm_add(int type, void *c, const void *a, const void *b, const void *bias, const void *add,
                double alpha, int64_t batch, int64_t sa, int64_t sb, int64_t m, int64_t n, int64_t k, int ta, int tb)
{
    static const cudaDataType_t types[] = {CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F, CUDA_R_64F};
    static const int64_t esize[] = {4, 2, 2, 8};
    if (type < KC_GEMM_F32 || type > KC_GEMM_F64)
        cu_internal("kc_gemm_add: operand type %d", type);
    return gemm("kc_gemm_add", types[type], esize[type], c, add ? add : c, alpha, add ? 1.0 : 0.0, bias, a, b, batch,
                sa, sb, m, n, k, ta, tb);
}

void cu_gemm_cache_free(void)
{
    for (size_t i = 0; i < g_cap; i++) {
        GemmPlan *p = &g_plan[i];
        if (!p->used)
            continue;
        /* teardown: a failure here cannot hurt the run that already ended */
        (void)cublasLtMatrixLayoutDestroy(p->la);
        (void)cublasLtMatrixLayoutDestroy(p->lb);
        (void)cublasLtMatrixLayoutDestroy(p->lc);
        (void)cublasLtMatmulDescDestroy(p->op);
    }
    free(g_plan);
    g_plan = NULL;
    g_cap = g_count = 0;
}
