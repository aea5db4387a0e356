/* exe.c — the executable of either target: C source for the step, the init
 * file, the build.  The cuda target differs only in what the step's calls
 * resolve to (kernels/cuda/kc_map.h), the pointers it uses (c->dev_*), the
 * embedded device code (cuda.c) and the libraries it links.
 *
 * requires: memplan (every value placed; node order final).
 * ensures:  OUT (an executable linked with runtime/ and kernels/c, or for
 *           cuda with the cuda runtime and kernels/cuda's launchers) and
 *           OUT.init (the step-0 checkpoint: original model bytes, constants,
 *           each unit's unpadded flat initial parameters, each section
 *           checksummed), written aside and replacing the old pair only once
 *           both are complete, in an order that keeps a pair that starts in
 *           place throughout ("installing the pair" below); a failing C
 *           compiler leaves the old pair as it was.
 *
 * The emitted C is straight-line: one kernel or collective call per node in
 * schedule order, in a function per phase (forward, backward, optimizer) that
 * step() calls (a run of nodes in one OpenMP team: team.c); each tensor a named pointer (t_ + its ONNX name, emit.c)
 * computed from the static plan, declared with its shape at the top of the
 * function using it; each GEMM's geometry an RtGemm descriptor.  Names from
 * the model never reach the C text except through cg_cstr() (escaped string
 * literals), cg_comment() (sanitised comments) and the tensors' identifiers
 * (letters, digits and '_' only): a model cannot inject code.
 *
 * It is two files: step.c (the tables, the step, the model's description
 * fsdpc_step_model), in which no initial weight value and not the model
 * file's name appear, and main.c (a header with fsdpc's version, the command
 * line and the model file's hash; the init file's id, the model's name,
 * main).  step.c's object comes from the object cache when a build of the
 * same step made it before (objcache.c): a build that changes only the
 * weights compiles main.c and links.  The init file's id is the graph's
 * structure (init.c), so --init-only writes OUT.init alone, for an OUT built
 * before from the same model with other weights: no C compiled at all.
 * --emit-c's OUT.c is main.c then step.c, one file that compiles.
 */
#define _POSIX_C_SOURCE 200809L
#define _XOPEN_SOURCE 700 /* realpath */
#include "build.h"
#include "rt.h"
#include "afile.h"
#include "isum.h"
#include "fsdpc_config.h"
#include "kernels.h" /* K_PAR_MIN */
#include "../ir/rules/nn.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;
static const char *g_cc; /* --cc override of the configured compiler */

/* ---- what a build has made (build.h) -------------------------------------
 * Everything a build writes before it succeeds is aside, removed again if it
 * fails: OUT.init's temporary (rt_afile), the private folder the C compiler
 * works in, the device images' folder (cuda). */

static void remove_tree(const char *dir, int nimage);

_Noreturn void cg_build_fail(Build *b, const char *msg)
{
    rt_afile_abort(&b->init);
    if (b->privfd >= 0)
        close(b->privfd);
    if (b->priv[0])
        rt_dir_remove(b->dirfd, b->priv);
    if (b->cuda_dir)
        remove_tree(b->cuda_dir, b->nimage);
    fatal("%s; %s and %s.init are left as they were", msg, b->out, b->out);
}

/* the C compiler failed (why: cg_spawn_cc's line) */
static _Noreturn void cc_fail(Build *b, const char *why)
{
    cg_build_fail(b, ir_fmt("%s: building the executable failed: %s: fix that (disk space, --cc, the fsdpc "
                            "install) and compile again", b->out, why));
}

