/* cg.h — shared by the codegen files: a growable text buffer, the state of
 * one compile's emission (Cg, passed to every emitter: no module globals, so
 * in-process compiles such as the fuzzer's and --report's need no resets) and
 * the helpers that turn IR values into C expressions.  Never included by the
 * runtime. */
#ifndef FSDPC_CG_H
#define FSDPC_CG_H

#include "ir.h"

typedef struct {
    char *buf;
    size_t len, cap;
} Buf;

/* the values a function of the step uses (emit.c's named tensors): mark[v] == stamp when v is one of them */
typedef struct {
    int *mark, stamp;
    int *list, n, cap; /* in first-use order */
} CgUses;

/* One compile's codegen state: exe.c's emit_step makes it and every emitter takes it.  The graph, the target,
 * and what emitting the step gathers besides its text. */
typedef struct {
    const Graph *g;
    int cuda;              /* the target being emitted (1: cuda) */
    int team;              /* cpu: the node's code is for a thread of a team that shares its work (team.c) */
    int ncheck;            /* cuda: the checked calls' messages (cg_check_end), in call order */
    const char **checks;
    Buf jobs;              /* the collectives' job functions, before the step */
    Buf fused_src;         /* cuda: the generated fused kernels' source (emit_fused.c) */
    int nfused;            /* ... and their count */
    Buf tables;            /* cpu: the fused loops' tables of a unary op at every bfloat16 value (emit_fused.c, */
    Buf tables_fill;       /* ops.def's TAB16), their definitions and the statements that fill them */
    int ntable;            /* ... their count, and each one's op and parameters as C text (kf_unary_f32's) */
    const char **table_key;
    const char **tname;    /* per value: its C name (cg_name_tensors) */
    CgUses fn, job, *cur;  /* the uses of the step function / collective job being emitted, the current one */
} Cg;

void cg_put(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *cg_cstr(const char *s);       /* a C string literal of any bytes */
const char *cg_comment(const char *s);    /* text safe inside a C comment */
const char *cg_ctype(DType t);            /* "float", "int64_t", ... */
const char *cg_sfx(DType t);              /* kernel suffix: "f32" / "f64" */
/* a GEMM-like kernel's suffix (k_matmul_*, k_attention_*): its operand's dtype when 16-bit ("bf16", "f16"),
 * else its float32 / float64 result's */
const char *cg_gemm_sfx(DType operand, DType result);
const char *cg_kdt(DType t);              /* kernel dtype code: "K_DT_F32", ... */
/* named tensors (emit.c): cg_name_tensors gives every value of cg->g its C name (t_ + its sanitised ONNX name,
 * unique) before the step is emitted; each function of the step is emitted as cg_fn_begin, its body (whose
 * cg_ptr calls return the names of the values it uses), then cg_fn_decls, the declarations of those values
 * (a typed constant pointer each, with its shape and ONNX name in a comment) that go at the body's top */
void cg_name_tensors(Cg *cg);
const char *cg_ptr(Cg *cg, int v);
void cg_fn_begin(Cg *cg, int job);
void cg_fn_decls(Cg *cg, Buf *b);
const char *cg_ints(const int64_t *v, int n); /* "{1, 2, 3}" (never empty) */
Shape cg_attr_shape(const Node *n, const char *name); /* a shape attribute (ConvGrad's xshape, ...) */
int cg_same_place(const Graph *g, int a, int b);
void cg_emit_node(Cg *cg, Buf *b, const Node *n);

/* The target being emitted: Cg.cuda.  The step is the same text for both:
 * it uses the device pointers (c->dev_*, the host ones on cpu) and
 * rt_memcpy / rt_memset, and calls that check their input on the device
 * register their message with cg_check_end, in call order (kernels/cuda/kc.h).
 * Only kernels/cuda/kc_map.h, included on cuda, makes its k_ calls launch. */
/* closes a checked call `{ int64_t bad = k_...(...);`: on cpu with the host
 * test of bad (cpu_test, the C text), on cuda by registering device_msg */
void cg_check_end(Cg *cg, Buf *b, const char *cpu_test, const char *device_msg);
/* cuda.c: the device code for every --arch into dir (images + images.S): kernels/cuda's library (compiled
 * once per arch and NVRTC, then from the kernel cache) and, when the model has fused kernels (cg->fused_src),
 * the model's own program; the C text of `static const RtImage images[]` (each with its part) into tables;
 * returns their count */
int cg_cuda_images(const Cg *cg, const char *dir, Buf *tables, const char **asm_path);
/* cuda.c, --emulate: no device code; the emulation's images ("cuemu:kernels/cuda", and "cuemu:fsdpc_model"
 * when the model has fused kernels, sm_90) into tables and the model's fused kernels as host C++
 * (kernels/cuda/emu.h) into dir/fused.cc (*cc_path), which registers them with the emulation when the
 * executable starts; returns the number of images (1 or 2) */
int cg_cuemu_images(const Cg *cg, const char *dir, Buf *tables, const char **cc_path);
/* objcache.c: the cache folder of compiled kernels (cuda.c) and objects: $FSDPC_CACHE_DIR, else
 * $XDG_CACHE_HOME/fsdpc, else ~/.cache/fsdpc, made if missing; NULL: none of those is set, or the folder is
 * not this user's (or root's) or others can write into it (a warning says which) */
const char *cg_cache_dir(void);
/* notes.c: the notes (stderr) on what OUT needs that this machine lacks: an NVIDIA driver (cuda), a native bf16
 * GEMM (cpu, --precision bf16) */
void cg_notes(const Graph *g);

/* the kernels.h op code of an elementwise op ("K_RELU", "K_ADD") and a unary
 * op's two parameters as C text (emit.c) */
const char *cg_kernel_op(Op op);
const char *cg_unary_params(Op op, const Node *n);
/* y = a OP b (k_binary, op "K_ADD"...) broadcast to y's shape; py, pa, pb
 * their pointers as C text (emit_nn.c); cg_binary_i64: node n's, on int64
 * (a division by zero fails the step) */
void cg_binary_i64(Cg *cg, Buf *b, const Node *n);
void cg_binary(Cg *cg, Buf *b, const char *op, int y, const char *py, int a, const char *pa, int bb,
               const char *pb);
/* a Fused node (emit_fused.c): on cpu an inline loop; on cuda a launch of a
 * generated kernel fsdpc_fused<K> whose source goes to cg->fused_src
 * (cg->nfused of them) */
void cg_emit_fused(Cg *cg, Buf *b, const Node *n);
/* the step's tables (emit_fused.c) as C text: their definitions and a function tables() that fills them the
 * first time it is called (step() calls it first); "" when there are none */
const char *cg_fused_tables(const Cg *cg);

/* op families (codegen/emit_*.c): emit n and return 1, or return 0 if n is
 * not theirs */
int cg_tensor(Cg *cg, Buf *b, const Node *n);
int cg_nn(Cg *cg, Buf *b, const Node *n);
/* the initializer name (a C literal) of constant v if the step writes it
 * (Assign: BatchNormalization running statistics), else "0" */
const char *cg_nn_state_name(const Graph *g, int v);
#endif
