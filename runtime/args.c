/* args.c — the command line of a training or forward-only (eval) executable:
 * the options (RtOpts) with their defaults, --help text, and flag parsing.
 * Each kind rejects the other's flags; cpu builds reject the cuda target's
 * (--rendezvous, --no-cuda-graph).  Errors go through rt_err_set (status 2
 * for a bad command line), so that rt.c reports them once for all ranks.
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

static void usage_inputs(const RtModel *m)
{
    printf("\nModel inputs (one .npy each, N rows, or --tokens samples; b = rows per rank and step,\n"
           "so the global batch is b * ranks; at step s = 0, 1, ... rank r reads rows\n"
           "(s*b*ranks + r*b + i) mod N, i < b):\n");
    if (m->ninput == 0)
        printf("  (none)\n");
    for (int i = 0; i < m->ninput; i++) {
        const RtInput *in = &m->input[i];
        printf("  %-16s %s [", in->name, npy_dtype_name(in->dtype));
        for (int d = 0; d < in->rank && d < RT_MAX_RANK; d++) {
            if (d == 0)
                printf("N");
            else
                printf(", %" PRId64, in->shape[d]);
        }
        printf("]  (b = %" PRId64 ")\n", in->rank > 0 ? in->shape[0] : 0);
    }
    int ti, tl;
    char why[1024];
    if (rt_token_inputs(m, NULL, &ti, &tl, why, sizeof why) == 0)
        printf("--tokens feeds '%s' (tokens) and '%s' (labels: the tokens shifted by one) by default.\n",
               m->input[ti].name, m->input[tl].name);
}

/* the cuda target's flags (both kinds) */
static void usage_cuda(const RtModel *m)
{
    if (!m->target_cuda)
        return;
    printf("  --rendezvous SPEC       how the ranks find rank 0: file:PATH (a file every rank can\n"
           "                          read; rank 0 writes its address there), tcp:HOST:PORT (rank 0\n"
           "                          listens on PORT) or mpi (Open MPI's library, loaded at run\n"
           "                          time, broadcasts rank 0's address).  Default: MASTER_ADDR and\n"
           "                          MASTER_PORT, else under mpirun or srun mpi when libmpi.so.40\n"
           "                          loads ($FSDPC_MPI_LIB: another path, or none), else (mpirun,\n"
           "                          one node) a file in /tmp.  Ranks come from mpirun, srun, or\n"
           "                          RANK and WORLD_SIZE\n"
           "  --no-cuda-graph         run every step eagerly instead of replaying a CUDA Graph\n");
}

static void usage_fp16(const RtModel *m)
{
    if (!m->loss_scaling)
        return;
    printf("  --loss-scale-init S     built with --precision fp16: dynamic loss scaling starts at S\n"
           "                          (default 65536 = 2^16).  A step whose gradient overflows (a\n"
           "                          non-finite global norm, the same on every rank) is skipped and\n"
           "                          S halves; S doubles after N steps without one\n"
           "  --loss-scale-growth-interval N\n"
           "                          that N (default 2000)\n"
           "  --loss-scale S          a fixed loss scale instead (overflowing steps are still skipped)\n");
}

static void eval_usage(const RtModel *m)
{
    printf("usage: %s --out-dir DIR --input NAME=FILE ... [options]\n"
           "Runs the forward pass of %s once (built by fsdpc --eval) and writes every graph\n"
           "output to DIR/NAME.npy.\n"
           "\n"
           "  --input NAME=FILE       model input NAME from FILE.npy, or FILE.pb (a serialized ONNX\n"
           "                          TensorProto); one per input, of its exact dtype and shape\n"
           "  --out-dir DIR           where the outputs go (created if missing); required\n"
           "  --init FILE             constants (default: this executable's path + .init)\n"
           "  --quiet                 no progress lines\n"
           "  --help                  this text\n",
           rt_prog, m->name ? m->name : "the model");
    usage_cuda(m);
    printf("\nModel inputs:\n");
    char dims[256];
    if (m->ninput == 0)
        printf("  (none)\n");
    for (int i = 0; i < m->ninput; i++) {
        rt_dims_str(dims, sizeof dims, m->input[i].rank, m->input[i].shape, 0);
        printf("  %-16s %s %s\n", m->input[i].name, npy_dtype_name(m->input[i].dtype), dims);
    }
    printf("Model outputs:\n");
    if (m->noutput == 0 || !m->output)
        printf("  (none)\n");
    for (int i = 0; m->output && i < m->noutput; i++) {
        const RtOutput *out = &m->output[i];
        char *f = out->name ? rt_output_file_name(out->name) : NULL;
        rt_dims_str(dims, sizeof dims, out->rank, out->shape, 0);
        printf("  %-16s %s %s  -> DIR/%s\n", out->name ? out->name : "?", npy_dtype_name(out->dtype), dims,
               f ? f : "?");
        free(f);
    }
    fflush(stdout);
}