/* ---- the C source ------------------------------------------------------- */
static void emit_tables(Cg *cg, Buf *b, const InitLayout *L)
{
    const Graph *g = cg->g;
    int nstate = g->opt->optimizer == OPT_SGD ? 1 : 2;
    cg_put(b, "static const RtUnit units[] = {\n");
    for (int u = 0; u < g->nunit; u++)
        cg_put(b, "    {%s, %lld, %d, %d, %lld},\n", cg_cstr(g->unit[u].name), (long long)g->unit[u].numel,
            g->unit[u].dtype, nstate, (long long)L->unit_off[u]);
    if (!g->nunit)
        cg_put(b, "    {0, 0, 0, 0, 0},\n"); /* C has no empty arrays; the count says 0 */
    cg_put(b, "};\nstatic const RtParam params[] = {\n");
    for (int u = 0; u < g->nunit; u++)
        for (int i = 0; i < g->unit[u].nparams; i++) {
            int p = g->unit[u].params[i];
            cg_put(b, "    {%s, %d, %lld, %lld, %d},\n", cg_cstr(g->val[p].name), u, (long long)g->unit[u].offset[i],
                (long long)value_numel(g, p), g->val[p].shape.rank);
        }
    if (!g->nunit)
        cg_put(b, "    {0, 0, 0, 0, 0},\n");
    cg_put(b, "};\nstatic const RtInput inputs[] = {\n");
    int64_t batch = -1;
    for (int k = 0; k < g->ninput; k++) {
        const Value *x = &g->val[g->input[k]];
        if (!g->opt->eval && (x->shape.rank < 1 || (batch >= 0 && x->shape.dim[0] != batch)))
            fatal("%s: input '%s' %s: every input needs the same leading batch dimension", g->opt->model,
                  ir_q(x->name), x->shape.rank < 1 ? "is a scalar" : "has another batch size");
        batch = x->shape.dim[0];
        cg_put(b, "    {%s, %d, %d, %s, %lld},\n", cg_cstr(x->name), x->dtype, x->shape.rank,
            cg_ints(x->shape.dim, x->shape.rank), (long long)x->loc.off);
    }
    if (!g->ninput)
        cg_put(b, "    {0, 0, 0, {0}, 0},\n");
    cg_put(b, "};\nstatic const RtConst consts[] = {\n");
    int nconst = 0;
    for (int v = 0; v < g->nval; v++)
        if (L->const_off[v] >= 0) {
            cg_put(b, "    {%lld, %lld, %lld, %s}, /* %s */\n", (long long)L->const_off[v],
                (long long)g->val[v].loc.off,
                (long long)(value_numel(g, v) * (int64_t)dtype_size(g->val[v].dtype)),
                cg_nn_state_name(g, v), cg_comment(g->val[v].name));
            nconst++;
        }
    if (!nconst)
        cg_put(b, "    {0, 0, 0},\n");
    cg_put(b, "};\nstatic const RtExtern externs[] = {\n");
    for (int i = 0; i < g->ninit; i++)
        if (L->ext_off[i] >= 0)
            cg_put(b, "    {%d, %lld, %lld},\n", i, (long long)L->ext_off[i], (long long)g->ext[i].len);
    if (!L->next)
        cg_put(b, "    {0, 0, 0},\n");
    cg_put(b, "};\nstatic const RtOutput outputs[] = {\n");
    for (int k = 0; k < g->noutput; k++) {
        const Value *x = &g->val[g->output[k]];
        cg_put(b, "    {%s, %d, %d, %s, %lld},\n", cg_cstr(x->name), x->dtype, x->shape.rank,
            cg_ints(x->shape.dim, x->shape.rank), (long long)x->loc.off);
    }
    if (!g->noutput)
        cg_put(b, "    {0, 0, 0, {0}, 0},\n");
    cg_put(b, "};\n\n");
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* The nodes a validation pass runs (need[i] = 1): those the averaged loss
 * depends on, through inputs and the values they view, and the Wait of each
 * collective among them.  The rest (backward, optimizer, BatchNormalization's
 * running-statistics Assign) run only in training.  A subset of the schedule
 * in its order, on the same plan, is safe: every node kept reads only values
 * that kept nodes wrote before it, at the offsets memplan gave them.  NULL
 * for --eval builds (no loss). */
static char *validation_nodes(const Graph *g)
{
    if (g->opt->eval || g->loss_avg < 0)
        return NULL;
    /* in the compile's arena: a user error later in emit_step (fatal) leaks nothing (fuzz_compile's leak check) */
    char *need = ir_alloc((size_t)g->nnode + 1), *seen = ir_alloc((size_t)g->nval + 1);
    char *tag = ir_alloc((size_t)g->ncoll + 1); /* a kept collective's tag */
    int *stack = ir_alloc(sizeof(int) * ((size_t)g->nval + 1)), sp = 0;
    stack[sp++] = g->loss_avg;
    seen[g->loss_avg] = 1;
    while (sp > 0) {
        const Value *v = &g->val[stack[--sp]];
        if (v->producer >= 0 && !need[v->producer]) {
            const Node *n = &g->node[v->producer];
            need[v->producer] = 1;
            for (int i = 0; i < n->nin; i++)
                if (n->in[i] >= 0 && !seen[n->in[i]])
                    seen[n->in[i]] = 1, stack[sp++] = n->in[i];
        }
        if (v->alias_of >= 0 && !seen[v->alias_of])
            seen[v->alias_of] = 1, stack[sp++] = v->alias_of;
    }
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < g->nnode; i++) {
            const Node *n = &g->node[i];
            int64_t t = ir_attr_i(n, "tag", -1);
            if (t < 0 || t >= g->ncoll)
                continue;
            if (pass == 0 && need[i] && (op_info[n->op].flags & F_COLL))
                tag[t] = 1;
            else if (pass == 1 && n->op == OP_Wait && tag[t])
                need[i] = 1;
        }
    return need;
}

/* ---- --cpu -------------------------------------------------------------- */

static const char *const cpu_levels[] = {"x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4", NULL};

void cg_cpu_check_name(const char *cpu)
{
    if (!strcmp(cpu, "native"))
        return;
    for (int i = 0; cpu_levels[i]; i++)
        if (!strcmp(cpu, cpu_levels[i])) {
            if (!*FSDPC_KERNEL_LEVELS)
                fatal("--cpu %s: this fsdpc builds for a CPU that is not x86-64: use --cpu native", cpu);
            return;
        }
    fatal("--cpu %s: expected native, x86-64, x86-64-v2, x86-64-v3 or x86-64-v4", ir_q(cpu));
}

/* the x86-64 level (1-4) of --cpu; native: this machine's (0: not x86-64) */
static int cpu_level(const char *cpu)
{
    for (int i = 0; cpu_levels[i]; i++)
        if (!strcmp(cpu, cpu_levels[i]))
            return i + 1;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init(); /* by features: Clang 14 has no level names */
    int v2 = __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("popcnt") && __builtin_cpu_supports("ssse3");
    int v3 = v2 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2");
    int v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
    return v4 ? 4 : v3 ? 3 : v2 ? 2 : 1;
#else
    return 0;
#endif
}

/* the kernels built for the highest level (FSDPC_KERNEL_LEVELS: "v3 v4") the --cpu level allows: the library's
 * name suffix ("" the baseline) and the level's name */
static const char *cpu_kernels(const char *cpu, const char **name)
{
    int l = cpu_level(cpu);
    *name = l >= 1 ? "x86-64" : "this machine's baseline";
    for (int k = l; k >= 3; k--)
        if (strstr(FSDPC_KERNEL_LEVELS, k == 4 ? "v4" : "v3")) {
            *name = cpu_levels[k - 1];
            return k == 4 ? "_v4" : "_v3";
        }
    return "";
}

static const char *opt_cpu(const Graph *g) { return g->opt->cpu ? g->opt->cpu : "native"; }

/* The step's phases, in schedule order: forward up to the loss's seed (autodiff's Ones), backward, then the
 * optimizer from its first node (GradNormSq, AdamW, Sgd) to the end (with the collectives, Waits and Frees
 * scheduled among them). */
enum { PH_FORWARD, PH_BACKWARD, PH_OPTIMIZER };
static const char *const phase_name[] = {"forward", "backward", "optimizer"};

static int node_phase(const Node *n, int prev)
{
    if (n->op == OP_Ones && prev == PH_FORWARD)
        return PH_BACKWARD;
    if (n->op == OP_GradNormSq || n->op == OP_AdamW || n->op == OP_Sgd)
        return PH_OPTIMIZER;
    return prev;
}

/* one function of the step: nodes [lo, hi) of one phase; guard: each run of nodes a validation pass skips
 * (need[i] 0) in one `if (!c->validating) { ... }` (0: the caller skips the whole function) */
