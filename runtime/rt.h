/* rt.h — the runtime library inside every fsdpc executable.
 *
 * The compiler emits one C file per model: static tables describing the model
 * (units, parameters, inputs, constants, the memory plan) and a step function
 * that calls kernels and the collectives below in schedule order.  Its main()
 * is `return rt_main(argc, argv, &model);`.  Everything that does not depend
 * on the model — flags, MPI, the arena, data, initial weights, metrics,
 * export — lives here.  This header never includes compiler headers; the
 * compiler includes it to know the ABI it emits against.
 *
 * Memory: one allocation per rank, carved at start-up:
 *   [ arena_bytes: fixed compile-time offsets (constants, inputs, activations) ]
 *   [ nslot slots, each F*ceil(numel_u/F) elements (u = slot_unit[s]) of slot_esize[s] bytes: gathered params,
 *     flat grads ]
 *   [ per unit: RT_NSTATE shards of ceil(numel_u/F) elements: param, grad, optimizer ]
 *   [ --accum-mode local: per unit F*ceil(numel_u/F) elements: the summed flat gradient ]
 * Only the last two depend on the world size: F is the shard group's size
 * (the world size W for FULL_SHARD and SHARD_GRAD_OP, 1 for NO_SHARD).
 *
 * Eval builds (fsdpc --eval, m->eval = 1) are forward-only: no units,
 * parameters or slots (every initializer is a constant), inputs of exact
 * shapes from --input, one call of step, then rank 0 writes m->output[]
 * from the arena to --out-dir as .npy files (runtime/eval.c).
 */
#ifndef FSDPC_RT_H
#define FSDPC_RT_H

#include <stdint.h>
#include <stddef.h>

/* dtype codes: identical to the compiler's DType numbering */
enum { RT_F32 = 1, RT_F64 = 2, RT_I64 = 3, RT_I32 = 4, RT_BOOL = 5, RT_BF16 = 6, RT_F16 = 7,
       RT_I8 = 8, RT_U8 = 9, RT_I16 = 10, RT_U16 = 11, RT_U32 = 12, RT_U64 = 13 };
enum { RT_ADAMW = 0, RT_SGD = 1, RT_ADAM = 2 };
/* shard kinds per unit: shard[u * RT_NSTATE + k] */
enum { RT_S_PARAM = 0, RT_S_GRAD = 1, RT_S_M = 2, RT_S_V = 3, RT_NSTATE = 4 };
/* a slot's users (ir.h's SLOT_*): gathered parameters / flat gradients that can be their unit's shard itself when
 * the shard group is one rank; anything else */
enum { RT_SLOT_PARAM = 1, RT_SLOT_GRAD = 2, RT_SLOT_OTHER = 4 };

#define RT_MAX_RANK 8
#define RT_INIT_MAGIC "FSDPC-INIT-v3\0\0" /* 16 bytes incl. padding NULs */
#define RT_INIT_HEADER 64 /* magic, id, file size, the header's own checksum, the checksum of the table of the
                           * sections' checksums that ends the file (u64 LE each), zeros */

typedef struct {
    const char *name;
    int64_t numel;        /* unpadded flat length */
    int dtype;
    int nstate;           /* optimizer states used: 0, 1 (sgd momentum), 2 (adamw m, v) */
    int64_t file_off;     /* OUT.init offset of the unpadded initial flat values */
} RtUnit;

typedef struct {
    const char *name;     /* ONNX initializer name (for export) */
    int unit;
    int64_t offset;       /* element offset inside the unit's flat buffer */
    int64_t numel;
    int rank;             /* its number of dims (--no-decay's default: no weight decay where rank < 2) */
} RtParam;

typedef struct {
    const char *name;     /* graph input name, as in --data NAME=FILE.npy */
    int dtype;
    int rank;
    int64_t shape[RT_MAX_RANK]; /* shape[0] = per-rank batch b (eval: the exact shape, rank >= 0) */
    int64_t arena_off;
} RtInput;

typedef struct {
    int64_t file_off, arena_off, nbytes;  /* constants copied from OUT.init at start */
    const char *name;     /* ONNX initializer the step writes back (BatchNormalization running
                           * statistics), exported with its current value; NULL for the others */
} RtConst;

/* an initializer of the original model kept in an external data file and not trained: its bytes in OUT.init,
 * from which --export-onnx copies them (the export then needs no file of the original) */
typedef struct {
    int init;             /* its index among the ONNX graph's initializers */
    int64_t file_off, nbytes;
} RtExtern;

