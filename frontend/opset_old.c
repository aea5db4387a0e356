/* opset_old.c — nodes of opsets 7 to 12, read as their versions.
 *
 * The rest of fsdpc knows the ops as opset 13 and later define them.  The
 * versions of opsets 7-12 that differ are rewritten here, right after the
 * frontend made the node, into a form that means the same at opset 13:
 *
 *   attribute → input  Squeeze, Unsqueeze, Split, ReduceSum (13), Pad's pads
 *                      (11), Clip's min, max (11), Slice's starts, ends, axes
 *                      (10), TopK's k (10): fold turns those inputs into the
 *                      attributes of the same name, so the old attribute is
 *                      kept as it is (Pad's float value becomes the constant
 *                      tensor fold would make of constant_value); Dropout's
 *                      ratio (12) becomes a constant input, as it is read
 *   Softmax, LogSoftmax, Hardmax (before 13: the input coerced to 2-D at axis,
 *                      default 1) → Flatten(axis), the op on axis 1, then a
 *                      Reshape back to Shape(x) (views: no data moves)
 *   Resize-10          (X, scales; mode) → Resize(X, , scales) with
 *                      coordinate_transformation_mode asymmetric and, for
 *                      nearest, nearest_mode floor (ONNX's version converter)
 *   Upsample-7, -9     (X; scales attribute or input) → the same Resize
 *                      (the frontend reads it as Resize, and Scatter-9 as
 *                      ScatterElements: the same op renamed)
 *   BatchNormalization-7 spatial 1 is opset 9's only form; spatial 0 is refused
 *
 * A node in the form of a newer version (an input where its opset has an
 * attribute: ops.def's WAS_ATTR rows) is refused, never misread, before it
 * comes here (frontend/onnx.c's version_rules).  Every other change of fsdpc's ops
 * between opsets 7 and 13 widens what a model may say (types, negative axes
 * and indices, broadcasting, optional inputs, new attributes with defaults
 * that keep the old meaning), so the opset 13 reading is the old one too.
 */
#include "opset_old.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---- messages ---------------------------------------------------------------- */

