/* cost.c — the predicted step: fsdpc --report --hw PROFILE.
 *
 * Reads the scheduled, memory-planned IR of one rank and a hardware profile
 * (codegen/hw/NAME.hw, or a file --calibrate wrote) and replays the step as
 * the runtime runs it: one compute stream running the nodes in order, and
 * the collectives on their lanes (rt.h), each lane running its own in start
 * order: on cuda two streams, the gathers' and the reductions' (a gather
 * overlaps a reduce-scatter as well as the compute, as in PyTorch FSDP);
 * on cpu one communication thread for both.
 *   compute node   op_overhead + max(FLOPs / (peak_gemm[dtype] x
 *                  gemm_efficiency), bytes / (mem_bw x mem_efficiency)),
 *                  a fused attention at attention_efficiency where the
 *                  profile gives it (flash kernels reach less of the
 *                  peak than cuBLAS's GEMMs):
 *                  FLOPs of GEMMs and convolutions (cg_node_flops, with the
 *                  work recompute adds), bytes read and written (every
 *                  input and output once; a view moves none)
 *   collective     starts when the compute stream reaches its start node
 *                  and its lane is free; a gather or
 *                  reduce-scatter of S bytes over a group of F ranks takes
 *                  (F-1) latency + (F-1)/F S / busbw (NCCL's and MPI's ring
 *                  algorithms); an all-reduce over R ranks 2(R-1) latency +
 *                  2(R-1)/R S / busbw.  The inter-node bandwidth and latency
 *                  apply when the group spans nodes (ranks are numbered node
 *                  by node, devices_per_node to a node), else intra-node; the
 *                  inter-node bandwidth is a node's, so HYBRID's replica
 *                  all-reduces, which every rank of a node runs at once over
 *                  its own group, share it (min(F, devices per node) rings);
 *                  reductions at the profile's *_rs_* rates where it gives
 *                  them (MPI's reduce-scatter on the cpu target is an
 *                  all-reduce: slower than its all-gather).  Two
 *                  collectives in flight at once (one per lane) share the
 *                  links: each progresses at half the rate it has alone (a
 *                  fluid model; the bus bandwidth is one, whichever stream
 *                  uses it), so a second lane never moves more bytes a
 *                  second, it only lets a gather start without queueing
 *                  behind a long reduce-scatter
 *   Wait           the compute stream stalls until its collective is done:
 *                  the exposed communication (with comm_overlap 0, as the
 *                  cpu target runs them without a core for its
 *                  communication thread, at the start node itself)
 * The step time is when the compute stream and every lane are done.  Not modelled: compute slowed
 * by the collectives' own use of the device (NCCL's kernels take SMs), the
 * data loader, the first step's set-up.
 */
#define _POSIX_C_SOURCE 200809L /* fileno, fsync */
#include "cg.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { RT_LANES_MAX = 2 }; /* the runtime's lanes of collectives (runtime/rt.h: RT_NLANE) */

/* the shipped profiles (codegen/hw/NAME.hw, embedded by codegen/embed.cmake) */
extern const char *const fsdpc_hw_name[], *const fsdpc_hw_text[];
extern const int fsdpc_hw_count;

/* ---- the profile ------------------------------------------------------- */
typedef struct {
    const char *key;
    size_t off;      /* into CgHw, a double (or per_node's int) */
    double scale;    /* the file's unit to CgHw's */
    int need;        /* 1: required; 0: optional */
    double min;      /* smallest value allowed (> min when min is 0 and strict) */
    int strict;      /* value > min (else >= min) */
} Key;

#define K(key, field, scale, need, min, strict) {key, offsetof(CgHw, field), scale, need, min, strict}
static const Key keys[] = {
    K("peak_tflops_f32", peak[DT_F32], 1e12, 1, 0, 1),
    K("peak_tflops_f32_gemm", peak_gemm[DT_F32], 1e12, 0, 0, 1),
    K("peak_tflops_bf16", peak_gemm[DT_BF16], 1e12, 0, 0, 1),
    K("peak_tflops_f16", peak_gemm[DT_F16], 1e12, 0, 0, 1),
    K("peak_tflops_f64", peak_gemm[DT_F64], 1e12, 0, 0, 1),
    K("gemm_efficiency", gemm_eff, 1, 1, 0, 1),
    K("attention_efficiency", attn_eff, 1, 0, 0, 1),
    K("mem_bw_gbs", mem_bw, 1e9, 1, 0, 1),
    K("mem_efficiency", mem_eff, 1, 0, 0, 1),
    K("op_overhead_us", op_overhead, 1e-6, 0, 0, 0),
    K("intra_busbw_gbs", intra_bw, 1e9, 1, 0, 1),
    K("intra_latency_us", intra_lat, 1e-6, 1, 0, 0),
    K("inter_busbw_gbs", inter_bw, 1e9, 1, 0, 1),
    K("inter_latency_us", inter_lat, 1e-6, 1, 0, 0),
    K("comm_overlap", overlap, 1, 0, 0, 0),
    K("intra_rs_busbw_gbs", rs_intra_bw, 1e9, 0, 0, 1),
    K("intra_rs_latency_us", rs_intra_lat, 1e-6, 0, 0, 0),
    K("inter_rs_busbw_gbs", rs_inter_bw, 1e9, 0, 0, 1),
    K("inter_rs_latency_us", rs_inter_lat, 1e-6, 0, 0, 0),
};
#undef K
enum { NKEY = sizeof keys / sizeof keys[0] };

