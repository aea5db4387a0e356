/* team.c — one OpenMP team for a run of nodes in the emitted step (exe.c's
 * emit_phase_fn asks, node by node, whether the node joins the run).
 *
 * Every kernel call of the step forks the OpenMP team and joins it (a parallel region each: about 210 a step of
 * the 128/4/128/8 GPT at 2 threads before runs existed), and at every join the team waits for its slowest
 * thread: on cores shared with other work, for the thread that is not running.  Some kernels can instead take
 * their thread's share inside a team the step already runs (team_kernels below: k_share, then walk.h's
 * par_range or team_share, or an orphaned `omp for`; each output element is computed alike however the work
 * is split, so the bits do not change — the float32 GEMMs take rows of C, which on oneDNN keep the bits of one
 * call and on OpenBLAS's Haswell kernels may not, as OpenBLAS's own team does not either; the 16-bit GEMMs
 * rows of C on oneDNN's bf16 GEMM, which keep them, or the widened tiles, whose bits do not depend on the
 * thread that computes them), and so can the
 * step's fused loops (emitted with `omp for nowait` for a team: emit_fused.c), so a run of consecutive nodes
 * whose code calls only them (a LayerNorm and the GEMM after it, a Split's three copies, the attention's
 * transposes, the fused attention and its backward (every dtype: their units split over the team as their own
 * region splits them: walk.h's attn_share), the views between, a bias gradient's sum after a LayerNorm's
 * backward, the GELU node (k_unary) and its gradient, the GEMMs of the backward one after the other, of every
 * dtype; --precision bf16's Casts between float32 and bfloat16 around a LayerNorm or its backward) is one parallel
 * region, with a barrier only where a node writes bytes that a node of the run read or wrote since the last
 * barrier, or reads bytes one wrote (the arena's, a slot's or a shard's: each a space of its own).  The
 * collectives' starts and waits join too, on the team's first thread (cg_team_coll), and the checked calls whose
 * check every thread makes alike.  A node calling anything else (a GEMM with a partly broadcast batch, which
 * loops) ends the run, and so does a validation pass's guard (`if (!c->validating)`) opening or closing.
 * A run becomes a team only where two of its nodes or more touch K_PAR_MIN elements or more (a smaller
 * kernel runs on the team's first thread): a run the kernels would not have split keeps its plain code.
 * --trace marks each node where it ends: in a team, after a barrier taken only when tracing (CG_TEAM_TRACE), so
 * a node's time is its own and not its run's; a collective's start or wait where it happens. */
#include "build.h"
#include "kernels.h" /* K_PAR_MIN */

#include <ctype.h>
#include <string.h>

/* the kernels that take their thread's share inside a team (k_share): their work all in par_range or in
 * orphaned `omp for` loops, each element computed alike however it is split.  A name ending in '_' stands for
 * every dtype's; the others are exact (their other dtypes' kernels are written otherwise). */
static const char *const team_kernels[] = {
    "k_copy_strided", "k_transpose_",      "k_binary_f32",     "k_binary_f64",          "k_reduce_sum_to_",
    "k_layernorm_f32", "k_layernorm_f64", "k_layernorm_bf16", "k_layernorm_f16", "k_layernorm_grad_",
    "k_cast",           "k_matmul_f32",     "k_matmul_add_f32",
    /* the 16-bit GEMMs (matmul_bf16.c: oneDNN's bf16 GEMM a share of rows or matrices; matmul.c: the widened
     * tiles a share of units); a MatMulAdd stored in 16 bits writes its scratch (the node's second output) too */
    "k_matmul_bf16", "k_matmul_add_bf16", "k_matmul_add_rows_bf16", "k_matmul_f16", "k_matmul_add_f16",
    "k_matmul_add_rows_f16",
    /* the fused attention of every dtype (walk.h attn_share), the loops of K_PAR_FOR, par_range's and par_sum's */
    "k_attention_f32", "k_attention_f64", "k_attention_grad_f32", "k_attention_grad_f64", "k_attention_bf16",
    "k_attention_f16", "k_attention_grad_bf16", "k_attention_grad_f16", "k_unary_f32",
    "k_unary_f64", "k_unary_grad_f32", "k_unary_grad_f64", "k_fill_f32", "k_fill_f64", "k_scale_f32", "k_scale_f64",
    "k_cross_entropy_grad_f32", "k_cross_entropy_grad_f64", "k_gather_grad_f32", "k_gather_grad_f64",
    "k_sum_squares_f32", "k_sum_squares_f64", "k_nan_unless_finite", "k_cross_entropy_grad_bf16",
    "k_cross_entropy_grad_f16", "k_unscale_sq_f32", /* --precision fp16's: its one value by the first thread */
    /* checked calls (`int64_t bad = k_...(...); if (bad >= 0) rt_step_fail(...)`) whose check every thread makes
     * alike over the whole input before its share of the work: each thread finds the same bad index */
    "k_gather",         "k_cross_entropy_f32", "k_cross_entropy_f64", "k_cross_entropy_bf16", "k_cross_entropy_f16",
};

