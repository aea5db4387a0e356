/* memplan.c — every tensor of the step at a static place, one arena per rank.
 *
 * requires: shard (final node order).
 * ensures:  every value a node touches has a Loc:
 *   - constants read at run time: LOC_ARENA, packed first, loaded at start-up;
 *   - activations, inputs, unaliased gradients: LOC_ARENA at offsets packed
 *     by liveness (greedy by size: biggest first, lowest free address that no
 *     value alive at the same time occupies);
 *   - gathered flat parameters and flat gradients: LOC_SLOT, colored by
 *     liveness into g->nslot slots; a slot's size is the largest unit that
 *     takes it (g->slot_unit) padded for the world size (known at start-up)
 *     times the slot's element size — the paper's "sum/F + the largest
 *     gathered units in flight", where a slot only a small unit takes (a
 *     GPT's root: the head and last blocks) stays that unit's size.  Buffers
 *     of one element size share slots (bf16 gathers never take a float32
 *     slot).
 *     With a shard group of one rank (world 1, NO_SHARD, hybrid:1) a gather
 *     of the same dtype would copy the whole shard into a slot, and the flat
 *     gradient be copied into the gradient shard after its reduction: such a
 *     value is marked (Loc.alias) to be its unit's shard itself then, when
 *     nothing writes the shard while the value lives (the optimizer's update
 *     comes after the gathered parameters' last reader; the gradient's
 *     reduction has no bf16 buffer); the executable decides at start-up (the
 *     group's size, --accum 1 for gradients) and leaves a slot that only such
 *     values use unallocated (g->slot_alias);
 *   - shards and optimizer state: LOC_SHARD, owned by the runtime;
 *   - views (parameters, gradients, Reshape/Identity outputs): their root's
 *     place plus the view offset.
 * g->arena_bytes is the world-independent part; the executable allocates it
 * once and never allocates per step.
 */
#include "ir.h"

#include <stdlib.h>
#include <string.h>

enum { ALIGN = 64 };

static int64_t align_up(int64_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }


/* Outputs of Reshape / Identity become views of their input. */
static void make_views(Graph *g)
{
    for (int i = 0; i < g->nnode; i++) {
        Node *n = &g->node[i];
        if (!(op_info[n->op].flags & F_VIEW))
            continue;
        Value *o = &g->val[n->out[0]];
        if (o->alias_of >= 0)
            continue; /* already placed inside a flat buffer: codegen copies */
        int x = n->in[0];
        if (g->val[ir_root(g, x)].role == R_FLAT)
            continue; /* a view of a gathered parameter would outlive its Free: copy */
        o->alias_of = ir_root(g, x);
        o->alias_off = g->val[x].alias_of >= 0 ? g->val[x].alias_off : 0;
    }
    /* passes/pack.c's views of a value that has just become a view itself (GPT-2's c_attn output as a Reshape
     * of its 2-D addmm): onto that root, at their offset plus its */
    for (int v = 0; v < g->nval; v++) {
        Value *o = &g->val[v];
        if (o->alias_of >= 0 && g->val[o->alias_of].alias_of >= 0)
            o->alias_off += g->val[o->alias_of].alias_off, o->alias_of = g->val[o->alias_of].alias_of;
    }
}

static int read_at_run_time(const Node *n, int j) { return !(n->op == OP_Reshape && j == 1); }

typedef struct {
    int v;
    int64_t size, def, last, off;
} Item;

static int by_size(const void *a, const void *b)
{
    const Item *x = a, *y = b;
    if (x->size != y->size)
        return x->size < y->size ? 1 : -1;
    return x->v - y->v; /* stable: byte-identical plans run to run */
}

static int by_off(const void *a, const void *b)
{
    const Item *const *x = a, *const *y = b;
    return (*x)->off < (*y)->off ? -1 : (*x)->off > (*y)->off;
}

