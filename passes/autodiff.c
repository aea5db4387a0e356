/* autodiff.c — reverse mode: d loss / d every trainable initializer.
 *
 * requires: loss.
 * ensures:  the trainable float initializers (trainable(): --params, else the
 *           graph signature's PARAMETERs, else rank >= 1 and no Pow exponent;
 *           less --freeze) on a differentiable path to the loss become R_PARAM
 *           (the rest stay constants/buffers: no gradient, no optimizer state,
 *           their values unchanged and exported as given); each parameter's
 *           .grad names the value holding its full gradient; the backward
 *           nodes follow the forward ones (g->nfwd marks the boundary).
 *
 * Two sweeps over the node list mark what matters: `fwd` = depends on a
 * trainable initializer, `bwd` = reaches the loss; a value on both is active.
 * The reverse sweep then applies one rule per op (the op layer's,
 * ir/rules/grad_*.c, built with ir/build.c's ad_* helpers) and sums
 * contributions when a value feeds several nodes.  Broadcasting is undone by
 * ad_sum_to().
 *
 * Before any of it, the model must be the module: a parameter the exported
 * program's signature lists but the graph lacks (check_lost) or holds only
 * as an unnamed folded copy (check_folded) is refused.  An embedding weight
 * with a padding_idx gets a note (note_padding); its lookups' gradient rule
 * leaves that row zero (ir/rules/grad_tensor.c).
 */
#include "ir.h"

#include <fnmatch.h>
#include <stdio.h>

/* Does input i of op carry a gradient? (ops.def's diff column) */
static int diff_input(Op op, int i) { return i < 32 && (op_info[op].diff >> i & 1u); }

static void accumulate(Graph *g, int *grad, int v, int contrib, const char *name)
{
    grad[v] = grad[v] < 0 ? contrib : ad_emit(g, OP_Add, ir_fmt("%s.acc", name), grad[v], contrib);
}

/* Apply node n's rule: add the contributions of its outputs' gradients to
 * the gradients of its inputs. */
static void node_grad(Graph *g, int id, int *grad, const char *active)
{
    Node n = g->node[id]; /* copy: emitting nodes moves g->node */
    int need[GRAD_MAX_IN] = {0}, d[GRAD_MAX_IN], any = 0;
    int *dys = ir_alloc(sizeof(int) * (size_t)(n.nout + 1));
    for (int k = 0; k < n.nout; k++)
        dys[k] = grad[n.out[k]];
    for (int i = 0; i < n.nin; i++) {
        d[i < GRAD_MAX_IN ? i : 0] = -1;
        int nd = n.in[i] >= 0 && active[n.in[i]] && diff_input(n.op, i);
        if (nd && i >= GRAD_MAX_IN)
            die("node '%s' (%s): gradient for input %d", n.name, op_info[n.op].name, i);
        if (i < GRAD_MAX_IN)
            any |= need[i] = nd;
    }
    if (!any)
        return;
    for (int k = 1; k < n.nout && !(op_info[n.op].flags & F_DOUT); k++)
        if (dys[k] >= 0)
            node_fatal(g, &n, "the loss depends on output %d ('%s'), and fsdpc differentiates %s through its "
                       "output 0 only; the loss may read only '%s' of it", k,
                       ir_q(g->val[n.out[k]].name), op_info[n.op].name, ir_q(g->val[n.out[0]].name));
    const char *nm = ir_fmt("%s.bwd", n.name);
    GradCtx cx = {g, &n, nm, dys, need, d};
    if (!grad_core(&cx) && !grad_tensor(&cx) && !grad_nn(&cx))
        die("no gradient rule for %s (node '%s')", op_info[n.op].name, n.name);
    for (int i = 0; i < n.nin && i < GRAD_MAX_IN; i++)
        if (need[i] && d[i] != GRAD_IN_OTHER) {
            if (d[i] < 0)
                die("node '%s' (%s): no gradient made for input %d", n.name, op_info[n.op].name, i);
            accumulate(g, grad, n.in[i], d[i], nm);
        }
}

/* Does x's name match one of the n patterns?  used[k]: pattern k matched one. */
static int matches(const char *const *pat, int n, const Value *x, char *used)
{
    int hit = 0;
    for (int k = 0; k < n; k++)
        if (fnmatch(pat[k], x->name, 0) == 0)
            hit = used[k] = 1;
    return hit;
}