static void parse_profile(const char *text, const char *what, CgHw *hw)
{
    int seen[NKEY] = {0}, have_desc = 0, have_node = 0, line = 0;
    hw->rs_intra_lat = hw->rs_inter_lat = -1; /* not given */
    hw->overlap = 1;
    for (const char *p = text; *p;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char buf[512];
        line++;
        if (len >= sizeof buf)
            fatal("%s line %d: longer than %zu characters", what, line, sizeof buf - 1);
        memcpy(buf, p, len);
        buf[len] = 0;
        p += len + (e != NULL);
        char *hash = strchr(buf, '#');
        if (hash)
            *hash = 0;
        char *key = buf + strspn(buf, " \t\r"), *val = key + strcspn(key, " \t\r");
        if (!*key)
            continue;
        if (*val)
            *val++ = 0;
        val += strspn(val, " \t\r");
        for (char *t = val + strlen(val); t > val && strchr(" \t\r", t[-1]); t--)
            t[-1] = 0;
        for (const char *c = val; *c; c++)
            if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e)
                fatal("%s line %d: '%s' holds a character outside printable ASCII", what, line, ir_q(key));
        if (!*val)
            fatal("%s line %d: '%s' has no value (a line is KEY VALUE)", what, line, ir_q(key));
        if (!strcmp(key, "description")) {
            if (have_desc++)
                fatal("%s line %d: 'description' given twice", what, line);
            snprintf(hw->description, sizeof hw->description, "%s", val);
            continue;
        }
        char *end;
        errno = 0;
        double x = strtod(val, &end);
        if (*end || errno || !isfinite(x))
            fatal("%s line %d: '%s' of '%s' is not a number", what, line, ir_q(val), ir_q(key));
        if (!strcmp(key, "devices_per_node")) {
            if (have_node++)
                fatal("%s line %d: 'devices_per_node' given twice", what, line);
            if (x < 1 || x > 1 << 20 || x != floor(x))
                fatal("%s line %d: devices_per_node %s is not an integer in [1, %d]", what, line, ir_q(val),
                      1 << 20);
            hw->per_node = (int)x;
            continue;
        }
        int k = 0;
        while (k < NKEY && strcmp(keys[k].key, key))
            k++;
        if (k == NKEY)
            fatal("%s line %d: unknown key '%s' (see codegen/hw/a100-roce.hw for the keys)", what, line, ir_q(key));
        if (seen[k]++)
            fatal("%s line %d: '%s' given twice", what, line, keys[k].key);
        if (keys[k].strict ? !(x > keys[k].min) : !(x >= keys[k].min))
            fatal("%s line %d: %s must be %s %g, not %s", what, line, keys[k].key, keys[k].strict ? ">" : ">=",
                  keys[k].min, ir_q(val));
        if (strstr(keys[k].key, "efficiency") && x > 1)
            fatal("%s line %d: %s is a share of the peak, in (0, 1], not %s", what, line, keys[k].key, ir_q(val));
        *(double *)((char *)hw + keys[k].off) = x * keys[k].scale;
    }
    if (!have_node)
        fatal("%s: 'devices_per_node' is missing", what);
    for (int k = 0; k < NKEY; k++)
        if (keys[k].need && !seen[k])
            fatal("%s: '%s' is missing", what, keys[k].key);
    if (!hw->peak_gemm[DT_F32])
        hw->peak_gemm[DT_F32] = hw->peak[DT_F32];
    /* reduce-scatters and all-reduces: as gathers unless the profile says otherwise */
    if (!hw->rs_intra_bw)
        hw->rs_intra_bw = hw->intra_bw;
    if (!hw->rs_inter_bw)
        hw->rs_inter_bw = hw->inter_bw;
    if (hw->rs_intra_lat < 0)
        hw->rs_intra_lat = hw->intra_lat;
    if (hw->rs_inter_lat < 0)
        hw->rs_inter_lat = hw->inter_lat;
    if (!hw->mem_eff)
        hw->mem_eff = 1;
    if (!hw->attn_eff)
        hw->attn_eff = hw->gemm_eff;
    if (hw->overlap != 0 && hw->overlap != 1)
        fatal("%s: comm_overlap is 1 (collectives beside the compute) or 0 (inside it)", what);
}

