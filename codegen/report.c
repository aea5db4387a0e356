/* report.c — fsdpc --report: units and the planned memory of one rank.
 *
 * The figures follow the runtime's start-up carving exactly (runtime/rt.h):
 * the fixed arena, nslot slots of W*ceil(n_u/W) elements for the largest unit
 * u that takes the slot (memplan.c's slot_unit), of each slot's element size
 * (2 bytes for bf16 gathers; with a shard group of one rank, only the slots
 * holding more than gathered parameters and flat gradients that are their
 * shards: memplan.c; at --accum 1), and per unit
 * (2 + optimizer states) shards of ceil(n_u/W) elements, each piece rounded
 * up to 64 bytes.  The executable prints the same numbers when it starts.
 */
#define _POSIX_C_SOURCE 200809L /* fileno, fsync */
#include "cg.h"
#include "rules/nn.h"
#include "afile.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

static int64_t al(int64_t x) { return (x + 63) / 64 * 64; }

/* the ranks of a shard group at world: every rank, one (NO_SHARD) or hybrid's F */
int cg_group_size(const Graph *g, int world)
{
    return g->opt->shard == SHARD_NONE ? 1 : g->opt->shard == SHARD_HYBRID ? g->opt->hybrid : world;
}

void cg_plan(const Graph *g, int world, CgPlan *p)
{
    int nstate = g->opt->optimizer == OPT_SGD ? 1 : 2, F = cg_group_size(g, world);
    memset(p, 0, sizeof *p);
    for (int u = 0; u < g->nunit; u++) {
        const Unit *un = &g->unit[u];
        int64_t len = (un->numel + F - 1) / F, es = (int64_t)dtype_size(un->dtype);
        p->params += un->numel;
        p->state += (2 + nstate) * al(len * es);
        p->model_state += (2 + nstate) * un->numel * es;
    }
    int alias = F == 1 ? SLOT_PARAM | SLOT_GRAD : 0; /* as the executable decides at --accum 1 (runtime/load.c) */
    for (int s = 0; s < g->nslot; s++)
        if (g->slot_alias[s] & ~alias) {
            p->slots += al((g->unit[g->slot_unit[s]].numel + F - 1) / F * F * (int64_t)g->slot_esize[s]);
            p->nslot++;
        }
    p->total = al(g->arena_bytes) + p->slots + p->state;
    /* bytes one rank sends per step under the ring algorithms' cost: a gather or
     * reduce-scatter of S bytes over F ranks sends (F-1)/F S, an all-reduce of
     * S over R ranks 2(R-1)/R S (HYBRID and NO_SHARD: the shard over the R
     * replicas after the group's reduce-scatter) */
    int R = world / F;
    for (int i = 0; i < g->nnode; i++) {
        const Node *n = &g->node[i];
        if (n->op != OP_AllGather && n->op != OP_ReduceScatter)
            continue;
        int64_t S = cg_coll_bytes(g, n, F);
        p->sent += S * (F - 1) / F;
        if (n->op == OP_ReduceScatter)
            p->sent += 2 * (R - 1) * (S / F) / R;
    }
}

int64_t cg_coll_bytes(const Graph *g, const Node *n, int F)
{
    const Unit *un = &g->unit[n->unit];
    int64_t len = (un->numel + F - 1) / F;
    /* the dtype on the wire: the gathered one; the reduced one (--reduce-dtype's copy when there is one) */
    int wire = n->op == OP_AllGather ? n->out[0] : n->nout > 1 && n->out[1] >= 0 ? n->out[1] : n->in[0];
    return len * F * (int64_t)dtype_size(g->val[wire].dtype);
}

/* the share of a fused attention's t x s scores its kernels compute: under a causal band (attrs causal,
 * window) the keys each query sees, the masked ones skipped; 1 otherwise */
