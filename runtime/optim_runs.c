/* optim_runs.c — the optimizer's parameter groups: which parameters weight decay skips (--no-decay; by
 * default those of rank < 2) and their learning-rate factors (--lr-mult), as runs of each unit's flat
 * layout that the step's update (codegen/emit.c) walks inside this rank's shard.
 */
#include <fnmatch.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_priv.h"

/* whether parameter p decays under --no-decay (none given: rank >= 2) */
static int decays(const RtParam *p, const RtOpts *o)
{
    if (o->nno_decay == 0)
        return p->rank >= 2;
    for (int k = 0; k < o->nno_decay; k++)
        if (strcmp(o->no_decay[k], "none") != 0 && fnmatch(o->no_decay[k], p->name, 0) == 0)
            return 0;
    return 1;
}

/* parameter p's learning-rate factor: the first --lr-mult PATTERN=X whose PATTERN matches its name, else 1 */
static double lr_mult(const RtParam *p, const RtOpts *o)
{
    for (int k = 0; k < o->nlr_mult; k++)
        if (fnmatch(o->lr_mult[k].pattern, p->name, 0) == 0)
            return o->lr_mult[k].mult;
    return 1;
}

static int cmp_param_off(const void *a, const void *b)
{
    const RtParam *x = *(const RtParam *const *)a, *y = *(const RtParam *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* 0, or -1 (rt_err_set called) for a --no-decay or --lr-mult pattern that names no parameter */
static int check_patterns(const RtModel *m, const RtOpts *o)
{
    for (int k = 0; k < o->nno_decay + o->nlr_mult; k++) {
        const char *pat = k < o->nno_decay ? o->no_decay[k] : o->lr_mult[k - o->nno_decay].pattern;
        const char *flag = k < o->nno_decay ? "--no-decay" : "--lr-mult";
        if (k < o->nno_decay && strcmp(pat, "none") == 0) {
            if (o->nno_decay == 1)
                continue;
            rt_err_set(2, "--no-decay none (every parameter decays) goes alone: drop the other --no-decay flags");
            return -1;
        }
        int hit = 0;
        for (int i = 0; i < m->nparam && !hit; i++)
            hit = fnmatch(pat, m->param[i].name, 0) == 0;
        if (!hit) {
            rt_err_set(2, "%s %.200s: no parameter's name matches it (parameters are named as the model's "
                          "initializers; see --help)", flag, pat);
            return -1;
        }
    }
    return 0;
}

/* c->opt_run / opt_nrun: per unit, its flat layout [0, numel) cut into runs of parameters updated alike
 * (weight decay or not, one learning-rate factor; a gap between parameters joins the run before it); how
 * many parameters and elements decay into *np, *ne.  0, or -1 (rt_err_set called). */
static int runs(RtCtx *c, const RtOpts *o, int *np, int64_t *ne)
{
    const RtModel *m = c->m;
    *np = 0, *ne = 0;
    if (check_patterns(m, o) != 0)
        return -1;
    c->opt_run = calloc((size_t)m->nunit + 1, sizeof *c->opt_run);
    c->opt_nrun = calloc((size_t)m->nunit + 1, sizeof *c->opt_nrun);
    const RtParam **ps = calloc((size_t)m->nparam + 1, sizeof *ps);
    for (int u = 0; c->opt_run && c->opt_nrun && ps && u < m->nunit; u++) {
        int n = 0;
        for (int i = 0; i < m->nparam; i++)
            if (m->param[i].unit == u)
                ps[n++] = &m->param[i];
        qsort(ps, (size_t)n, sizeof *ps, cmp_param_off);
        RtOptRun *run = c->opt_run[u] = calloc((size_t)n + 1, sizeof *run);
        if (!run)
            break;
        int nr = 0;
        for (int i = 0; i < n; i++) {
            int d = decays(ps[i], o);
            double f = lr_mult(ps[i], o);
            *np += d, *ne += d ? ps[i]->numel : 0;
            if (nr > 0 && run[nr - 1].decay == d && run[nr - 1].lr_mult == f) {
                run[nr - 1].hi = ps[i]->offset + ps[i]->numel;
                continue;
            }
            if (nr > 0)
                run[nr - 1].hi = ps[i]->offset; /* a gap joins the run before */
            run[nr] = (RtOptRun){nr ? ps[i]->offset : 0, ps[i]->offset + ps[i]->numel, d, f};
            nr++;
        }
        if (nr > 0)
            run[nr - 1].hi = m->unit[u].numel;
        c->opt_nrun[u] = nr;
    }
    int ok = c->opt_run && c->opt_nrun && ps;
    for (int u = 0; ok && u < m->nunit; u++)
        ok = c->opt_run[u] != NULL;
    free(ps);
    if (!ok)
        rt_err_set(1, "out of memory");
    return ok ? 0 : -1;
}

int rt_opt_runs(RtCtx *c, const RtOpts *o, int print)
{
    const RtModel *m = c->m;
    int np;
    int64_t ne, total = 0;
    if (runs(c, o, &np, &ne) != 0)
        return -1;
    for (int i = 0; i < m->nparam; i++)
        total += m->param[i].numel;
    if (print && o->wd > 0)
        printf("weight decay %g on %d of %d parameters (%" PRId64 " of %" PRId64 " elements): %s\n", o->wd, np,
               m->nparam, ne, total, o->nno_decay == 0 ? "not on those of rank < 2 (biases, norm scales; "
               "--no-decay none: on all)" : strcmp(o->no_decay[0], "none") == 0 ? "on all (--no-decay none)"
               : "not on those --no-decay names");
    return 0;
}

void rt_opt_runs_free(RtCtx *c)
{
    for (int u = 0; c->opt_run && u < c->m->nunit; u++)
        free(c->opt_run[u]);
    free(c->opt_run);
    free(c->opt_nrun);
    c->opt_run = NULL;
    c->opt_nrun = NULL;
}
