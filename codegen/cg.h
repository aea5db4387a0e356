/* cg.h — shared by the codegen files: a growable text buffer and the helpers
 * that turn IR values into C expressions.  Never included by the runtime. */
#ifndef FSDPC_CG_H
#define FSDPC_CG_H

#include "ir.h"

typedef struct {
    char *buf;
    size_t len, cap;
} Buf;

void cg_put(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *cg_cstr(const char *s);       /* a C string literal of any bytes */
const char *cg_comment(const char *s);    /* text safe inside a C comment */
const char *cg_ctype(DType t);            /* "float", "int64_t", ... */
const char *cg_sfx(DType t);              /* kernel suffix: "f32" / "f64" */
/* a GEMM-like kernel's suffix (k_matmul_*, k_attention_*): its operand's dtype when 16-bit ("bf16", "f16"),
 * else its float32 / float64 result's */
const char *cg_gemm_sfx(DType operand, DType result);
const char *cg_kdt(DType t);              /* kernel dtype code: "K_DT_F32", ... */
/* named tensors (emit.c): cg_name_tensors gives every value of g its C name (t_ + its sanitised ONNX name,
 * unique) before the step is emitted; each function of the step is emitted as cg_fn_begin, its body (whose
 * cg_ptr calls return the names of the values it uses), then cg_fn_decls, the declarations of those values
 * (a typed constant pointer each, with its shape and ONNX name in a comment) that go at the body's top */
void cg_name_tensors(const Graph *g);
const char *cg_tensor_name(int v);
const char *cg_ptr(const Graph *g, int v);
void cg_fn_begin(int job);
void cg_fn_decls(Buf *b, const Graph *g);
const char *cg_ints(const int64_t *v, int n); /* "{1, 2, 3}" (never empty) */
Shape cg_attr_shape(const Node *n, const char *name); /* a shape attribute (ConvGrad's xshape, ...) */
int cg_same_place(const Graph *g, int a, int b);
void cg_emit_node(Buf *b, const Graph *g, const Node *n);

/* The target being emitted (1: cuda).  The step is the same text for both:
 * it uses the device pointers (c->dev_*, the host ones on cpu) and
 * rt_memcpy / rt_memset, and calls that check their input on the device
 * register their message with cg_check_end, in call order (kernels/cuda/kc.h).
 * Only kernels/cuda/kc_map.h, included on cuda, makes its k_ calls launch. */
extern int cg_cuda;
/* closes a checked call `{ int64_t bad = k_...(...);`: on cpu with the host
 * test of bad (cpu_test, the C text), on cuda by registering device_msg */
void cg_check_end(Buf *b, const char *cpu_test, const char *device_msg);
extern int cg_ncheck;
extern const char **cg_checks;
/* cuda.c: the kernels for every --arch into dir (images + images.S); the C
 * text of `static const RtImage images[]` into tables; returns their count */
int cg_cuda_images(const Graph *g, const char *dir, Buf *tables, const char **asm_path);
/* cuda.c, --emulate: no device code; the emulation's image ("cuemu:kernels/cuda,fsdpc_model", sm_90) into
 * tables and the model's fused kernels as host C++ (kernels/cuda/emu.h) into dir/fused.cc (*cc_path), which
 * registers them with the emulation when the executable starts; returns the number of images (1) */
int cg_cuemu_images(const Graph *g, const char *dir, Buf *tables, const char **cc_path);
/* objcache.c: the cache folder of compiled kernels (cuda.c) and objects: $FSDPC_CACHE_DIR, else
 * $XDG_CACHE_HOME/fsdpc, else ~/.cache/fsdpc; NULL: none of those is set */
const char *cg_cache_dir(void);
/* mkdir -p dir (failures show when the cache's entry is written) */
void cg_cache_mkdir(const char *dir);
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
void cg_binary_i64(Buf *b, const Graph *g, const Node *n);
void cg_binary(Buf *b, const Graph *g, const char *op, int y, const char *py, int a, const char *pa, int bb,
               const char *pb);
/* a Fused node (emit_fused.c): on cpu an inline loop; on cuda a launch of a
 * generated kernel whose source goes to cg_fused_src, its name to
 * cg_fused_names (cg_nfused of them) */
void cg_emit_fused(Buf *b, const Graph *g, const Node *n);
extern Buf cg_fused_src;
/* the jobs of the scheduled collectives (static functions, before the step) */
extern Buf cg_jobs;
extern int cg_nfused;

/* op families (codegen/emit_*.c): emit n and return 1, or return 0 if n is
 * not theirs */
int cg_tensor(Buf *b, const Graph *g, const Node *n);
int cg_nn(Buf *b, const Graph *g, const Node *n);
/* the initializer name (a C literal) of constant v if the step writes it
 * (Assign: BatchNormalization running statistics), else "0" */
const char *cg_nn_state_name(const Graph *g, int v);
#endif
