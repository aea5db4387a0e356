/* fold.h — what passes/fold.c and the files of its rewrites (expand.c, compose.c, seq.c, ...) share: the sweep
 * over the program, its visit, and the rewrites each file does.
 * Private to passes/: nothing else includes it. */
#ifndef FSDPC_FOLD_H
#define FSDPC_FOLD_H

#include "ir.h"
#include "rules/nn.h"

typedef struct { int v, n; int *el; } Seq; /* sequence value v: the tensors el[0..n) */

typedef struct {
    Graph *g;
    int *order;                /* node ids in the new program order */
    int n, cap;
    int nnew;                  /* numbers the names of inserted values */
    Seq *seq;                  /* the sequences resolved so far */
    int nseq, seqcap;
} Sweep;


/* Fold or shape node id; keep it in the program unless folded (fold.c). */
void fold_visit(Sweep *s, int id);
/* input i of n, which must be a constant (else one line naming the node and what) (fold.c) */
const Value *fold_const_in(Graph *g, const Node *n, int i, const char *what);
/* MatMul node id's operands that are Transposes of the last two axes read through transA / transB (fold.c) */
void fold_matmul_operands(Sweep *s, int id);
/* the attribute `name` of node id, replacing one of that name (fold.c) */
Attr *fold_set_attr(Graph *g, int id, const char *name, AttrKind k);
/* op(in) named NODE/suffix with the ints attribute attr = {axis} (Split / Squeeze / Unsqueeze's axes), visited;
 * its output (seq.c) */
int seq_part(Sweep *s, int id, Op op, int in, const char *suffix, const char *attr, int64_t axis);
/* sequences (seq.c), before node id's canonicalisation: 1 if it was a sequence op (or an Identity of a
 * sequence) and is gone from the program (its output a sequence or a constant); 0 if it is a tensor op to
 * canonicalise (SequenceAt and ConcatFromSequence rewritten into one); one line if it reads a sequence else */
int seq_resolve(Sweep *s, int id);
/* the sequence value v holds, or NULL if v is not a sequence (seq.c) */
const Seq *seq_of(const Sweep *s, int v);
/* op(a[, b]) named NODE/suffix writing out (-1: a new value), visited; its output (expand.c) */
int fold_expand(Sweep *s, int id, Op op, int a, int b, const char *suffix, int out);
/* expand.c's builders for expand_attn.c and einsum.c: op(in[0..nin)) / op(a[, b]) named NODE/suffix writing out (-1: a new
 * value), not yet visited (the caller adds attributes, then visits it): its node; op(a, b, c) visited: its
 * output; a scalar constant v of dtype dt (float32/64, int32/64 or bool); x reshaped to dims[0..n) (x itself
 * when it has them); x transposed by perm (rank n); a reduction op of x over axis (keepdims) — the last three
 * visited, their output */
int expand_node_n(Sweep *s, int id, Op op, const int *in, int nin, const char *suffix, int out);
int expand_node(Sweep *s, int id, Op op, int a, int b, const char *suffix, int out);
int expand3(Sweep *s, int id, Op op, int a, int b, int c, const char *suffix, int out);
int expand_scalar(Sweep *s, int id, DType dt, double v, const char *suffix);
int expand_reshape(Sweep *s, int id, int x, const int64_t *dims, int n);
int expand_perm(Sweep *s, int id, int x, const int64_t *perm, int n, const char *suffix);
int expand_reduce(Sweep *s, int id, Op op, int x, int axis, int keepdims, const char *suffix, int out);
/* compose.c's builders for the expansions: Cast(x) to `to`; a scalar constant of a float dtype; a constant of
 * dtype t and shape sh whose element i is f(i, ctx) (float32, float64, int64, int32 or bool); f = i */
int fold_cast(Sweep *s, int id, int x, DType to, const char *suffix, int out);
int fold_scalar(Sweep *s, int id, DType dt, double v, const char *suffix);
int fold_const_fill(Sweep *s, int id, DType t, const Shape *sh, double (*f)(int64_t, const int64_t *),
                    const int64_t *ctx, const char *suffix);
double fold_index_of(int64_t i, const int64_t *ctx);

