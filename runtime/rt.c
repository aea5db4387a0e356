/* rt.c — rt_main: the life of an executable around the model's step
 * function: options (opts.c, args.c), the control plane (rt_ctl.h), start-up (init
 * file and memory from load.c, data from data.c; the device from rt_dev.h), the step
 * loop with its progress lines and metrics, export and --dump-grads
 * (dumpgrads.c), after a check of the model tables (tables.c).  Forward-only
 * builds (m->eval) branch to eval.c once the control plane is up.  No MPI
 * here: this file, like the rest of the target-neutral core, runs on MPI
 * (cpu) and TCP (cuda) control planes.
 *
 * Options: every rank parses its own (opts.c: the command line, a --config
 * file, the --resume checkpoint's run.toml); once the control plane is up,
 * if any rank read such a file, the ranks compare a hash of them, so that a
 * file that differs between nodes stops the run at start-up instead of
 * training two runs in one.
 *
 * Start-up errors (err.c's agreement): every rank runs the same checks;
 * local failures (a file only one node misses, an allocation) are agreed on
 * collectively (rt_err_sync), so that
 * no rank is left waiting in a collective.  Exactly one line is printed, by
 * the lowest failing rank, and every rank exits with the same status after
 * rt_ctl_finalize (1, or 2 for command-line errors).  Among them, before
 * anything is written: no output may be one of the run's inputs
 * (noclobber.c).  Every file is written with rt_afile (afile.h); --metrics
 * is published as soon as it is created, as it is read while it grows.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "rt_ctl.h"
#include "rt_dev.h"
#include "rt_priv.h"

static int g_rank, g_world = 1; /* this rank and the run's ranks (rt_ctl_init) */

/* ------------------------------------------------------------------- output */

static int cmp_host(const void *a, const void *b) { return strcmp(a, b); }

/* Collective: every rank's host name (gethostname) to rank 0, which counts
 * the hosts into *hosts and writes "ranks: 4 on 2 hosts (a: 2, b: 2)" into
 * line (the first 4 hosts by name, with their ranks).  Rank 0 only. */
static void count_hosts(int *hosts, char *line, size_t cap)
{
    enum { H = 64, SHOWN = 4 };
    char me[H] = "";
    if (gethostname(me, sizeof me) != 0 || !me[0])
        snprintf(me, sizeof me, "?");
    me[H - 1] = 0;
    char *all = NULL;
    if (g_rank == 0 && !(all = malloc((size_t)g_world * H)))
        rt_fatal(1, "rank 0: out of memory for %d host names", g_world);
    rt_ctl_gather(me, H, all, 0);
    if (g_rank != 0)
        return;
    for (int r = 0; r < g_world; r++) { /* read from the other ranks: printable, terminated */
        char *h = all + (size_t)r * H;
        h[H - 1] = 0;
        for (char *q = h; *q; q++)
            if ((unsigned char)*q < 0x21 || (unsigned char)*q > 0x7e)
                *q = '?';
    }
    qsort(all, (size_t)g_world, H, cmp_host);
    int n = 0, lo = INT_MAX, hi = 0;
    size_t len = (size_t)snprintf(line, cap, "ranks: %d on ", g_world);
    char list[5 * H + 32] = "";
    size_t ll = 0;
    for (int r = 0; r < g_world;) {
        int k = 1;
        while (r + k < g_world && !strcmp(all + (size_t)r * H, all + (size_t)(r + k) * H))
            k++;
        if (n < SHOWN && ll < sizeof list)
            ll += (size_t)snprintf(list + ll, sizeof list - ll, "%s%s: %d", n ? ", " : "", all + (size_t)r * H, k);
        lo = k < lo ? k : lo;
        hi = k > hi ? k : hi;
        n++;
        r += k;
    }
    if (len < cap) {
        if (n <= SHOWN)
            snprintf(line + len, cap - len, "%d host%s (%s)", n, n == 1 ? "" : "s", list);
        else if (lo == hi)
            snprintf(line + len, cap - len, "%d hosts, %d per host (%s, ...)", n, lo, list);
        else
            snprintf(line + len, cap - len, "%d hosts, %d to %d per host (%s, ...)", n, lo, hi, list);
    }
    *hosts = n;
    free(all);
}

static void print_memory(const RtCtx *c, const RtMem *mem, int hosts, FILE *mf)
{
    uint64_t state = mem->param + mem->grad + mem->optim;
    char acc[64] = "";
    if (mem->accum)
        snprintf(acc, sizeof acc, ", local accumulation %" PRIu64 " B", mem->accum);
    printf("memory per rank: params %" PRIu64 " B, grads %" PRIu64 " B, optimizer %" PRIu64
           " B (state total %" PRIu64 " B of the whole model's %" PRIu64 " B), slots %" PRIu64
           " B, arena %" PRIu64 " B%s, total %" PRIu64 " B; init params read %" PRIu64 " B\n",
           mem->param, mem->grad, mem->optim, state, mem->model_state, mem->slots, mem->arena, acc, mem->total,
           mem->init_param_read);
    fflush(stdout);
    if (mf)
        fprintf(mf,
                "{\"memory\":{\"rank\":%d,\"world\":%d,\"hosts\":%d,\"param_bytes\":%" PRIu64 ",\"grad_bytes\":%" PRIu64
                ",\"optim_bytes\":%" PRIu64 ",\"state_bytes\":%" PRIu64 ",\"model_state_bytes\":%" PRIu64
                ",\"slot_bytes\":%" PRIu64 ",\"arena_bytes\":%" PRIu64 ",\"accum_bytes\":%" PRIu64
                ",\"total_bytes\":%" PRIu64
                ",\"init_param_bytes_read\":%" PRIu64 ",\"init_param_bytes_read_max\":%" PRIu64 "}}\n",
                c->rank, c->world, hosts, mem->param, mem->grad, mem->optim, state, mem->model_state, mem->slots,
                mem->arena, mem->accum, mem->total, mem->init_param_read, mem->init_param_read_max);
}
/* The shortest decimal that reads back as exactly v (v rounded to float
 * first when is_f32: then at most 9 digits, i.e. %.9g); "null" for NaN and
 * Inf, which JSON lacks. */
