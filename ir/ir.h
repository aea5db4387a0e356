/* ir.h — the one header of the compiler: IR structs, op table, pass entry points.
 *
 * A Graph owns arrays of Values and Nodes referenced by integer ids; there are
 * no pointers between IR objects.  The order of g->nodes IS the program order:
 * every pass leaves the nodes topologically sorted, and after the schedule pass
 * that order is the order the executable runs them in.
 *
 * Memory: the compiler is short-lived and allocates from one arena that is
 * released at exit (ir_alloc / ir_strdup); passes never free.  An in-process
 * driver (tests/fuzz_compile.c) releases it between compiles with ir_reset.
 */
#ifndef FSDPC_IR_H
#define FSDPC_IR_H

#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <setjmp.h>

#define MAX_RANK 8
/* The most elements one tensor may have: every shape fsdpc accepts or infers
 * is checked against it (shape_count), so element counts and byte sizes of
 * the IR never wrap. */
#define MAX_NUMEL ((int64_t)1 << 40)
#define MAX_WORLD (1 << 20) /* ranks of a job (--world, hybrid:F; the runtime's limit too) */

typedef enum {
    DT_UNDEF,
#define DTYPE(name, ctype, size, onnx, kdt, text, model, wide, kind, npy, numpy) DT_##name,
#include "dtypes.def" /* F32, F64, I64, I32, BOOL; BF16, F16; I8, U8, I16, U16, U32, U64 */
    DT_COUNT
} DType;

typedef enum {
#define OP(name, since, types, inmin, inmax, outmin, outmax, diff, flags) OP_##name,
#include "ops.def"
#undef OP
    OP_COUNT
} Op;

/* the dtypes an ONNX op takes (ops.def's types column, where each is spelled
 * out for docs/ops.md) */
typedef enum { T_NONE, T_FLOAT, T_ANY, T_BOOL, T_CMP, T_TEST, T_INDEX, T_SHAPE, T_NUMBER } OpTypes;

enum { F_EW = 1, F_COLL = 2, F_OPT = 4, F_VIEW = 8, F_UNARY = 16, F_BINARY = 32, F_DOUT = 64, F_I64 = 128, F_REDUCE = 256 };

/* a parameter of an elementwise kernel: the float attribute attr of the node
 * (value when absent), the constant value (attr NULL), or, with choices
 * ("none|tanh"), the index of the node's string attribute attr in that list
 * (0 when absent) */
typedef struct {
    const char *attr;
    double value;
    const char *choices;
} OpParam;

typedef struct {
    const char *name;
    int since;           /* 0: fsdpc's own; else the first ONNX opset the frontend reads it at */
    OpTypes types;
    int inmin, inmax;    /* inmax -1: unbounded */
    int outmin, outmax;  /* outmax -1: as many as the node names */
    unsigned diff;       /* bit i: input i carries a gradient */
    int flags;
    /* F_UNARY / F_BINARY: the row of kernels/c/fused.h (KF_UNARY / KF_BINARY)
     * that computes it, its name there ("RELU") and p0, p1 (unary) */
    int kernel;
    const char *kname;
    OpParam param[2];
    /* EW2D: the rows of d/da and d/db (-1: the derivative is 1), and their
     * names ("POW_DA") */
    int dkernel[2];
    const char *dkname[2];
} OpInfo;
extern const OpInfo op_info[OP_COUNT];
/* A part of an ONNX op that exists from an opset on (ops.def's SINCE_IN, WAS_ATTR, SINCE_ATTR and SINCE_VALUE
 * rows): input number `input` (name: its name; was_attr: before, it was the attribute `name`), or (input -1) the
 * attribute `name`, or its string value `value`.  op_since lists them in ops.def's order, ending with op
 * OP_COUNT. */
typedef struct {
    Op op;
    int opset;
    int input;
    const char *name, *value;
    int was_attr;
} OpSince;
extern const OpSince op_since[];

typedef struct {
    int rank;
    int64_t dim[MAX_RANK];
} Shape;