/* cuda target: the embedded NVRTC outputs, one per --arch and part (codegen/cuda.c): the library of
 * kernels/cuda (kc_names, the same for every model) and the model's own program (its fused kernels, when it
 * has any); dev_cuda.c loads the best image of each part for the GPU as a library of its own */
enum { RT_IMAGE_KERNELS, RT_IMAGE_MODEL };
typedef struct {
    const char *arch;     /* "sm_90" (cubin) or "compute_80" (PTX, for newer GPUs) */
    const unsigned char *data;
    int64_t len;
    int part;             /* RT_IMAGE_KERNELS (kernel ids < KC_COUNT) or RT_IMAGE_MODEL (KC_COUNT + k) */
} RtImage;

typedef struct {
    const char *name;     /* graph output name */
    int dtype;
    int rank;
    int64_t shape[RT_MAX_RANK];
    int64_t arena_off;
} RtOutput;

struct RtCtx;

/* elements [lo, hi) of a unit's flat layout, whose parameters decay (or not) and train at lr * lr_mult */
typedef struct {
    int64_t lo, hi;
    int decay;
    double lr_mult;
} RtOptRun;

typedef struct {
    uint64_t id;          /* must equal the id in OUT.init */
    uint64_t key;         /* this executable: id and the step's code (batch, strategy, layout); the ranks of a
                           * run must agree on it */
    const char *name;     /* model file name, for messages */
    int nunit;   const RtUnit *unit;
    int nparam;  const RtParam *param;
    int ninput;  const RtInput *input;
    int nconst;  const RtConst *cnst;
    int64_t arena_bytes;  /* fixed part */
    int nslot;
    const int *slot_esize; /* bytes per element of each slot */
    const int *slot_unit;  /* the largest unit each slot holds: the slot is its F*ceil(numel/F) elements */
    const int *slot_alias; /* what each slot holds (RT_SLOT_* bits): a slot of only RT_SLOT_PARAM / _GRAD values
                            * is not allocated where the executable makes them their shards (RtCtx.slot_alias) */
    int64_t loss_off;     /* arena offset of the averaged loss scalar */
    int64_t gnorm_off;    /* arena offset of the global squared gradient norm (units' dtype), -1: none */
    int shard_group;      /* ranks per shard group (fsdpc --shard): 0 every rank (full, grad_op), 1 (none),
                           * F (hybrid:F, the world a multiple of F) */
    int loss_dtype;
    int64_t rank_loss_off; /* arena offset of this rank's own loss (before the average; loss_dtype),
                            * read after a step whose loss is not finite: -1 none */
    int optimizer;        /* RT_ADAMW / RT_SGD / RT_ADAM */
    int64_t model_off, model_len; /* the original ONNX bytes inside OUT.init */
    void (*step)(struct RtCtx *);
    int eval;             /* 1: forward-only executable (fsdpc --eval): no units, no optimizer */
    int noutput; const RtOutput *output; /* eval: the graph outputs, written after the step */
    /* cuda target only (0 / NULL on cpu): */
    int target_cuda;
    int nimage; const RtImage *image;     /* kernels: cubins and PTX, of both parts */
    int ncheck; const char *const *check; /* messages of the step's device-side checks, in call
                                           * order (kernels/cuda/kc.h, kc_next_check) */
    int nnode;            /* the step's nodes (--trace: their names) */
    const char *const *trace_name;
    int ncoll;            /* the step's collectives (rt_coll_start tags 0 .. ncoll-1) */
    int nfused; const char *const *fused; /* the generated elementwise kernels in the model's images,
                                           * launched as kc_launch(KC_COUNT + k, ...) */
    int nextern; const RtExtern *ext; /* the untrained initializers stored as external data (export) */
    int loss_scaling;     /* 1: built with --precision fp16: the step scales the loss by c->loss_scale */
    double flops;         /* model FLOPs of one rank's micro-step (fsdpc's count: matmuls and convolutions,
                           * forward and backward; 0: unknown) */
    int64_t tokens;       /* what one rank's micro-step consumes: label positions (cross_entropy) or samples */
    const char *token_unit; /* "tok" or "samples" */
    uint64_t dropout_seed; /* the build's dropout seed (c->seed without --seed) */
    /* cpu target only (NULL on cuda): */
    const char *cpu;       /* what the step was compiled for (fsdpc --cpu: native or an x86-64 level) */
    const char *cpu_kernels; /* the level of the kernels it links */
    const char *const *cpu_needs; /* the CPU features that lets the compiler use (RT_CPU_FEATURES' names),
                                   * NULL-terminated: rt_dev_init refuses to run on a CPU without one */
    int (*bf16_native)(void); /* a step of bf16 GEMMs (fsdpc --precision bf16): k_bf16_gemm_native (0: they run
                               * widened to float32 on this CPU, which rank 0 says at start); NULL otherwise */
    int64_t (*conv_bytes)(void); /* a step with convolutions: k_conv2d_dnnl_bytes, the bytes oneDNN's convolutions
                                  * hold outside the arena (rank 0 says so at the end); NULL otherwise */
} RtModel;

