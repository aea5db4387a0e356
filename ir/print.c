/* print.c — the IR as text (fsdpc --dump-after PASS), complete enough that
 * ir/parse.c reads it back: print(parse(print(g))) == print(g).
 *
 *   graph: 40 values, 31 nodes, 2 units
 *   flags: --target cpu --loss mse:y,target --optimizer adamw ...   the options the passes read
 *   state: loss %20 loss_avg %21 grad_norm_sq %-1 nfwd 12 signature 0 params default ncoll 4 ...
 *   inputs: %0 %1
 *   outputs: %9
 *   unit 0 "unit0": 2 params, 136 elements f32 params %3@0 %4@128 flat %30 flatgrad %31 shard %32 ...
 *   slot 0 esize 4 alias 1
 *   fusion 0: 2 members
 *     member %7 = Erf %6    # "gelu/Erf"
 *   values:
 *     %3 f32[16,8] param "fc1.weight" unit 0 @slot0+256 init 1 persistent data=elided:0123456789abcdef
 *   nodes:
 *     %7 = MatMul %2, %3 transB=1    # "fc1/Gemm"
 *     %13 = AllGather %12 unit 0    # "unit0.gather"    (collectives name their unit)
 *
 * One line per object, ids in array order, so the output is byte-stable; the
 * node list is last (tests read everything after "nodes:" as nodes).  Values
 * keep every field a pass reads.  Bytes of constants and parameters (in
 * ir_data_dtype: a parameter's are its unit's dtype, the float32 master
 * copy, even where precision made the parameter bf16): integer and bool
 * data and float data of at most IR_INLINE_NUMEL elements are written inline
 * (floats as the shortest decimal that reads back to the same value, 16-bit
 * floats as their bits in hex); larger float data (weights, whose values no
 * pass reads) is elided with its FNV-1a 64 digest, which the reader keeps
 * and prints back, unless --dump-data asks for every byte; a pass that reads
 * elided bytes stops with one line (ir_data).  Float data not yet read
 * from an external data file is written "data=external" (never read here).
 * Names and strings are quoted with C escapes (\" \\ \n \xHH).
 */
#include "ir.h"

#include <stdlib.h>
#include <string.h>

/* s as a quoted string the reader reads back: " \ and control bytes escaped */
void ir_print_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(f, "\\%c", *c);
        else if (*c == '\n')
            fputs("\\n", f);
        else if (*c < 0x20 || *c == 0x7f)
            fprintf(f, "\\x%02x", *c);
        else
            fputc(*c, f);
    }
    fputc('"', f);
}

/* x as the shortest %g that strtod reads back exactly; mark: with a '.' when
 * it would read as an integer (so a FLOAT attribute stays one) */
void ir_print_double(FILE *f, double x, int mark)
{
    char b[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(b, sizeof b, "%.*g", p, x);
        if (strtod(b, NULL) == x || x != x)
            break;
    }
    fputs(b, f);
    if (mark && !strpbrk(b, ".eEna"))
        fputs(".0", f);
}

/* a float32 as the shortest %g that strtof reads back exactly */
static void print_float(FILE *f, float x)
{
    char b[40];
    for (int p = 1; p <= 9; p++) {
        snprintf(b, sizeof b, "%.*g", p, (double)x);
        if (strtof(b, NULL) == x || x != x)
            break;
    }
    fputs(b, f);
}

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

/* FNV-1a 64 of n bytes at p: the digest of elided data */
uint64_t ir_digest(const void *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const uint8_t *)p)[i]) * 0x100000001b3ull;
    return h;
}

/* element i of data d of dtype t, as the reader reads it back */
static void print_elem(FILE *f, DType t, const void *d, int64_t i)
{
    if (t == DT_F32)
        print_float(f, ((const float *)d)[i]);
    else if (t == DT_F64)
        ir_print_double(f, ((const double *)d)[i], 0);
    else if (dtype_kind(t) == 'f') /* a 16-bit float: its bits */
        fprintf(f, "0x%04x", ((const uint16_t *)d)[i]);
    else if (dtype_kind(t) == 'i')
        fprintf(f, "%lld", (long long)dtype_get_int(d, i, t));
    else
        fprintf(f, "%llu", (unsigned long long)dtype_get_int(d, i, t));
}

DType ir_data_dtype(const Graph *g, int v)
{
    const Value *x = &g->val[v];
    return x->role == R_PARAM && x->unit >= 0 && x->unit < g->nunit ? g->unit[x->unit].dtype : x->dtype;
}

