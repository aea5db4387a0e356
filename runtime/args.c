/* args.c — the values of a training or forward-only (eval) executable's
 * options: their defaults (RtOpts), the parsing of each value (rt_set_flag:
 * one flag's text, from the command line or a run file alike), and the
 * checks across options once all are in (rt_opts_check).  Which options
 * exist and where their values come from is opts.c's; the --help text is
 * usage.c's.  Errors go through rt_err_set (status 2 for a bad value), so
 * that err.c reports them once for all ranks.
 */
#define _POSIX_C_SOURCE 200809L

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_priv.h"

static int parse_double(const char *flag, const char *s, double lo, double hi, int hi_open, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != 0 || isspace((unsigned char)*s) || errno == ERANGE || !isfinite(v)) {
        rt_err_set(2, "%s: invalid number '%s' (see --help)", flag, s);
        return -1;
    }
    if (v < lo || v > hi || (hi_open && v == hi)) {
        if (hi_open)
            rt_err_set(2, "%s: %s is out of range [%g, %g)", flag, s, lo, hi);
        else
            rt_err_set(2, "%s: %s must be >= %g", flag, s, lo);
        return -1;
    }
    *out = v;
    return 0;
}

/* Counts of steps (--steps, --warmup-steps, --accum, ...) are at most 2^53: exact as doubles (the schedule,
 * the ETA) and far from wrapping when added or multiplied by a unit's events (--trace-steps) */
#define MAX_COUNT ((int64_t)1 << 53)

/* The one parser of the executable's integer flags: s, a decimal integer in [lo, hi]; else one line naming
 * flag, s and the range (rt_err_set).  Every integer flag goes through it. */