void rt_usage(const RtModel *m)
{
    if (m->eval) {
        eval_usage(m);
        return;
    }
    printf("usage: %s [options]            (one rank)\n"
           "       mpirun -np N %s [options]   (N ranks; or srun)\n"
           "Trains %s (built by fsdpc; optimizer %s).\n"
           "\n"
           "  --data NAME=FILE.npy    training data of model input NAME (one per input)\n"
           "  --tokens FILE.bin       a token stream (uint16 little-endian, as nanoGPT's train.bin;\n"
           "                          or llm.c's .bin with its 1024-byte header: version 1 uint16,\n"
           "                          version 2 uint32 tokens) feeding two int64\n"
           "                          [N, T] inputs: sample k is tokens [k*T, k*T+T) and its labels\n"
           "                          tokens [k*T+1, k*T+T+1); (ntokens-1)/T samples.  Other inputs\n"
           "                          still come from --data (with as many rows as samples)\n"
           "  --shuffle               each epoch visits the samples in its own order: a permutation of\n"
           "                          the N samples drawn from --seed and the epoch (a bijection, no\n"
           "                          table), the same at every world size; without it sample k of\n"
           "                          global position p is p mod N\n"
           "  --random-windows        --tokens: the window of global position p starts at a token\n"
           "                          drawn uniformly from [0, ntokens - T) by (--seed, p), as\n"
           "                          nanoGPT's get_batch (independent draws, the same at every world\n"
           "                          size; resumed runs continue the draws); validation keeps fixed\n"
           "                          windows\n"
           "  --seed S                seeds --shuffle, --random-windows and Dropout's masks (default 0:\n"
           "                          the build's dropout seed)\n"
           "  --token-inputs IN,LAB   the inputs --tokens feeds (default: the model's first int64\n"
           "                          [N, T] input and the other one, e.g. the labels input of\n"
           "                          --loss cross_entropy:logits,labels)\n"
           "  --val-data NAME=FILE.npy, --val-tokens FILE.bin\n"
           "                          held-out data, as --data / --tokens: the mean loss over it is\n"
           "                          computed every --eval-every K steps and after the last one,\n"
           "                          forward only (Dropout off, BatchNorm on its running statistics, as\n"
           "                          torch's eval mode; no optimizer state or statistic touched),\n"
           "                          sharded as training; the step line and --metrics get val_loss\n"
           "  --eval-every K          validate after every K-th step (default: after the last only)\n"
           "  --eval-steps N          batches per validation, from the set's start each time (default:\n"
           "                          one pass: its samples / the global batch, at least 1)\n"
           "  --save-best             keep the checkpoint of the best validation loss in --ckpt-dir's\n"
           "                          best/ (--resume DIR/best continues from it)\n"
           "  --steps N               optimizer steps (default 10)\n"
           "  --lr X                  learning rate (default 1e-3)\n"
           "  --weight-decay X        weight decay (default 0.01 for adamw, 0 for adam and sgd: PyTorch's);\n"
           "                          adamw decouples it (p -= lr*X*p), adam and sgd add X*p to the\n"
           "                          gradient\n"
           "  --no-decay PATTERN      the parameters weight decay skips: those whose ONNX name matches\n"
           "                          PATTERN (a glob; repeatable); default: every parameter of rank\n"
           "                          < 2 (biases, norm scales), as nanoGPT and Hugging Face do;\n"
           "                          --no-decay none: every parameter decays\n"
           "  --lr-mult PATTERN=X     the parameters whose ONNX name matches PATTERN (a glob;\n"
           "                          repeatable, the first match counts) train at X times the learning\n"
           "                          rate (and its schedule), as a PyTorch param group with lr*X\n"
           "  --momentum X            sgd momentum (default 0)\n"
           "  --nesterov              sgd: Nesterov momentum (torch.optim.SGD nesterov=True; needs\n"
           "                          --momentum > 0)\n"
           "  --beta1 X, --beta2 X    adamw/adam betas (default 0.9, 0.999)\n"
           "  --eps X                 adamw/adam epsilon (default 1e-8)\n"
           "  --clip-grad-norm X      scale the gradient to global L2 norm at most X before each\n"
           "                          update (torch.nn.utils.clip_grad_norm_; the norm over every\n"
           "                          rank's shard); metrics then report grad_norm (default: none)\n"
           "  --lr-schedule constant|cosine|linear|wsd\n"
           "                          every one: lr * s/W for steps s <= W (--warmup-steps W, default 0);\n"
           "                          then constant (the default): lr; cosine: cosine decay from lr to\n"
           "                          --min-lr X (default lr/10) at step --decay-steps D (default\n"
           "                          --steps), min-lr after it; linear: the same, linear; wsd\n"
           "                          (warmup-stable-decay): lr until D - K, then linear to min-lr at D\n"
           "                          (--wsd-decay-steps K, default (D - W)/5 rounded up)\n"
           "  --on-nonfinite stop|skip\n"
           "                          a step whose loss or gradient norm is not finite (NaN, inf) is\n"
           "                          never applied; stop (the default): the run stops there with an\n"
           "                          error, before any checkpoint or export of it; skip: the update is\n"
           "                          skipped (counted in the step line and --metrics) and training goes on\n"
           "  --metrics FILE.jsonl    rank 0 writes one JSON object per step\n"
           "  --trace FILE.json       a Chrome trace (chrome://tracing, Perfetto) of the first steps:\n"
           "                          every node of every rank, compute and collectives apart (cpu)\n"
           "  --trace-steps N         steps traced (default 2)\n"
           "  --accum K               gradient accumulation: each step runs K micro-steps of the batch\n"
           "                          this was built for and updates once: as a batch K times larger\n"
           "  --accum-mode comm|local comm (default): each micro-step's gradient is reduce-scattered into\n"
           "                          the gradient shards; local: summed in an unsharded gradient per unit\n"
           "                          (more memory), reduce-scattered once, after the last micro-step\n"
           "  --ckpt-dir DIR          sharded checkpoints DIR/step-NNNNNNNN (DIR/latest names the newest\n"
           "                          complete one) after every --ckpt-every K-th step and the last\n"
           "  --resume PATH           continue from a checkpoint (PATH, or a --ckpt-dir's latest): at\n"
           "                          its step + 1 up to --steps; any world size, --shard or layout of\n"
           "                          the same model\n"
           "  --export-onnx FILE.onnx write the trained model as ONNX at the end\n"
           "  --export-safetensors FILE\n"
           "                          write the trained parameters (and BatchNorm statistics) as\n"
           "                          safetensors at the end, named as the model's initializers\n"
           "  --init FILE             initial weights (default: this executable's path + .init)\n"
           "  --dump-grads DIR        after step 1, write the gradient of every parameter (averaged\n"
           "                          over the global batch, before the optimizer) to DIR/NAME.npy\n"
           "                          (rank 0; NAME sanitised as in --eval outputs; DIR is created)\n"
           "  --log-every N           print the step line of step 1, every N-th step and the\n"
           "                          last step (default 1: every step; --metrics gets all): loss, lr,\n"
           "                          grad norm (when computed), step time, tokens/s (or samples/s) over\n"
           "                          all ranks, TFLOPS and MFU per rank, peak memory, ETA\n"
           "  --peak-tflops X         the per-rank peak MFU is computed against (default: measured once\n"
           "                          at start on cpu, a float32 GEMM on this rank's BLAS threads; cuda:\n"
           "                          no MFU unless given)\n"
           "  --quiet                 no per-step lines\n"
           "  --help                  this text\n",
           rt_prog, rt_prog, m->name ? m->name : "the model", rt_opt_name(m->optimizer));
    usage_cuda(m);
    usage_fp16(m);
    usage_inputs(m);
    fflush(stdout);
}

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