static void emit_phase_fn(Cg *cg, Buf *out, const char *name, int lo, int hi, const char *need, int guard)
{
    const Graph *g = cg->g;
    /* run, plain: the pending run's code for a team and alone; node: each node's, in turn (team: a fused loop's
     * for a team) */
    Buf body = {0}, run = {0}, plain = {0}, node = {0}, team = {0};
    CgRanges rd = {0}, wr = {0};
    int nrun = 0, calls = 0, big = 0;
    cg_fn_begin(cg, 0);
    int open = 0;
    for (int i = lo; i < hi; i++) {
        const Node *n = &g->node[i];
        int skip = guard && need && !need[i];
        node.len = team.len = 0;
        cg_emit_node(cg, &node, n);
        if (!cg->cuda && (n->op == OP_Fused || n->op == OP_AdamW || n->op == OP_Sgd || cg_team_coll(n))) {
            cg->team = 1;
            cg_emit_node(cg, &team, n);
            cg->team = 0;
        }
        const Buf *mine = team.len ? &team : &node; /* its code in a team */
        int k = 0, barrier = 0;
        int joins = !cg->cuda && cg_team_node(g, n, node.len ? node.buf : "", &k, &rd, &wr, &barrier);
        if (joins && !k) /* no code (a view, a Free's comment): no guard of its own either */
            skip = open;
        /* ends the run: a node that does not join, a guard opening or closing, a barrier before the run's first
         * call (a new run then) */
        if (!joins || skip != open || (barrier && calls == 0)) {
            cg_team_flush(&body, &run, &plain, nrun, big);
            nrun = 0, calls = 0, big = 0, rd.n = wr.n = 0, barrier = 0;
        }
        if (skip != open)
            cg_put(&body, skip ? "    if (!c->validating) {\n" : "    }\n");
        open = skip;
        if (!joins && cg->cuda) {
            cg_put(&body, "%s", node.len ? node.buf : "");
        } else if (!joins) { /* alone: its code, then --trace's mark */
            cg_put(&body, "%s    RT_TRACE(c, %d);\n", node.len ? node.buf : "", i);
        } else {
            if (barrier) {
                cg_put(&run, CG_TEAM_BARRIER);
                rd.n = wr.n = 0;
            }
            const int coll = cg_team_coll(n); /* its team text: emit.c's team_coll, a barrier after a Wait */
            cg_put(&run, "%s", mine->len ? mine->buf : "");
            cg_put(&plain, "%s    RT_TRACE(c, %d);\n", node.len ? node.buf : "", i); /* --trace: node i ended */
            if (!coll) /* (a collective's start or wait is marked where it happens, on the first thread) */
                cg_put(&run, CG_TEAM_TRACE, i);
            /* a reduce-scatter's Wait then adds up the shard (its inputs, taken as written), each thread its share */
            if (coll == 2 && ir_attr_i(n, "of", -1) == OP_ReduceScatter) {
                rd.n = wr.n = 0;
                cg_team_take(g, n, &wr, &wr);
            } else if (coll == 2)
                rd.n = wr.n = 0;
            else if (coll)
                cg_team_take(g, n, &rd, &wr);
            else if (k)
                big += cg_team_take(g, n, &rd, &wr);
            nrun++, calls += k;
        }
    }
    cg_team_flush(&body, &run, &plain, nrun, big);
    if (open)
        cg_put(&body, "    }\n");
    cg_put(out, "/* the step's %s: nodes %d to %d */\nstatic void %s(RtCtx *c)\n{\n", name, lo, hi - 1, name);
    cg_fn_decls(cg, out);
    cg_put(out, "%s}\n\n", body.buf ? body.buf : "");
}

/* The step: a function per phase and step(), which calls them in order; a function of nodes that a
 * validation pass skips all of is called under `if (!c->validating)`.  Returns the text: the collectives'
 * jobs, the phases, step(). */
static Buf emit_step(Cg *cg)
{
    const Graph *g = cg->g;
    char *need = validation_nodes(g);
    /* c->validating: a validation pass (runtime/rt.c), the forward to the averaged loss only, Dropout
     * as identity and BatchNormalization in inference form (codegen/emit_nn.c) */
    cg_name_tensors(cg);
    Buf fns = {0}, step = {0};
    for (int lo = 0, ph = PH_FORWARD; lo < g->nnode;) {
        ph = node_phase(&g->node[lo], ph);
        int hi = lo + 1, all_skipped = need != NULL && !need[lo];
        for (; hi < g->nnode && node_phase(&g->node[hi], ph) == ph; hi++)
            all_skipped &= need != NULL && !need[hi];
        const char *name = phase_name[ph];
        emit_phase_fn(cg, &fns, name, lo, hi, need, !all_skipped);
        cg_put(&step, all_skipped ? "    if (!c->validating)\n        %s(c);\n" : "    %s(c);\n", name);
        lo = hi;
    }
    /* the phases emitted, the fused loops' tables are known (emit_fused.c): before the phases, filled first */
    cg_put(&cg->jobs, "%s%sstatic void step(RtCtx *c)\n{\n%s%s%s}\n\n", cg_fused_tables(cg), fns.buf ? fns.buf : "",
           cg->ntable ? "    tables();\n" : "", cg->cuda ? "" : "    RT_TRACE(c, -1);\n", step.buf ? step.buf : "");
    return cg->jobs;
}