/* exp[v]: v is the exponent (input 1) of a Pow */
static char *pow_exponents(const Graph *g)
{
    char *exp = ir_alloc((size_t)g->nval);
    for (int i = 0; i < g->nnode; i++)
        if (g->node[i].op == OP_Pow && g->node[i].in[1] >= 0)
            exp[g->node[i].in[1]] = 1;
    return exp;
}

/* The inputs whose initializer is a weight PyTorch always makes a parameter: MatMul's and Gemm's operands,
 * Conv's weight and bias, a normalisation's scale and bias. */
static int weight_input(Op op, int i)
{
    switch (op) {
    case OP_MatMul: case OP_Gemm: return 1;
    case OP_Conv: case OP_LayerNormalization: case OP_BatchNormalization: return i == 1 || i == 2;
    default: return 0;
    }
}

/* A model with a graph signature whose exporter folded or merged parameters: an initializer the signature
 * does not name feeds a weight input, so training it would train a copy (a pre-transposed val_N) or one
 * weight for several modules.  Refused, with the export that keeps parameters as they are. */
static void check_folded(const Graph *g)
{
    for (int i = 0; i < g->nnode; i++) {
        const Node *n = &g->node[i];
        for (int j = 0; j < n->nin; j++) {
            const Value *x = n->in[j] >= 0 ? &g->val[n->in[j]] : NULL;
            if (x && weight_input(n->op, j) && x->role == R_CONST && x->init_index >= 0 && dtype_is_float(x->dtype) &&
                x->sig == SIG_NONE)
                fatal("%s: initializer '%s' feeds node '%s' (%s) as a weight, but the model's graph signature does "
                      "not name it: the exporter folded or merged parameters, and training it would not train "
                      "the module's; export with torch.onnx.export(model, args, f, dynamo=True, optimize=False), "
                      "or name what to train with --params", g->opt->model, ir_q(x->name), ir_q(n->name),
                      op_info[n->op].name);
        }
    }
}

/* A parameter the exported program's signature lists but the graph lacks (G->sig_lost: the exporter's
 * optimizer removed it, a zero Conv bias, or folded it into another constant) would train a different
 * network with exit 0.  Refused, naming it and the export that keeps it. */
static void check_lost(const Graph *g)
{
    if (g->nsig_lost)
        fatal("%s: parameter '%s'%s is in the model's graph signature but not in its graph: the exporter's "
              "optimizer removed or folded it, and training without it would not train the module; export with "
              "torch.onnx.export(model, args, f, dynamo=True, optimize=False) or (dynamo=False) "
              "do_constant_folding=False, as scripts/export_torch.py does", g->opt->model, ir_q(g->sig_lost[0]),
              g->nsig_lost > 1 ? ir_fmt(" (and %d more)", g->nsig_lost - 1) : "");
}

/* The initializers trained, before the loss has its say: --params names them; else the graph signature's
 * PARAMETERs; else float initializers of rank >= 1 that are no Pow exponent (a scalar is an exported
 * constant: an attention scale, GELU's sqrt(2)).  --freeze takes its matches out of any of these. */
static char *trainable(Graph *g)
{
    const Options *o = g->opt;
    char *pick = ir_alloc((size_t)g->nval), *exp = pow_exponents(g);
    char *used = ir_alloc((size_t)o->nparams + 1), *fused = ir_alloc((size_t)o->nfreeze + 1);
    g->param_rule = o->nparams ? PARAMS_FLAG : g->signature ? PARAMS_SIGNATURE : PARAMS_DEFAULT;
    if (g->param_rule == PARAMS_SIGNATURE)
        check_folded(g);
    check_lost(g);
    for (int v = 0; v < g->nval; v++) {
        const Value *x = &g->val[v];
        if (x->role != R_CONST || x->init_index < 0 || !dtype_is_float(x->dtype))
            continue;
        int frozen = matches(o->freeze, o->nfreeze, x, fused);
        switch (g->param_rule) {
        case PARAMS_FLAG: pick[v] = (char)matches(o->params, o->nparams, x, used); break;
        case PARAMS_SIGNATURE: pick[v] = x->sig == SIG_PARAMETER; break;
        case PARAMS_DEFAULT: pick[v] = x->shape.rank > 0 && !exp[v]; break;
        }
        pick[v] &= !frozen;
    }
    for (int k = 0; k < o->nparams; k++)
        if (!used[k])
            fatal("--params '%s' matches no float initializer of %s", o->params[k], o->model);
    for (int k = 0; k < o->nfreeze; k++)
        if (!fused[k])
            fatal("--freeze '%s' matches no float initializer of %s", o->freeze[k], o->model);
    return pick;
}

