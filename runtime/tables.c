/* tables.c — the check of the model tables the compiler emitted (RtModel,
 * rt.h), one for training and forward-only builds alike: never trusted,
 * never a crash.  Every count is non-negative and every table it counts
 * present; every offset and size lies inside the arena (or the unit) with no
 * overflow on the way; dtypes, optimizers and slot users are ones the
 * runtime knows.  A training build (m->eval = 0) adds its units, parameters,
 * slots and scalars (loss, gradient norm) and inputs of rank 1 or more that
 * agree on the batch size; a forward-only one has no units, parameters or
 * slots, and adds its outputs.  The inputs, outputs and constants are
 * checked by the same functions for both.  A failure is a start-up error
 * (err.c): "corrupt model tables: WHAT".
 */
#include <inttypes.h>
#include <stdint.h>

#include "rt_priv.h"

#define BAD(...) do { rt_err_set(1, "corrupt model tables: " __VA_ARGS__); return -1; } while (0)

/* an input or output: a name, a known dtype, rank in [min_rank, RT_MAX_RANK], inside the arena */
static int check_tensor(const RtModel *m, const char *what, int i, const char *name, int dtype, int rank,
                        int min_rank, const int64_t *shape, int64_t off)
{
    if (!name || !name[0] || rt_elem_size(dtype) == 0 || rank < min_rank || rank > RT_MAX_RANK)
        BAD("%s %d", what, i);
    uint64_t bytes = (uint64_t)rt_elem_size(dtype);
    for (int d = 0; d < rank; d++)
        if (shape[d] < 0 || __builtin_mul_overflow(bytes, (uint64_t)shape[d], &bytes))
            BAD("%s '%s' shape", what, name);
    if (off < 0 || bytes > (uint64_t)m->arena_bytes || off > m->arena_bytes - (int64_t)bytes)
        BAD("%s '%s' outside the arena", what, name);
    return 0;
}

/* the embedded model's range, and the constants inside the arena */
static int check_consts(const RtModel *m)
{
    if (m->model_off < 0 || m->model_len < 0)
        BAD("model range");
    for (int i = 0; i < m->nconst; i++) {
        const RtConst *k = &m->cnst[i];
        if (k->nbytes < 0 || k->file_off < 0 || k->arena_off < 0 || k->arena_off > m->arena_bytes - k->nbytes)
            BAD("constant %d outside the arena", i);
    }
    return 0;
}

/* a training build's counts, tables, slots, scalars, units and parameters */
static int check_train(const RtModel *m)
{
    if (m->nunit < 0 || m->nparam < 0 || m->ninput < 0 || m->nconst < 0 || m->nslot < 0 || m->arena_bytes < 0)
        BAD("negative count");
    if ((m->nunit && !m->unit) || (m->nparam && !m->param) || (m->ninput && !m->input) ||
        (m->nconst && !m->cnst) || (m->nslot && (!m->slot_esize || !m->slot_alias || !m->slot_unit)) || !m->step)
        BAD("missing table");
    for (int s = 0; s < m->nslot; s++)
        if (m->slot_esize[s] != 1 && m->slot_esize[s] != 2 && m->slot_esize[s] != 4 && m->slot_esize[s] != 8)
            BAD("slot %d element size %d", s, m->slot_esize[s]);
    for (int s = 0; s < m->nslot; s++)
        if (m->slot_unit[s] < 0 || m->slot_unit[s] >= m->nunit)
            BAD("slot %d unit %d", s, m->slot_unit[s]);
    for (int s = 0; s < m->nslot; s++)
        if (m->slot_alias[s] < 1 || m->slot_alias[s] > (RT_SLOT_PARAM | RT_SLOT_GRAD | RT_SLOT_OTHER))
            BAD("slot %d users %d", s, m->slot_alias[s]);
    if (m->optimizer != RT_ADAMW && m->optimizer != RT_SGD && m->optimizer != RT_ADAM)
        BAD("unknown optimizer %d", m->optimizer);
    if (m->loss_dtype != RT_F32 && m->loss_dtype != RT_F64)
        BAD("loss dtype %d", m->loss_dtype);
    if (m->loss_off < 0 || m->loss_off > m->arena_bytes - rt_elem_size(m->loss_dtype))
        BAD("loss offset %" PRId64 " outside the arena", m->loss_off);
    if (m->shard_group < 0)
        BAD("shard group %d", m->shard_group);
    if (m->gnorm_off < -1 || (m->gnorm_off >= 0 && (m->nunit < 1 || m->gnorm_off > m->arena_bytes - 8)))
        BAD("gradient norm offset %" PRId64, m->gnorm_off);
    if (m->rank_loss_off < -1 || m->rank_loss_off > m->arena_bytes - rt_elem_size(m->loss_dtype))
        BAD("rank loss offset %" PRId64 " outside the arena", m->rank_loss_off);
    for (int u = 0; u < m->nunit; u++) {
        const RtUnit *un = &m->unit[u];
        if (un->dtype != RT_F32 && un->dtype != RT_F64)
            BAD("unit %d dtype %d", u, un->dtype);
        if (un->numel < 0 || un->numel > INT64_MAX / 16 || un->file_off < 0)
            BAD("unit %d size", u);
        if (un->nstate < 0 || un->nstate > RT_NSTATE - 2)
            BAD("unit %d nstate %d", u, un->nstate);
    }
    for (int i = 0; i < m->nparam; i++) {
        const RtParam *p = &m->param[i];
        if (p->unit < 0 || p->unit >= m->nunit || p->offset < 0 || p->numel < 0 ||
            p->offset > m->unit[p->unit].numel - p->numel)
            BAD("parameter %d outside its unit", i);
    }
    return 0;
}

/* a training build's input: as check_tensor (rank 1 or more), all of one batch size */
static int check_train_input(const RtModel *m, int i)
{
    const RtInput *in = &m->input[i];
    if (check_tensor(m, "input", i, in->name, in->dtype, in->rank, 1, in->shape, in->arena_off) != 0)
        return -1;
    if (in->shape[0] < 1)
        BAD("input '%s' has batch %" PRId64, in->name, in->shape[0]);
    if (in->shape[0] != m->input[0].shape[0])
        BAD("inputs '%s' and '%s' disagree on the batch size", m->input[0].name, in->name);
    return 0;
}

/* a forward-only build: no units, parameters or slots; its counts and tables */
static int check_eval(const RtModel *m)
{
    if (m->nunit != 0 || m->nparam != 0 || m->nslot != 0)
        BAD("a forward-only build with %d units, %d parameters, %d slots", m->nunit, m->nparam, m->nslot);
    if (m->ninput < 0 || m->nconst < 0 || m->noutput < 0 || m->arena_bytes < 0)
        BAD("negative count");
    if ((m->ninput && !m->input) || (m->nconst && !m->cnst) || (m->noutput && !m->output) || !m->step)
        BAD("missing table");
    return 0;
}

int rt_check_model(const RtModel *m)
{
    if ((m->eval ? check_eval(m) : check_train(m)) != 0 || check_consts(m) != 0)
        return -1;
    for (int i = 0; i < m->ninput; i++) {
        const RtInput *in = &m->input[i];
        if (m->eval ? check_tensor(m, "input", i, in->name, in->dtype, in->rank, 0, in->shape, in->arena_off)
                    : check_train_input(m, i))
            return -1;
    }
    for (int i = 0; m->eval && i < m->noutput; i++) {
        const RtOutput *out = &m->output[i];
        if (check_tensor(m, "output", i, out->name, out->dtype, out->rank, 0, out->shape, out->arena_off) != 0)
            return -1;
    }
    return 0;
}

#undef BAD