typedef enum {
    R_ACT,       /* activation / temporary of the step */
    R_INPUT,     /* graph input fed from data each step (first axis = batch) */
    R_PARAM,     /* trainable parameter (a view into its unit's gathered flat buffer after shard) */
    R_CONST,     /* constant: non-trainable initializer, Constant node, folded value */
    R_GRAD,      /* gradient of a parameter (a view into its unit's flat grad after shard) */
    R_OPTSTATE,  /* per-parameter optimizer state before shard (m, v, momentum) */
    R_FLAT,      /* a unit's gathered flat parameter, padded to W*ceil(n/W) at run time */
    R_FLATGRAD,  /* a unit's flat gradient, same size as R_FLAT */
    R_SHARD,     /* this rank's shard of a unit's flat parameter (persistent) */
    R_GRADSHARD, /* this rank's shard of the averaged flat gradient (persistent) */
    R_STATESHARD,/* this rank's shard of an optimizer state (persistent); attr in Value.state */
    R_COUNT
} Role;

/* What the model's graph signature (PyTorch's torch.export metadata, read by the frontend) says an
 * initializer is: nothing (no entry), a PARAMETER, or another kind (BUFFER, CONSTANT_TENSOR, ...). */
typedef enum { SIG_NONE, SIG_PARAMETER, SIG_OTHER } SigKind;

/* How autodiff chose the initializers it trains (--report says it). */
typedef enum { PARAMS_DEFAULT, PARAMS_SIGNATURE, PARAMS_FLAG } ParamRule;

/* A slot's users (Graph.slot_alias, Loc.alias): gathered parameters and flat gradients that are, when the shard
 * group is one rank, their unit's param / grad shard itself; anything else. */
enum { SLOT_PARAM = 1, SLOT_GRAD = 2, SLOT_OTHER = 4 };

/* Where a value lives at run time (memplan). */
typedef enum {
    LOC_NONE,   /* not yet planned */
    LOC_ARENA,  /* arena + off: fixed compile-time offset, independent of world size */
    LOC_SLOT,   /* slot[slot] + off: one of the slots, each its largest unit's size (depends on world size) */
    LOC_SHARD,  /* per-unit shard storage: (unit, state kind), length ceil(n/W) */
} LocKind;

typedef struct {
    LocKind kind;
    int slot;       /* LOC_SLOT */
    int unit;       /* LOC_SHARD; LOC_SLOT with alias: the unit */
    int state;      /* LOC_SHARD: 0 param, 1 grad, 2.. optimizer states; LOC_SLOT with alias: 0 or 1 */
    int alias;      /* LOC_SLOT: SLOT_PARAM / SLOT_GRAD when, with a shard group of one rank, the value is
                     * that shard of its unit itself (the slot unused), else 0 */
    int64_t off;    /* bytes */
} Loc;

typedef struct {
    char *name;      /* ONNX name, or a derived one ("fc1.weight.grad") */
    DType dtype;
    Shape shape;
    Role role;
    int unit;        /* FSDP unit, -1 if none */
    int producer;    /* node id, -1 for inputs/params/consts (recomputed by ir_link) */
    int nuses;       /* number of node inputs reading it (ir_link) */
    void *data;      /* R_CONST / R_PARAM: host bytes (numel * size); NULL for a float initializer left in its
                      * external data file (g->ext[init_index]; only float ones are): ir_data() reads it */
    int init_index;  /* index of the ONNX initializer it came from, -1 otherwise */
    SigKind sig;     /* initializers: what the model's graph signature says it is */
    int64_t pad_row; /* an embedding weight: the row its padding_idx names (the export's metadata), which the
                      * lookup gives no gradient (autodiff's Gather rule); -1 none */
    int grad;        /* R_PARAM: value id of its gradient (autodiff), -1 otherwise */
    int state;       /* R_STATESHARD: which state (2 = m / momentum, 3 = v) */
    int alias_of;    /* -1, or the value this one is a view of (shares its bytes) */
    int64_t alias_off; /* bytes into alias_of */
    int64_t alias_ld; /* 0: a view's bytes are dense; else its rows (of the dims after its first two) lie alias_ld
                       * elements apart in alias_of, as q, k and v in a packed projection (passes/pack.c): only
                       * the nodes that pass lets read or write it index it so */
    int persistent;  /* lives across steps (consts, shards) */
    const char *digest; /* read from IR text (ir/parse.c) whose data was not inline: "elided:HEX" (the FNV-1a 64
                      * of the bytes) or "external"; data is NULL and ir_data refuses it */
    Loc loc;         /* filled by memplan */
} Value;

typedef enum { A_INT, A_FLOAT, A_INTS, A_FLOATS, A_STRING, A_TENSOR, A_STRINGS } AttrKind;

