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
 * forms the root unit.  A parameter used twice (tied weights) is one
 * parameter, so it lands in one unit by construction.
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
                  g->val[p].name, dtype_name(g->val[p].dtype));
        u->params[i] = p;
        u->offset[i] = u->numel;
        u->numel += value_numel(g, p);
        g->val[p].unit = g->nunit;
    }
    g->nunit++;
}

void pass_units(Graph *g)
{
    int *order = ir_alloc(sizeof(int) * (size_t)g->nval);
    int n = first_use_order(g, order);
    g->unit = ir_alloc(sizeof(Unit) * (size_t)(n + 1));
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