/* the step source's end: the model's description, all but what ties it to one init file (emit_main) */
static void emit_model(Cg *cg, Buf *b, const InitLayout *L, int nimage)
{
    const Graph *g = cg->g;
    int nconst = 0;
    for (int v = 0; v < g->nval; v++)
        nconst += L->const_off[v] >= 0;
    int nparam = 0;
    for (int u = 0; u < g->nunit; u++)
        nparam += g->unit[u].nparams;
    cg_put(b, "const RtModel fsdpc_step_model = { /* main.c adds .id, .key and .name */\n");
    cg_put(b, "    .nunit = %d, .unit = units, .nparam = %d, .param = params,\n", g->nunit, nparam);
    cg_put(b, "    .ninput = %d, .input = inputs, .nconst = %d, .cnst = consts,\n", g->ninput, nconst);
    cg_put(b, "    .arena_bytes = %lld, .nslot = %d, .slot_esize = slot_esize, .slot_alias = slot_alias,\n",
        (long long)g->arena_bytes, g->nslot);
    cg_put(b, "    .slot_unit = slot_unit,\n");
    int la = g->loss_avg;
    cg_put(b, "    .gnorm_off = %lld, .shard_group = %d,\n",
        g->grad_norm_sq >= 0 ? (long long)g->val[g->grad_norm_sq].loc.off : -1LL,
        g->opt->shard == SHARD_NONE ? 1 : g->opt->shard == SHARD_HYBRID ? g->opt->hybrid : 0);
    /* this rank's own loss: where it is a plain scalar of the averaged loss's dtype (memplan keeps it) */
    int lr = g->loss >= 0 && la >= 0 && g->val[g->loss].dtype == g->val[la].dtype &&
                     g->val[g->loss].loc.kind == LOC_ARENA ? g->loss : -1;
    cg_put(b, "    .loss_off = %lld, .loss_dtype = %d, .rank_loss_off = %lld, .optimizer = %d,\n",
        la >= 0 ? (long long)g->val[la].loc.off : -1LL, la >= 0 ? (int)g->val[la].dtype : 0,
        lr >= 0 ? (long long)g->val[lr].loc.off : -1LL,
        g->opt->optimizer == OPT_SGD ? RT_SGD : g->opt->optimizer == OPT_ADAM ? RT_ADAM : RT_ADAMW);
    cg_put(b, "    .model_off = %lld, .model_len = %lld, .step = step,\n", (long long)L->model_off,
        (long long)g->model_len);
    cg_put(b, "    .eval = %d, .noutput = %d, .output = outputs,\n", g->opt->eval, g->noutput);
    cg_put(b, "    .dropout_seed = %#llxull,\n", (unsigned long long)NN_DROPOUT_SEED);
    if (!g->opt->eval) { /* the progress line's throughput: label positions (cross_entropy) or samples */
        int lab = g->opt->loss == LOSS_CE && g->opt->loss_target ? ir_find_value(g, g->opt->loss_target) : -1;
        int pred = g->opt->loss_pred ? ir_find_value(g, g->opt->loss_pred) : -1;
        int64_t tokens = lab >= 0 ? value_numel(g, lab)
                       : pred >= 0 && g->val[pred].shape.rank > 0 ? g->val[pred].shape.dim[0] : 1;
        cg_put(b, "    .flops = %.17g, .tokens = %lld, .token_unit = \"%s\",\n", cg_step_flops(g), (long long)tokens,
               lab >= 0 ? "tok" : "samples");
    }
    cg_put(b, "    .nnode = %d, .trace_name = trace_name, .ncoll = %d,\n", g->nnode,
        g->ncoll);
    cg_put(b, "    .nextern = %d, .ext = externs,\n", L->next);
    if (g->opt->precision == PREC_FP16)
        cg_put(b, "    .loss_scaling = 1,\n");
    if (!cg->cuda) {
        const char *kname;
        cpu_kernels(opt_cpu(g), &kname);
        cg_put(b, "    .cpu = \"%s\", .cpu_kernels = \"%s\", .cpu_needs = cpu_needs,\n", opt_cpu(g), kname);
        if (g->opt->precision == PREC_BF16) /* its GEMMs' path, which rank 0 names at start where it is widened */
            cg_put(b, "    .bf16_native = k_bf16_gemm_native,\n");
        for (int i = 0; i < g->nnode; i++)
            if (g->node[i].op == OP_Conv || g->node[i].op == OP_ConvGrad) { /* oneDNN's scratch, said at the end */
                cg_put(b, "    .conv_bytes = k_conv2d_dnnl_bytes,\n");
                break;
            }
    }
    if (cg->cuda)
        cg_put(b, "    .target_cuda = 1, .nimage = %d, .image = images, .ncheck = %d, .check = checks,\n"
               "    .nfused = %d, .fused = fused,\n", nimage, cg->ncheck, cg->nfused);
    cg_put(b, "};\n");
}

/* The step's source (step.c): the tables, the step, the model's description (emit_model).  Nothing in it depends
 * on the initial weights' values: builds that differ only in those share it (objcache.c). */
static Buf emit_source(Cg *cg, const InitLayout *L, const Buf *step, const Buf *images, int nimage)
{
    const Graph *g = cg->g;
    Buf b = {0};
    /* no model file name in this file: the object cache's key (objcache.c) is the same for every build of the
     * same step */
    cg_put(&b, "/* generated by fsdpc %s: the training step and its tables, target %s (the model, the command line, the\n"
               " * init file's id and main: the executable's main.c). Do not edit. */\n", FSDPC_VERSION,
           cg->cuda ? "cuda" : "cpu");
    cg_put(&b, "#include <math.h>\n#include <stdint.h>\n#include <string.h>\n#include \"rt.h\"\n");
    /* cuda: kc_map.h turns the k_ calls into launches of their kc_ twins */
    cg_put(&b, cg->cuda ? "#include \"kc_map.h\"\n\n" : "#include \"kernels.h\"\n#include \"fused.h\"\n\n");
    emit_tables(cg, &b, L);
    if (cg->cuda) {
        cg_put(&b, "%s", images->buf ? images->buf : "");
        cg_put(&b, "static const char *const checks[] = {\n");
        for (int i = 0; i < cg->ncheck; i++)
            cg_put(&b, "    %s,\n", cg_cstr(cg->checks[i]));
        cg_put(&b, "    0\n};\nstatic const char *const fused[] = {\n");
        for (int i = 0; i < cg->nfused; i++)
            cg_put(&b, "    \"fsdpc_fused%d\",\n", i);
        cg_put(&b, "    0\n};\n\n");
    }
    cg_put(&b, "%s", step->buf);
    /* --trace: every node's name */
    cg_put(&b, "static const char *const trace_name[] = {\n");
    for (int i = 0; i < g->nnode; i++)
        cg_put(&b, "    %s,\n", cg_cstr(ir_fmt("%s (%s)", g->node[i].name, op_info[g->node[i].op].name)));
    cg_put(&b, "    0\n};\n");
    cg_put(&b, "static const int slot_esize[] = {");
    for (int s = 0; s < g->nslot; s++)
        cg_put(&b, "%s%d", s ? ", " : "", g->slot_esize[s]);
    cg_put(&b, "%s};\n", g->nslot ? "" : "0");
    cg_put(&b, "static const int slot_alias[] = {");
    for (int s = 0; s < g->nslot; s++)
        cg_put(&b, "%s%d", s ? ", " : "", g->slot_alias[s]);
    cg_put(&b, "%s};\n", g->nslot ? "" : "0");
    cg_put(&b, "static const int slot_unit[] = {");
    for (int s = 0; s < g->nslot; s++)
        cg_put(&b, "%s%d", s ? ", " : "", g->slot_unit[s]);
    cg_put(&b, "%s};\n", g->nslot ? "" : "0");
    if (!cg->cuda) { /* what -march lets the compiler use here: rt_dev_init checks this CPU has it */
        cg_put(&b, "static const char *const cpu_needs[] = {\n");
#define NEED(macro, name) cg_put(&b, "#ifdef __" #macro "__\n    \"" name "\",\n#endif\n");
        RT_CPU_FEATURES(NEED)
#undef NEED
        cg_put(&b, "    0\n};\n");
    }
    emit_model(cg, &b, L, nimage);
    return b;
}