/* Greedy by size; returns the peak. */
static int64_t pack(Item *it, int n)
{
    qsort(it, (size_t)n, sizeof *it, by_size);
    Item **busy = malloc(sizeof(Item *) * (size_t)(n + 1));
    int64_t peak = 0;
    for (int i = 0; i < n; i++) {
        int nb = 0;
        for (int j = 0; j < i; j++)
            if (it[j].def <= it[i].last && it[i].def <= it[j].last)
                busy[nb++] = &it[j];
        qsort(busy, (size_t)nb, sizeof *busy, by_off);
        int64_t off = 0;
        for (int j = 0; j < nb; j++) {
            if (busy[j]->off >= off + it[i].size)
                break;
            int64_t end = busy[j]->off + busy[j]->size;
            off = off > end ? off : end;
        }
        it[i].off = off;
        peak = peak > off + it[i].size ? peak : off + it[i].size;
    }
    free(busy);
    return peak;
}

/* SLOT_PARAM / SLOT_GRAD when flat value v (a gathered parameter or a flat gradient, last read at node
 * last) can be its unit's shard when the shard group is one rank; SLOT_OTHER otherwise */
static int slot_user(const Graph *g, int v, int64_t last)
{
    for (int i = 0; i < g->nnode; i++) {
        const Node *n = &g->node[i];
        if (n->op == OP_AllGather && n->out[0] == v) {
            int sh = n->in[0];
            if (g->val[sh].dtype != g->val[v].dtype)
                return SLOT_OTHER; /* --precision: a cast into the slot */
            for (int k = 0; k <= last && k < g->nnode; k++) { /* the shard read (by an update) before? */
                const Node *o = &g->node[k];
                for (int j = 0; j < o->nin && o->op != OP_AllGather && o->op != OP_Wait; j++)
                    if (o->in[j] == sh)
                        return SLOT_OTHER;
            }
            return SLOT_PARAM;
        }
        if (n->op == OP_ReduceScatter && n->in[0] == v)
            return n->nout == 1 && g->val[n->out[0]].dtype == g->val[v].dtype ? SLOT_GRAD : SLOT_OTHER;
    }
    return SLOT_OTHER;
}