static int is_file_flag(const char *flag)
{
    return !strcmp(flag, "--metrics") || !strcmp(flag, "--export-onnx") || !strcmp(flag, "--init") ||
           !strcmp(flag, "--out-dir") || !strcmp(flag, "--tokens") || !strcmp(flag, "--dump-grads") ||
           !strcmp(flag, "--ckpt-dir") || !strcmp(flag, "--resume") || !strcmp(flag, "--trace") ||
           !strcmp(flag, "--export-safetensors") || !strcmp(flag, "--val-tokens");
}

/* one known flag that takes a value */
static int set_flag(RtOpts *o, const char *flag, const char *val)
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
    if (rc != 0)
        return -1;
    if (*val == 0 && is_file_flag(flag)) {
        rt_err_set(2, "%s: empty file name", flag);
        return -1;
    }
    return 0;
}

/* flags that take a value: for training executables, for eval ones, for both */
static const char *const train_flags[] = {"--data", "--steps", "--lr", "--weight-decay", "--momentum",
                                          "--beta1", "--beta2", "--eps", "--metrics", "--export-onnx",
                                          "--log-every", "--tokens", "--token-inputs", "--dump-grads",
                                          "--clip-grad-norm", "--lr-schedule", "--warmup-steps", "--wsd-decay-steps",
                                          "--decay-steps", "--min-lr", "--ckpt-dir", "--ckpt-every", "--resume",
                                          "--accum", "--accum-mode", "--trace", "--trace-steps",
                                          "--export-safetensors", "--loss-scale-init",
                                          "--loss-scale-growth-interval", "--loss-scale", "--on-nonfinite",
                                          "--peak-tflops", "--seed", "--val-data", "--val-tokens",
                                          "--eval-every", "--eval-steps", "--no-decay", "--lr-mult"};
