/* units.c — group parameters into FSDP units (the wrap policy).
 *
 * requires: autodiff (R_PARAM marked).
 * ensures:  g->unit[]: every parameter in exactly one unit, in order of first
 *           use in the forward pass; each unit lists its parameters with
 *           their element offsets in the unit's flat buffer.
 *
 * Policy `--wrap size:N` (PyTorch's size-based auto wrap): parameters are
 * grouped into layers by name prefix (everything before the last '.', so
 * "fc1.weight" and "fc1.bias" stay together); consecutive layers accumulate
 * into a unit until it holds at least N elements; what is left at the end
 * forms the root unit.
 * Policy `--wrap blocks`: a name component that is an index (digits) after
 * a container seen with at least two indices marks a repeated block
 * ("transformer.h.0.", "layer2.1."); each block is a unit, the parameters
 * outside every block form the root unit.
 * Policy `--wrap prefix:A,B,...`: a unit per prefix, holding the parameters
 * whose names start with it (the first listed that matches); the rest form
 * the root unit.
 * Units follow the order of their first parameter's first use.  A parameter
 * used twice (tied weights) is one parameter, so it lands in one unit by
 * construction, gathered around all its uses.
 */
#include "ir.h"

#include <string.h>

static int same_layer(const char *a, const char *b)
{
    const char *da = strrchr(a, '.'), *db = strrchr(b, '.');
    size_t la = da ? (size_t)(da - a) : strlen(a), lb = db ? (size_t)(db - b) : strlen(b);
    return la == lb && !strncmp(a, b, la);
}

/* parameters in order of first use by a forward node */
static int first_use_order(const Graph *g, int *order)
{
    char *seen = ir_alloc((size_t)g->nval);
    int n = 0;
    for (int i = 0; i < g->nfwd; i++)
        for (int j = 0; j < g->node[i].nin; j++) {
            int v = g->node[i].in[j];
            if (v >= 0 && g->val[v].role == R_PARAM && !seen[v]) {
                seen[v] = 1;
                order[n++] = v;
            }
        }
    return n;
}

static void close_unit(Graph *g, const int *params, int n, const char *name)
{
    Unit *u = &g->unit[g->nunit];
    u->name = ir_strdup(name);
    u->nparams = n;
    u->params = ir_alloc(sizeof(int) * (size_t)n);
    u->offset = ir_alloc(sizeof(int64_t) * (size_t)n);
    u->dtype = g->val[params[0]].dtype;
    u->flat = u->flatgrad = u->shard = u->gradshard = u->state[0] = u->state[1] = -1;
    for (int i = 0; i < n; i++) {
        int p = params[i];
        if (g->val[p].dtype != u->dtype)
            fatal("%s: parameters '%s' (%s) and '%s' (%s) have different dtypes; fsdpc needs one "
                  "dtype per model", g->opt->model, g->val[params[0]].name, dtype_name(u->dtype),
                  ir_q(g->val[p].name), dtype_name(g->val[p].dtype));
        u->params[i] = p;
        u->offset[i] = u->numel;
        u->numel += value_numel(g, p);
        g->val[p].unit = g->nunit;
    }
    g->nunit++;
}

/* "NAME.<digits>." of the repeated block that name belongs to (its first
 * index component whose container has two indices or more), or NULL */
static char *block_of(const Graph *g, const int *order, int n, const char *name)
{
    for (const char *p = strchr(name, '.'); p; p = strchr(p + 1, '.')) {
        const char *q = p + 1;
        size_t d = strspn(q, "0123456789");
        if (!d || q[d] != '.')
            continue;
        size_t clen = (size_t)(p - name) + 1; /* "container." */
        for (int i = 0; i < n; i++) { /* another index under the same container? */
            const char *o = g->val[order[i]].name;
            size_t od = strspn(o + clen, "0123456789");
            if (!strncmp(o, name, clen) && od && o[clen + od] == '.' && (od != d || strncmp(o + clen, q, d)))
                return ir_fmt("%.*s", (int)(clen + d + 1), name);
        }
    }
    return NULL;
}

/* the unit key of every parameter under --wrap blocks / prefix (NULL: root) */
static const char **keys(const Graph *g, const int *order, int n)
{
    const Options *o = g->opt;
    const char **key = ir_alloc(sizeof(char *) * (size_t)(n + 1));
    char *used = ir_alloc((size_t)o->nprefix + 1);
    int any = 0;
    for (int i = 0; i < n; i++) {
        const char *name = g->val[order[i]].name;
        if (o->wrap == WRAP_BLOCKS)
            key[i] = block_of(g, order, n, name);
        for (int k = 0; o->wrap == WRAP_PREFIX && k < o->nprefix && !key[i]; k++)
            if (!strncmp(name, o->prefix[k], strlen(o->prefix[k])))
                key[i] = o->prefix[k], used[k] = 1;
        any |= key[i] != NULL;
    }
    for (int k = 0; k < o->nprefix; k++)
        if (o->wrap == WRAP_PREFIX && !used[k])
            fatal("--wrap prefix: '%s' starts no parameter name of %s", o->prefix[k], o->model);
    if (o->wrap == WRAP_BLOCKS && !any)
        fatal("--wrap blocks: %s has no repeated blocks in its parameter names (NAME.0., NAME.1., ...); use "
              "--wrap size:N or prefix:A,B,...", o->model);
    return key;
}

/* one unit per distinct key, in order of first use, then the root */
static void by_key(Graph *g, const int *order, int n, const char **key)
{
    int *members = ir_alloc(sizeof(int) * (size_t)(n + 1));
    char *done = ir_alloc((size_t)n + 1);
    for (int i = 0; i < n; i++) {
        if (done[i] || !key[i])
            continue;
        int m = 0;
        for (int j = i; j < n; j++)
            if (!done[j] && key[j] && !strcmp(key[j], key[i]))
                members[m++] = order[j], done[j] = 1;
        close_unit(g, members, m, ir_fmt("unit%d", g->nunit));
    }
    int m = 0;
    for (int i = 0; i < n; i++)
        if (!done[i])
            members[m++] = order[i];
    if (m)
        close_unit(g, members, m, "root");
}

void pass_units(Graph *g)
{
    int *order = ir_alloc(sizeof(int) * (size_t)g->nval);
    int n = first_use_order(g, order);
    g->unit = ir_alloc(sizeof(Unit) * (size_t)(n + 1));
    if (g->opt->wrap != WRAP_SIZE) {
        by_key(g, order, n, keys(g, order, n));
        return;
    }
    int64_t limit = g->opt->wrap_size;
    int start = 0;
    int64_t count = 0;
    for (int i = 0; i < n; i++) {
        count += value_numel(g, order[i]);
        int layer_ends = i + 1 == n || !same_layer(g->val[order[i]].name, g->val[order[i + 1]].name);
        if (layer_ends && count >= limit) {
            close_unit(g, order + start, i + 1 - start, ir_fmt("unit%d", g->nunit));
            start = i + 1;
            count = 0;
        }
    }
    if (start < n)
        close_unit(g, order + start, n - start, "root");
}