typedef struct {
    char *name;
    AttrKind kind;
    int64_t i;
    double f;
    int64_t *ints;
    double *floats;
    int n;           /* length of ints / floats / strs */
    char *s;
    char **strs;     /* A_STRINGS (RNN's activations) */
    int t;           /* A_TENSOR: value id of a R_CONST holding it */
} Attr;

typedef struct {
    Op op;
    char *name;      /* ONNX node name or a derived one; never empty */
    int nin, nout;
    int *in;         /* value ids; -1 marks an omitted optional input */
    int *out;
    int nattr;
    Attr *attr;
    int unit;        /* collectives / optimizer: the unit; -1 otherwise */
} Node;

typedef struct {
    char *name;      /* "unit0", ... ; "root" for the last */
    int nparams;
    int *params;     /* value ids of R_PARAM, in flat order */
    int64_t *offset; /* element offset of each param inside the flat buffer */
    int64_t numel;   /* sum of param numels (unpadded) */
    DType dtype;
    int flat, flatgrad, shard, gradshard; /* value ids (shard pass) */
    int state[2];    /* optimizer state shard value ids, -1 if unused */
} Unit;

/* A group of elementwise nodes that run as one loop (passes/fuse.c): the
 * member nodes, copied, in program order; the last one's output is the
 * Fused node's output, the others' outputs live only inside the loop. */
typedef struct {
    int n;
    Node *member;
} Fusion;

/* --loss KIND (passes/loss.c): mse and cross_entropy are fsdpc's own ops, the others composites */
typedef enum { LOSS_NONE, LOSS_MSE, LOSS_CE, LOSS_L1, LOSS_HUBER, LOSS_SMOOTH_L1, LOSS_BCE } LossKind;
typedef enum { OPT_ADAMW, OPT_SGD, OPT_ADAM } OptKind; /* adam: AdamW's update and state, L2 weight decay */
typedef enum { PREC_FP32, PREC_BF16, PREC_FP16 } Precision; /* fp16: with loss scaling (runtime) */
/* --shard: FULL_SHARD, SHARD_GRAD_OP (no reshard after forward), NO_SHARD
 * (every rank the whole model: DDP), HYBRID_SHARD (shard inside groups of
 * Options.hybrid consecutive ranks, replicate across groups) */
typedef enum { SHARD_FULL, SHARD_GRAD_OP, SHARD_NONE, SHARD_HYBRID } ShardMode;
typedef enum { RECOMPUTE_NONE, RECOMPUTE_UNITS, RECOMPUTE_SELECTIVE } Recompute; /* --recompute's order */
/* --prefetch: when a backward gather starts (passes/schedule.c) */
typedef enum { PREFETCH_PRE, PREFETCH_POST, PREFETCH_NONE } Prefetch;