/* The executable's main.c: what ties the step (step.c's fsdpc_step_model) to its init files (their id: the
 * graph's structure), the model's name, and main.  Small, so that a build whose step is in the cache
 * (objcache.c: a weight-only variant of a model) compiles only this. */
static Buf emit_main(const Graph *g, uint64_t id, const Buf *step)
{
    Buf b = {0};
    /* what made this build (not in step.c: the object cache's key, which a weight-only variant shares) */
    uint64_t hash = g->model_bytes ? cg_fnv(14695981039346656037ull, g->model_bytes, g->model_len) : 0;
    cg_put(&b, "/* generated by fsdpc %s from %s (%zu bytes, FNV-1a 64 0x%016llx; external data not counted)\n"
               " *   %s\n"
               " * the executable's main, with its init file's id (the step and its tables: step.c, after it in\n"
               " * OUT.c). Do not edit. */\n",
        FSDPC_VERSION, cg_comment(base_name(g->opt->model)), g->model_len, (unsigned long long)hash,
        g->opt->cmdline ? cg_comment(g->opt->cmdline) : "(built in process: no command line)");
    cg_put(&b, "#include <stdint.h>\n#include \"rt.h\"\n\nextern const RtModel fsdpc_step_model;\n\n");
    /* the key covers what the ranks must share: the init file and the step (shapes, offsets, collectives),
     * and the shard groups */
    uint64_t key = cg_fnv(id, step->buf, step->len);
    int sg = g->opt->shard == SHARD_NONE ? 1 : g->opt->shard == SHARD_HYBRID ? g->opt->hybrid : 0;
    key = cg_fnv(key, &sg, sizeof sg);
    cg_put(&b, "int main(int argc, char **argv)\n{\n    RtModel m = fsdpc_step_model;\n");
    cg_put(&b, "    m.id = 0x%016llxull, m.key = 0x%016llxull, m.name = %s;\n", (unsigned long long)id,
        (unsigned long long)key, cg_cstr(base_name(g->opt->model)));
    cg_put(&b, "    return rt_main(argc, argv, &m);\n}\n\n");
    return b;
}

/* ---- building ----------------------------------------------------------- */

/* dirname of a path with no trailing slash ("/" stays "/") */
static const char *parent(const char *p)
{
    const char *e = strrchr(p, '/');
    return !e ? "." : e == p ? "/" : ir_fmt("%.*s", (int)(e - p), p);
}

/* Where the runtime's headers (*inc) and libraries (*lib) are: $FSDPC_HOME, an install prefix, when set;
 * else this build tree (and its source tree) when fsdpc runs from it; else the install prefix above the
 * directory fsdpc runs from (PREFIX/bin/fsdpc), so a moved prefix still works. */
void cg_runtime_dirs(const char **inc, const char **lib)
{
    static const char *ci, *cl;
    if (!ci) {
        const char *home = getenv("FSDPC_HOME"), *prefix = NULL, *why;
        char self[4096], *bin = realpath(FSDPC_BUILD_DIR, NULL);
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        self[n > 0 ? n : 0] = 0;
        if (home && *home) {
            prefix = home, why = "FSDPC_HOME";
        } else if (n > 0 && bin && !strcmp(parent(self), bin)) {
            ci = FSDPC_SOURCE_DIR, cl = FSDPC_BUILD_DIR;
        } else if (n > 0) {
            prefix = parent(parent(self)), why = ir_fmt("the prefix of %s", self);
        } else {
            fatal("cannot find the fsdpc runtime: /proc/self/exe is unreadable (%s); set FSDPC_HOME to the install "
                  "prefix", strerror(errno));
        }
        free(bin);
        if (prefix) {
            ci = FSDPC_INSTALL_INCLUDEDIR[0] == '/' ? FSDPC_INSTALL_INCLUDEDIR
                                                    : ir_fmt("%s/%s", prefix, FSDPC_INSTALL_INCLUDEDIR);
            cl = FSDPC_INSTALL_LIBDIR[0] == '/' ? FSDPC_INSTALL_LIBDIR : ir_fmt("%s/%s", prefix, FSDPC_INSTALL_LIBDIR);
            if (access(ir_fmt("%s/runtime/rt.h", ci), R_OK) || access(ir_fmt("%s/libfsdpc_rt.a", cl), R_OK))
                fatal("cannot find the fsdpc runtime in %s (%s/runtime/rt.h, %s/libfsdpc_rt.a): install fsdpc with "
                      "cmake --install, or set FSDPC_HOME to its install prefix", why, ci, cl);
        }
        if (strpbrk(ci, " \t\n") || strpbrk(cl, " \t\n"))
            fatal("the fsdpc runtime's path '%s' holds a space: install fsdpc under a path without one", ir_q(cl));
    }
    *inc = ci, *lib = cl;
}

/* Split a configure-time flag string on spaces (CMake's paths have none), @INC@ and @LIB@ replaced by
 * the runtime's directories, @CPU@ by the kernels' suffix for --cpu. */
static int split(const char *s, char **argv, int max, const char *cpu)
{
    const char *inc, *lib, *unused;
    cg_runtime_dirs(&inc, &lib);
    const char *const key[] = {"@INC@", "@LIB@", "@CPU@"};
    const char *const val[] = {inc, lib, cpu ? cpu_kernels(cpu, &unused) : ""};
    char *c = ir_strdup(s);
    int n = 0;
    for (char *t = strtok(c, " "); t && n < max; t = strtok(NULL, " ")) {
        for (int k = 0; k < 3; k++)
            for (char *at; (at = strstr(t, key[k]));)
                t = ir_fmt("%.*s%s%s", (int)(at - t), t, val[k], at + 5);
        argv[n++] = t;
    }
    return n;
}