static double band_share(const Node *n, int64_t t, int64_t s)
{
    if (!ir_attr_i(n, "causal", 0) || t <= 0 || s <= 0)
        return 1;
    const int64_t w = ir_attr_i(n, "window", 0);
    double kept = 0;
    for (int64_t i = 0; i < t; i++) {
        const int64_t hi = i + s - t < s - 1 ? i + s - t : s - 1, lo = w && i + s - t - w + 1 > 0 ? i + s - t - w + 1 : 0;
        kept += hi >= lo ? (double)(hi - lo + 1) : 0;
    }
    return kept / ((double)t * (double)s);
}

/* the FLOPs of node n: 2 m n k per matmul, 2 per tap of a convolution output (the forward, dx and dw
 * each), the unfused chain's products for fused attention; hardware: also the fused attention backward's
 * recomputed scores (the model's FLOPs leave them out, like activation recompute), and only the scores a
 * causal band keeps (the model's FLOPs count them all, as the unfused chain computes them) */
double cg_node_flops(const Graph *g, const Node *n, int hardware)
{
    if (n->op == OP_MatMul || n->op == OP_MatMulAdd) {
        const Shape *sa = &g->val[n->in[0]].shape, *sy = &g->val[n->out[0]].shape;
        int ta = (int)ir_attr_i(n, "transA", 0);
        return 2.0 * (double)shape_numel(sy) * (double)sa->dim[sa->rank - (ta ? 2 : 1)];
    }
    if (n->op == OP_FusedAttention || n->op == OP_FusedAttentionGrad) {
        /* q kt and p v forward; dv, dp, dq, dkt backward */
        const int grad = n->op == OP_FusedAttentionGrad;
        const Shape *q = &g->val[n->in[grad]].shape, *v = &g->val[n->in[grad + 2]].shape;
        const int rows = ir_attn_rows_axis(n, q); /* t and s: the same axis of q and v */
        const double ts = (double)shape_numel(q) / (double)q->dim[q->rank - 1] * (double)v->dim[rows];
        const double dk = (double)q->dim[q->rank - 1], dv = (double)v->dim[v->rank - 1];
        const double f = (grad ? 2.0 : 1.0) * 2.0 * ts * (dk + dv) + (grad && hardware ? 2.0 * ts * dk : 0.0);
        return hardware ? f * band_share(n, q->dim[rows], v->dim[rows]) : f;
    }
    if (n->op == OP_Conv || n->op == OP_ConvGrad) {
        KConv2d p;
        Shape xs = n->op == OP_Conv ? g->val[n->in[0]].shape : cg_attr_shape(n, "xshape");
        Shape ws = n->op == OP_Conv ? g->val[n->in[1]].shape : cg_attr_shape(n, "wshape");
        nn_conv_geom(g, n, &xs, &ws, &p);
        /* one product: every output element sums c/groups x kh x kw taps */
        double one = 2.0 * (double)(p.n * p.m * p.oh * p.ow) * (double)(p.c / p.groups * p.kh * p.kw);
        int need = n->op == OP_Conv ? 1 : (int)ir_attr_i(n, "need", 0);
        return one * (double)((need & 1) + ((need & 2) != 0)); /* the forward, dx, dw: one product each */
    }
    return 0;
}

int cg_is_recompute(const Node *n)
{
    size_t len = strlen(n->name);
    return len >= 10 && !strcmp(n->name + len - 10, "@recompute");
}

double cg_step_flops(const Graph *g)
{
    double f = 0;
    for (int i = 0; i < g->nnode; i++)
        if (!cg_is_recompute(&g->node[i])) /* activation recompute: hardware work, not the model's */
            f += cg_node_flops(g, &g->node[i], 0);
    return f;
}

/* what autodiff trains and how it chose, and the float initializers it keeps fixed; at most MAX_NAMES names
 * of each */
enum { MAX_NAMES = 16 };