__attribute__((format(printf, 2, 3)))
static _Noreturn void refuse(const OldNode *c, const char *fmt, ...)
{
    char m[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    fatal("%s: %s: %s (at opset %lld; or convert the model with onnx.version_converter.convert_version(model, 13))",
          c->path, c->what, m, (long long)c->opset);
}

/* ---- attributes that became inputs ----------------------------------------- */

/* A scalar float32 constant of value v, named after the node. */
static int scalar_const(const OldNode *c, const Node *n, const char *what, double v)
{
    float f = (float)v;
    Shape s = {.rank = 0};
    return ir_const(c->g, c->fresh(c->fe, ir_fmt("%s.%s", n->name, what)), DT_F32, &s, &f);
}

/* Dropout-7 and -10: the ratio attribute → the ratio input (its reading). */
static void dropout_ratio(const OldNode *c, int id)
{
    const Attr *a = ir_attr(&c->g->node[id], "ratio");
    if (!a)
        return; /* 0.5, the input's default too */
    if (a->kind != A_FLOAT)
        refuse(c, "attribute ratio must be a float");
    int r = scalar_const(c, &c->g->node[id], "ratio", a->f);
    Node *n = &c->g->node[id];
    int *in = ir_alloc(sizeof(int) * 2);
    in[0] = n->in[0];
    in[1] = r;
    n->in = in;
    n->nin = 2;
}

/* Pad-2's float value → the constant tensor fold makes of constant_value. */
static void pad_value(const OldNode *c, int id)
{
    Node *n = &c->g->node[id];
    for (int i = 0; i < n->nattr; i++)
        if (!strcmp(n->attr[i].name, "value") && n->attr[i].kind == A_FLOAT) {
            n->attr[i].t = scalar_const(c, n, "value", n->attr[i].f); /* adds a value, not a node */
            n->attr[i].kind = A_TENSOR;
        }
}

/* ---- Softmax's 2-D coercion --------------------------------------------------- */

/* op(x, axis) before 13 = Reshape(op(Flatten(x, axis), axis 1), Shape(x)).  The
 * node itself becomes the Flatten (its axis attribute, default 1 as the op's). */
static void coerce_2d(const OldNode *c, int id)
{
    Graph *g = c->g;
    Node *n = &g->node[id];
    Op op = n->op;
    const char *base = n->name;
    int x = n->in[0], y = n->out[0];
    int flat = ir_value(g, c->fresh(c->fe, ir_fmt("%s/flat", base)), DT_UNDEF, NULL, R_ACT);
    int two = ir_value(g, c->fresh(c->fe, ir_fmt("%s/2d", base)), DT_UNDEF, NULL, R_ACT);
    int shape = ir_value(g, c->fresh(c->fe, ir_fmt("%s/shape", base)), DT_UNDEF, NULL, R_ACT);
    g->node[id].op = OP_Flatten;
    g->node[id].out[0] = flat;
    int s = ir_node1(g, op, c->fresh(c->fe, ir_fmt("%s/2d", base)), flat, -1, two);
    ir_attr_add(g, s, "axis", A_INT)->i = 1;
    ir_node1(g, OP_Shape, c->fresh(c->fe, ir_fmt("%s/shape", base)), x, -1, shape);
    ir_node1(g, OP_Reshape, c->fresh(c->fe, ir_fmt("%s/reshape", base)), two, shape, y);
}

/* ---- Resize-10 ------------------------------------------------------------------ */

static void set_string(Graph *g, int id, const char *name, const char *s)
{
    if (!ir_attr(&g->node[id], name))
        ir_attr_add(g, id, name, A_STRING)->s = ir_strdup(s);
}

/* Resize(X, scales) of opset 10, or Upsample(X, scales) → Resize(X, , scales), asymmetric coordinates, nearest =
 * floor.  op: the op's name in messages; attr: the attribute besides mode it may have (Upsample-7's scales). */
static void resize_asymmetric(const OldNode *c, int id, const char *op, const char *attr)
{
    Node *n = &c->g->node[id];
    if (n->nin != 2)
        refuse(c, "%s takes X and scales%s; this node has %d input%s", op, c->opset < 9 ? " (as an attribute)" : "",
               n->nin, n->nin == 1 ? "" : "s");
    for (int i = 0; i < n->nattr; i++)
        if (strcmp(n->attr[i].name, "mode") && strcmp(n->attr[i].name, attr))
            refuse(c, "%s has only the attribute mode here; this node has %s", op, ir_q(n->attr[i].name));
    int *in = ir_alloc(sizeof(int) * 3);
    in[0] = n->in[0];
    in[1] = -1;
    in[2] = n->in[1];
    n->in = in;
    n->nin = 3;
    set_string(c->g, id, "coordinate_transformation_mode", "asymmetric");
    if (!strcmp(ir_attr_s(n, "mode", "nearest"), "nearest"))
        set_string(c->g, id, "nearest_mode", "floor");
}

/* Upsample-7's scales attribute → the scales input Upsample-9 takes (float32, as ONNX's floats are). */
static void upsample_scales(const OldNode *c, int id)
{
    Node *n = &c->g->node[id];
    const Attr *a = ir_attr(n, "scales");
    if (n->nin != 1 || !a || a->kind != A_FLOATS || a->n < 1 || a->n > MAX_RANK)
        refuse(c, "Upsample takes X and the attribute scales (a list of floats, one per axis) before opset 9");
    float f[MAX_RANK];
    for (int i = 0; i < a->n; i++)
        f[i] = (float)a->floats[i];
    Shape s = {.rank = 1, .dim = {a->n}};
    int v = ir_const(c->g, c->fresh(c->fe, ir_fmt("%s.scales", n->name)), DT_F32, &s, f);
    n = &c->g->node[id];
    int *in = ir_alloc(sizeof(int) * 2);
    in[0] = n->in[0];
    in[1] = v;
    n->in = in;
    n->nin = 2;
}

void onnx_upsample(const OldNode *c, int id)
{
    if (c->opset < 9)
        upsample_scales(c, id);
    resize_asymmetric(c, id, "Upsample", c->opset < 9 ? "scales" : "mode");
}

/* ---- the entry --------------------------------------------------------------------- */

void onnx_old_node(const OldNode *c, int id)
{
    const Node *n = &c->g->node[id];
    switch (n->op) {
    case OP_Dropout:
        dropout_ratio(c, id);
        break;
    case OP_Pad:
        pad_value(c, id);
        break;
    case OP_Softmax: case OP_LogSoftmax: case OP_Hardmax:
        coerce_2d(c, id);
        break;
    case OP_Resize:
        if (c->opset < 11)
            resize_asymmetric(c, id, "Resize", "mode");
        break;
    case OP_BatchNormalization:
        if (c->opset < 9 && ir_attr_i(n, "spatial", 1) != 1)
            refuse(c, "spatial = %lld (per-element statistics) is not supported",
                   (long long)ir_attr_i(n, "spatial", 1));
        break;
    default:
        break;
    }
}