/* The C compiler's command line: the flags of the target and --cpu (-march; cpu target), then -o out (none where
 * out is NULL), the inputs in (NULL-terminated), and with link the runtime and the kernels built for the --cpu
 * level (emulate: the CUDA emulation's runtime) */
static char **cc_argv(int cuda, const char *const *in, const char *out, const char *cpu, int link, int emulate)
{
    char **argv = ir_alloc(sizeof(char *) * 256);
    int n = 0;
    argv[n++] = (char *)(g_cc ? g_cc : FSDPC_CC);
    n += split(cuda ? FSDPC_CFLAGS_CUDA : FSDPC_CFLAGS, argv + n, 100, NULL);
    if (cpu)
        argv[n++] = ir_fmt("-march=%s", cpu);
    if (out) {
        argv[n++] = "-o";
        argv[n++] = (char *)out;
    }
    for (int i = 0; in[i] && n < 150; i++)
        argv[n++] = (char *)in[i];
    if (link)
        n += split(emulate ? FSDPC_LIBS_CUEMU : cuda ? FSDPC_LIBS_CUDA : FSDPC_LIBS, argv + n, 100, cpu);
    argv[n] = NULL;
    return argv;
}

/* --emulate: the C++ compiler and its flags for the model's fused kernels on the host */
static char **cxx_argv(void)
{
    char **argv = ir_alloc(sizeof(char *) * 64);
    int n = 0;
    argv[n++] = FSDPC_CXX;
    n += split(FSDPC_CXXFLAGS_CUEMU, argv + n, 50, NULL);
    argv[n] = NULL;
    return argv;
}

/* Is this line of the C compiler's messages only context ("In function", "In file included from", a note, a
 * warning, the quoted source under an error), not what went wrong? */
static int context_line(const char *l, size_t n)
{
    static const char *const ctx[] = {"In function", "In file included from", "At top level", ": note:",
                                      ": warning:", "                 from ", NULL};
    const char *e = l + n;
    if (n == 0 || l[0] == ' ' || l[0] == '\t') /* a source line quoted under a message, its caret */
        return 1;
    for (int i = 0; ctx[i]; i++)
        for (const char *p = l; p + strlen(ctx[i]) <= e; p++)
            if (!strncmp(p, ctx[i], strlen(ctx[i])))
                return 1;
    return 0;
}

/* what went wrong, from the C compiler's messages: their first line that is not context (else their first
 * line), a tool's path trimmed ("/usr/bin/ld: x" -> "ld: x"); NULL: there are none */
static const char *cc_reason(const char *text, size_t len)
{
    const char *first = NULL, *pick = NULL;
    size_t first_n = 0, pick_n = 0;
    for (const char *l = text, *end = text + len; l < end && !pick;) {
        const char *nl = memchr(l, '\n', (size_t)(end - l));
        size_t n = nl ? (size_t)(nl - l) : (size_t)(end - l);
        if (n && !first)
            first = l, first_n = n;
        if (!context_line(l, n))
            pick = l, pick_n = n;
        l += n + 1;
    }
    if (!pick)
        pick = first, pick_n = first_n;
    if (!pick)
        return NULL;
    const char *colon = memchr(pick, ':', pick_n);
    if (pick[0] == '/' && colon && !memchr(pick, ' ', (size_t)(colon - pick))) {
        const char *name = pick;
        for (const char *p = pick; p < colon; p++)
            if (*p == '/')
                name = p + 1;
        pick_n -= (size_t)(name - pick), pick = name;
    }
    return ir_fmt("%.*s", (int)pick_n, pick);
}

/* how a child that failed ended */
static const char *how_ended(int st)
{
    return WIFEXITED(st) ? ir_fmt("exit status %d", WEXITSTATUS(st))
         : WIFSIGNALED(st) ? ir_fmt("killed by signal %d", WTERMSIG(st)) : "stopped";
}

/* fd read to its end: the first 64 KiB (*len bytes), the rest read and dropped */
static char *read_capped(int fd, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *text = ir_alloc(cap), drop[4096];
    for (ssize_t r; (r = read(fd, n < cap ? text + n : drop, n < cap ? cap - n : sizeof drop)) != 0;)
        if (r > 0 && n < cap)
            n += (size_t)r;
        else if (r < 0 && errno != EINTR)
            break;
    *len = n;
    return text;
}

/* Run the C compiler (argv), its messages read through a pipe (a full disk loses none of them) and passed
 * on when it succeeds.  NULL, or one line: what went wrong and how it ended. */
const char *cg_spawn_cc(char *const *argv)
{
    int pfd[2];
    if (pipe(pfd) != 0)
        return ir_fmt("cannot run the C compiler '%s': %s", argv[0], strerror(errno));
    fcntl(pfd[0], F_SETFD, FD_CLOEXEC);
    fcntl(pfd[1], F_SETFD, FD_CLOEXEC); /* the child's stderr is a dup2 of it, without the flag */
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, pfd[1], 2);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(pfd[1]);
    if (rc) {
        close(pfd[0]);
        return ir_fmt("cannot run the C compiler '%s': %s", argv[0], strerror(rc));
    }
    size_t len;
    char *text = read_capped(pfd[0], &len);
    close(pfd[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return ir_fmt("the C compiler '%s': %s", argv[0], strerror(errno));
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        fwrite(text, 1, len, stderr);
        return NULL;
    }
    const char *why = cc_reason(text, len);
    return why ? ir_fmt("%s (the C compiler '%s': %s)", why, argv[0], how_ended(st))
               : ir_fmt("the C compiler '%s' failed without a message (%s)", argv[0], how_ended(st));
}

static void remove_tree(const char *dir, int nimage)
{
    for (int i = 0; i < nimage; i++)
        unlink(ir_fmt("%s/img%d.bin", dir, i));
    unlink(ir_fmt("%s/images.S", dir));
    unlink(ir_fmt("%s/fused.cc", dir)); /* --emulate */
    unlink(ir_fmt("%s/fused.o", dir));
    unlink(ir_fmt("%s/fused.o.d", dir)); /* the compiler's list of headers (objcache.c), where a build stopped */
    rmdir(dir);
}