/* a value's bytes: inline, elided with a digest, or still in the external file */
static void print_data(FILE *f, const Graph *g, int id)
{
    const Value *v = &g->val[id];
    DType dt = ir_data_dtype(g, id);
    int ext = !v->data && v->init_index >= 0 && v->init_index < g->ninit && g->ext[v->init_index].loc;
    if (ext) {
        fputs(" data=external", f);
    } else if (!v->data && v->digest) {
        fprintf(f, " data=%s", v->digest);
    } else if (v->data) {
        int64_t n = shape_numel(&v->shape);
        int flt = dt == DT_F32 || dt == DT_F64 || dt == DT_BF16 || dt == DT_F16;
        if (flt && n > IR_INLINE_NUMEL && !g->opt->dump_data) {
            fprintf(f, " data=elided:%016llx", (unsigned long long)ir_digest(v->data, (size_t)n * dtype_size(dt)));
            return;
        }
        fputs(" data=[", f);
        for (int64_t i = 0; i < n; i++) {
            if (i)
                fputc(',', f);
            print_elem(f, dt, v->data, i);
        }
        fputc(']', f);
    }
}

static void print_value(FILE *f, const Graph *g, int i)
{
    static const char *const sig[] = {"none", "parameter", "other"}; /* SigKind order */
    const Value *v = &g->val[i];
    fprintf(f, "  %%%d %s", i, dtype_name(v->dtype));
    print_shape(f, &v->shape);
    fprintf(f, " %s ", role_name(v->role));
    ir_print_str(f, v->name);
    if (v->unit >= 0)
        fprintf(f, " unit %d", v->unit);
    if (v->alias_of >= 0)
        fprintf(f, " view %%%d+%lld", v->alias_of, (long long)v->alias_off);
    if (v->alias_ld)
        fprintf(f, " ld %lld", (long long)v->alias_ld);
    if (v->grad >= 0)
        fprintf(f, " grad %%%d", v->grad);
    print_loc(f, v);
    if (v->init_index >= 0)
        fprintf(f, " init %d", v->init_index);
    if (v->sig != SIG_NONE)
        fprintf(f, " sig %s", sig[v->sig]);
    if (v->pad_row >= 0)
        fprintf(f, " pad_row %lld", (long long)v->pad_row);
    if (v->state)
        fprintf(f, " state %d", v->state);
    if (v->persistent)
        fputs(" persistent", f);
    print_data(f, g, i);
    fputc('\n', f);
}

static void print_attr(FILE *f, const Attr *a)
{
    fprintf(f, " %s=", a->name);
    switch (a->kind) {
    case A_INT: fprintf(f, "%lld", (long long)a->i); break;
    case A_FLOAT: ir_print_double(f, a->f, 1); break;
    case A_STRING: ir_print_str(f, a->s); break;
    case A_TENSOR: fprintf(f, "%%%d", a->t); break;
    case A_STRINGS:
        fputc('[', f);
        for (int i = 0; i < a->n; i++) {
            if (i)
                fputc(',', f);
            ir_print_str(f, a->strs[i]);
        }
        fputc(']', f);
        break;
    case A_INTS:
    case A_FLOATS:
        fputs(a->kind == A_FLOATS && !a->n ? "floats[" : "[", f); /* [] alone reads as ints */
        for (int i = 0; i < a->n; i++) {
            if (i)
                fputc(',', f);
            if (a->kind == A_INTS)
                fprintf(f, "%lld", (long long)a->ints[i]);
            else
                ir_print_double(f, a->floats[i], 1);
        }
        fputc(']', f);
        break;
    }
}

static void print_node(FILE *f, const Node *n)
{
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
    fputs("    # ", f);
    ir_print_str(f, n->name);
    fputc('\n', f);
}

/* one flag and its value, quoted when it holds a blank, a quote or nothing */
static void print_flag(FILE *f, const char *flag, const char *v)
{
    fprintf(f, " %s", flag);
    if (!v)
        return;
    fputc(' ', f);
    if (!*v || strpbrk(v, " \t\"\\#") || strchr(v, '\n'))
        ir_print_str(f, v);
    else
        fputs(v, f);
}

/* --wrap as the flag spells it */
static void print_wrap(FILE *f, const Options *o)
{
    if (o->wrap == WRAP_SIZE) {
        print_flag(f, "--wrap", ir_fmt("size:%lld", (long long)(o->wrap_size ? o->wrap_size : 100000000)));
    } else if (o->wrap == WRAP_BLOCKS) {
        print_flag(f, "--wrap", "blocks");
    } else {
        const char *s = "prefix:";
        for (int k = 0; k < o->nprefix; k++)
            s = ir_fmt("%s%s%s", s, k ? "," : "", o->prefix[k]);
        print_flag(f, "--wrap", s);
    }
}