static void json_num(char *buf, size_t cap, double v, int is_f32)
{
    if (!isfinite(v)) {
        snprintf(buf, cap, "null");
        return;
    }
    for (int prec = is_f32 ? 6 : 15; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        double back = strtod(buf, NULL);
        if (is_f32 ? (float)back == (float)v : back == v)
            return;
    }
}

/* the metrics written so far out to the file (*mf: f's stream; closed, NULL on failure) */
static int metrics_flush(RtAFile *f, FILE **mf, const char *path)
{
    if (*mf && (fflush(*mf) != 0 || ferror(*mf))) {
        fprintf(stderr, "%s: error: writing metrics file %s: %s (metrics stop here)\n", rt_prog, path,
                strerror(errno ? errno : EIO));
        fflush(stderr);
        rt_afile_abort(f); /* published: the lines so far stay */
        *mf = NULL;
        return -1;
    }
    return 0;
}


/* --------------------------------------------------------------------- main */

/* Everything one run holds, so that every exit path can release it. */
typedef struct {
    RtCtx ctx;
    RtOpts o;
    RtMem mem;
    RtData data;
    char *init_path, *base;
    int init_fd;
    RtAFile metrics;      /* rank 0, --metrics: published at once (read as it grows) */
    FILE *mf;             /*   its stream, NULL when none */
    int metrics_failed;
    RtDump dump;          /* rank 0, --dump-grads */
    RtInputs in;          /* rank 0: the input files no output may be */
    int64_t first;        /* steps already done (--resume: the checkpoint's step) */
    double peak;          /* rank 0: the per-rank peak FLOP/s of MFU (0: none) */
    double peak_share;    /*   the fraction of its threads' time its probe got (-1: not probed) */
    double total_s;       /* rank 0: the time of the steps run so far */
    int64_t nrun;         /*   and their count */
    RtData val;           /* --val-data / --val-tokens (has_val) */
    int has_val;
    int64_t val_batches;  /* batches per validation (--eval-steps, or one pass) */
    double best_val;      /* the best validation loss so far (INFINITY: none yet) */
    int64_t best_step;
} Run;

/* optimizer hyper-parameters into c; warnings for flags the build ignores */
static void set_hyper(RtCtx *c, const RtOpts *o)
{
    const RtModel *m = c->m;
    if (m->optimizer != RT_SGD && o->set_momentum)
        rt_warn0("--momentum has no effect: this model was built with --optimizer %s", rt_opt_name(m->optimizer));
    if (o->nesterov && m->optimizer != RT_SGD)
        rt_err_set(2, "--nesterov is SGD's; this model was built with --optimizer %s", rt_opt_name(m->optimizer));
    else if (o->nesterov && o->momentum <= 0)
        rt_err_set(2, "--nesterov needs --momentum > 0 (as torch.optim.SGD)");
    c->nesterov = o->nesterov;
    if (m->optimizer == RT_SGD && (o->set_beta1 || o->set_beta2 || o->set_eps))
        rt_warn0("--beta1/--beta2/--eps have no effect: this model was built with --optimizer sgd");
    if (m->optimizer == RT_SGD && o->momentum != 0)
        for (int u = 0; u < m->nunit; u++)
            if (m->unit[u].nstate < 1) {
                rt_err_set(1, "--momentum %g needs momentum buffers, which this build has none of "
                              "(unit '%s'); rebuild with momentum or drop --momentum", o->momentum, m->unit[u].name);
                break;
            }
    c->lr = rt_lr_at(o, 1);
    c->clip_norm = o->clip;
    c->loss_scale = m->loss_scaling ? o->loss_scale_init : 0; /* --resume may replace it (dynamic) */
    if (o->trace && m->target_cuda)
        rt_err_set(2, "--trace: the cuda step runs asynchronously on the GPU and has no host timeline; use Nsight "
                      "Systems (nsys profile) for its streams, or a --target cpu build");
    if (o->clip > 0 && m->gnorm_off < 0)
        rt_err_set(1, "--clip-grad-norm: this executable computes no gradient norm (rebuild it with this fsdpc)");
    c->weight_decay = o->wd;
    c->momentum = o->momentum;
    c->beta1 = o->beta1;
    c->beta2 = o->beta2;
    c->eps = o->eps;
    rt_opt_runs(c, o, g_rank == 0 && !o->quiet);
}