/* fwd: depends on a trainable initializer; bwd: reaches the loss. */
static char *mark_active(Graph *g)
{
    int nv = g->nval;
    char *fwd = trainable(g), *bwd = ir_alloc((size_t)nv), *act = ir_alloc((size_t)nv);
    for (int i = 0; i < g->nnode; i++) {
        Node *n = &g->node[i];
        for (int j = 0; j < n->nin; j++)
            if (n->in[j] >= 0 && fwd[n->in[j]] && diff_input(n->op, j))
                for (int k = 0; k < n->nout; k++)
                    fwd[n->out[k]] = dtype_is_float(g->val[n->out[k]].dtype);
    }
    bwd[g->loss] = 1;
    for (int i = g->nnode - 1; i >= 0; i--) {
        Node *n = &g->node[i];
        int live = 0;
        for (int k = 0; k < n->nout; k++)
            live |= bwd[n->out[k]];
        for (int j = 0; live && j < n->nin; j++)
            if (n->in[j] >= 0 && diff_input(n->op, j))
                bwd[n->in[j]] = 1;
    }
    for (int v = 0; v < nv; v++)
        act[v] = fwd[v] && bwd[v];
    return act;
}

/* Each trained embedding weight with a padding_idx (Value.pad_row): a note saying its lookups leave that row
 * untrained (the Gather rule's mask); refused when no forward Gather along axis 0 reads it, as then no mask
 * does what PyTorch does. */
static void note_padding(const Graph *g, int nfwd)
{
    for (int v = 0; v < g->nval; v++) {
        const Value *w = &g->val[v];
        if (w->role != R_PARAM || w->pad_row < 0)
            continue;
        int lookups = 0;
        for (int i = 0; i < nfwd; i++)
            lookups += g->node[i].op == OP_Gather && g->node[i].in[0] == v &&
                       (ir_attr_i(&g->node[i], "axis", 0) == 0 || ir_attr_i(&g->node[i], "axis", 0) == -2);
        if (!lookups)
            fatal("%s: '%s' has a padding_idx (%lld, the export's metadata) but no Gather along its axis 0 reads "
                  "it, so fsdpc cannot keep that row untrained as PyTorch does; export the model again with "
                  "scripts/export_torch.py", g->opt->model, ir_q(w->name), (long long)w->pad_row);
        fprintf(stderr, "fsdpc: note: %s: row %lld of '%s' is its embedding's padding_idx (the export's metadata): "
                "its lookups give that row no gradient, as PyTorch's do\n", g->opt->model, (long long)w->pad_row,
                ir_q(w->name));
    }
}

void pass_autodiff(Graph *g)
{
    char *active = mark_active(g);
    int nparam = 0;
    for (int v = 0; v < g->nval; v++)
        if (active[v] && g->val[v].role == R_CONST) {
            g->val[v].role = R_PARAM;
            g->val[v].persistent = 0;
            nparam++;
        }
    if (!nparam)
        fatal("%s: the loss depends on no trainable float initializer (%s): nothing to train", g->opt->model,
              g->param_rule == PARAMS_FLAG ? "those --params names" : g->param_rule == PARAMS_SIGNATURE
              ? "the graph signature's PARAMETERs" : "rank >= 1, no Pow exponent, not --freeze'd");

    int nfwd = g->nfwd = g->nnode;
    int *grad = ir_alloc(sizeof(int) * (size_t)g->nval * 2 + 16);
    for (int v = 0; v < g->nval; v++)
        grad[v] = -1;
    Shape scalar = {0};
    grad[g->loss] = ir_value(g, "loss.grad", g->val[g->loss].dtype, &scalar, R_ACT);
    ir_node(g, OP_Ones, "loss.grad", 0, NULL, 1, &grad[g->loss]);

    int nval0 = g->nval; /* values made below are never differentiated */
    for (int i = nfwd - 1; i >= 0; i--) {
        Node *n = &g->node[i];
        int flows = 0;
        for (int k = 0; k < n->nout; k++)
            flows |= n->out[k] < nval0 && active[n->out[k]] && grad[n->out[k]] >= 0;
        if (flows)
            node_grad(g, i, grad, active);
    }
    note_padding(g, nfwd);
    for (int v = 0; v < nval0; v++)
        if (g->val[v].role == R_PARAM) {
            if (grad[v] < 0)
                die("parameter '%s' got no gradient", g->val[v].name);
            g->val[v].grad = grad[v];
        }
    ir_link(g);
    share_constants(g); /* the trained initializers are known: the rest are constants for good */
}