/* composite ops into the ops fsdpc computes (expand.c): each replaces node id by nodes it visits */
void expand_rmsnorm(Sweep *s, int id);    /* RMSNormalization */
void expand_logical(Sweep *s, int id);    /* IsNaN, IsInf, And, Or, Xor */
void expand_argmax(Sweep *s, int id);     /* ArgMax, ArgMin */
void expand_topk(Sweep *s, int id);
void expand_recurrent(Sweep *s, int id);  /* RNN, GRU, LSTM: unrolled (recurrent.c) */
void expand_gridsample(Sweep *s, int id); /* gridsample.c */
void expand_cumsum(Sweep *s, int id);
void expand_gather_nd(Sweep *s, int id);
void expand_scatter(Sweep *s, int id);    /* ScatterND, ScatterElements */
void expand_resize(Sweep *s, int id);
void expand_einsum(Sweep *s, int id);     /* einsum.c */
void expand_attention(Sweep *s, int id);  /* expand_attn.c */
void expand_rope(Sweep *s, int id);       /* RotaryEmbedding (expand_attn.c) */

/* integer arithmetic at run time (intarith.c) */
int int_widen(Sweep *s, int id);          /* int32 arithmetic in int64: the int32 output to narrow into, or -1 */
void int_narrow(Sweep *s, int id, int y32);
int int_unary(Sweep *s, int id);          /* Neg, Abs, Sign of int64: 1 if replaced */
int int_pow(Sweep *s, int id);            /* Pow's operands; 1 if replaced (an integer base) */
/* narrow dtypes computed in wide ones: narrow_begin before the node's canonicalisation (0: none), narrow_end
 * after it */
typedef struct {
    int k;           /* outputs: node id's, and the new values it writes instead */
    int *orig, *wide;
    int noutput;     /* the graph's output count before */
    DType nt;        /* the narrow dtype of the data outputs (DT_UNDEF: none) */
} Narrowing;
int narrow_begin(Sweep *s, int id, Narrowing *nw);
void narrow_end(Sweep *s, int id, const Narrowing *nw);
/* 1-D convolutions and pooling as 2-D ones (lift1d.c): lift_1d before the node's canonicalisation (0: not one),
 * lower_1d after it */
int lift_1d(Sweep *s, int id, int orig[2], int *nout);
void lower_1d(Sweep *s, int id, const int orig[2], int nout);
void explicit_pads(Sweep *s, int id);     /* auto_pad written as the pads it stands for (lift1d.c) */
/* 3-D convolutions and pooling composed of 2-D ones (lift3d.c): 1 if node id was one and is replaced */
int lift_3d(Sweep *s, int id);
/* compositions (compose.c): the reductions written as a ReduceSum (the node's own output, -1: not one; *shift:
 * LogSumExp's max) and their epilogue after the ReduceSum is visited; Mean's scale; OneHot */
int compose_reduce(Sweep *s, int id, int *shift);
void compose_reduce_end(Sweep *s, int id, Op of, int y, int shift);
int compose_mean(Sweep *s, int id);
void compose_mean_end(Sweep *s, int id, int n, int y);
/* Sum / Mean (made an Add) and Min / Max of n inputs: a chain of n - 1 two-input nodes (1: done, node id
 * replaced); of one input, an Identity (0: canonicalise node id) */
int compose_variadic(Sweep *s, int id);
void compose_gemm(Sweep *s, int id);            /* MatMul [-> Scale alpha] [-> Add (Scale beta) C] */
void compose_onehot(Sweep *s, int id);
void compose_convt(Sweep *s, int id);
void compose_lppool(Sweep *s, int id);
/* LpPool's and the 3-D pools' parts: the window sums of x over q (a depthwise Conv of ones) written into out
 * (-1: new), its output; attribute p checked; |x|^p; y^(1/p) written into out */
int compose_sum_pool(Sweep *s, int id, int x, const KPool2d *q, int out);
int64_t compose_lp_p(Sweep *s, int id);
int compose_lp_power(Sweep *s, int id, int x, int64_t p);
void compose_lp_root(Sweep *s, int id, int y, int64_t p, int out);
void compose_hardmax(Sweep *s, int id);
void compose_lpnorm(Sweep *s, int id);
void compose_swish(Sweep *s, int id);
void compose_prelu(Sweep *s, int id);
void compose_shrink(Sweep *s, int id);
void compose_global_max(Sweep *s, int id);
void compose_eyelike(Sweep *s, int id);
void compose_space_depth(Sweep *s, int id);     /* SpaceToDepth, DepthToSpace */
void compose_instance_norm(Sweep *s, int id);
void compose_group_norm(Sweep *s, int id);
void compose_center_crop_pad(Sweep *s, int id);
void compose_affine_grid(Sweep *s, int id);
void compose_swiglu(Sweep *s, int id);
void compose_window(Sweep *s, int id);          /* HannWindow, HammingWindow, BlackmanWindow */
void compose_lrn(Sweep *s, int id);
void compose_reverse_sequence(Sweep *s, int id);

#endif