void cg_hw_load(const char *arg, CgHw *hw)
{
    memset(hw, 0, sizeof *hw);
    if (!strchr(arg, '/') && !strstr(arg, ".hw")) { /* a shipped profile by name */
        for (int i = 0; i < fsdpc_hw_count; i++)
            if (!strncmp(fsdpc_hw_name[i], arg, strlen(arg)) && !strcmp(fsdpc_hw_name[i] + strlen(arg), ".hw")) {
                snprintf(hw->name, sizeof hw->name, "%s", arg);
                parse_profile(fsdpc_hw_text[i], ir_fmt("--hw %s", arg), hw);
                return;
            }
        Buf names = {0};
        for (int i = 0; i < fsdpc_hw_count; i++)
            cg_put(&names, "%s%.*s", i ? ", " : "", (int)(strlen(fsdpc_hw_name[i]) - 3), fsdpc_hw_name[i]);
        fatal("--hw %s: no such profile (shipped: %s; or a file, e.g. one fsdpc --calibrate wrote: --hw ./NAME.hw)",
              ir_q(arg), names.buf ? names.buf : "none");
    }
    int64_t size;
    const char *why;
    int fd = ir_open_regular(arg, 0, &size, &why);
    if (fd < 0)
        fatal("--hw %s: %s", ir_q(arg), why);
    FILE *f = fdopen(fd, "rb");
    if (!f || size > 65536)
        fatal("--hw %s: %s", ir_q(arg), f ? "larger than 64 KiB: not a profile" : strerror(errno));
    char *text = ir_alloc((size_t)size + 1);
    size_t got = fread(text, 1, (size_t)size, f);
    fclose(f);
    if (got != (size_t)size)
        fatal("--hw %s: read failed", ir_q(arg));
    if (memchr(text, 0, got))
        fatal("--hw %s: a NUL byte: not a text profile", ir_q(arg));
    const char *base = strrchr(arg, '/') ? strrchr(arg, '/') + 1 : arg;
    size_t n = strlen(base) > 3 && !strcmp(base + strlen(base) - 3, ".hw") ? strlen(base) - 3 : strlen(base);
    snprintf(hw->name, sizeof hw->name, "%.*s", (int)(n < 63 ? n : 63), base);
    parse_profile(text, ir_fmt("--hw %s", ir_q(arg)), hw);
}

/* ---- the model ---------------------------------------------------------- */
/* a value's bytes on one rank: a shard (or its gradient, optimizer state) is ceil(numel / F) of its unit's
 * flat buffer (the IR types it with the whole unit: the world is the runtime's) */
static double bytes_of(const Graph *g, int v, int F)
{
    const Value *x = &g->val[v];
    int64_t numel = value_numel(g, v);
    if ((x->role == R_SHARD || x->role == R_GRADSHARD || x->role == R_STATESHARD) && x->unit >= 0)
        numel = (g->unit[x->unit].numel + F - 1) / F;
    return (double)numel * (double)dtype_size(x->dtype);
}

/* bytes a node reads and writes: each distinct input and output once */
static double node_bytes(const Graph *g, const Node *n, int F)
{
    double b = 0;
    for (int k = 0; k < n->nin + n->nout; k++) {
        int v = k < n->nin ? n->in[k] : n->out[k - n->nin], dup = v < 0;
        for (int j = 0; j < k && !dup; j++)
            dup = (j < n->nin ? n->in[j] : n->out[j - n->nin]) == v;
        if (!dup)
            b += bytes_of(g, v, F);
    }
    return b;
}

/* the dtype a GEMM-like node computes in: its first operand's */
static DType gemm_dtype(const Graph *g, const Node *n)
{
    return g->val[n->in[n->op == OP_FusedAttentionGrad]].dtype;
}

static double need_peak(const CgHw *hw, DType dt)
{
    static const char *const names[DT_COUNT] = {[DT_F32] = "f32_gemm", [DT_F64] = "f64", [DT_BF16] = "bf16",
                                                [DT_F16] = "f16"};
    const int ok = dt > DT_UNDEF && dt < DT_COUNT;
    if (!ok || !hw->peak_gemm[dt])
        fatal("--hw: profile %s gives no peak_tflops_%s, and the model computes its GEMMs in %s", hw->name,
              ok && names[dt] ? names[dt] : "?", dtype_name(dt));
    return hw->peak_gemm[dt];
}

