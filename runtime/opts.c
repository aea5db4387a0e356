/* opts.c — which options the executables take, and where their values come
 * from: the table of them (OPTS: name, value type, which builds take it,
 * whether a checkpoint keeps it), the command line, a --config FILE and the
 * run.toml of the --resume checkpoint.
 *
 * Values come from three sources, lowest precedence first: the run.toml of
 * the --resume checkpoint (the options of the run that wrote it), the
 * --config FILE, the command line; an option takes its values from the
 * highest source that gives it (a repeatable one its whole list).  Run files
 * are read by runcfg.c; a key is an option's name, its value the text the
 * flag would get, so every source goes through args.c's rt_set_flag (a run
 * file's values the command line overrides are checked too).  describe()
 * then writes the options in force as the run.toml every checkpoint gets
 * (all but F_NOSAVE's), the start-up line on what --resume restored, and a
 * hash the ranks compare (each reads its files itself; rt.c).
 *
 * Each kind rejects the other's options; cpu builds reject the cuda
 * target's (--rendezvous, --no-cuda-graph), fp32 builds the fp16 ones (a
 * run.toml of another build has them ignored, and said so).  Errors go
 * through rt_err_set, status 2: "FILE:LINE: key 'K': ..." for a run file.
 */
#define _POSIX_C_SOURCE 200809L

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_priv.h"

/* ------------------------------------------------------------ the option table */

enum { T_SWITCH, T_INT, T_REAL, T_STR, T_LIST }; /* the value an option takes (T_LIST: repeatable) */
enum {
    F_TRAIN = 1,   /* an option of training executables */
    F_EVAL = 2,    /* of forward-only ones (both bits: of both) */
    F_CUDA = 4,    /* of cuda-target builds only */
    F_FP16 = 8,    /* of --precision fp16 builds only */
    F_FILE = 16,   /* names a file or folder: never empty */
    F_NOSAVE = 32, /* not kept in a checkpoint's run.toml: nothing to restore */
};
#define TE (F_TRAIN | F_EVAL)

/* Every option of the executables, once; run.toml lists them in this order.  The values are parsed by
 * rt_set_flag (switches by set_switch). */
static const struct {
    const char *name; /* the flag without "--"; a run file's key */
    int type, flags;
} OPTS[] = {
    {"config", T_STR, TE | F_FILE | F_NOSAVE},
    {"data", T_LIST, F_TRAIN},
    {"tokens", T_STR, F_TRAIN | F_FILE},
    {"token-inputs", T_STR, F_TRAIN},
    {"val-data", T_LIST, F_TRAIN},
    {"val-tokens", T_STR, F_TRAIN | F_FILE},
    {"shuffle", T_SWITCH, F_TRAIN},
    {"random-windows", T_SWITCH, F_TRAIN},
    {"seed", T_INT, F_TRAIN},
    {"eval-every", T_INT, F_TRAIN},
    {"eval-steps", T_INT, F_TRAIN},
    {"save-best", T_SWITCH, F_TRAIN},
    {"steps", T_INT, F_TRAIN},
    {"lr", T_REAL, F_TRAIN},
    {"weight-decay", T_REAL, F_TRAIN},
    {"no-decay", T_LIST, F_TRAIN},
    {"lr-mult", T_LIST, F_TRAIN},
    {"momentum", T_REAL, F_TRAIN},
    {"nesterov", T_SWITCH, F_TRAIN},
    {"beta1", T_REAL, F_TRAIN},
    {"beta2", T_REAL, F_TRAIN},
    {"eps", T_REAL, F_TRAIN},
    {"clip-grad-norm", T_REAL, F_TRAIN},
    {"lr-schedule", T_STR, F_TRAIN},
    {"warmup-steps", T_INT, F_TRAIN},
    {"decay-steps", T_INT, F_TRAIN},
    {"min-lr", T_REAL, F_TRAIN},
    {"wsd-decay-steps", T_INT, F_TRAIN},
    {"on-nonfinite", T_STR, F_TRAIN},
    {"accum", T_INT, F_TRAIN},
    {"accum-mode", T_STR, F_TRAIN},
    {"loss-scale-init", T_REAL, F_TRAIN | F_FP16},
    {"loss-scale-growth-interval", T_INT, F_TRAIN | F_FP16},
    {"loss-scale", T_REAL, F_TRAIN | F_FP16},
    {"metrics", T_STR, F_TRAIN | F_FILE},
    {"trace", T_STR, F_TRAIN | F_FILE | F_NOSAVE},
    {"trace-steps", T_INT, F_TRAIN | F_NOSAVE},
    {"ckpt-dir", T_STR, F_TRAIN | F_FILE},
    {"ckpt-every", T_INT, F_TRAIN},
    {"resume", T_STR, F_TRAIN | F_FILE | F_NOSAVE},
    {"export-onnx", T_STR, F_TRAIN | F_FILE},
    {"export-safetensors", T_STR, F_TRAIN | F_FILE},
    {"init", T_STR, TE | F_FILE},
    {"dump-grads", T_STR, F_TRAIN | F_FILE | F_NOSAVE},
    {"log-every", T_INT, F_TRAIN},
    {"peak-tflops", T_REAL, F_TRAIN},
    {"quiet", T_SWITCH, TE | F_NOSAVE},
    {"rendezvous", T_STR, TE | F_CUDA | F_NOSAVE},
    {"no-cuda-graph", T_SWITCH, TE | F_CUDA},
    {"input", T_LIST, F_EVAL},
    {"out-dir", T_STR, F_EVAL | F_FILE},
};
#define NOPT ((int)(sizeof OPTS / sizeof OPTS[0]))