typedef struct {
    const char *model;       /* path of the .onnx */
    const char *cmdline;     /* fsdpc's command line as given (the header of the emitted main.c); NULL: none */
    const uint8_t *model_data; /* non-NULL (in-process drivers): the model's bytes, model_size of them, read */
    size_t model_size;         /* instead of the file `model` (still its name and directory) */
    const char *out;         /* -o */
    const char *target;      /* "cuda" or "cpu" */
    const char *arch;        /* --arch sm_80,sm_90 (cuda; NULL: the default) */
    int emulate;             /* --emulate (cuda): link the CUDA emulation instead of the GPU libraries */
    LossKind loss;
    const char *loss_pred, *loss_target;
    double loss_param;       /* huber: --huber-delta (1); smooth_l1: --smooth-l1-beta (1) */
    const char *loss_param_flag; /* which of the two was given (NULL: none) */
    double label_smoothing;  /* cross_entropy: --label-smoothing (0) */
    OptKind optimizer;
    int ndims;
    const char *dim_name[64];
    int64_t dim_value[64];
    int64_t dim_default;     /* > 0 (in-process drivers): the size of every symbolic dim --dim leaves unbound */
    int64_t wrap_size;       /* --wrap size:N, parameters per unit */
    enum { WRAP_SIZE, WRAP_BLOCKS, WRAP_PREFIX } wrap;
    int nprefix;             /* --wrap prefix:A,B,...: one unit per prefix */
    const char *prefix[64];
    int nfreeze;             /* --freeze PATTERN (fnmatch, repeatable): initializers kept fixed */
    const char *freeze[64];
    int nparams;             /* --params PATTERN (fnmatch, repeatable): the initializers to train */
    const char *params[64];
    const char *dump_after;  /* pass name or NULL */
    const char *run_pass;    /* --run-pass PASS: run that one pass on the IR text `model` (ir/parse.c) */
    int dump_data;           /* --dump-data: the IR text holds every constant's and parameter's bytes */
    int report;
    int world;               /* --world N for --report (default 2) */
    const char *hw;          /* --hw PROFILE: --report predicts the step on it (codegen/cost.c) */
    const char *report_json; /* --report-json PATH */
    int calibrate;           /* --calibrate: measure this machine, write a profile (-o) */
    int verify;              /* run ir_verify after each pass (--verify, tests) */
    const char *cc;          /* C compiler for the generated step */
    const char *cpu;         /* --cpu: native or an x86-64 level (the step and kernels are built for it); NULL: native */
    int keep_c;              /* --emit-c: keep OUT.c */
    int init_only;           /* --init-only: write OUT.init alone (an executable of the same structure reads it) */
    int quiet;               /* --quiet: no progress lines on stderr (NVRTC's stages); notes and warnings stay */
    int eval;                /* --eval: forward-only executable, outputs written as .npy */
    int no_fuse;             /* --no-fuse: every elementwise node its own kernel */
    int recompute;           /* --recompute: RECOMPUTE_NONE, _UNITS (activations recomputed in backward),
                              * _SELECTIVE (the same, GEMM / conv / attention outputs kept) */
    Precision precision;     /* --precision: the dtype parameters are gathered and GEMMs computed in */
    Precision reduce_dtype;  /* --reduce-dtype: the dtype gradients are reduced in */
    ShardMode shard;         /* --shard */
    int hybrid;              /* --shard hybrid:F: F, the ranks of a shard group */
    Prefetch prefetch;       /* --prefetch backward_pre|backward_post|none */
    int forward_prefetch;    /* --forward-prefetch */
    int max_inflight;        /* --max-inflight K: gathered buffers live at once by prefetch (0: 2) */
} Options;

/* Where an initializer's bytes are in an external data file.  The frontend checked the location as the model
 * was read (inside the model's directory, a regular file holding off + len bytes); the bytes of a float
 * initializer are read only when something needs them: ir_data(), or OUT.init streamed from the file. */
typedef struct {
    const char *loc;     /* the file as the model names it (NULL: the initializer is inline) */
    const char *file;    /* its real path (NULL: missing) */
    const char *what;    /* "initializer 'NAME'", for messages */
    const char *missing; /* the file does not exist (accepted without -o): the one-line error a read gives */
    int64_t off, len;    /* bytes */
} ExtData;

typedef struct {
    Value *val; int nval, capval;
    Node *node; int nnode, capnode;
    int *input; int ninput;     /* graph inputs fed by data (R_INPUT) */
    int *output; int noutput;   /* ONNX graph outputs */
    int loss;                   /* value id of the scalar loss, -1 before loss pass */
    int loss_avg;               /* value id of the all-reduced loss (what is reported) */
    int grad_norm_sq;           /* shard: the global squared gradient norm (--clip-grad-norm), -1 before */
    int nfwd;                   /* autodiff: nodes [0, nfwd) are the forward pass */
    int signature;              /* frontend: the model carries a graph signature (some value has a SigKind) */
    ParamRule param_rule;       /* autodiff: how the trained initializers were chosen */
    const char **sig_lost; int nsig_lost; /* frontend: parameters the exported program's signature lists that
                                 * the graph has no initializer of (the exporter removed or folded them) */
    Unit *unit; int nunit;
    Fusion *fusion; int nfusion;/* fuse: the groups behind the Fused nodes */
    int ncoll;                  /* schedule: collectives (tags 0 .. ncoll-1) */
    int nslot;                  /* memplan: number of slots (gathered parameters, flat gradients) */
    int *slot_esize;            /* memplan: bytes per element of each slot (bf16 gathers: 2) */
    int *slot_unit;             /* memplan: the largest unit whose flat buffers take the slot: the slot holds
                                 * its F*ceil(numel/F) elements (F known at start-up) */
    int *slot_alias;            /* memplan: per slot, what it holds: SLOT_PARAM | SLOT_GRAD | SLOT_OTHER */
    int64_t arena_bytes;        /* memplan: W-independent part of the arena */
    int64_t const_bytes;        /* memplan: bytes of constants inside the arena */
    int64_t peak_act_bytes;     /* memplan: peak of activations (no slots, no consts) */
    /* the original model, kept for export */
    const uint8_t *model_bytes; size_t model_len;
    /* per ONNX initializer (ninit): where its external data is; OUT.init keeps the untrained ones, so that an
     * export needs no original file */
    ExtData *ext; int ninit;
    const Options *opt;
} Graph;

