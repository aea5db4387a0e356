/* cuemu_lt.c — the subset of cuBLASLt that kc_rt.c calls, on the host:
 * handles, the matmul descriptor (transposes, the bias epilogue, its type
 * and pointer), matrix layouts (type, rows, columns, leading dimension,
 * batch count and stride; column-major), preferences (accepted, recorded
 * nowhere), the heuristic (one algorithm for every supported case) and
 * cublasLtMatmul, enqueued on its stream like a kernel.
 *
 * cublasLtMatmul computes, for each batch b (each matrix at b times its
 * layout's stride; a stride of 0 broadcasts one matrix),
 *   D = alpha op(A) op(B) + beta C  [+ bias, one value per row of D]
 * with beta == 0 not reading C.  Operands: float32, float64, bfloat16 or
 * float16; C, D, the bias and the scales float32 (float64 with float64
 * operands).  Each dot product is summed in double in k order and rounded
 * once: float32 exact (CUBLAS_COMPUTE_32F) as fsdpc's FSDPC_NO_TF32 wants
 * it, float64 under CUBLAS_COMPUTE_64F; CUBLAS_COMPUTE_32F_FAST_TF32 rounds
 * float32 operands to TF32 first (10 mantissa bits, to nearest even), as
 * the tensor cores do.  The scalars are read when the call is made (host
 * pointer mode), the descriptors too: the enqueued work holds its own
 * copy, so a later cublasLtMatmulDescSetAttribute (kc_rt.c resets the
 * bias pointer per call) cannot change it, and a capture replays it.
 *
 * Every operand range (all its batches) must lie in device memory, or the
 * call fails (CUBLAS_STATUS_INVALID_VALUE) with one line naming it.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>

#include "cuemu.h"

typedef struct {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;
    int64_t stride;
} Layout;

typedef struct {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    int32_t transa, transb;
    uint32_t epilogue;
    cudaDataType_t bias_type;
    const void *bias;
} Desc;

struct cublasLtContext {
    int magic;
};

static size_t esize(cudaDataType_t t)
{
    switch (t) {
    case CUDA_R_64F: return 8;
    case CUDA_R_32F: return 4;
    case CUDA_R_16BF:
    case CUDA_R_16F: return 2;
    default: return 0;
    }
}

const char *cublasLtGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    default: return "an unknown cuBLAS status (cuemu)";
    }
}

/* *out := a new object of size bytes, a copy of its initial state v (NULL: zeros): SUCCESS, INVALID_VALUE (out is
 * NULL) or ALLOC_FAILED (*out untouched) */
static cublasStatus_t create(void **out, const void *v, size_t size)
{
    if (!out)
        return CUBLAS_STATUS_INVALID_VALUE;
    void *p = calloc(1, size);
    if (!p)
        return CUBLAS_STATUS_ALLOC_FAILED;
    if (v)
        memcpy(p, v, size);
    *out = p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h)
{
    return create((void **)h, NULL, sizeof **h);
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h)
{
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}

/* ------------------------------------------------------------- descriptors */

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *pl, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld)
{
    if (!pl || !esize(type) || ld < (int64_t)(rows ? rows : 1) || rows > ((uint64_t)1 << 40) ||
        cols > ((uint64_t)1 << 40))
        return CUBLAS_STATUS_INVALID_VALUE;
    Layout l = {type, rows, cols, ld, 1, 0};
    return create((void **)pl, &l, sizeof l);
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l)
{
    free(l);
    return CUBLAS_STATUS_SUCCESS;
}