static int parse_int(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != 0 || isspace((unsigned char)*s) || *s == '+') {
        rt_err_set(2, "%s: invalid integer '%.40s' (expected one in [%" PRId64 ", %" PRId64 "]; see --help)", flag,
                   s, lo, hi);
        return -1;
    }
    if (errno == ERANGE || v < lo || v > hi) {
        rt_err_set(2, "%s: %.40s is out of range: expected an integer in [%" PRId64 ", %" PRId64 "]", flag, s, lo,
                   hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* --data NAME=FILE.npy, --input NAME=FILE, --val-data NAME=FILE.npy */
static int add_data(RtOpts *o, const char *flag, const char *val)
{
    int val_set = strcmp(flag, "--val-data") == 0;
    RtDataArg *list = val_set ? o->val_data : o->data;
    int *n = val_set ? &o->nval_data : &o->ndata;
    const char *e = strchr(val, '=');
    if (!e || e == val || e[1] == 0) {
        rt_err_set(2, "%s expects NAME=FILE%s, got '%s' (see --help)", flag,
                   strcmp(flag, "--input") != 0 ? ".npy" : " (FILE.npy or FILE.pb)", val);
        return -1;
    }
    char *name = strndup(val, (size_t)(e - val));
    if (!name) {
        rt_err_set(1, "out of memory");
        return -1;
    }
    for (int k = 0; k < *n; k++)
        if (strcmp(list[k].name, name) == 0) {
            rt_err_set(2, "%s %s is given twice", flag, name);
            free(name);
            return -1;
        }
    list[*n].name = name;
    list[*n].file = e + 1;
    (*n)++;
    return 0;
}

int rt_set_flag(RtOpts *o, const char *flag, const char *val)
{
    int rc = 0;
    if (strcmp(flag, "--data") == 0 || strcmp(flag, "--input") == 0 || strcmp(flag, "--val-data") == 0) {
        rc = add_data(o, flag, val);
    } else if (strcmp(flag, "--no-decay") == 0) {
        o->no_decay[o->nno_decay++] = val;
    } else if (strcmp(flag, "--lr-mult") == 0) {
        const char *eq = strrchr(val, '=');
        if (!eq || eq == val) {
            rt_err_set(2, "--lr-mult expects PATTERN=X, got '%s' (see --help)", val);
            return -1;
        }
        char *pat = strndup(val, (size_t)(eq - val));
        if (!pat) {
            rt_err_set(1, "out of memory");
            return -1;
        }
        o->lr_mult[o->nlr_mult].pattern = pat;
        rc = parse_double(flag, eq + 1, 0, INFINITY, 0, &o->lr_mult[o->nlr_mult].mult);
        o->nlr_mult++;
    } else if (strcmp(flag, "--val-tokens") == 0) {
        o->val_tokens = val;
    } else if (strcmp(flag, "--eval-every") == 0) {
        rc = parse_int(flag, val, 1, MAX_COUNT, &o->eval_every);
    } else if (strcmp(flag, "--eval-steps") == 0) {
        rc = parse_int(flag, val, 1, MAX_COUNT, &o->eval_steps);
    } else if (strcmp(flag, "--out-dir") == 0) {
        o->out_dir = val;
    } else if (strcmp(flag, "--steps") == 0) {
        rc = parse_int(flag, val, 0, MAX_COUNT, &o->steps);
    } else if (strcmp(flag, "--log-every") == 0) {
        rc = parse_int(flag, val, 1, MAX_COUNT, &o->log_every);
    } else if (strcmp(flag, "--lr") == 0) {
        rc = parse_double(flag, val, 0, INFINITY, 0, &o->lr);
    } else if (strcmp(flag, "--weight-decay") == 0) {
        rc = parse_double(flag, val, 0, INFINITY, 0, &o->wd);
        o->set_wd = 1;
    } else if (strcmp(flag, "--momentum") == 0) {
        rc = parse_double(flag, val, 0, INFINITY, 0, &o->momentum);
        o->set_momentum = 1;
    } else if (strcmp(flag, "--beta1") == 0) {
        rc = parse_double(flag, val, 0, 1, 1, &o->beta1);
        o->set_beta1 = 1;
    } else if (strcmp(flag, "--beta2") == 0) {
        rc = parse_double(flag, val, 0, 1, 1, &o->beta2);
        o->set_beta2 = 1;
    } else if (strcmp(flag, "--eps") == 0) {
        rc = parse_double(flag, val, 0, INFINITY, 0, &o->eps);
        o->set_eps = 1;
    } else if (strcmp(flag, "--export-safetensors") == 0) {
        o->export_st = val;
    } else if (strcmp(flag, "--trace") == 0) {
        o->trace = val;
    } else if (strcmp(flag, "--trace-steps") == 0) {
        rc = parse_int(flag, val, 1, MAX_COUNT, &o->trace_steps);
    } else if (strcmp(flag, "--accum") == 0) {
        rc = parse_int(flag, val, 1, MAX_COUNT, &o->accum);
    } else if (strcmp(flag, "--accum-mode") == 0) {
        if (strcmp(val, "local") == 0 || strcmp(val, "comm") == 0) {
            o->accum_local = val[0] == 'l';
        } else {
            rt_err_set(2, "--accum-mode expects comm or local, got '%s' (see --help)", val);
            rc = -1;
        }
    } else if (strcmp(flag, "--on-nonfinite") == 0) {
        if (strcmp(val, "stop") == 0 || strcmp(val, "skip") == 0) {
            o->skip_nonfinite = val[1] == 'k';
        } else {
            rt_err_set(2, "--on-nonfinite expects stop or skip, got '%s' (see --help)", val);
            rc = -1;
        }
    } else if (strcmp(flag, "--ckpt-dir") == 0) {
        o->ckpt_dir = val;
    } else if (strcmp(flag, "--ckpt-every") == 0) {
        rc = parse_int(flag, val, 1, MAX_COUNT, &o->ckpt_every);
    } else if (strcmp(flag, "--resume") == 0) {
        o->resume = val;
    } else if (strcmp(flag, "--config") == 0) {
        o->config = val;
    } else if (strcmp(flag, "--seed") == 0) {
        rc = parse_int(flag, val, 0, INT64_MAX, &o->seed);
    } else if (strcmp(flag, "--peak-tflops") == 0) {
        rc = parse_double(flag, val, 0, INFINITY, 0, &o->peak_tflops);
    } else if (strcmp(flag, "--clip-grad-norm") == 0) {
        rc = parse_double(flag, val, 0, INFINITY, 0, &o->clip);
    } else if (strcmp(flag, "--lr-schedule") == 0) {
        static const char *const names[] = {"constant", "cosine", "linear", "wsd"}; /* RT_SCHED_ order */
        o->sched = -1;
        for (int k = 0; k < 4; k++)
            if (strcmp(val, names[k]) == 0)
                o->sched = k;
        if (o->sched < 0) {
            rt_err_set(2, "--lr-schedule expects constant, cosine, linear or wsd, got '%s' (see --help)", val);
            rc = -1;
        }
    } else if (strcmp(flag, "--wsd-decay-steps") == 0) {
        rc = parse_int(flag, val, 1, MAX_COUNT, &o->wsd_decay);
    } else if (strcmp(flag, "--warmup-steps") == 0) {
        rc = parse_int(flag, val, 0, MAX_COUNT, &o->warmup);
    } else if (strcmp(flag, "--decay-steps") == 0) {
        rc = parse_int(flag, val, 1, MAX_COUNT, &o->decay_steps);
        o->set_decay = 1;
    } else if (strcmp(flag, "--min-lr") == 0) {
        rc = parse_double(flag, val, 0, INFINITY, 0, &o->min_lr);
        o->set_min_lr = 1;
    } else if (strcmp(flag, "--metrics") == 0) {
        o->metrics = val;
    } else if (strcmp(flag, "--export-onnx") == 0) {
        o->export_path = val;
    } else if (strcmp(flag, "--init") == 0) {
        o->init = val;
    } else if (strcmp(flag, "--tokens") == 0) {
        o->tokens = val;
    } else if (strcmp(flag, "--token-inputs") == 0) {
        o->token_inputs = val;
    } else if (strcmp(flag, "--dump-grads") == 0) {
        o->dump_grads = val;
    } else if (strcmp(flag, "--loss-scale-init") == 0 || strcmp(flag, "--loss-scale") == 0) {
        rc = parse_double(flag, val, 0, INFINITY, 0, &o->loss_scale_init);
        if (rc == 0 && !(o->loss_scale_init > 0 && o->loss_scale_init <= 0x1p126)) {
            rt_err_set(2, "%s: %s is outside (0, 2^126]: give a positive loss scale (a power of two keeps "
                          "unscaling exact)", flag, val);
            rc = -1;
        }
        o->static_scale |= strcmp(flag, "--loss-scale") == 0;
        o->set_scale_init |= strcmp(flag, "--loss-scale-init") == 0;
    } else if (strcmp(flag, "--loss-scale-growth-interval") == 0) {
        rc = parse_int(flag, val, 1, MAX_COUNT, &o->growth_interval);
        o->set_growth = 1;
    } else if (strcmp(flag, "--rendezvous") == 0) {
        if (strncmp(val, "file:", 5) == 0 || strncmp(val, "tcp:", 4) == 0 || strcmp(val, "mpi") == 0) {
            o->rendezvous = val;
        } else {
            rt_err_set(2, "--rendezvous expects file:PATH, tcp:HOST:PORT or mpi, got '%s' (see --help)", val);
            rc = -1;
        }
    }
    return rc != 0 ? -1 : 0;
}

void rt_opts_defaults(const RtModel *m, RtOpts *o)
{
    memset(o, 0, sizeof *o);
    o->steps = 10;
    o->log_every = 1;
    o->lr = 1e-3;
    o->wd = m->optimizer == RT_ADAMW ? 0.01 : 0.0; /* PyTorch's defaults: AdamW 0.01, Adam and SGD 0 */
    o->momentum = 0;
    o->beta1 = 0.9;
    o->beta2 = 0.999;
    o->eps = 1e-8;
    o->accum = 1;
    o->trace_steps = 2;
    o->loss_scale_init = 65536;
    o->growth_interval = 2000;
    o->data_flag = "--data";
    o->tokens_flag = "--tokens";
}

int rt_opts_check(const RtModel *m, RtOpts *o)
{
    if (m->eval && !o->out_dir) {
        rt_err_set(2, "--out-dir DIR is required (see --help)");
        return -1;
    }
    if (o->random_windows && !o->tokens) {
        rt_err_set(2, "--random-windows draws the windows of --tokens FILE.bin, which is missing (see --help)");
        return -1;
    }
    if (o->random_windows && o->shuffle) {
        rt_err_set(2, "--random-windows draws every window at random; --shuffle permutes the fixed ones: give "
                      "one or the other (see --help)");
        return -1;
    }
    if (o->token_inputs && !o->tokens) {
        rt_err_set(2, "--token-inputs names the inputs fed by --tokens FILE.bin, which is missing (see --help)");
        return -1;
    }
    if (o->dump_grads && o->steps < 1) {
        rt_err_set(2, "--dump-grads writes the gradients of step 1; --steps 0 runs none (see --help)");
        return -1;
    }
    int val = o->nval_data > 0 || o->val_tokens;
    if ((o->eval_every || o->eval_steps || o->save_best) && !val) {
        rt_err_set(2, "%s validates on held-out data: give it with --val-data NAME=FILE.npy or --val-tokens "
                      "FILE.bin (see --help)", o->eval_every ? "--eval-every" : o->eval_steps ? "--eval-steps"
                                                                                           : "--save-best");
        return -1;
    }
    if (o->save_best && !o->ckpt_dir) {
        rt_err_set(2, "--save-best keeps its checkpoint in --ckpt-dir DIR/best: give --ckpt-dir (see --help)");
        return -1;
    }
    if (o->ckpt_every && !o->ckpt_dir) {
        rt_err_set(2, "--ckpt-every needs --ckpt-dir DIR (see --help)");
        return -1;
    }
    if (o->sched == RT_SCHED_CONSTANT && (o->set_decay || o->set_min_lr)) {
        rt_err_set(2, "--decay-steps and --min-lr shape --lr-schedule cosine, linear or wsd, which is not given "
                      "(see --help)");
        return -1;
    }
    if (o->wsd_decay && o->sched != RT_SCHED_WSD) {
        rt_err_set(2, "--wsd-decay-steps shapes --lr-schedule wsd, which is not given (see --help)");
        return -1;
    }
    if (o->static_scale && (o->set_scale_init || o->set_growth)) {
        rt_err_set(2, "--loss-scale S fixes the loss scale; --loss-scale-init and --loss-scale-growth-interval "
                      "shape the dynamic one: give one or the other (see --help)");
        return -1;
    }
    if (!o->set_decay)
        o->decay_steps = o->steps;
    if (!o->set_min_lr)
        o->min_lr = o->lr / 10;
    if (o->sched != RT_SCHED_CONSTANT && o->decay_steps <= o->warmup) {
        rt_err_set(2, "--lr-schedule decays after --warmup-steps %" PRId64 " until step %" PRId64
                      " (--decay-steps, default --steps): give a later one", o->warmup, o->decay_steps);
        return -1;
    }
    if (o->sched == RT_SCHED_WSD && !o->wsd_decay)
        o->wsd_decay = (o->decay_steps - o->warmup + 4) / 5;
    if (o->sched == RT_SCHED_WSD && o->wsd_decay > o->decay_steps - o->warmup) {
        rt_err_set(2, "--wsd-decay-steps %" PRId64 " is longer than the %" PRId64 " steps between --warmup-steps "
                      "and --decay-steps", o->wsd_decay, o->decay_steps - o->warmup);
        return -1;
    }
    return 0;
}

double rt_lr_at(const RtOpts *o, int64_t step)
{
    if (step <= o->warmup)
        return o->lr * (double)step / (double)o->warmup;
    if (o->sched == RT_SCHED_CONSTANT)
        return o->lr;
    if (step >= o->decay_steps)
        return o->min_lr;
    int64_t from = o->sched == RT_SCHED_WSD ? o->decay_steps - o->wsd_decay : o->warmup; /* the decay's start */
    if (step <= from)
        return o->lr; /* wsd's stable phase */
    double t = (double)(step - from) / (double)(o->decay_steps - from);
    if (o->sched == RT_SCHED_COSINE)
        return o->min_lr + 0.5 * (o->lr - o->min_lr) * (1 + cos(3.14159265358979323846 * t));
    return o->lr + (o->min_lr - o->lr) * t; /* linear, wsd's decay */
}