static const char *const eval_flags[] = {"--input", "--out-dir"};

static int in_list(const char *flag, const char *const *list, size_t n)
{
    for (size_t k = 0; k < n; k++)
        if (strcmp(flag, list[k]) == 0)
            return 1;
    return 0;
}

#define IN_LIST(flag, list) in_list(flag, list, sizeof list / sizeof list[0])

/* 0, or -1 for a cuda target's flag in a cpu build (rt_err_set called) */
static int cuda_only(const RtModel *m, const char *flag)
{
    if (m->target_cuda)
        return 0;
    rt_err_set(2, "%s: only for executables built with --target cuda", flag);
    return -1;
}

/* 1: a value flag of m's kind; 0: unknown; -1: the other kind's or target's (rt_err_set called) */
static int takes_value(const RtModel *m, const char *flag)
{
    if (strcmp(flag, "--init") == 0)
        return 1;
    if (strcmp(flag, "--rendezvous") == 0)
        return cuda_only(m, flag) == 0 ? 1 : -1;
    if (!strncmp(flag, "--loss-scale", 12) && IN_LIST(flag, train_flags) && !m->eval && !m->loss_scaling) {
        rt_err_set(2, "%s: loss scaling is for executables built with fsdpc --precision fp16; this one was not "
                      "(drop the flag, or rebuild with --precision fp16)", flag);
        return -1;
    }
    int train = IN_LIST(flag, train_flags), eval = IN_LIST(flag, eval_flags);
    if (m->eval && train) {
        rt_err_set(2, "%s is a training flag; this executable is forward-only (built with fsdpc --eval; "
                      "see --help)", flag);
        return -1;
    }
    if (!m->eval && eval) {
        rt_err_set(2, "%s is a flag of forward-only executables (fsdpc --eval); this one trains%s (see --help)",
                   flag, strcmp(flag, "--input") == 0 ? ": use --data NAME=FILE.npy" : "");
        return -1;
    }
    return train || eval;
}

