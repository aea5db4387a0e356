/* consts.c — identical constants stored once (the last step of pass_autodiff).
 *
 * An exported model often holds the same constant many times: nanoGPT's
 * causal mask is a buffer of every layer (12 copies of [1, 1, T, T] at GPT-2
 * small: 48 MB at T 1024 in float32, 3 GB at T 8192), and folding makes more
 * (a Slice of each layer's mask, the same scalar in every block).  Each copy
 * would take its own room in the arena and in OUT.init.  So after folding,
 * every reader of a constant reads the first constant (in value order) of
 * the same dtype, shape and bytes instead; the copies lose their readers and
 * are planned nowhere (memplan places only constants something reads).
 * It runs once the trained initializers are known (autodiff makes them
 * R_PARAM): before that, LayerNorm scales of ones or biases of zeros are
 * constants that look alike and must not be merged.
 *
 * What is compared.  Constants whose bytes are in memory (inline in the
 * model, or made by folding) are compared by content: grouped by a hash of
 * dtype, shape and bytes, then compared byte for byte.  A float initializer
 * left in its external data file is not read for this (--report runs
 * without the data file, and must plan what a compile with it plans): it
 * is the same as another only when both name the same bytes of the same
 * file.  Graph outputs and the loss's named values keep their own constant,
 * and so does state a node writes (BatchNorm's running mean and variance,
 * updated by Assign: every layer's starts as the same zeros and ones).
 */
#include "ir.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t hash;
    int v;
} Key;

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

/* the external location of constant v, or NULL when its bytes are in memory */
static const ExtData *ext_of(const Graph *g, int v)
{
    const Value *x = &g->val[v];
    int i = x->init_index;
    return !x->data && i >= 0 && i < g->ninit && g->ext[i].loc ? &g->ext[i] : NULL;
}

/* whether constants a and b (same hash) hold the same tensor */
static int same_const(const Graph *g, int a, int b)
{
    const Value *x = &g->val[a], *y = &g->val[b];
    if (x->dtype != y->dtype || !shape_eq(&x->shape, &y->shape))
        return 0;
    const ExtData *ea = ext_of(g, a), *eb = ext_of(g, b);
    if (ea || eb)
        return ea && eb && ea->off == eb->off && ea->len == eb->len && !strcmp(ea->loc, eb->loc);
    return !memcmp(x->data, y->data, (size_t)shape_numel(&x->shape) * dtype_size(x->dtype));
}

static int key_cmp(const void *pa, const void *pb)
{
    const Key *a = pa, *b = pb;
    return a->hash != b->hash ? (a->hash < b->hash ? -1 : 1) : a->v - b->v;
}

void share_constants(Graph *g)
{
    Key *key = ir_alloc(sizeof(Key) * (size_t)(g->nval + 1));
    char *written = ir_alloc((size_t)g->nval + 1); /* state a node updates: BatchNorm's running statistics */
    for (int i = 0; i < g->nnode; i++)
        for (int j = 0; j < g->node[i].nin; j++) {
            const int r = g->node[i].in[j] >= 0 ? ir_root(g, g->node[i].in[j]) : -1;
            if (r >= 0 && ir_writes(g, &g->node[i], r))
                written[r] = 1;
        }
    int n = 0;
    for (int v = 0; v < g->nval; v++) {
        const Value *x = &g->val[v];
        if (x->role != R_CONST || x->nuses == 0 || ir_wanted(g, v) || written[ir_root(g, v)])
            continue;
        uint64_t h = fnv(0xcbf29ce484222325ULL, &x->dtype, sizeof x->dtype);
        h = fnv(h, x->shape.dim, sizeof(int64_t) * (size_t)x->shape.rank);
        const ExtData *e = ext_of(g, v);
        if (e) {
            h = fnv(h, e->loc, strlen(e->loc));
            h = fnv(h, &e->off, sizeof e->off);
        } else if (x->data) {
            h = fnv(h, x->data, (size_t)shape_numel(&x->shape) * dtype_size(x->dtype));
        } else {
            continue; /* no bytes at all (none is made so): left alone */
        }
        key[n++] = (Key){h, v};
    }
    qsort(key, (size_t)n, sizeof *key, key_cmp);
    int *repl = ir_alloc(sizeof(int) * (size_t)(g->nval + 1)), *rep = ir_alloc(sizeof(int) * (size_t)(n + 1));
    int shared = 0, nrep = 0;
    for (int v = 0; v < g->nval; v++)
        repl[v] = v;
    for (int i = 0; i < n; i++) { /* rep: the distinct constants of this run of equal hashes, in value order */
        if (i == 0 || key[i].hash != key[i - 1].hash)
            nrep = 0;
        int k = 0;
        while (k < nrep && !same_const(g, rep[k], key[i].v))
            k++;
        if (k < nrep)
            repl[key[i].v] = rep[k], shared++;
        else
            rep[nrep++] = key[i].v;
    }
    if (!shared)
        return;
    for (int i = 0; i < g->nnode; i++)
        for (int k = 0; k < g->node[i].nin; k++)
            if (g->node[i].in[k] >= 0)
                g->node[i].in[k] = repl[g->node[i].in[k]];
    ir_link(g);
}