/* the device, the init file, the allocation, constants and this rank's
 * parameter shards; then the max over ranks of the parameter bytes read */
static int load(Run *r, const char *argv0)
{
    int status = rt_start_init(&r->ctx, &r->mem, &r->base, &r->o, argv0, &r->init_path, &r->init_fd);
    if (status != 0)
        return status;
    int64_t most = (int64_t)r->mem.init_param_read;
    rt_ctl_allreduce_i64(&most, 1, RT_CTL_MAX);
    r->mem.init_param_read_max = (uint64_t)most;
    return 0;
}

/* rank 0, before anything is written: no file output is an input, nor the checkpoints' folder (noclobber.c) */
static void refuse_clobber(Run *r)
{
    const RtOpts *o = &r->o;
    if (rt_inputs_collect(&r->in, o, r->init_path) != 0)
        return;
    const char *flag[] = {"--export-onnx", "--export-safetensors", "--metrics", "--trace"};
    const char *out[] = {o->export_path, o->export_st, o->metrics, o->trace};
    for (int i = 0; i < 4; i++)
        if (out[i] && rt_inputs_refuse(&r->in, flag[i], out[i]) != 0)
            return;
    if (o->export_path) { /* the export's external data file, FILE.data */
        size_t n = strlen(o->export_path) + 6;
        char *data = malloc(n);
        if (!data) {
            rt_err_set(1, "out of memory");
            return;
        }
        snprintf(data, n, "%s.data", o->export_path);
        int rc = rt_inputs_refuse(&r->in, "--export-onnx (its external data)", data);
        free(data);
        if (rc != 0)
            return;
    }
    if (o->ckpt_dir)
        rt_inputs_refuse_ckpt(&r->in, o->ckpt_dir);
}

/* rank 0: the export target is usable; the metrics file opens */
static int open_outputs(Run *r)
{
    const RtOpts *o = &r->o;
    char why[1024];
    if (g_rank == 0 && o->export_path && rt_export_check(r->ctx.m, "--export-onnx", o->export_path, why, sizeof why))
        rt_err_set(1, "%s", why);
    else if (g_rank == 0 && o->export_st &&
             rt_export_check(r->ctx.m, "--export-safetensors", o->export_st, why, sizeof why))
        rt_err_set(1, "%s", why);
    if (g_rank == 0 && o->metrics && !rt_err_code()) {
        r->mf = rt_afile_fopen(&r->metrics, o->metrics, 0666);
        if (!r->mf || rt_afile_publish(&r->metrics) != 0) {
            rt_err_set(1, "cannot create metrics file %s: %s", o->metrics, strerror(errno));
            if (r->mf)
                rt_afile_abort(&r->metrics);
            r->mf = NULL;
        }
    }
    return rt_err_sync();
}

/* --val-data / --val-tokens: opened and checked as the training data, under
 * their own flags' names; the batches of one validation.  Returns the exit
 * status. */
static int open_validation(Run *r)
{
    const RtModel *m = r->ctx.m;
    const RtOpts *o = &r->o;
    r->best_val = INFINITY;
    r->best_step = -1;
    if (!o->nval_data && !o->val_tokens)
        return 0;
    RtOpts v = *o;
    v.data = o->val_data;
    v.ndata = o->nval_data;
    v.tokens = o->val_tokens;
    v.shuffle = v.random_windows = 0; /* every validation reads the same batches, from the start */
    v.data_flag = "--val-data";
    v.tokens_flag = "--val-tokens";
    r->has_val = 1;
    rt_data_open(m, &v, g_world, &r->val);
    int status = rt_err_sync();
    if (status != 0)
        return status;
    rt_data_agree(&v, &r->val, g_rank);
    if ((status = rt_err_sync()) != 0)
        return status;
    int64_t pass = r->val.gstep > 0 ? r->val.rows / r->val.gstep : 1;
    r->val_batches = o->eval_steps ? o->eval_steps : pass > 0 ? pass : 1;
    if (g_rank == 0 && !o->quiet) {
        printf("validation: %" PRId64 " batches of %" PRId64 " samples (%" PRId64 " in the set) %s\n",
               r->val_batches, r->val.gstep, r->val.rows,
               o->eval_every ? "every --eval-every steps and after the last" : "after the last step");
        if (o->val_tokens)
            rt_data_describe(m, &v, &r->val);
        fflush(stdout);
    }
    return 0;
}

/* Everything between the flags and the first step.  Returns the exit
 * status; 0 to train. */