/* ir.c: construction and queries */
void *ir_alloc(size_t n);                         /* zeroed, never NULL, freed at exit */
void ir_reset(void);                              /* free everything ir_alloc returned (in-process drivers) */
typedef struct { void *blk; size_t used, cap; } IrMark;
IrMark ir_mark(void);                             /* the arena now */
void ir_release(IrMark m);                        /* free what ir_alloc returned since m (a graph no longer used) */
char *ir_strdup(const char *s);
char *ir_fmt(const char *fmt, ...);               /* ir_alloc'ed sprintf */
Graph *ir_new(const Options *opt);
int ir_value(Graph *g, const char *name, DType dt, const Shape *s, Role role);
int ir_node(Graph *g, Op op, const char *name, int nin, const int *in, int nout, const int *out);
int ir_const(Graph *g, const char *name, DType dt, const Shape *s, const void *data);
int ir_like(Graph *g, const char *name, int like, Role role); /* same dtype/shape as value like */
int ir_scalar(Graph *g, const char *name, DType dt, double v); /* a scalar constant (float32/64, int32/64, bool) */
int ir_node1(Graph *g, Op op, const char *name, int a, int b, int out); /* 1 or 2 inputs (b=-1) */
Attr *ir_attr_add(Graph *g, int node, const char *name, AttrKind k);
/* an A_INTS attribute holding v[0..n) added to node */
void ir_attr_ints_add(Graph *g, int node, const char *name, const int64_t *v, int n);
int ir_is_read(const Graph *g, int v); /* value v is read by a node or is a graph output */
const Attr *ir_attr(const Node *n, const char *name);
/* Typed readers: def when absent; an attribute of another kind is a user
 * error naming the node ("attribute 'transB' must be an INT, found STRING").
 * ir_attr_f accepts an INT; ir_attr_ints returns NULL (count 0) when absent. */
int64_t ir_attr_i(const Node *n, const char *name, int64_t def);
double ir_attr_f(const Node *n, const char *name, double def);
const char *ir_attr_s(const Node *n, const char *name, const char *def);
const int64_t *ir_attr_ints(const Node *n, const char *name, int *count);
/* parameter i (0, 1) of the elementwise kernel of op (ops.def's EW1 p0, p1)
 * for node n: n is a node of op, or its UnaryGrad (which carries its
 * attributes) */
double ir_kernel_param(const Node *n, Op op, int i);
/* a node's string-valued kernel parameter outside its choices: one line */
void ir_kernel_param_check(const Graph *g, const Node *n);
/* the index of string attribute name in choices ("a|b|c"), 0 when absent;
 * another value: one line naming the choices */
int ir_attr_choice(const Graph *g, const Node *n, const char *name, const char *choices);
int ir_find_value(const Graph *g, const char *name); /* -1 if absent */
/* The host bytes of value v (NULL: none, v is not a constant): its data, or for a float initializer the frontend
 * left in its external data file, the bytes read now (once; one line and exit when they cannot be).  Every test of
 * whether a value that may be float is a known constant reads through it, so that a weight not yet read is never
 * taken for a non-constant (indices and shapes, never deferred, may be read as data). */
const void *ir_data(const Graph *g, int v);
/* Every file the compiler reads is opened this way (the model, its external data, --hw, the kernel cache), so
 * that none can hang it: O_NONBLOCK (a FIFO without a writer does not block the open), refused unless fstat
 * says it is a regular file (a FIFO or device could block or never end), then back to blocking reads.  flags:
 * more open flags (O_NOFOLLOW).  Returns the fd and the file's size in *size, or -1 with the reason as a
 * message's tail in *why ("not a regular file (a FIFO)", strerror). */
int ir_open_regular(const char *path, int flags, int64_t *size, const char **why);
/* Passes the len bytes of external data e to put(ctx, p, n) in order, at most IR_CHUNK at a time: NULL, or the
 * one-line reason they cannot be read (the file gone, shorter, not a regular file; nothing is printed). */