static void list_initializers(FILE *f, const Graph *g, int trained)
{
    int n = 0;
    int64_t bytes = 0;
    for (int v = 0; v < g->nval; v++) {
        const Value *x = &g->val[v];
        if (x->init_index < 0 || (trained ? x->role != R_PARAM : x->role != R_CONST ||
                                  (x->dtype != DT_F32 && x->dtype != DT_F64)))
            continue;
        if (n < MAX_NAMES)
            fprintf(f, "%s%s", n ? ", " : ": ", ir_q(x->name));
        n++;
        bytes += value_numel(g, v) * (int64_t)dtype_size(x->dtype);
    }
    if (n > MAX_NAMES)
        fprintf(f, ", ... (%d more)", n - MAX_NAMES);
    fprintf(f, "%s (%d, %lld B)\n", n ? "" : ": none", n, (long long)bytes);
}

static void report_params(FILE *f, const Graph *g)
{
    const char *how = g->param_rule == PARAMS_FLAG ? "--params: the initializers it names"
                    : g->param_rule == PARAMS_SIGNATURE ? "the model's graph signature: its PARAMETERs"
                    : "the default rule: float initializers of rank >= 1, no Pow exponent";
    fprintf(f, "trained (chosen by %s%s, on a differentiable path to the loss)", how,
            g->opt->nfreeze ? ", less --freeze" : "");
    list_initializers(f, g, 1);
    fprintf(f, "fixed float initializers");
    list_initializers(f, g, 0);
}

/* the prediction on hw (cost.c), in a line */
static void report_cost(FILE *f, const Graph *g, int world, const CgHw *hw)
{
    CgCost c;
    cg_cost(g, world, hw, &c);
    fprintf(f, "predicted on %s (%s), world %d: step %.4g s (compute %.4g s: GEMMs %.4g, other kernels %.4g, "
            "per-kernel cost %.4g; communication %.4g s, %.4g s of it exposed); %.4g TFLOPS per device (model FLOPs; "
            "%.4g with the work recompute adds), MFU %.1f %% of %.4g TFLOPS\n",
            hw->name, *hw->description ? hw->description : "no description", world, c.step_s, c.compute_s, c.gemm_s,
            c.other_s, c.overhead_s, c.comm_s, c.exposed_s, c.tflops, c.hw_tflops, 100 * c.mfu, c.peak / 1e12);
    fprintf(f, "  predicted compute by op:");
    for (int k = 0, taken[OP_COUNT] = {0}; k < 8; k++) { /* the 8 largest */
        int best = -1;
        for (int op = 0; op < OP_COUNT; op++)
            if (!taken[op] && c.op_s[op] > 0 && (best < 0 || c.op_s[op] > c.op_s[best]))
                best = op;
        if (best < 0)
            break;
        taken[best] = 1;
        fprintf(f, "%s %s %.3g s (%.1f %%)", k ? "," : "", op_info[best].name, c.op_s[best],
                100 * c.op_s[best] / c.compute_s);
    }
    fprintf(f, "\n");
}

void cg_report(FILE *f, const Graph *g, int world, const CgHw *hw)
{
    report_params(f, g);
    int F = cg_group_size(g, world);
    fprintf(f, "units (world %d, shard groups of %d):\n", world, F);
    for (int u = 0; u < g->nunit; u++) {
        const Unit *un = &g->unit[u];
        int64_t len = (un->numel + F - 1) / F;
        fprintf(f, "  %-8s %6d params %12lld elements  shard %lld (+%lld padding)\n", un->name,
                un->nparams, (long long)un->numel, (long long)len,
                (long long)(len * F - un->numel));
    }
    CgPlan p;
    cg_plan(g, world, &p);
    fprintf(f, "parameters: %lld in %d units\n", (long long)p.params, g->nunit);
    fprintf(f, "memory per rank (world %d):\n", world);
    fprintf(f, "  shards (params, grads, optimizer)  %14lld B  (unsharded model state %lld B)\n",
            (long long)p.state, (long long)p.model_state);
    fprintf(f, "  gathered slots (%d, unit-sized)     %14lld B\n", p.nslot, (long long)p.slots);
    fprintf(f, "  arena: constants                   %14lld B\n", (long long)g->const_bytes);
    fprintf(f, "  arena: activations (peak)          %14lld B\n", (long long)g->peak_act_bytes);
    fprintf(f, "  planned peak                       %14lld B\n", (long long)p.total);
    fprintf(f, "  sent per step (ring algorithms)    %14lld B\n", (long long)p.sent);
    fprintf(f, "FLOPs per rank per step (matmuls and convolutions, forward and backward, no recompute): %.6g\n",
            cg_step_flops(g));
    if (hw)
        report_cost(f, g, world, hw);
}