/* the table index of option name (no "--"), or -1 */
static int opt_find(const char *name)
{
    for (int k = 0; k < NOPT; k++)
        if (!strcmp(OPTS[k].name, name))
            return k;
    return -1;
}

/* NULL when option k is one of m's; else why not */
static const char *out_of_scope(const RtModel *m, int k)
{
    int f = OPTS[k].flags;
    if (m->eval && !(f & F_EVAL))
        return "a training option; this executable is forward-only (built with fsdpc --eval; see --help)";
    if (!m->eval && !(f & F_TRAIN))
        return "an option of forward-only executables (fsdpc --eval); this one trains (its data: --data "
               "NAME=FILE.npy)";
    if ((f & F_CUDA) && !m->target_cuda)
        return "only for executables built with --target cuda";
    if ((f & F_FP16) && !m->loss_scaling)
        return "loss scaling is for executables built with fsdpc --precision fp16; this one was not (drop it, or "
               "rebuild with --precision fp16)";
    return NULL;
}

/* switch option name on or off */
static void set_switch(RtOpts *o, const char *name, int on)
{
    int *field = !strcmp(name, "quiet")          ? &o->quiet
               : !strcmp(name, "no-cuda-graph")  ? &o->no_cuda_graph
               : !strcmp(name, "shuffle")        ? &o->shuffle
               : !strcmp(name, "save-best")      ? &o->save_best
               : !strcmp(name, "random-windows") ? &o->random_windows
                                                 : &o->nesterov;
    *field = on;
}

/* ------------------------------------------------- the options' sources */

/* Where values come from, lowest precedence first: the --resume checkpoint's run.toml, the --config file,
 * the command line.  An option takes its values from the highest source that gives it (a list whole: the
 * command line's --data replaces a file's data = [...]). */
enum { L_CKPT, L_CONFIG, L_ARGV, NLAYER };

typedef struct {
    const char **val; /* the values given, in order: argv's strings, or a run file's */
    int n, cap;       /* cap > 0: val allocated here (argv's) */
    int set;          /* given (an empty array too) */
    int line;         /* a run file's line */
} Given;

struct RtOptSrc {
    Given g[NLAYER][NOPT];
    RtCfg file[NLAYER];   /* [L_CKPT]: run.toml, [L_CONFIG]: --config's */
    int ignored[NOPT];    /* run.toml gave it, but it is another build's (cuda, fp16) */
    int have_ckpt;        /* run.toml was read */
};

/* the value of a single-valued option that counts: the last given (a run file's only one) */
static const char *last(const Given *g) { return g->n > 0 ? g->val[g->n - 1] : ""; }

/* the source whose values of option k count, or -1 */
static int top(const RtOptSrc *src, int k)
{
    for (int l = NLAYER - 1; l >= 0; l--)
        if (src->g[l][k].set)
            return l;
    return -1;
}

/* argv's value v, appended to those given before: a list's next, or a single value's next (each is checked;
 * the last counts, as set_flag sees them in order) */
static int add_argv(Given *g, const char *v)
{
    if (g->n == g->cap) {
        const char **q = realloc(g->val, sizeof *q * (size_t)(2 * g->cap + 4));
        if (!q) {
            rt_err_set(1, "out of memory");
            return -1;
        }
        g->val = q;
        g->cap = 2 * g->cap + 4;
    }
    g->val[g->n++] = v;
    g->set = 1;
    return 0;
}

