/* report.c — fsdpc --report: units and the planned memory of one rank.
 *
 * The figures follow the runtime's start-up carving exactly (runtime/rt.h):
 * the fixed arena, nslot slots of max_u W*ceil(n_u/W) elements (of each
 * slot's element size: 2 bytes for bf16 gathers), and per unit
 * (2 + optimizer states) shards of ceil(n_u/W) elements, each piece rounded
 * up to 64 bytes.  The executable prints the same numbers when it starts.
 */
#include "ir.h"

static int64_t al(int64_t x) { return (x + 63) / 64 * 64; }

void cg_report(FILE *f, const Graph *g, int world)
{
    int nstate = g->opt->optimizer == OPT_ADAMW ? 2 : 1;
    int64_t total_params = 0, state = 0, slot_elems = 0, model_state = 0;
    /* the shard group: every rank, one (NO_SHARD) or hybrid's F */
    int F = g->opt->shard == SHARD_NONE ? 1 : g->opt->shard == SHARD_HYBRID ? g->opt->hybrid : world;
    fprintf(f, "units (world %d, shard groups of %d):\n", world, F);
    for (int u = 0; u < g->nunit; u++) {
        const Unit *un = &g->unit[u];
        int64_t len = (un->numel + F - 1) / F;
        size_t es = dtype_size(un->dtype);
        total_params += un->numel;
        state += (2 + nstate) * al(len * (int64_t)es);
        model_state += (2 + nstate) * un->numel * (int64_t)es;
        slot_elems = slot_elems > len * F ? slot_elems : len * F;
        fprintf(f, "  %-8s %6d params %12lld elements  shard %lld (+%lld padding)\n", un->name,
                un->nparams, (long long)un->numel, (long long)len,
                (long long)(len * F - un->numel));
    }
    int64_t slots = 0;
    for (int s = 0; s < g->nslot; s++)
        slots += al(slot_elems * (int64_t)g->slot_esize[s]);
    int64_t total = al(g->arena_bytes) + slots + state;
    fprintf(f, "parameters: %lld in %d units\n", (long long)total_params, g->nunit);
    fprintf(f, "memory per rank (world %d):\n", world);
    fprintf(f, "  shards (params, grads, optimizer)  %14lld B  (unsharded model state %lld B)\n",
            (long long)state, (long long)model_state);
    fprintf(f, "  gathered slots (%d x unit)          %14lld B\n", g->nslot, (long long)slots);
    fprintf(f, "  arena: constants                   %14lld B\n", (long long)g->const_bytes);
    fprintf(f, "  arena: activations (peak)          %14lld B\n", (long long)g->peak_act_bytes);
    fprintf(f, "  planned peak                       %14lld B\n", (long long)total);
}