static int start_up(Run *r, const char *argv0)
{
    const RtModel *m = r->ctx.m;
    int status;
    rt_check_model(m);
    if (g_world % r->ctx.sf != 0)
        rt_err_set(1, "built with fsdpc --shard hybrid:%d, which shards inside groups of %d ranks: %d ranks are "
                      "not a multiple of %d (run on a multiple, or rebuild with another --shard)", r->ctx.sf,
                   r->ctx.sf, g_world, r->ctx.sf);
    if ((status = rt_err_sync()) != 0)
        return status;
    set_hyper(&r->ctx, &r->o);
    if ((status = rt_err_sync()) != 0)
        return status;
    if ((status = load(r, argv0)) != 0)
        return status;
    if (g_rank == 0)
        refuse_clobber(r);
    if ((status = rt_err_sync()) != 0)
        return status;
    rt_data_open(m, &r->o, g_world, &r->data);
    if ((status = rt_err_sync()) != 0)
        return status;
    rt_data_agree(&r->o, &r->data, g_rank);
    if ((status = rt_err_sync()) != 0)
        return status;
    if (g_rank == 0 && r->o.dump_grads)
        rt_dump_prepare(m, r->o.dump_grads, r->init_fd, &r->in, &r->dump);
    if ((status = rt_err_sync()) != 0)
        return status;
    if (g_rank == 0 && !r->o.quiet)
        rt_data_describe(m, &r->o, &r->data);
    if ((status = open_validation(r)) != 0)
        return status;
    return open_outputs(r);
}

/* a float scalar of the step's arena (the loss, the gradient norm) */
static double read_scalar(RtCtx *c, int64_t off, int dtype)
{
    rt_dev_download(c, c->arena + off, rt_elem_size(dtype));
    double v;
    if (dtype == RT_F32) {
        float f;
        memcpy(&f, c->arena + off, sizeof f);
        v = f;
    } else {
        memcpy(&v, c->arena + off, sizeof v);
    }
    return v;
}

/* fp16, after a step with a finite loss that ran with the loss scale in c:
 * an overflow (a non-finite global squared norm gsq, all-reduced: every rank
 * decides the same) skipped the update, so the optimizers' count stays and S
 * halves; otherwise S doubles after --loss-scale-growth-interval good steps
 * in a row (torch.cuda.amp.GradScaler's rule).  --loss-scale fixes S.
 * Returns 1 when the step was skipped. */
static int loss_scale_update(RtCtx *c, const RtOpts *o, double gsq)
{
    if (!isfinite(gsq)) {
        c->skipped++;
        if (!o->static_scale) {
            if (c->loss_scale * 0.5 >= 0x1p-126) /* S stays positive: a NaN the scale cannot cure keeps skipping */
                c->loss_scale *= 0.5;
            c->scale_good = 0;
        }
        return 1;
    }
    c->updates++;
    if (!o->static_scale && ++c->scale_good >= o->growth_interval) {
        c->scale_good = 0;
        if (c->loss_scale * 2 <= 0x1p126) /* the seed stays a finite float */
            c->loss_scale *= 2;
    }
    return 0;
}

/* peak resident memory of this process in bytes (Linux: ru_maxrss in KiB) */
/* The process's peak resident memory: VmHWM, this image's own (getrusage's ru_maxrss survives exec, so a rank
 * started by a large process, a Python launcher say, would report its parent's peak) */
static double peak_rss(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) {
            kb = strtod(line + 6, NULL);
            break;
        }
    if (f)
        fclose(f);
    struct rusage u;
    if (kb < 0)
        kb = getrusage(RUSAGE_SELF, &u) == 0 ? (double)u.ru_maxrss : 0;
    return kb * 1024.0;
}

/* "12.3k" style: 3 significant digits with k, M, G */
static const char *si(char *buf, size_t cap, double v)
{
    const char *u = v >= 1e9 ? "G" : v >= 1e6 ? "M" : v >= 1e3 ? "k" : "";
    double d = v >= 1e9 ? 1e9 : v >= 1e6 ? 1e6 : v >= 1e3 ? 1e3 : 1;
    snprintf(buf, cap, "%.3g%s", v / d, u);
    return buf;
}

/* a duration: "42s", "3m05s", "2h07m" */
static const char *hms(char *buf, size_t cap, double s)
{
    long long t = (long long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, cap, "%lldh%02lldm", t / 3600, t / 60 % 60);
    else if (t >= 60)
        snprintf(buf, cap, "%lldm%02llds", t / 60, t % 60);
    else
        snprintf(buf, cap, "%llds", t);
    return buf;
}

/* MFU's peak is trusted unless its probe's threads got less than PEAK_SHARE of
 * their time (the machine was busy: runtime/dev_host.c rt_dev_peak_flops) */
#define PEAK_SHARE 0.75
static int peak_trusted(const Run *r) { return r->peak_share < 0 || r->peak_share >= PEAK_SHARE; }

/* What a step of s seconds achieved: tokens (or samples) per second over all
 * ranks, model FLOP/s of one rank, MFU against r->peak (-1: none) */
typedef struct {
    double tps, flops, mfu;
} Speed;

static Speed speed(const Run *r, double s)
{
    const RtModel *m = r->ctx.m;
    Speed v = {0, 0, -1};
    if (s > 0) {
        v.tps = (double)m->tokens * (double)r->ctx.world * (double)r->ctx.accum / s;
        v.flops = m->flops * (double)r->ctx.accum / s;
    }
    if (r->peak > 0 && m->flops > 0)
        v.mfu = v.flops / r->peak;
    return v;
}

/* The mean loss over the validation batches, from the set's start: the
 * step's forward to the averaged loss only (c->validating: codegen's
 * validation nodes), sharded as training; nothing it runs writes a
 * parameter, gradient, optimizer state or BatchNorm statistic. */