#define IR_CHUNK ((size_t)4 << 20)
const char *ir_ext_stream(const ExtData *e, void (*put)(void *ctx, const void *p, size_t n), void *ctx);
void *ir_ext_load(const Graph *g, const ExtData *e); /* e's bytes in the arena; one line and exit when unreadable */
int64_t shape_numel(const Shape *s);               /* of a checked shape (no overflow test) */
/* The element count of s, or -1 when a dim is negative or the product of
 * its non-zero dims (so every stride, even of an empty tensor) exceeds
 * MAX_NUMEL; never overflows, whatever the dims. */
int64_t shape_count(const Shape *s);
const char *shape_str(const Shape *s);            /* "[2,3]", ir_alloc'ed */
/* A model-supplied name as it may appear in a one-line message: control
 * characters become '?', and it is cut after 80 bytes ("..."). */
const char *ir_q(const char *s);
int shape_eq(const Shape *a, const Shape *b);
/* is v a graph output or the loss's named prediction or target (kept as it is by the passes that drop or merge) */
int ir_wanted(const Graph *g, int v);
size_t dtype_size(DType t);
const char *dtype_name(DType t);
/* the dtype the step computes values of t in (dtypes.def's wide column):
 * t itself for F32, F64, I64, I32, BOOL */
DType dtype_wide(DType t);
/* dtypes.def's kind column: 'f' floating point, 'i' signed, 'u' unsigned, 'b' bool; 0 for DT_UNDEF */
char dtype_kind(DType t);
/* a float the step computes in: f32, f64 (the 16-bit floats are stored only, computed widened to float32) */
int dtype_is_float(DType t);
/* element i of array d of dtype t (any but a float) as an int64 (a uint64 keeps its bits); storing v narrows it
 * by C's conversion; the values an integer dtype holds, [lo, hi] (uint64: up to INT64_MAX, the IR's integers) */
int64_t dtype_get_int(const void *d, int64_t i, DType t);
void dtype_set_int(void *d, int64_t i, DType t, int64_t v);
void dtype_int_range(DType t, int64_t *lo, int64_t *hi);
/* element i of array d of dtype t (a float32, float64 or an integer) as a double; storing v converts it by C's
 * conversion (a bool stores v != 0); 16-bit floats (their bits) are neither read nor written here */
double dtype_get_f(const void *d, int64_t i, DType t);
void dtype_set_f(void *d, int64_t i, DType t, double v);
const char *role_name(Role r);
int64_t value_numel(const Graph *g, int v);
void ir_link(Graph *g);                           /* recompute producer / nuses */
int ir_root(const Graph *g, int v);               /* the value whose bytes v views (v itself if none) */
/* FusedAttention's (and its gradient's) layout of an operand x (q, kt, v, y or a gradient) of rank r: the axis of
 * its rows (t or s: r - 2, or with attr heads, [.., t, H, d], r - 3) and its problems (the leading dims' product,
 * with heads times H) */
int ir_attn_rows_axis(const Node *n, const Shape *x);
int64_t ir_attn_problems(const Node *n, const Shape *x);
/* does n write the bytes of root r: an output, or an input it updates in place (optimizer updates, Assign,
 * ReduceScatter's flat gradient)? */
int ir_writes(const Graph *g, const Node *n, int r);
void ir_set_nodes(Graph *g, Node *nodes, int n);  /* replace node array (reorder/insert) */
/* may input `input` of n be bfloat16 or float16 (ops.def's LOW rows)? */
int ir_reads_low(const Node *n, int input);
/* is unary op looked up in a table of its 65536 bfloat16 values in the cpu fused loops (ops.def's TAB16 rows)? */
int ir_tab16(Op op);

/* print.c / parse.c / verify.c */
#define IR_INLINE_NUMEL 256 /* float data of more elements is elided from the IR text (without --dump-data) */
DType ir_data_dtype(const Graph *g, int v);       /* the dtype of v's data: a parameter's unit's (master) dtype */
void ir_print(FILE *f, const Graph *g);
void ir_print_str(FILE *f, const char *s);        /* a quoted string with C escapes, as parse.c reads it */
void ir_print_double(FILE *f, double x, int mark);/* shortest exact decimal; mark: never reads as an integer */
uint64_t ir_digest(const void *p, size_t n);      /* FNV-1a 64 */
/* The IR text at opt->model (fsdpc --run-pass) as a Graph: print(parse(print(g))) == print(g).  Any fault in the
 * file is one line naming FILE:LINE (exit 1).  ir_parse_flags: the tokens of its "flags:" line, for fsdpc's flag
 * parser (the options the passes read are the file's). */