static int team_kernel(const char *name, size_t len)
{
    for (size_t k = 0; k < sizeof team_kernels / sizeof *team_kernels; k++) {
        const char *t = team_kernels[k];
        size_t n = strlen(t);
        if (t[n - 1] == '_' ? len > n && !strncmp(name, t, n) : len == n && !strncmp(name, t, n))
            return 1;
    }
    return 0;
}

/* is text (a node's code) only team-kernel calls and `static const` tables (and braces, comments), so that every
 * thread of a team may run it?  *calls: how many calls */
static int team_text(const char *s, int *calls)
{
    *calls = 0;
    const char *stmt = NULL; /* the statement being read: its first character */
    for (const char *p = s; p && *p; p++) {
        if (p[0] == '/' && p[1] == '*') { /* comments are not code */
            p = strstr(p + 2, "*/");
            if (!p)
                return 0;
            p++;
        } else if (!stmt && !isspace((unsigned char)*p) && *p != '{' && *p != '}') {
            stmt = p;
            if (*p == ';')
                stmt = NULL;
        } else if (stmt && *p == ';') {
            const char *call = strncmp(stmt, "int64_t bad = ", 14) ? stmt : stmt + 14, *q = call;
            while (isalnum((unsigned char)*q) || *q == '_')
                q++;
            if (!strncmp(stmt, "static const ", 13) || !strncmp(stmt, "if (bad >= 0) rt_step_fail(", 27))
                ;
            else if (*q == '(' && team_kernel(call, (size_t)(q - call)))
                ++*calls;
            else
                return 0;
            stmt = NULL;
        }
    }
    return !stmt;
}

/* value v's bytes [lo, hi) in its spaces (0 the arena, 1 + a slot, or a shard's key): *n of them, 2 for a slot
 * value that may alias its unit's shard (SLOT_PARAM / SLOT_GRAD: in the shard where the shard group is one rank,
 * at the same offsets; in the slot, which other units' values take in turn, elsewhere); 0 where it is not
 * planned */
static int value_range(const Graph *g, int v, int64_t space[2], int64_t *lo, int64_t *hi, int *n)
{
    const Loc *l = &g->val[v].loc;
    *n = 1;
    if (l->kind == LOC_ARENA)
        space[0] = 0;
    else if (l->kind == LOC_SLOT || l->kind == LOC_SHARD) {
        space[0] = ((int64_t)1 << 40) + (int64_t)l->unit * 256 + l->state;
        if (l->kind == LOC_SLOT && !l->alias)
            space[0] = 1 + (int64_t)l->slot;
        else if (l->kind == LOC_SLOT)
            space[(*n)++] = 1 + (int64_t)l->slot;
    } else
        return 0;
    const Value *x = &g->val[v];
    const int64_t es = (int64_t)dtype_size(x->dtype), ne = value_numel(g, v);
    *lo = l->off;
    *hi = *lo + ne * es;
    if (x->alias_ld && ne > 0) { /* a strided view (passes/pack.c): its rows of w elements alias_ld apart */
        const int64_t rows = x->shape.rank >= 2 ? x->shape.dim[0] * x->shape.dim[1] : 1, w = ne / rows;
        *hi = *lo + ((rows - 1) * x->alias_ld + w) * es;
    }
    return 1;
}

static int overlaps(const CgRanges *r, int64_t space, int64_t lo, int64_t hi)
{
    for (int k = 0; k < r->n; k++)
        if (r->space[k] == space && lo < r->hi[k] && r->lo[k] < hi)
            return 1;
    return 0;
}

static void ranges_add(CgRanges *r, int64_t space, int64_t lo, int64_t hi)
{
    r->space[r->n] = space;
    r->lo[r->n] = lo;
    r->hi[r->n++] = hi;
}