static double validate(Run *r)
{
    RtCtx *c = &r->ctx;
    const RtModel *m = c->m;
    double sum = 0;
    r->val.pos = 0;
    c->validating = 1;
    for (int64_t k = 0; k < r->val_batches; k++) {
        rt_data_next(c, &r->val);
        rt_dev_step(c);
        sum += read_scalar(c, m->loss_off, m->loss_dtype);
    }
    c->validating = 0;
    return sum / (double)r->val_batches;
}

/* after step: validate when due (*did), the loss in *val; a new best is
 * kept under --save-best (every rank has the same mean, so they agree).
 * Returns the exit status. */
static int validate_due(Run *r, int64_t step, int *did, double *val, double *val_ms)
{
    const RtOpts *o = &r->o;
    *did = 0;
    if (!r->has_val || !(step == o->steps || (o->eval_every && step % o->eval_every == 0)))
        return 0;
    *did = 1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    *val = validate(r);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *val_ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
    if (!(*val < r->best_val))
        return 0;
    r->best_val = *val;
    r->best_step = step;
    if (!o->save_best)
        return 0;
    int status = rt_ckpt_save(&r->ctx, o->ckpt_dir, "best", step, r->data.pos, o->run_toml);
    if (status == 0 && g_rank == 0)
        rt_ckpt_prune(o->ckpt_dir, "best", step);
    return status;
}

/* rank 0: the step line (step 1, every --log-every-th, the last, and one
 * that validated) and the metrics line (every step); scale: the loss scale
 * the step ran with (fp16; 0 otherwise), skipped: why its update was
 * skipped (NULL: it was not); val: the validation loss (NULL: none this
 * step), val_ms its time */
static void report_step(Run *r, int64_t step, double loss, double gnorm, double ms, double scale,
                        const char *skipped, const double *val, double val_ms)
{
    const RtOpts *o = &r->o;
    const RtModel *m = r->ctx.m;
    int validated = val != NULL;
    int log = step == 1 || step % o->log_every == 0 || step == o->steps || skipped || validated;
    r->total_s += ms * 1e-3, r->nrun++;
    Speed v = speed(r, ms * 1e-3);
    double rss = peak_rss(), eta = r->total_s / (double)r->nrun * (double)(o->steps - step);
    if (!o->quiet && log) {
        char t[32];
        printf("step %lld/%lld  loss %.6f", (long long)step, (long long)o->steps, loss);
        if (validated)
            printf("  val loss %.6f%s", *val, r->best_step == step ? " (best)" : "");
        printf("  lr %.3g", r->ctx.lr);
        if (gnorm >= 0 || isnan(gnorm))
            printf("  grad norm %.4g", gnorm);
        printf("  %.2f ms  %s %s/s", ms, si(t, sizeof t, v.tps), m->token_unit ? m->token_unit : "samples");
        if (m->flops > 0)
            printf("  %.3g TFLOPS", v.flops * 1e-12);
        if (v.mfu >= 0)
            printf("  MFU %.1f%%", 100 * v.mfu);
        printf("  mem %.0f MB  ETA %s", rss * 1e-6, hms(t, sizeof t, eta));
        if (scale > 0)
            printf("  loss scale %g", scale);
        if (skipped)
            printf("  skipped: %s (%lld skipped so far", skipped, (long long)r->ctx.skipped);
        if (skipped && scale > 0)
            printf("; loss scale now %g", r->ctx.loss_scale);
        printf("%s\n", skipped ? ")" : "");
        fflush(stdout);
    }
    if (r->mf) {
        char lb[64], lrb[64];
        json_num(lb, sizeof lb, loss, r->ctx.m->loss_dtype == RT_F32);
        json_num(lrb, sizeof lrb, r->ctx.lr, 0);
        fprintf(r->mf, "{\"step\":%lld,\"loss\":%s,\"time_ms\":%.6f,\"lr\":%s", (long long)step, lb, ms, lrb);
        if (gnorm >= 0 || isnan(gnorm)) { /* --clip-grad-norm, fp16: the norm before clipping, as
                                           * clip_grad_norm_ returns it (null: an overflow) */
            char gb[64];
            json_num(gb, sizeof gb, gnorm, 0);
            fprintf(r->mf, ",\"grad_norm\":%s", gb);
        }
        if (validated) {
            char vb[64];
            json_num(vb, sizeof vb, *val, 0);
            fprintf(r->mf, ",\"val_loss\":%s,\"val_time_ms\":%.6f,\"val_best\":%s", vb, val_ms,
                    r->best_step == step ? "true" : "false");
        }
        if (scale > 0)
            fprintf(r->mf, ",\"loss_scale\":%.17g", scale);
        if (scale > 0 || o->skip_nonfinite)
            fprintf(r->mf, ",\"skipped\":%s,\"skipped_total\":%lld", skipped ? "true" : "false",
                    (long long)r->ctx.skipped);
        fprintf(r->mf, ",\"tokens_per_s\":%.6g,\"token_unit\":\"%s\",\"tflops\":%.6g", v.tps,
                m->token_unit ? m->token_unit : "samples", v.flops * 1e-12);
        if (v.mfu >= 0)
            fprintf(r->mf, ",\"mfu\":%.6g,\"peak_tflops\":%.6g,\"peak_trusted\":%s", v.mfu, r->peak * 1e-12,
                    peak_trusted(r) ? "true" : "false");
        fprintf(r->mf, ",\"peak_rss_bytes\":%.0f,\"eta_s\":%.3f}\n", rss, eta);
        if (metrics_flush(&r->metrics, &r->mf, o->metrics) != 0)
            r->metrics_failed = 1;
    }
}