/* copies an attribute of exactly want bytes */
static cublasStatus_t take(void *dst, size_t want, const void *buf, size_t size)
{
    if (!buf || size != want)
        return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(dst, buf, want);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t pl, cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t size)
{
    Layout *l = (Layout *)pl;
    if (!l)
        return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return take(&l->batch, sizeof l->batch, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return take(&l->stride, sizeof l->stride, buf, size);
    default:
        cuemu_complain("cublasLtMatrixLayoutSetAttribute", "attribute %d is not emulated", (int)attr);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *pd, cublasComputeType_t compute,
                                        cudaDataType_t scale)
{
    Desc d = {compute, scale, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, scale, NULL};
    return create((void **)pd, &d, sizeof d);
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d)
{
    free(d);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t pd, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size)
{
    Desc *d = (Desc *)pd;
    if (!d)
        return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return take(&d->transa, sizeof d->transa, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSB: return take(&d->transb, sizeof d->transb, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return take(&d->epilogue, sizeof d->epilogue, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: {
        int32_t t = 0;
        cublasStatus_t s = take(&t, sizeof t, buf, size);
        if (s == CUBLAS_STATUS_SUCCESS)
            d->bias_type = (cudaDataType_t)t;
        return s;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return take(&d->bias, sizeof d->bias, buf, size);
    default:
        cuemu_complain("cublasLtMatmulDescSetAttribute", "attribute %d is not emulated", (int)attr);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pp)
{
    return create((void **)pp, NULL, sizeof **pp);
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p)
{
    free(p);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t size)
{
    (void)attr; /* workspace and alignment limits: the host needs neither */
    return p && buf && size ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

/* ------------------------------------------------------------------ shapes */

/* the operation's m, n, k from the layouts; 0 if they do not fit together or a type is not emulated */
static int shape(const Desc *d, const Layout *a, const Layout *b, const Layout *c, const Layout *dd, uint64_t *m,
                 uint64_t *n, uint64_t *k)
{
    int wide = a->type == CUDA_R_64F;
    cudaDataType_t out = wide ? CUDA_R_64F : CUDA_R_32F;
    cublasComputeType_t want = wide ? CUBLAS_COMPUTE_64F : d->compute;
    if (a->type != b->type || c->type != out || dd->type != out || d->scale != out || d->compute != want ||
        (!wide && want != CUBLAS_COMPUTE_32F && want != CUBLAS_COMPUTE_32F_FAST_TF32))
        return 0;
    if (d->epilogue != CUBLASLT_EPILOGUE_DEFAULT &&
        (d->epilogue != CUBLASLT_EPILOGUE_BIAS || d->bias_type != out))
        return 0;
    *m = dd->rows, *n = dd->cols;
    *k = d->transa == CUBLAS_OP_N ? a->cols : a->rows;
    uint64_t am = d->transa == CUBLAS_OP_N ? a->rows : a->cols;
    uint64_t bk = d->transb == CUBLAS_OP_N ? b->rows : b->cols, bn = d->transb == CUBLAS_OP_N ? b->cols : b->rows;
    int32_t batch = dd->batch;
    return am == *m && bk == *k && bn == *n && c->rows == *m && c->cols == *n && batch >= 1 &&
           a->batch == batch && b->batch == batch && c->batch == batch;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la,
                                              cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc,
                                              cublasLtMatrixLayout_t ld, cublasLtMatmulPreference_t pref, int want,
                                              cublasLtMatmulHeuristicResult_t res[], int *nres)
{
    uint64_t m, n, k;
    if (!h || !op || !la || !lb || !lc || !ld || !pref || want < 1 || !res || !nres)
        return CUBLAS_STATUS_INVALID_VALUE;
    *nres = 0;
    if (!shape((Desc *)op, (Layout *)la, (Layout *)lb, (Layout *)lc, (Layout *)ld, &m, &n, &k))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    memset(&res[0], 0, sizeof res[0]);
    res[0].algo.data[0] = 0x637565; /* "cue": the one algorithm */
    res[0].workspaceSize = 0;
    res[0].state = CUBLAS_STATUS_SUCCESS;
    res[0].wavesCount = 1.0f;
    *nres = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------ matmul */

/* the enqueued operation: everything read when the call was made */
typedef struct {
    Desc d;
    Layout a, b, c, dd;
    uint64_t m, n, k;
    double alpha, beta;
    const void *pa, *pb, *pc;
    void *pd;
} Job;

static double round_tf32(double v)
{
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) /* finite: round the low 13 bits to nearest even */
        u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
    memcpy(&f, &u, 4);
    return f;
}

static double load(cudaDataType_t t, const void *p, uint64_t i)
{
    switch (t) {
    case CUDA_R_64F: return ((const double *)p)[i];
    case CUDA_R_32F: return ((const float *)p)[i];
    case CUDA_R_16BF: {
        uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    default: { /* CUDA_R_16F */
        uint16_t h = ((const uint16_t *)p)[i];
        int e = (h >> 10) & 0x1f, mant = h & 0x3ff;
        double v = e == 0x1f ? (mant ? NAN : INFINITY) : e ? ldexp(mant | 0x400, e - 25) : ldexp(mant, -24);
        return h & 0x8000 ? -v : v;
    }
    }
}

/* op(X) of one batch as rows x inner doubles, row-major: X's (r, i) element for r < rows, i < inner */
static void gather(double *out, const Layout *l, const void *base, int trans, uint64_t rows, uint64_t inner,
                   int tf32)
{
    for (uint64_t r = 0; r < rows; r++)
        for (uint64_t i = 0; i < inner; i++) {
            /* column-major: element (row, col) at row + col * ld */
            uint64_t at = trans ? i + r * (uint64_t)l->ld : r + i * (uint64_t)l->ld;
            double v = load(l->type, base, at);
            out[r * inner + i] = tf32 ? round_tf32(v) : v;
        }
}

static void run_matmul(void *p)
{
    const Job *j = p;
    const size_t ea = esize(j->a.type), eo = esize(j->dd.type);
    int tf32 = j->d.compute == CUBLAS_COMPUTE_32F_FAST_TF32 && j->a.type == CUDA_R_32F;
    /* op(A) as m x k rows; op(B)^T as n x k rows: both dot products contiguous */
    double *ar = malloc((j->m * j->k + 1) * sizeof *ar), *bc = malloc((j->n * j->k + 1) * sizeof *bc);
    if (!ar || !bc) {
        cuemu_complain("cublasLtMatmul", "out of host memory for a %llu x %llu x %llu GEMM",
                       (unsigned long long)j->m, (unsigned long long)j->n, (unsigned long long)j->k);
        abort();
    }
    for (int32_t bt = 0; bt < j->dd.batch; bt++) {
        const char *a = (const char *)j->pa + (int64_t)bt * j->a.stride * (int64_t)ea;
        const char *b = (const char *)j->pb + (int64_t)bt * j->b.stride * (int64_t)ea;
        const char *c = (const char *)j->pc + (int64_t)bt * j->c.stride * (int64_t)eo;
        char *d = (char *)j->pd + (int64_t)bt * j->dd.stride * (int64_t)eo;
        gather(ar, &j->a, a, j->d.transa != CUBLAS_OP_N, j->m, j->k, tf32);
        gather(bc, &j->b, b, j->d.transb == CUBLAS_OP_N, j->n, j->k, tf32);
        for (uint64_t col = 0; col < j->n; col++)
            for (uint64_t row = 0; row < j->m; row++) {
                double s = 0;
                for (uint64_t i = 0; i < j->k; i++)
                    s += ar[row * j->k + i] * bc[col * j->k + i];
                double v = j->alpha * s;
                if (j->beta != 0)
                    v += j->beta * load(j->c.type, c, row + col * (uint64_t)j->c.ld);
                if (j->d.epilogue == CUBLASLT_EPILOGUE_BIAS)
                    v += load(j->d.bias_type, j->d.bias, row);
                uint64_t at = row + col * (uint64_t)j->dd.ld;
                if (j->dd.type == CUDA_R_64F)
                    ((double *)d)[at] = v;
                else
                    ((float *)d)[at] = (float)v;
            }
    }
    free(ar);
    free(bc);
}

/* every batch of an operand lies in device memory; 0 or -1 after a message */
static int in_device(const char *which, const Layout *l, const void *p)
{
    size_t es = esize(l->type);
    uint64_t one = l->cols ? (l->cols - 1) * (uint64_t)l->ld + l->rows : 0;
    uint64_t span = one + (uint64_t)(l->batch - 1) * (uint64_t)(l->stride > 0 ? l->stride : 0);
    if (one == 0 || (p && cuemu_is_device(p, span * es)))
        return 0;
    cuemu_complain("cublasLtMatmul", "%s [%p, +%llu bytes) is not inside a device allocation", which, p,
                   (unsigned long long)(span * es));
    return -1;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t la, const void *B, cublasLtMatrixLayout_t lb, const void *beta,
                              const void *C, cublasLtMatrixLayout_t lc, void *D, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes, cudaStream_t s)
{
    (void)algo;
    if (!h || !op || !alpha || !beta || !la || !lb || !lc || !ld)
        return CUBLAS_STATUS_INVALID_VALUE;
    Job j;
    memset(&j, 0, sizeof j);
    j.d = *(Desc *)op, j.a = *(Layout *)la, j.b = *(Layout *)lb, j.c = *(Layout *)lc, j.dd = *(Layout *)ld;
    if (!shape(&j.d, &j.a, &j.b, &j.c, &j.dd, &j.m, &j.n, &j.k))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    int wide = j.dd.type == CUDA_R_64F;
    j.alpha = wide ? *(const double *)alpha : *(const float *)alpha;
    j.beta = wide ? *(const double *)beta : *(const float *)beta;
    j.pa = A, j.pb = B, j.pc = C, j.pd = D;
    Layout bias = {j.d.bias_type, j.m, 1, (int64_t)(j.m ? j.m : 1), 1, 0};
    if (in_device("A", &j.a, A) || in_device("B", &j.b, B) || (j.beta != 0 && in_device("C", &j.c, C)) ||
        in_device("D", &j.dd, D) ||
        (j.d.epilogue == CUBLASLT_EPILOGUE_BIAS && in_device("the bias", &bias, j.d.bias)) ||
        (ws_bytes && !cuemu_is_device(ws, ws_bytes)))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (j.m == 0 || j.n == 0)
        return CUBLAS_STATUS_SUCCESS;
    return cuemu_enqueue(s, "cublasLtMatmul", run_matmul, &j, sizeof j) == cudaSuccess ? CUBLAS_STATUS_SUCCESS
                                                                                      : CUBLAS_STATUS_EXECUTION_FAILED;
}