/* a collective's start (1) or a Wait (2), which join a run: the team's first thread (the step's own thread)
 * starts or waits, the others go on (emit.c's team text); 0 for any other node.  A reduce-scatter's Wait then
 * adds the gradient shard up (emit.c's grad accumulation), each thread its share */
int cg_team_coll(const Node *n)
{
    if (n->op == OP_AllGather || n->op == OP_ReduceScatter || n->op == OP_AllReduce)
        return 1;
    return n->op == OP_Wait ? 2 : 0;
}

/* may node n join a run (its code, text, calling only team kernels: *calls of them) whose reads and writes
 * since the last barrier are rd and wr?  *barrier: 1 where it must wait for them first */
int cg_team_node(const Graph *g, const Node *n, const char *text, int *calls, const CgRanges *rd,
                 const CgRanges *wr, int *barrier)
{
    int64_t space[2], lo, hi;
    int ns;
    /* exe.c emits these for the team (cg->team; emit.c's team_coll for a collective) */
    if (n->op == OP_Fused || n->op == OP_AdamW || n->op == OP_Sgd || cg_team_coll(n))
        *calls = 1;
    else if (!team_text(text, calls))
        return 0;
    if (n->nin > 32 || n->nout > 32)
        return 0;
    *barrier = 0;
    if (!*calls || cg_team_coll(n) == 2)
        return 1; /* a view or a comment touches nothing; a Wait, on the first thread, only waits (the barrier after
                   * it orders what came before it and what follows) */
    if (*calls > 1 && n->op != OP_Split && n->op != OP_Concat && n->op != OP_GradNormSq)
        return 0; /* its calls might depend on each other; a Split's or a Concat's write apart, and the gradient
                   * norm's write its one value on the first thread alone (team_writer) */
    if (2 * n->nin + rd->n > 64 || 2 * n->nout + wr->n > 64)
        *barrier = 1;
    for (int j = 0; j < n->nin; j++) {
        if (n->in[j] < 0)
            continue;
        if (!value_range(g, n->in[j], space, &lo, &hi, &ns))
            return 0;
        for (int k = 0; k < ns; k++)
            *barrier |= overlaps(wr, space[k], lo, hi);
    }
    for (int j = 0; j < n->nout; j++) {
        if (!value_range(g, n->out[j], space, &lo, &hi, &ns))
            return 0;
        for (int k = 0; k < ns; k++)
            *barrier |= overlaps(rd, space[k], lo, hi) || overlaps(wr, space[k], lo, hi);
    }
    return 1;
}

/* node n joined the run (after the barrier, if it asked for one): its reads and writes added to rd and wr;
 * returns 1 where it touches enough elements that its kernel splits them (K_PAR_MIN) */
int cg_team_take(const Graph *g, const Node *n, CgRanges *rd, CgRanges *wr)
{
    int64_t space[2], lo, hi, most = 0;
    int ns;
    for (int j = 0; j < n->nin; j++)
        if (n->in[j] >= 0 && value_range(g, n->in[j], space, &lo, &hi, &ns)) {
            for (int k = 0; k < ns; k++)
                ranges_add(rd, space[k], lo, hi);
            most = value_numel(g, n->in[j]) > most ? value_numel(g, n->in[j]) : most;
        }
    for (int j = 0; j < n->nout; j++)
        if (value_range(g, n->out[j], space, &lo, &hi, &ns)) {
            for (int k = 0; k < ns; k++)
                ranges_add(wr, space[k], lo, hi);
            most = value_numel(g, n->out[j]) > most ? value_numel(g, n->out[j]) : most;
        }
    return most >= K_PAR_MIN;
}

/* a run of nodes [first, first + k) (text: their code for a team, with a barrier where needed; plain: their
 * code alone; big: its nodes that split their work): one team where big is 2 or more, else the plain code */
void cg_team_flush(Buf *body, Buf *text, Buf *plain, int k, int big)
{
    if (!k && !plain->len) /* nothing pending */
        return;
    if (big > 1)
        cg_put(body, "    _Pragma(\"omp parallel\")\n    { k_share(1);\n%s      k_share(0); }\n", text->buf);
    else
        cg_put(body, "%s", plain->len ? plain->buf : "");
    text->len = plain->len = 0; /* the buffers kept for the next run */
}
