/* nn.h — what the nn family's three files share (ir/rules/shape_nn.c,
 * ir/rules/grad_nn.c, codegen/emit_nn.c): reading and checking a node's
 * attributes once, into the geometry records the kernels take.
 *
 * The shape rules call these first, so a bad attribute is a user error
 * there (one fatal() line naming the model, node, op and attribute); later
 * calls from the gradient rules and codegen see only checked nodes.
 * Backward nodes carry their forward node's attributes, so the same calls
 * describe them.
 */
#ifndef FSDPC_NN_H
#define FSDPC_NN_H

#include "ir.h"
#include "kernels.h"

/* Seed of Dropout's counter-based RNG (k_dropout): a compile-time constant
 * for now; the mask of element i is a function of (seed, node, step, i). */
#define NN_DROPOUT_SEED 0x6673647063ull /* "fsdpc" */


/* axis attribute value a of a rank-r tensor, normalised to [0, r) */
int nn_axis(const Graph *g, const Node *n, int64_t a, int r, const char *attr);
/* outer x axis x inner around axis ax of s (Softmax's view of a tensor) */
void nn_split(const Shape *s, int ax, int64_t *outer, int64_t *axis, int64_t *inner);

/* Conv: x n c h w, w m c/groups kh kw */
void nn_conv_geom(const Graph *g, const Node *n, const Shape *x, const Shape *w, KConv2d *p);
int64_t nn_conv_ws(const KConv2d *p);  /* = k_conv2d_workspace */
/* node src's Conv attributes (kernel_shape, strides, dilations, group, and
 * pads, or the given pads t l b r when not NULL) added to node dst */
void nn_conv_attrs(Graph *g, int dst, const Node *src, const int64_t *pads);
/* ConvTranspose: x n c h w, w c m/groups kh kw: checks the node, gives its
 * output shape y and the pads (t, l, b, r) of the Conv over y whose data
 * gradient it is (output_shape's pads computed; output padding is in y) */
void nn_convt_geom(const Graph *g, const Node *n, const Value *x, const Value *w, Shape *y, int64_t pads[4]);
/* one spatial dim of a ConvTranspose (in, kernel k, stride st, dilation dl): its output size; pd[2] (begin,
 * end) and *op (output padding) become those of the Conv over the output; os > 0: output_shape's size */
int64_t nn_convt_dim(const Graph *g, const Node *n, int64_t in, int64_t k, int64_t st, int64_t dl, int64_t *op,
                     int64_t pd[2], int64_t os);
/* MaxPool / AveragePool on x n c h w */
void nn_pool_geom(const Graph *g, const Node *n, const Shape *x, KPool2d *p);

/* ReduceMean / Sum / Max: red[d] = 1 where x's dim d is reduced (MAX_RANK
 * entries), kept = the output shape with keepdims.  Returns 0 when the node
 * is a no-op (ReduceSum, no axes, noop_with_empty_axes = 1). */
int nn_reduce_dims(const Graph *g, const Node *n, const Shape *x, Shape *kept, char *red);

/* Dropout: the ratio input (0.5 when absent) and whether it drops at all:
 * the training_mode input when given, else 1 in a training compile and 0 in
 * an --eval build. */
double nn_dropout_ratio(const Graph *g, const Node *n);
int nn_dropout_training(const Graph *g, const Node *n);

/* SoftmaxCrossEntropyLoss: reduction 0 none, 1 sum, 2 mean */
enum { NN_NONE, NN_SUM, NN_MEAN };
int nn_sce_reduction(const Graph *g, const Node *n);

/* BatchNormalization's training_mode attribute */
int nn_bn_training(const Node *n);

#endif
