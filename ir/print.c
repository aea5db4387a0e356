/* print.c — the IR as text (fsdpc --dump-after PASS).
 *
 *   values:
 *     %3 f32[16,8] param "fc1.weight" unit 0 @slot0+256
 *   nodes:
 *     %7 = MatMul %2, %3 transB=1            # "fc1/Gemm"
 *     AllGather %12 -> %13 unit 0            # collectives name their unit
 *
 * One line per object, ids in array order, so the output is byte-stable.
 */
#include "ir.h"

static void print_shape(FILE *f, const Shape *s)
{
    fputc('[', f);
    for (int i = 0; i < s->rank; i++)
        fprintf(f, i ? ",%lld" : "%lld", (long long)s->dim[i]);
    fputc(']', f);
}

static void print_loc(FILE *f, const Value *v)
{
    switch (v->loc.kind) {
    case LOC_NONE: break;
    case LOC_ARENA: fprintf(f, " @arena+%lld", (long long)v->loc.off); break;
    case LOC_SLOT:
        fprintf(f, " @slot%d+%lld", v->loc.slot, (long long)v->loc.off);
        if (v->loc.alias) /* what it is with a shard group of one rank */
            fprintf(f, " (F=1: @shard(unit %d, %d)+%lld)", v->loc.unit, v->loc.state, (long long)v->loc.off);
        break;
    case LOC_SHARD:
        fprintf(f, " @shard(unit %d, %d)+%lld", v->loc.unit, v->loc.state, (long long)v->loc.off);
        break;
    }
}

static void print_value(FILE *f, const Graph *g, int i)
{
    const Value *v = &g->val[i];
    fprintf(f, "  %%%d %s", i, dtype_name(v->dtype));
    print_shape(f, &v->shape);
    fprintf(f, " %s \"%s\"", role_name(v->role), v->name);
    if (v->unit >= 0)
        fprintf(f, " unit %d", v->unit);
    if (v->alias_of >= 0)
        fprintf(f, " view %%%d+%lld", v->alias_of, (long long)v->alias_off);
    if (v->grad >= 0)
        fprintf(f, " grad %%%d", v->grad);
    print_loc(f, v);
    fputc('\n', f);
}

static void print_attr(FILE *f, const Attr *a)
{
    fprintf(f, " %s=", a->name);
    switch (a->kind) {
    case A_INT: fprintf(f, "%lld", (long long)a->i); break;
    case A_FLOAT: fprintf(f, "%.9g", a->f); break;
    case A_STRING: fprintf(f, "\"%s\"", a->s); break;
    case A_TENSOR: fprintf(f, "%%%d", a->t); break;
    case A_STRINGS:
        for (int i = 0; i < a->n; i++)
            fprintf(f, "%s\"%s\"", i ? "," : "[", a->strs[i]);
        fputs(a->n ? "]" : "[]", f);
        break;
    case A_INTS:
    case A_FLOATS:
        fputc('[', f);
        for (int i = 0; i < a->n; i++) {
            if (i)
                fputc(',', f);
            if (a->kind == A_INTS)
                fprintf(f, "%lld", (long long)a->ints[i]);
            else
                fprintf(f, "%.9g", a->floats[i]);
        }
        fputc(']', f);
        break;
    }
}

static void print_node(FILE *f, const Node *n)
{
    fputs("  ", f);
    for (int i = 0; i < n->nout; i++)
        fprintf(f, i ? ", %%%d" : "%%%d", n->out[i]);
    if (n->nout)
        fputs(" = ", f);
    fputs(op_info[n->op].name, f);
    for (int i = 0; i < n->nin; i++) {
        fputs(i ? ", " : " ", f);
        if (n->in[i] < 0)
            fputs("_", f);
        else
            fprintf(f, "%%%d", n->in[i]);
    }
    for (int i = 0; i < n->nattr; i++)
        print_attr(f, &n->attr[i]);
    if (n->unit >= 0)
        fprintf(f, " unit %d", n->unit);
    fprintf(f, "    # \"%s\"\n", n->name);
}

void ir_print(FILE *f, const Graph *g)
{
    fprintf(f, "graph: %d values, %d nodes, %d units\n", g->nval, g->nnode, g->nunit);
    for (int u = 0; u < g->nunit; u++) {
        const Unit *un = &g->unit[u];
        fprintf(f, "unit %d \"%s\": %d params, %lld elements\n", u, un->name, un->nparams,
                (long long)un->numel);
    }
    fputs("values:\n", f);
    for (int i = 0; i < g->nval; i++)
        print_value(f, g, i);
    fputs("nodes:\n", f);
    for (int i = 0; i < g->nnode; i++)
        print_node(f, &g->node[i]);
}