/* x86 features -march may enable, as X(GCC's macro without its underscores, __builtin_cpu_supports name):
 * the generated step lists those its compiler defined, the cpu runtime checks them at start.  Those GCC 12
 * and Clang 14 both know (not lzcnt, movbe, f16c, adx, sha, avxvnni, avx512fp16, which no CPU has without
 * the others of its level). */
#define RT_CPU_FEATURES(X)                                                                                   \
    X(SSE3, "sse3") X(SSSE3, "ssse3") X(SSE4_1, "sse4.1") X(SSE4_2, "sse4.2") X(SSE4A, "sse4a")              \
    X(POPCNT, "popcnt") X(AES, "aes") X(PCLMUL, "pclmul") X(AVX, "avx") X(AVX2, "avx2") X(FMA, "fma")        \
    X(FMA4, "fma4") X(XOP, "xop") X(BMI, "bmi") X(BMI2, "bmi2") X(GFNI, "gfni") X(VPCLMULQDQ, "vpclmulqdq")  \
    X(AVX512F, "avx512f") X(AVX512VL, "avx512vl") X(AVX512BW, "avx512bw") X(AVX512DQ, "avx512dq")            \
    X(AVX512CD, "avx512cd") X(AVX512VBMI, "avx512vbmi") X(AVX512VBMI2, "avx512vbmi2")                         \
    X(AVX512IFMA, "avx512ifma") X(AVX512VNNI, "avx512vnni") X(AVX512BITALG, "avx512bitalg")                   \
    X(AVX512VPOPCNTDQ, "avx512vpopcntdq") X(AVX512BF16, "avx512bf16")

typedef struct RtCtx {
    const RtModel *m;
    uint64_t seed;        /* Dropout's seed: m->dropout_seed, moved by --seed S (rt_seed) */
    int rank, world;
    int sf, srank;        /* ranks of this rank's shard group (F) and this rank's place in it: groups
                           * are F consecutive ranks, shards ceil(numel / F) long */
    char *arena;          /* fixed part */
    char **slot;          /* nslot pointers */
    int slot_alias;       /* RT_SLOT_PARAM: gathered parameters are their shard (a shard group of one rank);
                           * | RT_SLOT_GRAD: flat gradients too (and --accum 1); see rt_slot_alias */
    char **shard;         /* nunit * RT_NSTATE pointers (NULL where unused) */
    int64_t *shard_len;   /* per unit: ceil(numel / sf) */
    int64_t step;         /* 1-based, for bias correction */
    double lr, weight_decay, beta1, beta2, eps, momentum;
    int nesterov;         /* --nesterov (sgd) */
    double clip_norm;     /* --clip-grad-norm (0: none) */
    int64_t micro, accum; /* --accum: micro-steps per step, and this one (0-based): gradients
                           * accumulate over them, the update runs after the last */
    char **acc;           /* --accum-mode local (with accum > 1): per unit a flat gradient of
                           * sf * shard_len elements summing the micro-steps, reduce-scattered
                           * after the last; NULL otherwise (comm: reduce-scattered every one) */
    void *impl;           /* runtime-private */
    void *trace;          /* --trace: the events recorded (NULL: off) */
    /* what the step runs on: the same layout as arena / slot / shard, in
     * device memory on the cuda target, the same pointers on cpu */
    char *dev_arena;
    char **dev_slot;
    char **dev_shard;
    char **dev_acc;
    /* the optimizers' step count for this step's update (bias correction; 1-based): step, less the steps
     * skipped (an fp16 overflow, --on-nonfinite skip); updates: the updates done so far; skipped: the steps
     * skipped so far */
    int64_t opt_step, updates, skipped;
    /* --precision fp16 (m->loss_scaling): the loss scale S of this step (0 without loss scaling), the
     * updates since S last changed (it doubles every --loss-scale-growth-interval of them) */
    double loss_scale;
    int64_t scale_good;
    /* a validation pass (--val-data, --val-tokens): the step runs only its forward to the averaged loss,
     * Dropout as the identity and BatchNormalization on its running statistics (codegen/exe.c) */
    int validating;
    /* per unit, opt_nrun[u] runs of its flat layout that the optimizer updates alike (--no-decay,
     * --lr-mult): it updates each run's part of this rank's shard */
    RtOptRun **opt_run;
    int *opt_nrun;
} RtCtx;