static double compute_time(const Graph *g, const Node *n, int F, const CgHw *hw, CgCost *c)
{
    if ((op_info[n->op].flags & F_VIEW) && g->val[n->out[0]].alias_of >= 0)
        return 0; /* a view: no kernel */
    if (n->op == OP_Free || n->op == OP_Wait)
        return 0;
    double f = cg_node_flops(g, n, 1), t = node_bytes(g, n, F) / (hw->mem_bw * hw->mem_eff);
    if (f > 0) {
        const int attn = n->op == OP_FusedAttention || n->op == OP_FusedAttentionGrad;
        double tc = f / (need_peak(hw, gemm_dtype(g, n)) * (attn ? hw->attn_eff : hw->gemm_eff));
        t = tc > t ? tc : t;
        c->hw_flops += f;
        c->gemm_s += t;
    } else {
        c->other_s += t;
    }
    c->overhead_s += hw->op_overhead;
    return hw->op_overhead + t;
}

/* a ring collective: steps latencies + the bytes a rank moves over the bus bandwidth; spans: across nodes;
 * rs: a reduction (reduce-scatter, all-reduce), whose rates the profile may give apart */
static double ring(const CgHw *hw, int spans, int rs, int steps, double moved)
{
    double lat = rs ? (spans ? hw->rs_inter_lat : hw->rs_intra_lat) : spans ? hw->inter_lat : hw->intra_lat;
    double bw = rs ? (spans ? hw->rs_inter_bw : hw->rs_intra_bw) : spans ? hw->inter_bw : hw->intra_bw;
    return steps * lat + moved / bw;
}

static double coll_time(const Graph *g, const Node *n, int world, const CgHw *hw)
{
    int F = cg_group_size(g, world), R = world / F;
    if (n->op == OP_AllReduce)
        return world < 2 ? 0 : hw->op_overhead + ring(hw, world > hw->per_node, 1, 2 * (world - 1),
                                                      2.0 * (world - 1) / world * bytes_of(g, n->in[0], 1));
    double S = (double)cg_coll_bytes(g, n, F), t = hw->op_overhead;
    if (F > 1)
        t += ring(hw, F > hw->per_node, n->op == OP_ReduceScatter, F - 1, (F - 1.0) / F * S);
    if (n->op == OP_ReduceScatter && R > 1) { /* HYBRID, NO_SHARD: the shard all-reduced over the replicas */
        /* every rank of a node all-reduces its own shard at once: across nodes the node's min(F, devices per node)
         * concurrent rings share its network (the profile's inter-node bus bandwidth is a node's) */
        int spans = (int64_t)(R - 1) * F >= hw->per_node, share = spans ? (F < hw->per_node ? F : hw->per_node) : 1;
        t += ring(hw, spans, 1, 2 * (R - 1), share * 2.0 * (R - 1) / R * (S / F));
    }
    return t;
}

/* The collectives' side of the replay: per tag its lane, the time its start node was reached, the seconds it
 * needs alone and has left, the time it was done (-1: not yet); per lane a queue of tags in start order; t: how
 * far the lanes have been played */
typedef struct {
    int nlane;
    int *lane_of, *q[RT_LANES_MAX], head[RT_LANES_MAX], tail[RT_LANES_MAX];
    double *ready, *left, *done, t;
} Lanes;

/* lane k's head collective if it runs at time l->t (queued and ready), else -1 */
static int running(const Lanes *l, int k)
{
    if (l->head[k] == l->tail[k])
        return -1;
    int h = l->q[k][l->head[k]];
    return l->ready[h] <= l->t ? h : -1;
}

/* play the lanes from l->t: until time `until` (want < 0), or until collective `want` is done.  Each step runs
 * the busy lanes' head collectives at 1/busy of their own rate until the first one finishes or a queued one
 * becomes ready */