static void set_defaults(const RtModel *m, RtOpts *o)
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

/* argv[*i] is "--flag", "--flag=value" or "--flag value" (then *i moves on).
 * 0: handled; 1: --help; -1: error. */
static int parse_one(int argc, char **argv, int *i, const RtModel *m, RtOpts *o)
{
    const char *a = argv[*i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
        return 1;
    if (strncmp(a, "--", 2) != 0 || a[2] == 0) {
        rt_err_set(2, "unexpected argument '%s' (see --help)", a);
        return -1;
    }
    char flag[64];
    const char *eq = strchr(a, '='), *val = NULL;
    size_t fl = eq ? (size_t)(eq - a) : strlen(a);
    if (fl >= sizeof flag) {
        rt_err_set(2, "unknown flag '%.40s...' (see --help)", a);
        return -1;
    }
    memcpy(flag, a, fl);
    flag[fl] = 0;
    int quiet = strcmp(flag, "--quiet") == 0, no_graph = strcmp(flag, "--no-cuda-graph") == 0;
    int shuffle = !m->eval && strcmp(flag, "--shuffle") == 0, best = !m->eval && strcmp(flag, "--save-best") == 0;
    int windows = !m->eval && strcmp(flag, "--random-windows") == 0;
    int nesterov = !m->eval && strcmp(flag, "--nesterov") == 0;
    if (quiet || no_graph || shuffle || best || windows || nesterov) {
        if (eq) {
            rt_err_set(2, "%s takes no value (see --help)", flag);
            return -1;
        }
        if (no_graph && cuda_only(m, flag) != 0)
            return -1;
        o->quiet |= quiet;
        o->no_cuda_graph |= no_graph;
        o->shuffle |= shuffle;
        o->save_best |= best;
        o->random_windows |= windows;
        o->nesterov |= nesterov;
        return 0;
    }
    int tv = takes_value(m, flag);
    if (tv < 0)
        return -1;
    if (tv == 0) {
        rt_err_set(2, "unknown flag '%s' (see --help)", flag);
        return -1;
    }
    if (eq)
        val = eq + 1;
    else if (*i + 1 < argc)
        val = argv[++*i];
    else {
        rt_err_set(2, "missing value for '%s' (see --help)", flag);
        return -1;
    }
    return set_flag(o, flag, val);
}

int rt_parse_flags(int argc, char **argv, const RtModel *m, RtOpts *o)
{
    set_defaults(m, o);
    o->data = calloc((size_t)argc + 1, sizeof *o->data);
    o->val_data = calloc((size_t)argc + 1, sizeof *o->val_data);
    o->no_decay = calloc((size_t)argc + 1, sizeof *o->no_decay);
    o->lr_mult = calloc((size_t)argc + 1, sizeof *o->lr_mult);
    if (!o->data || !o->val_data || !o->no_decay || !o->lr_mult) {
        rt_err_set(1, "out of memory");
        return -1;
    }
    /* past an error, go on (rt_err_set keeps the first): the control plane
     * starts anyway, to agree on it, and needs a later --rendezvous */
    int failed = 0;
    for (int i = 1; i < argc; i++) {
        int rc = parse_one(argc, argv, &i, m, o);
        if (rc == 1 && !failed)
            return 1;
        failed |= rc < 0;
    }
    if (failed)
        return -1;
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

void rt_opts_free(RtOpts *o)
{
    for (int k = 0; o->data && k < o->ndata; k++)
        free((char *)o->data[k].name);
    for (int k = 0; o->val_data && k < o->nval_data; k++)
        free((char *)o->val_data[k].name);
    free(o->data);
    free(o->val_data);
    free(o->no_decay);
    for (int k = 0; o->lr_mult && k < o->nlr_mult; k++)
        free((char *)o->lr_mult[k].pattern);
    free(o->lr_mult);
    o->data = o->val_data = NULL;
    o->no_decay = NULL;
    o->lr_mult = NULL;
    o->nno_decay = o->nlr_mult = 0;
    o->ndata = o->nval_data = 0;
}