int rt_main(int argc, char **argv, const RtModel *m);
/* the cpu target's fsdpc --calibrate: measure this machine over the ranks mpirun started and write the
 * profile argv[1] (runtime/calibrate.c); kernels: the kernel library's level it is linked with */
int rt_calibrate(int argc, char **argv, const char *kernels);

/* Collectives (MPI on the CPU target, NCCL on cuda).  Lengths are elements
 * of dtype.  "The group" is this rank's shard group (c->sf ranks); its
 * replicas are the ranks at the same place of every other group. */
/* every shard of the group into full (sf * shard_len elements) */
void rt_allgather(RtCtx *c, void *full, const void *shard, int64_t shard_len, int dtype);
/* zero full[numel .. sf*shard_len), average across all ranks (the group,
 * then the replicas), keep this rank's shard */
void rt_reduce_scatter_avg(RtCtx *c, void *shard, void *full, int64_t numel,
                           int64_t shard_len, int dtype);
/* rt_reduce_scatter_avg of a float32 full buffer reduced in bfloat16 (--reduce-dtype bf16): full
 * rounded into scratch (bf16, sf*shard_len elements), summed there, this rank's piece
 * divided by the world size into the float32 shard */
void rt_reduce_scatter_avg_bf16(RtCtx *c, void *shard, void *full, void *scratch, int64_t numel,
                                int64_t shard_len);
/* average across all ranks */
void rt_allreduce_avg(RtCtx *c, void *x, int64_t n, int dtype);
/* the sum across the group: over shards, every replica holding the same */
void rt_allreduce_sum(RtCtx *c, void *x, int64_t n, int dtype);

/* The step's collectives run beside it (fsdpc's schedule pass decides when):
 * rt_coll_start hands job, which makes the calls above for the collective of
 * tag (0 <= tag < m->ncoll, node: its index in the step, for --trace), to
 * its lane: RT_LANE_GATHER (all-gathers) or RT_LANE_REDUCE (reduce-scatters
 * and all-reduces).  cuda: each lane is a stream of its own with its own
 * NCCL communicators, so a gather overlaps a reduce-scatter as well as the
 * compute; cpu: both lanes are the one communication thread (at world 1,
 * or FSDPC_COMM_THREAD=0, a job runs at once).  rt_coll_wait(tag) returns
 * (cuda: orders the compute stream) once it is done.  A lane runs its jobs
 * one at a time in start order, so every rank issues each communicator's
 * collectives in one order. */
enum { RT_LANE_GATHER, RT_LANE_REDUCE, RT_NLANE };
void rt_coll_start(RtCtx *c, int tag, int node, int lane, void (*job)(RtCtx *));
void rt_coll_wait(RtCtx *c, int tag);

/* One GEMM node of the emitted step (codegen/emit.c), k_matmul's arguments by name: batch GEMMs of
 * C[m, n] = alpha op(A)[m, k] op(B)[k, n] (+ beta C), A and B advancing stride_a / stride_b elements from one to
 * the next (0: the same matrix for all), op transposing where trans_a / trans_b.  RT_GEMM(d) spells its
 * geometry as k_matmul_* and k_matmul_add_* take it. */
typedef struct {
    int64_t batch, stride_a, stride_b, m, n, k;
    int trans_a, trans_b;
    double alpha, beta;
} RtGemm;
#define RT_GEMM(d) (d).batch, (d).stride_a, (d).stride_b, (d).m, (d).n, (d).k, (d).trans_a, (d).trans_b

/* --trace: node ended now (-1: the step starts), called by the step when c->trace */
void rt_trace(RtCtx *c, int node);
/* the cpu step's mark after node i (not in a validation pass): one line per node of the emitted step */
#define RT_TRACE(c, i)                          \
    do {                                        \
        if ((c)->trace && !(c)->validating)     \
            rt_trace((c), (i));                 \
    } while (0)

/* Byte copies and fills inside the step (memcpy / memset on cpu; on cuda
 * asynchronous device copies on the compute stream) */
void rt_memcpy(void *dst, const void *src, int64_t bytes);
void rt_memset(void *dst, int byte, int64_t bytes);

/* A run-time failure inside the step (e.g. a label out of range): prints
 * "NAME: error: step S, rank R: <msg>" and brings every rank down. */
_Noreturn void rt_step_fail(RtCtx *c, const char *fmt, ...);

#endif