/* a new private directory under $TMPDIR (or /tmp, where $TMPDIR holds a quote, backslash or newline) */
static char *temp_dir(void)
{
    const char *t = getenv("TMPDIR");
    char *dir = ir_fmt("%s/fsdpc-XXXXXX", t && *t && !strpbrk(t, "\"\\\n") ? t : "/tmp"); /* mkdtemp's pattern */
    if (!mkdtemp(dir))
        fatal("%s: cannot create a temporary directory: %s", dir, strerror(errno));
    return dir;
}

/* fsdpc --calibrate: build the calibration executable (runtime/calibrate.c) as an executable of the cpu
 * target is built, and run it on world ranks (mpirun; alone for 1); it writes the profile out */
void cg_calibrate(const char *out, int world, const char *cc)
{
    g_cc = cc;
    char *dir = temp_dir();
    const char *src = ir_fmt("%s/calibrate.c", dir), *exe = ir_fmt("%s/calibrate", dir);
    FILE *f = fopen(src, "w");
    const char *kname;
    cpu_kernels("native", &kname);
    if (!f || fprintf(f, "#include \"rt.h\"\nint main(int argc, char **argv) { return rt_calibrate(argc, argv, \"%s\"); "
                      "}\n", kname) < 0 || fclose(f))
        fatal("%s: cannot write: %s", src, strerror(errno));
    const char *why = cg_spawn_cc(cc_argv(0, (const char *[]){src, NULL}, exe, "native", 1, 0));
    if (why) {
        unlink(exe);
        unlink(src);
        rmdir(dir);
        fatal("--calibrate: building the measurement failed: %s; check --cc and the fsdpc install", why);
    }
    char *argv[8];
    int n = 0;
    if (world > 1) { /* at most one rank per core (fsdpc.c checked): Open MPI needs no --oversubscribe */
        argv[n++] = (char *)(*FSDPC_MPIEXEC ? FSDPC_MPIEXEC : "mpirun");
        argv[n++] = "-np";
        argv[n++] = ir_fmt("%d", world);
    }
    argv[n++] = (char *)exe;
    argv[n++] = (char *)out;
    argv[n] = NULL;
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], NULL, NULL, argv, environ), st = 0;
    if (rc)
        fatal("--calibrate: cannot run %s: %s", argv[0], strerror(rc));
    int ok = waitpid(pid, &st, 0) >= 0 && WIFEXITED(st) && !WEXITSTATUS(st);
    unlink(exe);
    unlink(src);
    rmdir(dir);
    if (!ok)
        fatal("--calibrate: the measurement on %d rank%s failed (%s exit status %d): see its message above", world,
              world > 1 ? "s" : "", argv[0], WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

const char *cg_source_cpu(const Graph *g, size_t *len)
{
    Cg cg = {.g = g, .cuda = 0};
    InitLayout L = cg_init_layout(g);
    Buf step = emit_step(&cg);
    Buf src = emit_source(&cg, &L, &step, &(Buf){0}, 0);
    uint64_t id = cg_init_id(g, &L, step.buf, step.len);
    cg_write_init(g, &L, id, NULL);
    Buf all = emit_main(g, id, &step);
    cg_put(&all, "%s", src.buf);
    *len = all.len;
    return all.buf;
}

/* ---- installing the pair -------------------------------------------------
 * OUT and OUT.init are written aside and replace the old pair only once
 * both are complete: a failing C compiler, a full disk or an interrupted
 * build leaves the old pair as it was.  The executable finds its init file
 * as OUT.init and checks its id (runtime/load.c), so no order of two renames
 * keeps a matching pair in place throughout: OUT first leaves the new
 * executable beside the old init, OUT.init first the old executable beside
 * the new init.  So the new init file takes a third name first, one that
 * holds the build's id — .OUT.init.<id>, where the executable looks when
 * OUT.init is another build's — then the executable replaces OUT, then
 * .OUT.init.<id> replaces OUT.init (each rename fsync'ed, its folder too).
 * At every point OUT starts: the old pair; the old pair and a new init
 * aside; the new executable reading .OUT.init.<id>; the new pair.  A build
 * that crashed between the last two renames leaves .OUT.init.<id>, which the
 * new executable uses, and the next build of OUT removes.  Builds that
 * install into one folder at once take turns (flock on the folder), so each
 * leaves a whole pair.  A build killed before it installs leaves only its
 * hidden temporaries (.OUT.init.XXXXXX, .OUT.build.XXXXXX/). */

#define ID_NAME_LEN 22 /* ".init.": 6, the id in hex: 16 */

/* OUT's folder opened, its name checked; nothing made yet */
static Build build_open(const char *out)
{
    Build b = {.out = out, .privfd = -1, .init = {.fd = -1, .dirfd = -1}};
    if ((b.dirfd = rt_parent_open(out, &b.base)) < 0)
        fatal("-o %s: %s", out, errno == EISDIR ? "names a folder, not a file"
                                : errno == ENOENT ? ir_fmt("no folder %s", parent(out)) : strerror(errno));
    struct stat st;
    if (fstatat(b.dirfd, b.base, &st, 0) == 0 && S_ISDIR(st.st_mode))
        fatal("-o %s: names a folder, not a file", out);
    /* the pair is two files: a FIFO or device there would be written in place (afile.h), never installed */
    if (fstatat(b.dirfd, b.base, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode))
        fatal("-o %s: not a regular file (a FIFO, device or socket): name a file", out);
    if (fstatat(b.dirfd, ir_fmt("%s.init", b.base), &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode) &&
        !S_ISLNK(st.st_mode))
        fatal("-o %s: %s.init is not a regular file (a folder, FIFO, device or socket): remove it or name "
              "another file", out, out);
    if (strlen(b.base) + 1 + ID_NAME_LEN > 255)
        fatal("-o %s: the name is too long (fsdpc also writes .%s.init.<id> beside it): at most %d characters", out,
              b.base, 255 - 1 - ID_NAME_LEN);
    return b;
}

/* the private folder (mode 0700, in OUT's folder: the executable's rename stays on one file system) */
static void build_private(Build *b)
{
    if (rt_dir_mktemp(b->dirfd, ir_fmt(".%s.build", b->base), b->priv, sizeof b->priv) != 0 ||
        (b->privfd = rt_dir_openat(b->dirfd, b->priv)) < 0) {
        int e = errno;
        b->priv[0] = 0;
        cg_build_fail(b, ir_fmt("-o %s: cannot create a folder beside it: %s", b->out, strerror(e)));
    }
    b->priv_path = ir_fmt("%s/%s", parent(b->out), b->priv);
}

/* text into the private folder as name; its path there */
static const char *write_private(Build *b, const char *name, const Buf *text)
{
    int fd = openat(b->privfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || rt_write_all(fd, text->buf, text->len) != 0 || close(fd) != 0)
        cg_build_fail(b, ir_fmt("%s/%s: cannot write: %s", b->priv_path, name, strerror(errno)));
    return ir_fmt("%s/%s", b->priv_path, name);
}

/* --emit-c: OUT.c, main.c then step.c (one file that compiles as the two do) */
static void write_emit_c(Build *b, const Buf *main_src, const Buf *step_src)
{
    Buf all = {0};
    cg_put(&all, "%s%s", main_src->buf, step_src->buf);
    if (rt_afile_write(ir_fmt("%s.c", b->out), all.buf, all.len, 0644) != 0)
        cg_build_fail(b, ir_fmt("%s.c: cannot write: %s", b->out, strerror(errno)));
}

/* Is name .BASE.init.<16 hex digits>? */
static int id_name(const char *name, const char *base)
{
    size_t l = strlen(base), n = strlen(name);
    if (n != l + 1 + ID_NAME_LEN || name[0] != '.' || strncmp(name + 1, base, l) || strncmp(name + 1 + l, ".init.", 6))
        return 0;
    return strspn(name + l + 7, "0123456789abcdef") == 16;
}

/* init files of earlier builds of OUT left under their id's name (one crashed between its last two renames),
 * but keep */
static void remove_stale(Build *b, const char *keep)
{
    int fd = dup(b->dirfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return;
    }
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (id_name(e->d_name, b->base) && strcmp(e->d_name, keep))
            unlinkat(b->dirfd, e->d_name, 0);
    closedir(d);
}

/* the new pair in place of the old (see above); then nothing of the build left aside */
static void install(Build *b, uint64_t id)
{
    const char *aside = ir_fmt(".%s.init.%016llx", b->base, (unsigned long long)id);
    flock(b->dirfd, LOCK_EX); /* builds installing beside each other take turns (released at the close) */
    if (rt_afile_stage(&b->init, aside) != 0)
        cg_build_fail(b, ir_fmt("%s.init: cannot write: %s", b->out, strerror(errno)));
    if (rt_afile_install(b->privfd, "exe", b->dirfd, b->base) != 0)
        cg_build_fail(b, ir_fmt("%s: cannot write the executable: %s", b->out, strerror(errno)));
    if (rt_afile_commit(&b->init) != 0)
        fprintf(stderr, "fsdpc: warning: %s.init: cannot replace it: %s; %s reads its weights from %s beside it\n",
                b->out, strerror(errno), b->out, aside);
    remove_stale(b, aside); /* after the executable: it might have been the one reading one of them */
    close(b->privfd);
    b->privfd = -1;
    rt_dir_remove(b->dirfd, b->priv);
    if (b->cuda_dir)
        remove_tree(b->cuda_dir, b->nimage);
    close(b->dirfd);
    free(b->base);
}

/* --init-only: OUT.init alone, replacing the old one (the executable left as it is; one built from the model's
 * structure takes it) */
static void write_init_only(Build *b, const Graph *g, InitLayout *L, uint64_t id)
{
    cg_write_init(g, L, id, b);
    if (rt_afile_commit(&b->init) != 0)
        cg_build_fail(b, ir_fmt("%s.init: cannot write: %s", b->out, strerror(errno)));
    close(b->dirfd);
    free(b->base);
}

void cg_build(const Graph *g)
{
    g_cc = g->opt->cc;
    Cg cg = {.g = g, .cuda = !strcmp(g->opt->target, "cuda")};
    Build b = build_open(g->opt->out);
    if (!g->opt->init_only) /* --init-only builds no executable: nothing to say about one */
        cg_notes(g);     /* before NVRTC's and cc's minutes */
    InitLayout L = cg_init_layout(g);
    Buf images = {0};
    Buf step = emit_step(&cg); /* first: the kernels it generates are compiled with the rest */
    uint64_t id = cg_init_id(g, &L, step.buf, step.len);
    if (g->opt->init_only) {
        write_init_only(&b, g, &L, id);
        return;
    }
    const char *asm_src = NULL;
    if (cg.cuda) {
        if (!*FSDPC_LIBS_CUDA)
            fatal("--target cuda (the default): this fsdpc was built without the CUDA toolkit; use --target cpu, or "
                  "rebuild fsdpc where the CUDA 13 toolkit is installed");
        b.cuda_dir = temp_dir();
        if (g->opt->emulate) { /* the fused kernels for the host, compiled now: the object joins the link */
            const char *cc;
            b.nimage = cg_cuemu_images(&cg, b.cuda_dir, &images, &cc);
            asm_src = ir_fmt("%s/fused.o", b.cuda_dir);
            const char *why = cg_object(cc, cxx_argv(), asm_src);
            if (why)
                cg_build_fail(&b, ir_fmt("%s: compiling the fused kernels for the CUDA emulation failed: %s", b.out,
                                         why));
        } else
            b.nimage = cg_cuda_images(&cg, b.cuda_dir, &images, &asm_src);
    }
    Buf src = emit_source(&cg, &L, &step, &images, b.nimage);
    build_private(&b);
    cg_write_init(g, &L, id, &b);
    Buf main_src = emit_main(g, id, &step);
    if (g->opt->keep_c)
        write_emit_c(&b, &main_src, &src);
    const char *cpu = cg.cuda ? NULL : opt_cpu(g), *step_c = write_private(&b, "step.c", &src);
    const char *in[] = {write_private(&b, "main.c", &main_src), ir_fmt("%s/step.o", b.priv_path), asm_src, NULL};
    const char *why = cg_object(step_c, cc_argv(cg.cuda, (const char *[]){NULL}, NULL, cpu, 0, 0), in[1]);
    if (why)
        cc_fail(&b, why);
    why = cg_spawn_cc(cc_argv(cg.cuda, in, ir_fmt("%s/exe", b.priv_path), cpu, 1, cg.cuda && g->opt->emulate));
    if (why)
        cc_fail(&b, why);
    install(&b, id);
}