/* Collective, after a micro-step whose reported loss (the mean over ranks,
 * the same on every rank) is not finite: the lowest rank whose own loss is
 * not, -1 if none is known (the mean overflowed, or the build keeps no
 * rank's loss) */
static int nonfinite_loss_rank(RtCtx *c)
{
    const RtModel *m = c->m;
    int mine = m->rank_loss_off >= 0 && !isfinite(read_scalar(c, m->rank_loss_off, m->loss_dtype));
    int64_t key = mine ? c->rank : INT64_MAX;
    rt_ctl_allreduce_i64(&key, 1, RT_CTL_MIN);
    return key == INT64_MAX ? -1 : (int)key;
}

/* rank 0, --on-nonfinite stop: the run's last line (every rank exits 1) */
static void report_stop(const Run *r, double loss, int loss_rank, double gsq)
{
    char what[128];
    if (!isfinite(loss) && loss_rank >= 0)
        snprintf(what, sizeof what, "the loss is %s on rank %d", isnan(loss) ? "NaN" : "infinite", loss_rank);
    else if (!isfinite(loss))
        snprintf(what, sizeof what, "the loss is %s", isnan(loss) ? "NaN" : "infinite");
    else
        snprintf(what, sizeof what, "the gradient norm is %s", isnan(gsq) ? "NaN" : "infinite");
    fprintf(stderr, "%s: error: step %lld: %s; the run stops before its update (no checkpoint or export of it): "
                    "check the data, lower --lr (or clip with --clip-grad-norm), or pass --on-nonfinite skip to "
                    "skip such steps\n", rt_prog, (long long)r->ctx.step, what);
    fflush(stderr);
}

/* --on-nonfinite skip, and every step of this run skipped: the model is as it started, which a run that exits 0
 * (and exports) would hide; rank 0 says so in one line, every rank returns 1 (the skips were agreed) */
static int report_none_applied(const Run *r)
{
    if (g_rank == 0) {
        fprintf(stderr, "%s: error: no step was applied: all %lld steps of this run were skipped (--on-nonfinite "
                        "skip: their loss or gradient was not finite), so the model is unchanged and not exported: "
                        "check the data and --lr\n", rt_prog, (long long)(r->o.steps - r->first));
        fflush(stderr);
    }
    return 1;
}

/* the steps after r->first up to --steps, checkpointing as asked; returns the
 * exit status (non-zero: --dump-grads or a checkpoint failed, a step was
 * not finite under --on-nonfinite stop, or under skip none was applied).
 * A step whose loss or gradient norm is not finite is never applied: the
 * updates skip on a non-finite norm, a non-finite loss makes the norm NaN
 * (codegen), and after a micro-step with a non-finite loss the step's later
 * micro-steps only consume their data. */
static int train(Run *r)
{
    RtCtx *c = &r->ctx;
    const int64_t updates0 = c->updates;
    for (int64_t s = r->first; s < r->o.steps; s++) {
        c->step = s + 1;
        c->opt_step = c->updates + 1; /* a skipped step's update is not counted */
        c->lr = rt_lr_at(&r->o, c->step);
        const double scale = c->loss_scale;
        const RtModel *m = c->m;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        double loss = 0;
        int loss_rank = -1, last_ran = 0;
        for (c->micro = 0; c->micro < c->accum; c->micro++) { /* the last micro-step updates */
            rt_data_next(c, &r->data);
            if (!isfinite(loss))
                continue;
            rt_dev_step(c);
            last_ran = c->micro + 1 == c->accum;
            loss += read_scalar(c, m->loss_off, m->loss_dtype) / (double)c->accum;
            if (!isfinite(loss))
                loss_rank = nonfinite_loss_rank(c);
        }
        c->micro = c->accum - 1;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
        double gsq = last_ran && m->gnorm_off >= 0 ? read_scalar(c, m->gnorm_off, m->unit[0].dtype) : NAN;
        double gnorm = c->clip_norm > 0 || m->loss_scaling ? sqrt(gsq) : -1;
        const char *skipped = NULL;
        if (m->loss_scaling && isfinite(loss)) {
            if (loss_scale_update(c, &r->o, gsq))
                skipped = "the gradient overflowed";
        } else if (!isfinite(loss) || (m->gnorm_off >= 0 && !isfinite(gsq))) {
            if (!r->o.skip_nonfinite) {
                if (g_rank == 0)
                    report_stop(r, loss, loss_rank, gsq);
                return 1;
            }
            c->skipped++;
            skipped = isfinite(loss) ? "the gradient is not finite" : "the loss is not finite";
        } else {
            c->updates++;
        }
        double val = NAN, val_ms = 0;
        int did, status = validate_due(r, c->step, &did, &val, &val_ms);
        if (status != 0)
            return status;
        if (g_rank == 0)
            report_step(r, c->step, loss, gnorm, ms, scale, skipped, did ? &val : NULL, val_ms);
        if (c->step == 1 && r->o.dump_grads) {
            int status = rt_dump_grads(c, &r->dump, r->o.dump_grads, r->o.quiet, scale);
            if (status != 0)
                return status;
        }
        if (r->o.ckpt_dir && ((r->o.ckpt_every && c->step % r->o.ckpt_every == 0) || c->step == r->o.steps)) {
            int status = rt_ckpt_save(c, r->o.ckpt_dir, NULL, c->step, r->data.pos, r->o.run_toml);
            if (status != 0)
                return status;
        }
    }
    return r->o.skip_nonfinite && r->o.steps > r->first && c->updates == updates0 ? report_none_applied(r) : 0;
}