/* argv[*i] is "--flag", "--flag=value" or "--flag value" (then *i moves on): into src's command-line layer.
 * 0: done; 1: --help; -1: error. */
static int parse_one(int argc, char **argv, int *i, const RtModel *m, RtOptSrc *src)
{
    const char *a = argv[*i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
        return 1;
    if (strncmp(a, "--", 2) != 0 || a[2] == 0) {
        rt_err_set(2, "unexpected argument '%s' (see --help)", a);
        return -1;
    }
    char flag[64];
    const char *eq = strchr(a, '='), *val;
    size_t fl = eq ? (size_t)(eq - a) : strlen(a);
    if (fl >= sizeof flag) {
        rt_err_set(2, "unknown flag '%.40s...' (see --help)", a);
        return -1;
    }
    memcpy(flag, a, fl);
    flag[fl] = 0;
    int k = opt_find(flag + 2);
    const char *why = k >= 0 ? out_of_scope(m, k) : NULL;
    if (k < 0 || why) {
        rt_err_set(2, k < 0 ? "unknown flag '%s' (see --help)" : "%s: %s", flag, why);
        return -1;
    }
    if (OPTS[k].type == T_SWITCH) {
        val = eq ? eq + 1 : "true";
        if (strcmp(val, "true") && strcmp(val, "false")) {
            rt_err_set(2, "%s takes no value (or =true, =false: to override a run file's; see --help)", flag);
            return -1;
        }
    } else if (eq) {
        val = eq + 1;
    } else if (*i + 1 < argc) {
        val = argv[++*i];
    } else {
        rt_err_set(2, "missing value for '%s' (see --help)", flag);
        return -1;
    }
    if (!*val && (OPTS[k].flags & F_FILE)) {
        rt_err_set(2, "%s: empty file name", flag);
        return -1;
    }
    return add_argv(&src->g[L_ARGV][k], val);
}

/* does a run file's value of type cv (RT_CV_*) fit an option of type t? */
static int fits(int t, int cv)
{
    return t == T_SWITCH ? cv == RT_CV_BOOL
         : t == T_INT    ? cv == RT_CV_INT
         : t == T_REAL   ? cv == RT_CV_INT || cv == RT_CV_REAL
         : t == T_STR    ? cv == RT_CV_STR
                         : cv == RT_CV_STR || cv == RT_CV_ARRAY;
}

/* one entry e of run file l (a key of m's, with a value of its type) into src's layer l */
static int take_entry(const RtModel *m, RtOptSrc *src, int l, const RtCfgEntry *e)
{
    static const char *const want[] = {"true or false", "an integer", "a number", "a \"string\"",
                                       "a \"string\" or an array of them [\"a\", \"b\"]"};
    const char *path = src->file[l].path;
    int k = opt_find(e->key);
    if (k < 0) {
        rt_err_set(2, "%s:%d: unknown key '%s' (the keys are the long options without '--'; see --help)", path,
                   e->line, e->key);
        return -1;
    }
    const char *why = out_of_scope(m, k), *expected = "";
    if (k == opt_find("config") || (l == L_CKPT && k == opt_find("resume"))) {
        why = l == L_CKPT ? "a checkpoint's run.toml names no other run file" : "--config files do not nest";
    } else if (why && l == L_CKPT && (OPTS[k].flags & (F_CUDA | F_FP16))) { /* a checkpoint of another build */
        src->ignored[k] = 1;
        return 0;
    } else if (!why && !fits(OPTS[k].type, e->type)) {
        why = want[OPTS[k].type];
        expected = "expected ";
    } else if (!why && (OPTS[k].flags & F_FILE) && !*e->val[0]) {
        why = "empty file name";
    }
    if (why) {
        rt_err_set(2, "%s:%d: key '%s': %s%s", path, e->line, e->key, expected, why);
        return -1;
    }
    Given *g = &src->g[l][k];
    *g = (Given){(const char **)e->val, e->nval, 0, 1, e->line};
    return 0;
}

/* --config FILE (the command line's) and the run.toml of --resume PATH (the command line's or FILE's) into
 * src; 0, or -1 (rt_err_set called) */
static int load_files(const RtModel *m, RtOptSrc *src)
{
    int kc = opt_find("config"), kr = opt_find("resume");
    if (src->g[L_ARGV][kc].set) {
        int rc = rt_cfg_load(&src->file[L_CONFIG], "--config", last(&src->g[L_ARGV][kc]), 0, 0);
        for (int i = 0; rc == 0 && i < src->file[L_CONFIG].n; i++)
            rc = take_entry(m, src, L_CONFIG, &src->file[L_CONFIG].e[i]);
        if (rc != 0)
            return -1;
    }
    int l = top(src, kr);
    if (l < 0 || m->eval)
        return 0;
    char dir[PATH_MAX], path[PATH_MAX + 16];
    if (rt_ckpt_resolve(last(&src->g[l][kr]), dir, sizeof dir, 0) != 0)
        return -1;
    snprintf(path, sizeof path, "%s/run.toml", dir);
    int rc = rt_cfg_load(&src->file[L_CKPT], "--resume", path, 1, 1); /* none: a checkpoint of an older fsdpc */
    src->have_ckpt = rc == 0;
    for (int i = 0; rc == 0 && i < src->file[L_CKPT].n; i++)
        rc = take_entry(m, src, L_CKPT, &src->file[L_CKPT].e[i]);
    return rc < 0 ? -1 : 0;
}

/* the source of option k that apply(src, o, only) reads: only's, or (only < 0) the one that counts */
static int pick(const RtOptSrc *src, int k, int only)
{
    return only < 0 ? top(src, k) : src->g[only][k].set ? only : -1;
}

/* every option's values that count (only < 0), or those of source only, into o (in table order; a run file's
 * errors name its line) */
static int apply(RtOptSrc *src, RtOpts *o, int only)
{
    size_t total = 1;
    for (int k = 0; k < NOPT; k++)
        total += pick(src, k, only) >= 0 ? (size_t)src->g[pick(src, k, only)][k].n : 0;
    o->data = calloc(total, sizeof *o->data);
    o->val_data = calloc(total, sizeof *o->val_data);
    o->no_decay = calloc(total, sizeof *o->no_decay);
    o->lr_mult = calloc(total, sizeof *o->lr_mult);
    if (!o->data || !o->val_data || !o->no_decay || !o->lr_mult) {
        rt_err_set(1, "out of memory");
        return -1;
    }
    int failed = 0;
    for (int k = 0, l; k < NOPT; k++) {
        if ((l = pick(src, k, only)) < 0)
            continue;
        const Given *g = &src->g[l][k];
        char where[PATH_MAX + 128], flag[64];
        snprintf(where, sizeof where, "%s:%d: key '%s'", src->file[l].path, g->line, OPTS[k].name);
        snprintf(flag, sizeof flag, "--%s", OPTS[k].name);
        rt_err_where(l == L_ARGV ? NULL : where);
        for (int v = 0; v < g->n; v++) {
            if (OPTS[k].type == T_SWITCH) {
                set_switch(o, OPTS[k].name, !strcmp(g->val[v], "true"));
            } else {
                failed |= rt_set_flag(o, flag, g->val[v]) != 0;
            }
        }
        rt_err_where(NULL);
    }
    return failed ? -1 : 0;
}

/* option k's value(s) as TOML after "key = " (a single value: the last given) */
static void put_value(RtStr *b, int k, const Given *g)
{
    switch (OPTS[k].type) {
    case T_SWITCH:
        rt_str_add(b, "%s", last(g));
        break;
    case T_INT:
        rt_str_add(b, "%lld", strtoll(last(g), NULL, 10)); /* set_flag checked it: decimal, in range */
        break;
    case T_REAL:
        rt_cfg_put_real(b, strtod(last(g), NULL));
        break;
    case T_STR:
        rt_cfg_put_string(b, last(g));
        break;
    default:
        rt_str_add(b, "[");
        for (int v = 0; v < g->n; v++) {
            rt_str_add(b, "%s", g->n > 1 ? "\n    " : "");
            rt_cfg_put_string(b, g->val[v]);
            rt_str_add(b, "%s", g->n > 1 ? "," : "");
        }
        rt_str_add(b, "%s]", g->n > 1 ? "\n" : "");
    }
}

/* the options in force as run-file lines: all of them, or those a checkpoint keeps */
static void put_options(RtStr *b, const RtOptSrc *src, int all)
{
    for (int k = 0, l; k < NOPT; k++)
        if ((l = top(src, k)) >= 0 && (all || !(OPTS[k].flags & F_NOSAVE))) {
            rt_str_add(b, "%s = ", OPTS[k].name);
            put_value(b, k, &src->g[l][k]);
            rt_str_add(b, "\n");
        }
}

/* the start-up line on --resume's run.toml: the options it gave (as flags), those it gave for other builds */
static void put_restored(RtStr *b, const RtOptSrc *src)
{
    const char *path = src->file[L_CKPT].path;
    if (!src->have_ckpt) {
        rt_str_add(b, "no %s (a checkpoint of an older fsdpc): the options are the command line's", path);
        return;
    }
    int n = 0;
    rt_str_add(b, "options from %s:", path);
    for (int k = 0; k < NOPT; k++)
        for (int v = 0; top(src, k) == L_CKPT && v < src->g[L_CKPT][k].n; v++, n++) {
            const char *val = src->g[L_CKPT][k].val[v];
            if (OPTS[k].type == T_SWITCH)
                rt_str_add(b, " --%s%s", OPTS[k].name, strcmp(val, "true") ? "=false" : "");
            else
                rt_str_add(b, " --%s %s", OPTS[k].name, val);
        }
    rt_str_add(b, "%s", n ? "" : " none (given again)");
    for (int k = 0, first = 1; k < NOPT; k++)
        if (src->ignored[k]) {
            rt_str_add(b, "%s --%s", first ? "; ignored (another build's):" : "", OPTS[k].name);
            first = 0;
        }
    for (char *p = b->s; p && *p; p++) /* one line, whatever the values hold */
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
}

/* o->run_toml, o->restored and o->opts_hash from the options in force; 0, or -1 (out of memory) */
static int describe(const RtOptSrc *src, const RtModel *m, RtOpts *o)
{
    RtStr t = {0}, all = {0}, r = {0};
    rt_str_add(&t, "# fsdpc run options (every checkpoint keeps its run's): --resume restores them, and a flag or\n"
                   "# --config given with --resume overrides them; paths are relative to where the run starts\n");
    put_options(&t, src, 0);
    put_options(&all, src, 1);
    if (top(src, opt_find("resume")) >= 0 && !m->eval)
        put_restored(&r, src);
    o->run_toml = t.s;
    o->restored = r.s;
    o->opts_hash = rt_fnv(RT_FNV0, all.s ? all.s : "", all.n);
    o->from_files = src->have_ckpt || src->file[L_CONFIG].path;
    free(all.s);
    if (t.bad || all.bad || r.bad || !t.s) {
        rt_err_set(1, "out of memory");
        return -1;
    }
    return 0;
}

int rt_parse_flags(int argc, char **argv, const RtModel *m, RtOpts *o)
{
    rt_opts_defaults(m, o);
    RtOptSrc *src = o->src = calloc(1, sizeof *src);
    if (!src) {
        rt_err_set(1, "out of memory");
        return -1;
    }
    int failed = 0;
    for (int i = 1; i < argc; i++) {
        int rc = parse_one(argc, argv, &i, m, src);
        if (rc == 1 && !failed) /* --help: with the flags before it (--rendezvous), checked as before */
            return apply(src, o, L_ARGV) != 0 ? -1 : 1;
        failed |= rc < 0;
    }
    failed = failed || load_files(m, src) != 0;
    /* past an error, the values go into o all the same (rt_err_set keeps the
     * first error): the control plane starts anyway, to agree on it, and
     * needs --rendezvous */
    for (int l = L_CKPT; l <= L_CONFIG && !failed; l++) { /* a run file's values that the command line
                                                             * overrides are checked all the same */
        RtOpts scratch;
        rt_opts_defaults(m, &scratch);
        failed = apply(src, &scratch, l) != 0;
        rt_opts_free(&scratch);
    }
    failed |= apply(src, o, -1) != 0;
    if (failed || rt_opts_check(m, o) != 0)
        return -1;
    return describe(src, m, o);
}

void rt_opts_free(RtOpts *o)
{
    for (int k = 0; o->data && k < o->ndata; k++)
        free((char *)o->data[k].name);
    for (int k = 0; o->val_data && k < o->nval_data; k++)
        free((char *)o->val_data[k].name);
    free(o->data);
    free(o->val_data);
    free(o->no_decay);
    for (int k = 0; o->lr_mult && k < o->nlr_mult; k++)
        free((char *)o->lr_mult[k].pattern);
    free(o->lr_mult);
    for (int l = 0; o->src && l < NLAYER; l++) {
        for (int k = 0; l == L_ARGV && k < NOPT; k++)
            free(o->src->g[l][k].val);
        rt_cfg_free(&o->src->file[l]);
    }
    free(o->src);
    free(o->run_toml);
    free(o->restored);
    o->src = NULL;
    o->run_toml = o->restored = NULL;
    o->data = o->val_data = NULL;
    o->no_decay = NULL;
    o->lr_mult = NULL;
    o->nno_decay = o->nlr_mult = 0;
    o->ndata = o->nval_data = 0;
}