/* s as a JSON string: control characters and bytes outside ASCII escaped (valid JSON whatever the bytes) */
static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++)
        if (*c == '"' || *c == '\\')
            fprintf(f, "\\%c", *c);
        else if (*c < 0x20 || *c > 0x7e)
            fprintf(f, "\\u%04x", *c);
        else
            fputc(*c, f);
    fputc('"', f);
}

static void json_row(FILE *f, const CgRow *r, int hw, const char *indent)
{
    fprintf(f, "%s\"strategy\": ", indent);
    json_str(f, r->strategy);
    fprintf(f, ",\n%s\"peak_bytes_per_rank\": %lld,\n%s\"state_bytes_per_rank\": %lld,\n"
            "%s\"sent_bytes_per_step\": %lld,\n", indent, (long long)r->plan.total, indent,
            (long long)r->plan.state, indent, (long long)r->plan.sent);
    if (!hw) {
        fprintf(f, "%s\"step_time_s\": null,\n%s\"tflops_per_device\": null,\n%s\"mfu\": null", indent, indent,
                indent);
        return;
    }
    const CgCost *c = &r->cost;
    fprintf(f, "%s\"gemm_s\": %.17g,\n%s\"other_kernels_s\": %.17g,\n%s\"overhead_s\": %.17g,\n", indent, c->gemm_s,
            indent, c->other_s, indent, c->overhead_s);
    fprintf(f, "%s\"step_time_s\": %.17g,\n%s\"compute_s\": %.17g,\n%s\"comm_s\": %.17g,\n"
            "%s\"exposed_comm_s\": %.17g,\n%s\"tflops_per_device\": %.17g,\n%s\"hw_tflops_per_device\": %.17g,\n"
            "%s\"mfu\": %.17g", indent, c->step_s, indent, c->compute_s, indent, c->comm_s, indent, c->exposed_s,
            indent, c->tflops, indent, c->hw_tflops, indent, c->mfu);
}

void cg_report_json(const char *path, const Graph *g, int world, const CgHw *hw, const CgRow *row, int nrow,
                    int self)
{
    RtAFile af; /* written beside path and renamed over it: never through a link planted there */
    FILE *f = rt_afile_fopen(&af, path, 0666);
    if (!f)
        fatal("--report-json %s: cannot create a temporary beside it: %s", ir_q(path), strerror(errno));
    fprintf(f, "{\n  \"model\": ");
    json_str(f, g->opt->model);
    fprintf(f, ",\n  \"target\": ");
    json_str(f, g->opt->target);
    fprintf(f, ",\n  \"world\": %d,\n  \"hw\": ", world);
    if (hw)
        json_str(f, hw->name);
    else
        fputs("null", f);
    fprintf(f, ",\n  \"params\": %lld,\n  \"flops_per_step\": %.17g,\n", (long long)row[self].plan.params,
            cg_step_flops(g));
    if (hw)
        fprintf(f, "  \"hw_flops_per_step\": %.17g,\n  \"peak_tflops\": %.17g,\n", row[self].cost.hw_flops,
                row[self].cost.peak / 1e12);
    json_row(f, &row[self], hw != NULL, "  ");
    fprintf(f, ",\n  \"strategies\": [");
    for (int i = 0; i < nrow; i++) {
        fprintf(f, "%s\n    {\n", i ? "," : "");
        json_row(f, &row[i], hw != NULL, "      ");
        fprintf(f, "\n    }");
    }
    fprintf(f, "\n  ]\n}\n");
    if (rt_afile_commit(&af) != 0)
        fatal("--report-json %s: cannot write: %s", ir_q(path), strerror(errno));
}