/* export, close the metrics file; returns the exit status */
static int finish(Run *r)
{
    int status = 0;
    if ((r->o.export_path || r->o.export_st) &&
        rt_export(&r->ctx, r->o.export_path, r->o.export_st, r->init_fd, r->init_path, r->o.quiet) != 0)
        status = 1;
    if (g_rank == 0 && r->mf) {
        r->mf = NULL;
        if (rt_afile_commit(&r->metrics) != 0) {
            fprintf(stderr, "%s: error: writing metrics file %s: %s\n", rt_prog, r->o.metrics, strerror(errno));
            r->metrics_failed = 1;
        }
    }
    rt_ctl_bcast(&r->metrics_failed, sizeof r->metrics_failed, 0);
    return r->metrics_failed ? 1 : status;
}

static void release(Run *r)
{
    rt_dev_finish(&r->ctx);
    if (r->mf)
        rt_afile_abort(&r->metrics);
    rt_data_close(r->ctx.m, &r->data);
    if (r->has_val)
        rt_data_close(r->ctx.m, &r->val);
    rt_dump_free(r->ctx.m, &r->dump);
    rt_inputs_free(&r->in);
    if (r->init_fd >= 0)
        close(r->init_fd);
    free(r->init_path);
    free(r->base);
    free(r->ctx.slot);
    free(r->ctx.shard);
    free(r->ctx.shard_len);
    free(r->ctx.acc);
    rt_opt_runs_free(&r->ctx);
}

/* a training executable, after its flags and the control plane */
static int train_main(const RtOpts *o, const char *argv0, const RtModel *m)
{
    Run run;
    Run *r = &run;
    memset(r, 0, sizeof *r);
    r->ctx.m = m;
    r->ctx.seed = rt_seed(m, o->seed);
    r->ctx.rank = g_rank;
    r->ctx.world = g_world;
    r->ctx.sf = m->shard_group > 0 ? m->shard_group : g_world;
    r->ctx.accum = o->accum;
    r->ctx.srank = g_rank % r->ctx.sf;
    r->o = *o;
    r->init_fd = -1;

    int status = start_up(r, argv0);
    if (status == 0 && o->resume) {
        status = rt_ckpt_resume(&r->ctx, o->resume, &r->first, &r->data.pos);
        if (status == 0 && o->dump_grads && r->first >= 1) { /* every rank knows r->first: no sync needed */
            if (g_rank == 0)
                fprintf(stderr, "%s: error: --dump-grads writes the gradients of step 1, but --resume %s continues "
                                "after step %lld; drop one of them\n", rt_prog, o->resume, (long long)r->first);
            status = 2;
        }
        if (status == 0 && o->static_scale) /* --loss-scale fixes S, whatever the checkpoint ran with */
            r->ctx.loss_scale = o->loss_scale_init;
        if (status == 0 && g_rank == 0 && o->restored) /* even --quiet: it says what the run is */
            printf("%s\n", o->restored);
        if (status == 0 && g_rank == 0 && !o->quiet)
            printf("resumed from %s at step %lld\n", o->resume, (long long)r->first);
    }
    int64_t left = o->steps > r->first ? o->steps - r->first : 0; /* the steps this run traces: no more than run */
    int64_t traced = o->trace_steps < left ? o->trace_steps : left;
    if (status == 0 && o->trace && rt_trace_start(&r->ctx, traced) != 0)
        status = rt_err_sync();
    if (status == 0) {
        const char *overlap = rt_dev_overlap(&r->ctx);
        int hosts = 1;
        char line[512] = "";
        if (g_world > 1)
            count_hosts(&hosts, line, sizeof line);
        if (g_rank == 0) {
            if (m->bf16_native && !m->bf16_native()) /* fsdpc said so too where it compiled (codegen/notes.c) */
                rt_note0("no native bfloat16 GEMM on this CPU (AVX512-BF16): the bf16 GEMMs run widened to float32, a "
                      "step taking 0.9-1.0x the time of --precision fp32's");
            if (line[0] && !o->quiet)
                printf("%s\n", line);
            print_memory(&r->ctx, &r->mem, hosts, r->mf);
            if (!o->quiet && rt_dev_threads()[0])
                printf("threads: %s\n", rt_dev_threads());
            if (!o->quiet && m->bf16_native)
                printf("bf16 GEMMs: %s\n", m->bf16_native() ? "native (oneDNN on this CPU's AVX512-BF16)"
                                                              : "widened to float32 (no AVX512-BF16 here), C's tiles "
                                                                "split across the threads");
            if (!o->quiet)
                printf("collectives: %s\n", overlap);
            /* measured (about 0.1 s) only where someone reads it */
            /* a step of native bf16 GEMMs is measured against a bf16 GEMM, about twice float32's rate */
            int bf16 = m->bf16_native && m->bf16_native();
            r->peak_share = -1;
            r->peak = o->peak_tflops > 0                          ? o->peak_tflops * 1e12
                    : m->flops > 0 && (!o->quiet || r->mf) ? rt_dev_peak_flops(bf16, &r->peak_share) : 0;
            if (!o->quiet && m->flops > 0)
                printf("FLOPs per rank per step: %.4g (matmuls and convolutions); MFU against %s\n",
                       m->flops * (double)o->accum,
                       r->peak <= 0            ? "nothing (give --peak-tflops)"
                       : o->peak_tflops > 0    ? "--peak-tflops"
                       : bf16                  ? "the peak measured here (a bfloat16 GEMM on this rank's threads, "
                                                 "as the step's native bf16 GEMMs)"
                                               : "the peak measured here (a float32 GEMM on this rank's threads)");
            if (!o->quiet && r->peak > 0) {
                printf("peak: %.4g TFLOPS per rank", r->peak * 1e-12);
                if (!peak_trusted(r))
                    printf(" (untrusted: the probe's GEMM threads ran %.0f %% of the time, the machine is busy; "
                           "the peak is their rate while they ran; give --peak-tflops for one that means more)",
                           100 * r->peak_share);
                printf("\n");
            }
            if (metrics_flush(&r->metrics, &r->mf, r->o.metrics) != 0)
                r->metrics_failed = 1;
        }
        status = train(r);
        if (status == 0 && g_rank == 0 && !o->quiet && r->nrun > 0) {
            char t[32];
            Speed v = speed(r, r->total_s / (double)r->nrun);
            printf("done: %lld steps in %.2f s, %s %s/s, %.3g TFLOPS per rank", (long long)r->nrun, r->total_s,
                   si(t, sizeof t, v.tps), m->token_unit ? m->token_unit : "samples", v.flops * 1e-12);
            if (v.mfu >= 0)
                printf(" (MFU %.1f%%%s)", 100 * v.mfu, peak_trusted(r) ? "" : " against an untrusted peak");
            printf(", peak memory %.0f MB (rank 0)", peak_rss() * 1e-6);
            if (m->conv_bytes && m->conv_bytes() > 0) /* not in the compiler's plan: oneDNN picks it at run time */
                printf(" of which %.1f MB oneDNN's convolution scratch (outside the arena)",
                       (double)m->conv_bytes() * 1e-6);
            if (r->best_step >= 0)
                printf(", best val loss %.6f at step %lld%s", r->best_val, (long long)r->best_step,
                       o->save_best ? " (checkpoint in --ckpt-dir/best)" : "");
            printf("\n");
        }
        if (status == 0 && r->ctx.trace)
            status = rt_trace_write(&r->ctx, o->trace);
        if (status == 0)
            status = finish(r);
    }
    release(r);
    return status;
}