static void lanes_run(Lanes *l, double until, int want)
{
    while (want >= 0 ? l->done[want] < 0 : l->t < until) {
        int busy = 0;
        double step = INFINITY;
        for (int k = 0; k < l->nlane; k++) {
            busy += running(l, k) >= 0;
            if (l->head[k] < l->tail[k] && running(l, k) < 0 && l->ready[l->q[k][l->head[k]]] - l->t < step)
                step = l->ready[l->q[k][l->head[k]]] - l->t;
        }
        for (int k = 0; k < l->nlane; k++)
            if (running(l, k) >= 0 && l->left[running(l, k)] * busy < step)
                step = l->left[running(l, k)] * busy;
        if (want < 0 && step > until - l->t)
            step = until - l->t;
        if (!isfinite(step))
            die("cost: a Wait for a collective that never starts");
        for (int k = 0; k < l->nlane; k++) {
            int h = running(l, k);
            if (h < 0)
                continue;
            if (l->left[h] * busy <= step) { /* the one (or ones) that set the step */
                l->left[h] = 0;
                l->done[h] = l->t + step;
                l->head[k]++;
            } else {
                l->left[h] -= step / busy;
            }
        }
        l->t += step;
    }
}

/* collective tag, of d seconds alone, starts at time t on its lane */
static void lanes_start(Lanes *l, int tag, double t, double d)
{
    lanes_run(l, t, -1);
    int k = l->lane_of[tag];
    l->q[k][l->tail[k]++] = tag;
    l->ready[tag] = t;
    l->left[tag] = d;
}

/* the tag of collective or Wait node n */
static int tag_of(const Graph *g, const Node *n)
{
    int tag = (int)ir_attr_i(n, "tag", -1);
    if (tag < 0 || tag >= g->ncoll)
        die("cost: %s without a tag", n->op == OP_Wait ? "a Wait" : "a collective");
    return tag;
}

static void lanes_init(Lanes *l, const Graph *g)
{
    memset(l, 0, sizeof *l);
    int n = g->ncoll + 1;
    /* cuda: a stream per lane; cpu: one communication thread runs both */
    l->nlane = g->opt->target && !strcmp(g->opt->target, "cuda") ? RT_LANES_MAX : 1;
    l->lane_of = ir_alloc(sizeof(int) * (size_t)n);
    l->ready = ir_alloc(sizeof(double) * (size_t)n);
    l->left = ir_alloc(sizeof(double) * (size_t)n);
    l->done = ir_alloc(sizeof(double) * (size_t)n);
    for (int k = 0; k < l->nlane; k++)
        l->q[k] = ir_alloc(sizeof(int) * (size_t)n);
    for (int t = 0; t < n; t++)
        l->done[t] = -1;
    for (int i = 0; i < g->nnode; i++) {
        const Node *x = &g->node[i];
        if (op_info[x->op].flags & F_COLL) /* the gathers' lane 0, the reductions' 1 */
            l->lane_of[tag_of(g, x)] = l->nlane > 1 && x->op != OP_AllGather;
    }
}

void cg_cost(const Graph *g, int world, const CgHw *hw, CgCost *c)
{
    memset(c, 0, sizeof *c);
    Lanes l;
    lanes_init(&l, g);
    double tc = 0, tcomm = 0;
    for (int i = 0; i < g->nnode; i++) {
        const Node *n = &g->node[i];
        if (op_info[n->op].flags & F_COLL) {
            int tag = tag_of(g, n);
            double d = coll_time(g, n, world, hw);
            lanes_start(&l, tag, tc, d);
            c->comm_s += d;
            if (!hw->overlap) { /* run inside the step: the compute stream waits for it at once */
                lanes_run(&l, 0, tag);
                c->exposed_s += l.done[tag] - tc;
                tc = l.done[tag];
            }
        } else if (n->op == OP_Wait) {
            int tag = tag_of(g, n);
            lanes_run(&l, 0, tag);
            if (l.done[tag] > tc) {
                c->exposed_s += l.done[tag] - tc;
                tc = l.done[tag];
            }
        } else {
            double d = compute_time(g, n, cg_group_size(g, world), hw, c);
            c->op_s[n->op] += d;
            tc += d;
            c->compute_s += d;
        }
    }
    for (int k = 0; k < l.nlane; k++) /* the lanes drain */
        if (l.tail[k] > 0) {
            int last = l.q[k][l.tail[k] - 1];
            lanes_run(&l, 0, last);
            tcomm = l.done[last] > tcomm ? l.done[last] : tcomm;
        }
    c->step_s = tc > tcomm ? tc : tcomm;
    c->flops = cg_step_flops(g);
    DType dt = g->opt->precision == PREC_BF16 ? DT_BF16 : g->opt->precision == PREC_FP16 ? DT_F16
             : g->nunit ? g->unit[0].dtype : DT_F32;
    c->peak = need_peak(hw, dt);
    if (c->step_s > 0) {
        c->tflops = c->flops / c->step_s / 1e12;
        c->hw_tflops = c->hw_flops / c->step_s / 1e12;
        c->mfu = c->flops / c->step_s / c->peak;
    }
}