/* the options the passes read, as fsdpc's own flags (the reader hands them to fsdpc's flag parser) */
static void print_flags(FILE *f, const Options *o)
{
    static const char *const loss[] = {"", "mse", "cross_entropy", "l1", "huber", "smooth_l1", "bce"};
    static const char *const optim[] = {"adamw", "sgd", "adam"}, *const prec[] = {"fp32", "bf16", "fp16"};
    static const char *const shard[] = {"full", "grad_op", "none"}, *const rec[] = {"none", "units", "selective"};
    static const char *const pf[] = {"backward_pre", "backward_post", "none"}; /* the enums' orders */
    fputs("flags:", f);
    print_flag(f, "--target", o->target ? o->target : "cuda");
    if (o->loss != LOSS_NONE)
        print_flag(f, "--loss", ir_fmt("%s:%s,%s", loss[o->loss], o->loss_pred, o->loss_target));
    if (o->loss_param_flag) {
        fprintf(f, " %s ", o->loss_param_flag);
        ir_print_double(f, o->loss_param, 0);
    }
    if (o->label_smoothing > 0) {
        fputs(" --label-smoothing ", f);
        ir_print_double(f, o->label_smoothing, 0);
    }
    if (o->eval) { /* (which refuses the training options) */
        print_flag(f, "--eval", NULL);
    } else {
        print_flag(f, "--optimizer", optim[o->optimizer]);
        print_flag(f, "--precision", prec[o->precision]);
        print_flag(f, "--reduce-dtype", prec[o->reduce_dtype]);
        print_flag(f, "--shard", o->shard == SHARD_HYBRID ? ir_fmt("hybrid:%d", o->hybrid) : shard[o->shard]);
        print_flag(f, "--recompute", rec[o->recompute]);
    }
    print_wrap(f, o);
    for (int k = 0; k < o->nparams; k++)
        print_flag(f, "--params", o->params[k]);
    for (int k = 0; k < o->nfreeze; k++)
        print_flag(f, "--freeze", o->freeze[k]);
    print_flag(f, "--prefetch", pf[o->prefetch]);
    if (o->forward_prefetch)
        print_flag(f, "--forward-prefetch", NULL);
    if (o->max_inflight)
        print_flag(f, "--max-inflight", ir_fmt("%d", o->max_inflight));
    if (o->no_fuse)
        print_flag(f, "--no-fuse", NULL);
    fputc('\n', f);
}

/* the graph's own fields: the loss, the phases, what schedule and memplan decided */
static void print_state(FILE *f, const Graph *g)
{
    static const char *const rule[] = {"default", "signature", "flag"}; /* ParamRule order */
    fprintf(f, "state: loss %%%d loss_avg %%%d grad_norm_sq %%%d nfwd %d signature %d params %s ncoll %d "
               "arena %lld consts %lld peak_act %lld\n", g->loss, g->loss_avg, g->grad_norm_sq, g->nfwd,
            g->signature, rule[g->param_rule], g->ncoll, (long long)g->arena_bytes, (long long)g->const_bytes,
            (long long)g->peak_act_bytes);
    const char *what[2] = {"inputs:", "outputs:"};
    const int *ids[2] = {g->input, g->output}, n[2] = {g->ninput, g->noutput};
    for (int k = 0; k < 2; k++) {
        fputs(what[k], f);
        for (int i = 0; i < n[k]; i++)
            fprintf(f, " %%%d", ids[k][i]);
        fputc('\n', f);
    }
    if (g->nsig_lost) {
        fputs("sig_lost:", f);
        for (int i = 0; i < g->nsig_lost; i++)
            fputc(' ', f), ir_print_str(f, g->sig_lost[i]);
        fputc('\n', f);
    }
}

static void print_unit(FILE *f, const Graph *g, int u)
{
    const Unit *un = &g->unit[u];
    fprintf(f, "unit %d ", u);
    ir_print_str(f, un->name);
    fprintf(f, ": %d params, %lld elements %s params", un->nparams, (long long)un->numel, dtype_name(un->dtype));
    for (int i = 0; i < un->nparams; i++)
        fprintf(f, " %%%d@%lld", un->params[i], (long long)un->offset[i]);
    fprintf(f, " flat %%%d flatgrad %%%d shard %%%d gradshard %%%d state %%%d %%%d\n", un->flat, un->flatgrad,
            un->shard, un->gradshard, un->state[0], un->state[1]);
}

void ir_print(FILE *f, const Graph *g)
{
    fprintf(f, "graph: %d values, %d nodes, %d units\n", g->nval, g->nnode, g->nunit);
    print_flags(f, g->opt);
    print_state(f, g);
    for (int u = 0; u < g->nunit; u++)
        print_unit(f, g, u);
    for (int s = 0; s < g->nslot; s++)
        fprintf(f, "slot %d esize %d alias %d unit %d\n", s, g->slot_esize[s], g->slot_alias[s], g->slot_unit[s]);
    for (int k = 0; k < g->nfusion; k++) {
        fprintf(f, "fusion %d: %d members\n", k, g->fusion[k].n);
        for (int i = 0; i < g->fusion[k].n; i++)
            fputs("  member ", f), print_node(f, &g->fusion[k].member[i]);
    }
    fputs("values:\n", f);
    for (int i = 0; i < g->nval; i++)
        print_value(f, g, i);
    fputs("nodes:\n", f);
    for (int i = 0; i < g->nnode; i++)
        fputs("  ", f), print_node(f, &g->node[i]);
}