/* Every rank read its options itself: where any rank read a file (--config, the checkpoint's run.toml), do
 * they all match rank 0's?  (Command lines that differ by design, mpirun's A : B, are left to the checks of
 * what they name: the data, the executable.) */
static int agree_opts(const RtOpts *o)
{
    int64_t files = o->from_files;
    rt_ctl_allreduce_i64(&files, 1, RT_CTL_MAX);
    uint64_t h = o->opts_hash;
    rt_ctl_bcast(&h, sizeof h, 0);
    if (files && h != o->opts_hash)
        rt_err_set(2, "this rank's options differ from rank 0's: a --config file or the --resume checkpoint's "
                      "run.toml that differs between the nodes? (every rank must read the same)");
    return rt_err_sync();
}

int rt_main(int argc, char **argv, const RtModel *m)
{
    rt_dev_preinit(argv); /* may exec this program again, with the waiting its threads should do (dev_host.c) */
    if (argc > 0 && argv[0] && argv[0][0])
        rt_prog = argv[0];
    const char *argv0 = argc > 0 && argv[0] ? argv[0] : "";
    RtOpts o;
    int pf = rt_parse_flags(argc, argv, m, &o); /* errors: agreed on below */
    char why[1024] = "";
    int ctl = rt_ctl_init(&argc, &argv, o.rendezvous, m->key, &g_rank, &g_world, why, sizeof why);
    rt_err_rank(g_rank);
    if (ctl != 0) {
        int status = 1; /* no agreement without a control plane: a flag error first, else why */
        if (rt_err_code()) {
            rt_err_print();
            status = rt_err_code();
        } else if (why[0]) {
            fprintf(stderr, "%s: error: %s\n", rt_prog, why);
            fflush(stderr);
        }
        rt_ctl_finalize();
        rt_opts_free(&o);
        return status;
    }
    int status = rt_err_sync();
    if (status == 0 && pf == 0)
        status = agree_opts(&o);
    if (status == 0 && pf == 1) {
        if (g_rank == 0)
            rt_usage(m);
    } else if (status == 0) {
        status = m->eval ? rt_eval_main(&o, argv0, m, g_rank, g_world) : train_main(&o, argv0, m);
    }
    rt_opts_free(&o);
    fflush(stdout);
    rt_ctl_finalize();
    return status;
}