Graph *ir_parse(const Options *opt);
void ir_parse_flags(const char *path, int *argc, char ***argv);
void ir_verify(const Graph *g, const char *after);

/* errors: user input vs internal bug (see README "Errors") */
_Noreturn void fatal(const char *fmt, ...);       /* "fsdpc: error: ..." exit 1 */
/* a user error at a node: "fsdpc: error: MODEL: node 'NAME' (Op): ..." exit 1 */
_Noreturn void node_fatal(const Graph *g, const Node *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* node_fatal unless s is a shape a tensor may have (shape_count >= 0); what names it */
void node_check_shape(const Graph *g, const Node *n, const Shape *s, const char *what);
/* NULL in fsdpc.  An in-process driver (tests/fuzz_compile.c) points it at its jmp_buf: fatal and
 * node_fatal then longjmp there after printing, instead of exiting (then ir_reset before the next compile). */
extern jmp_buf *ir_fatal_jump;
#define die(...) die_at(__FILE__, __LINE__, __VA_ARGS__)
_Noreturn void die_at(const char *file, int line, const char *fmt, ...); /* internal bug: abort */

/* frontend/onnx.c */
Graph *onnx_load(const Options *opt);

/* passes/: one entry function each, run in the literal list in fsdpc.c */
void pass_fold(Graph *g);
void pass_shape(Graph *g);
void pass_gelu(Graph *g);
void pass_attention(Graph *g);
void share_constants(Graph *g); /* passes/consts.c: every reader of a constant reads the first identical one */
void pass_loss(Graph *g);
void pass_autodiff(Graph *g);
void pass_optim(Graph *g);
void pass_units(Graph *g);
void pass_shard(Graph *g);
void pass_precision(Graph *g);
DType precision_low(Precision p);               /* the 16-bit dtype of --precision bf16 / fp16 */
void pass_recompute(Graph *g);
void pass_fuse(Graph *g);
void pass_schedule(Graph *g);
void pass_pack(Graph *g); /* passes/pack.c: q, k, v read out of their packed projection, dq, dk, dv written in */
void pass_memplan(Graph *g);

/* ir/build.c: what the rules and the passes build with.  shape_node types one
 * node by the shape rules (and checks what they infer); each ad_* returns the
 * new value's id, shaped by shape_node. */
void shape_node(Graph *g, int node);
#define GRAD_MAX_IN 8
typedef struct {
    Graph *g;
    const Node *n;     /* the forward node (a copy: g->node moves while emitting) */
    const char *name;  /* base name for the nodes a rule creates */
    const int *dys;    /* dys[k]: gradient of output k, -1 = none (zero) */
    const int *need;   /* need[i]: input i wants a gradient */
    int *d;            /* out: d[i] = the contribution to input i's gradient, or GRAD_IN_OTHER: input i
                        * is the same value as an earlier input, whose d holds both contributions */
} GradCtx;
#define GRAD_IN_OTHER (-2)
int ad_emit(Graph *g, Op op, const char *name, int a, int b);    /* op(a[, b]) */
int ad_scale(Graph *g, const char *name, int x, double alpha);
int ad_reshape(Graph *g, const char *name, int x, const Shape *to);
int ad_sum_to(Graph *g, const char *name, int dy, int like);     /* undo broadcasting */
int ad_matmul(Graph *g, const char *name, int a, int b, int ta, int tb);
/* gradient rules (ir/rules/grad_*.c): set cx->d for the needed inputs and
 * return 1, or return 0 if the op is not the family's */
int grad_core(GradCtx *cx);     /* elementwise rows, MatMul, Reshape, Transpose, losses */
int grad_tensor(GradCtx *cx);   /* shapes, indexing, data movement, comparisons */
int grad_nn(GradCtx *cx);       /* conv, pooling, normalisation, softmax, reductions */
/* shape rules (ir/rules/shape_*.c): type every output of node and return 1,
 * or return 0 if the op is not the family's */
int shape_core(Graph *g, int node);        /* MatMul, Reshape, Transpose, losses, Identity-likes */
int shape_tensor(Graph *g, int node);
int shape_nn(Graph *g, int node);
int shape_elementwise(Graph *g, int node); /* ops.def's EW1 / EW2 rows (after the families) */

/* codegen/ */
/* --report: the planned memory of one rank at world (as the runtime carves it, at --accum 1) and the bytes it
 * sends per step; nslot: the slots allocated */
typedef struct {
    int64_t params, state, model_state, slots, total, sent;
    int nslot;
} CgPlan;
void cg_plan(const Graph *g, int world, CgPlan *p);
int cg_group_size(const Graph *g, int world);      /* ranks of a shard group: world, 1 (none) or hybrid's F */
int64_t cg_coll_bytes(const Graph *g, const Node *n, int F); /* a gather's / reduce-scatter's whole flat buffer */
/* FLOPs of one rank's step (one micro-step): 2 m n k per matmul, 2 per tap of every convolution output
 * (the forward, dx and dw each), activation recompute excluded: the model FLOPs of MFU */
double cg_step_flops(const Graph *g);
double cg_node_flops(const Graph *g, const Node *n, int hardware); /* hardware: with the work fsdpc redoes */
int cg_is_recompute(const Node *n);               /* a node --recompute units cloned into the backward */
/* cost.c: a machine as the cost model sees it (--hw NAME for a profile shipped in codegen/hw/, or a file
 * written by --calibrate).  Rates in FLOP/s and bytes/s, times in seconds. */
typedef struct {
    char name[64], description[160];
    int per_node;                                 /* devices (ranks) per node */
    double peak[DT_COUNT];                        /* FLOP/s of non-GEMM work by dtype (0: not given) */
    double peak_gemm[DT_COUNT];                   /* FLOP/s of GEMMs by dtype (float32: TF32 on GPUs) */
    double gemm_eff, mem_bw, mem_eff, op_overhead;
    double attn_eff;                              /* fused attention's share of the GEMM peak (default gemm_eff) */
    double overlap;                               /* 1: collectives run beside the compute; 0: inside it */
    double intra_bw, intra_lat, inter_bw, inter_lat; /* collectives: bus bandwidth, latency per ring step */
    double rs_intra_bw, rs_intra_lat, rs_inter_bw, rs_inter_lat; /* reductions' (default: the same) */
} CgHw;
void cg_hw_load(const char *name_or_path, CgHw *hw); /* fatal (one line) on a bad or unknown profile */
/* the predicted step of one rank at world on hw: compute and communication streams as scheduled */
typedef struct {
    double step_s, compute_s, comm_s, exposed_s; /* exposed: time the step waits for a collective */
    double gemm_s, other_s, overhead_s;          /* compute_s's parts: GEMM-like nodes, the rest, per-node cost */
    double op_s[OP_COUNT];                       /* compute_s by op */
    double flops, hw_flops;                      /* model FLOPs (cg_step_flops) and hardware FLOPs */
    double tflops, hw_tflops, mfu, peak;         /* per device; mfu against peak (the GEMM dtype's) */
} CgCost;
void cg_cost(const Graph *g, int world, const CgHw *hw, CgCost *c);
/* --report: the build's units, memory, FLOPs (and with hw its predicted step) */
void cg_report(FILE *f, const Graph *g, int world, const CgHw *hw);
/* --report-json PATH: the build's strategy row[self] at the top level and every row under "strategies"
 * (time keys null without hw); written atomically */
typedef struct {
    const char *strategy;
    CgPlan plan;
    CgCost cost;
} CgRow;
void cg_report_json(const char *path, const Graph *g, int world, const CgHw *hw, const CgRow *row, int nrow,
                    int self);
void cg_build(const Graph *g);                    /* writes OUT.c, OUT.init, builds OUT (either target) */
/* the directories of the runtime's headers and libraries the executables are built with: the build
 * tree's, $FSDPC_HOME's or the install prefix's (fatal when absent) */
void cg_runtime_dirs(const char **inc, const char **lib);
void cg_cpu_check_name(const char *cpu);          /* --cpu NAME: fatal unless native or a known level */
/* the C source cg_build compiles for --target cpu, in memory (*len bytes); nothing written, no cc
 * (tests/fuzz_compile.c) */
const char *cg_source_cpu(const Graph *g, size_t *len);
/* fsdpc --calibrate: measure this machine on world ranks (runtime/calibrate.c) and write the profile out */
void cg_calibrate(const char *out, int world, const char *cc);

#endif