void pass_memplan(Graph *g)
{
    make_views(g);
    int nv = g->nval, nn = g->nnode;
    int64_t *def = ir_alloc(sizeof(int64_t) * (size_t)nv), *last = ir_alloc(sizeof(int64_t) * (size_t)nv);
    char *used = ir_alloc((size_t)nv);
    for (int v = 0; v < nv; v++) {
        def[v] = -1;
        last[v] = -2;
    }
    for (int i = 0; i < nn; i++) {
        const Node *n = &g->node[i];
        for (int j = 0; j < n->nout; j++) {
            int r = ir_root(g, n->out[j]);
            used[n->out[j]] = used[r] = 1;
            if (def[r] < 0)
                def[r] = i; /* first write of the value or of a view into it */
            last[r] = last[r] > i ? last[r] : i;
        }
        for (int j = 0; j < n->nin; j++)
            if (n->in[j] >= 0 && read_at_run_time(n, j)) {
                int r = ir_root(g, n->in[j]);
                used[n->in[j]] = used[r] = 1;
                last[r] = last[r] > i ? last[r] : i;
            }
    }
    /* graph inputs are written before the step; the reported loss read after it */
    for (int k = 0; k < g->ninput; k++) {
        int r = ir_root(g, g->input[k]);
        def[r] = -1;
        last[r] = last[r] < -1 ? -1 : last[r]; /* an unread input is still written: never over another one */
        used[g->input[k]] = used[r] = 1;
    }
    /* what the runtime reads after the step: the reported loss and this rank's own (the rank a
     * non-finite loss came from), or (eval) the outputs */
    for (int k = 0; k < g->noutput + 2; k++) {
        int v = k < g->noutput ? (g->opt->eval ? g->output[k] : -1) : k == g->noutput ? g->loss_avg : g->loss;
        if (v < 0)
            continue;
        last[ir_root(g, v)] = nn;
        used[v] = used[ir_root(g, v)] = 1;
    }

    Item *acts = ir_alloc(sizeof(Item) * (size_t)nv);
    int nact = 0;
    int64_t cbytes = 0;
    int64_t *slot_busy = ir_alloc(sizeof(int64_t) * (size_t)(nv + 1));
    g->slot_esize = ir_alloc(sizeof(int) * (size_t)(nv + 1));
    g->slot_alias = ir_alloc(sizeof(int) * (size_t)(nv + 1));
    g->slot_unit = ir_alloc(sizeof(int) * (size_t)(nv + 1));
    g->nslot = 0;
    for (int v = 0; v < nv; v++) {
        Value *x = &g->val[v];
        if (!used[v] || x->alias_of >= 0)
            continue;
        int64_t size = align_up(value_numel(g, v) * (int64_t)dtype_size(x->dtype));
        switch (x->role) {
        case R_CONST:
            x->loc = (Loc){.kind = LOC_ARENA, .off = cbytes};
            cbytes += size;
            break;
        case R_SHARD: case R_GRADSHARD: case R_STATESHARD:
            x->loc = (Loc){.kind = LOC_SHARD, .unit = x->unit,
                           .state = x->role == R_SHARD ? 0 : x->role == R_GRADSHARD ? 1 : x->state};
            break;
        case R_FLAT: case R_FLATGRAD: /* size -1 marks a slot user */
            acts[nact++] = (Item){.v = v, .size = -1, .def = def[v], .last = last[v]};
            break;
        case R_PARAM: case R_OPTSTATE:
            die("value '%s' (%s) survived the shard pass unplaced", x->name, role_name(x->role));
        default:
            acts[nact++] = (Item){.v = v, .size = size, .def = def[v], .last = last[v]};
        }
    }
    /* slots: interval coloring of the flat buffers in order of definition */
    for (int pass = 0; pass < nn + 1; pass++)
        for (int k = 0; k < nact; k++) {
            if (acts[k].size != -1 || acts[k].def != pass)
                continue;
            int s = 0, es = (int)dtype_size(g->val[acts[k].v].dtype);
            while (s < g->nslot && (slot_busy[s] >= acts[k].def || g->slot_esize[s] != es))
                s++;
            const Value *x = &g->val[acts[k].v];
            if (x->unit < 0 || x->unit >= g->nunit)
                die("flat buffer '%s' has no unit", x->name);
            if (s == g->nslot)
                g->slot_alias[s] = 0, g->slot_esize[s] = es, g->slot_unit[s] = x->unit, g->nslot++;
            if (g->unit[x->unit].numel > g->unit[g->slot_unit[s]].numel)
                g->slot_unit[s] = x->unit; /* F*ceil(n/F) grows with n: the largest unit's fits the others' */
            slot_busy[s] = acts[k].last;
            int user = slot_user(g, acts[k].v, acts[k].last);
            g->slot_alias[s] |= user;
            g->val[acts[k].v].loc = (Loc){.kind = LOC_SLOT, .slot = s, .unit = x->unit,
                                          .state = user == SLOT_GRAD, .alias = user == SLOT_OTHER ? 0 : user};
        }
    int n = 0;
    for (int k = 0; k < nact; k++)
        if (acts[k].size != -1)
            acts[n++] = acts[k];
    g->peak_act_bytes = pack(acts, n);
    for (int k = 0; k < n; k++)
        g->val[acts[k].v].loc = (Loc){.kind = LOC_ARENA, .off = cbytes + acts[k].off};
    g->const_bytes = cbytes;
    g->arena_bytes = cbytes + g->peak_act_bytes;

    for (int v = 0; v < nv; v++) {
        Value *x = &g->val[v];
        if (x->alias_of < 0 || !used[v])
            continue;
        x->loc = g->val[x->alias_of].loc;
        x->loc.off += x->alias_off;
    }
}
