/* tensor.h — what the tensor family's files share (ir/rules/tensor.c defines
 * it; ir/rules/shape_tensor.c, ir/rules/grad_tensor.c, passes/fold.c, passes/expand.c and
 * codegen/emit_tensor.c use it): the checked
 * reading of a node's attributes and the description of its data movement,
 * written once and used both by fold (evaluating constants on the host with
 * the kernels) and by codegen (emitting the same kernel calls).
 *
 * After fold, the inputs that decide a shape are attributes of the same name
 * as the ONNX input: Squeeze/Unsqueeze `axes`, Slice `starts ends axes steps`,
 * Split `split`, Expand `shape`, Tile `repeats`, Pad `pads` (+ `value`, a
 * tensor attribute), Trilu `k`, ConstantOfShape `shape`.  Range keeps its
 * three constant inputs.  The shape rules read only attributes, so backward
 * nodes (Slice for Concat's gradient, SliceGrad, ...) are built the same way.
 */
#ifndef FSDPC_TENSOR_H
#define FSDPC_TENSOR_H

#include "ir.h"

/* axis attribute value a of a rank-r tensor, normalised to [0, r) */
int tensor_axis(const Graph *g, const Node *n, int64_t a, int r, const char *what);
/* constant indices ix (none checked when ix is no constant): entry i inside [-lim[i % k], lim[i % k]), else
 * fatal naming node n, the index and the entry (Gather, GatherElements: k 1; GatherND's tuples: k dims) */
void tensor_const_indices(const Graph *g, const Node *n, const Value *ix, const int64_t *lim, int k);
/* indices ix of node n (Gather, GatherElements, ScatterElements, GatherND, ScatterND; int32 ones are cast
 * before the rules run): int64, else fatal naming them, their dtype and the op */
void tensor_index_dtype(const Graph *g, const Node *n, const Value *ix);
/* GatherElements' and ScatterElements' indices ix into data x (node n, attr axis): int64, x's rank, no
 * longer than x off the axis, and, when a constant, inside x along it; returns the axis (fatal otherwise) */
int tensor_elements_axis(const Graph *g, const Node *n, const Value *x, const Value *ix);
/* NDIndex n over index tuples of shape ix [B.., Q.., k]: *nb = prod B (attr batch dims), *nq = prod Q */
void tensor_nd_counts(const Node *n, const Shape *ix, int64_t *nb, int64_t *nq);
/* dense row-major strides of s */
void tensor_dense(const Shape *s, int64_t *st);
/* strides of an operand of shape s broadcast (numpy) to shape y: 0 on the
 * dims s lacks or has as 1 */
void tensor_bcast(const Shape *s, const Shape *y, int64_t *st);
/* an A_INTS attribute, or NULL (count 0) when absent */
const int64_t *tensor_ints(const Node *n, const char *name, int *count);

/* Slice (and SliceGrad, which carries Slice's attributes) on x: for every
 * dim the first element read, the step and the number of elements. */
void tensor_slice(const Graph *g, const Node *n, const Shape *x, int64_t *start, int64_t *step,
                  int64_t *len);
/* Gather on data along axis: data viewed as outer x axis x inner */
void tensor_gather_dims(const Shape *data, int axis, int64_t *outer, int64_t *axdim,
                        int64_t *inner);

/* One k_copy_strided call: out[dst][yoff + idx.ys] = in[src][xoff + idx.xs]
 * for every idx of shape.  src -1 reads the node's fill element (Pad's value,
 * ConstantOfShape's value; strides xs all 0). */
typedef struct {
    int src, dst, rank;
    int64_t shape[2 * MAX_RANK], ys[2 * MAX_RANK], xs[2 * MAX_RANK];
    int64_t yoff, xoff;
} Move;

/* The copies that compute Slice, Split, Concat, Expand, Tile, Transpose,
 * Pad (any mode, any dtype), ConstantOfShape and SliceGrad's non-zero part,
 * in order (later ones overwrite earlier ones).  *m is ir_alloc'ed. */
int tensor_moves(const Graph *g, const Node *n, Move **m);
/* the fill element's bytes in the output dtype (little-endian, low bytes) */
uint64_t tensor_fill(const Graph *g, const Node *n);
/* the tensor attribute `value` (Pad, ConstantOfShape; checked: one element), or NULL */
const Value *tensor_value_attr(const Graph *g, const Node *n);
/* the same as a double; 0 when absent */
double tensor_value(const Graph *g, const Node *n);
/* Pad's mode as a kernel code K_PAD_* */
int tensor_pad_mode(const Graph *g, const Node *n);

/* ONNX TensorProto dtype codes <-> fsdpc dtypes; DT_UNDEF when unsupported */
DType tensor_from_onnx(int64_t code);
int64_t tensor_to_onnx(DType t);
/* "FLOAT16" for an ONNX dtype code */
const char *tensor_onnx_name(int64_t code);
/* kernels.h K_DT_* code of a dtype (k_cast) */
int tensor_kdt(DType t);
/* Range's element count from its constant inputs (checked) */
int64_t tensor_range_len(const Graph *g, const Node *n);
/* a constant's element i as a double / int64 */
double tensor_const_f(const Value *v, int64_t i);
int64_t tensor_const_i(const Value *v, int64_t i);
/* Is node r x * f (Mul or Div by a constant scalar, Scale) for an input x?  Then *x, *f (x / c: f = 1 / c). */
int tensor_scaling(const Graph *g, const Node *r, int *x, double *f);

#endif
