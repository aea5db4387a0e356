/* rt_priv.h — private to runtime/ (the target-neutral core: rt.c, opts.c, args.c, usage.c, runcfg.c,
 * load.c, data.c, export.c, eval.c, fatal.c, npy.c, tensor_pb.c; and the control
 * planes and device layers); never seen by generated code.  No MPI here:
 * the control plane is rt_ctl.h, the step's memory rt_dev.h. */
#ifndef FSDPC_RT_PRIV_H
#define FSDPC_RT_PRIV_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "npy.h" /* rt_elem_size, rt_pread_all, ... */
#include "rt.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the fsdpc runtime assumes a little-endian host (init file, .npy and ONNX raw_data are little-endian)"
#endif

/* ----------------------------------------------------- fatal errors (fatal.c) */

/* The program name used as the prefix of every message ("NAME: error: ..."). */
extern const char *rt_prog;

/* The first thread of the process to call it returns (again on every later
 * call); any other thread never returns: the process is going down.  Every
 * fatal path calls it before printing, so that one message is printed. */
void rt_fatal_claim(void);
/* "NAME: error: MESSAGE" on stderr, then rt_ctl_abort(code) */
_Noreturn void rt_fatal(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* --export-onnx / --export-safetensors (either path may be NULL): collective
 * over all ranks.  init_fd is the open init file.  Returns 0 on every rank if
 * the files were written, 1 on every rank otherwise (the message has been
 * printed by rank 0).  Unless quiet, rank 0 names the non-persistent buffers
 * the safetensors file leaves out. */
int rt_export(RtCtx *c, const char *onnx_path, const char *st_path, int init_fd, const char *init_path, int quiet);

/* Start-up check on rank 0, so that a run does not train for hours and then
 * fail to export: the model is embedded and FILE's directory is writable.
 * Returns 0, or -1 with a one-line reason in err. */
int rt_export_check(const RtModel *m, const char *flag, const char *path, char *err, size_t errlen);

/* ------------------------------------------- the progress record (progress.c) */

/* What this rank waits on with the other ranks: a node of the step (>= 0:
 * its collective), or the control plane's; and the step it is in.  Written
 * by the thread that makes the call (the step's, the communication thread:
 * never two waits at once), with relaxed stores only; seq counts the waits
 * begun, which every rank begins in the same order.  The cpu target's
 * watchdog (wd_mpi.c) reads it. */
enum { RT_WAIT_NONE = -1, RT_WAIT_ALLREDUCE = -2, RT_WAIT_BCAST = -3, RT_WAIT_GATHER = -4, RT_WAIT_BARRIER = -5,
       RT_WAIT_FIRST = -5 };
typedef struct {
    const RtModel *m; /* the step's (its node names); NULL before the first step */
    int64_t step, seq;
    int what;
} RtProgress;
void rt_progress_step(const RtModel *m, int64_t step);
void rt_progress_begin(int what);
void rt_progress_end(void);
void rt_progress_read(RtProgress *p);

/* A number of seconds from the environment variable `name`: `dflt` when
 * unset; set, a number in (0, 1e9]: '', 'inf', 'nan', '5s' are refused, not
 * read as the default or as never.  0, or -1 with a one-line reason in err.
 * Inline: the cuda device layer's self-test links no core. */
static inline int rt_env_seconds(const char *name, double dflt, double *seconds, char *err, size_t errlen)
{
    const char *t = getenv(name);
    *seconds = dflt;
    if (!t)
        return 0;
    char *end;
    double v = strtod(t, &end);
    if (!*t || *end || !(v > 0 && v <= 1e9)) { /* NaN fails too */
        char shown[41];
        size_t i = 0;
        for (; t[i] && i + 1 < sizeof shown; i++) /* printable: it is echoed in a one-line message */
            shown[i] = (unsigned char)t[i] < 0x20 || t[i] == 0x7f ? '?' : t[i];
        shown[i] = 0;
        snprintf(err, errlen, "%s='%s': expected a number of seconds > 0 and at most 1e9 (unset for the default, "
                 "%g)", name, shown, dflt);
        return -1;
    }
    *seconds = v;
    return 0;
}

/* FSDPC_STEP_TIMEOUT: the seconds one wait on the other ranks (a collective,
 * a step on the GPU) may make no progress before the job is brought down;
 * default 600. */
static inline int rt_step_timeout(double *seconds, char *err, size_t errlen)
{
    return rt_env_seconds("FSDPC_STEP_TIMEOUT", 600, seconds, err, errlen);
}

/* FSDPC_START_TIMEOUT: the seconds MPI's start-up (MPI_Init) and the ranks'
 * first agreement may take before a rank gives up on the others (ctl_mpi.c's
 * guard); default 600.  Apart from FSDPC_STEP_TIMEOUT: a launch across many
 * nodes can take longer than a short step timeout. */
static inline int rt_start_timeout(double *seconds, char *err, size_t errlen)
{
    return rt_env_seconds("FSDPC_START_TIMEOUT", 600, seconds, err, errlen);
}

/* start-up's guard (guard.c): from rt_guard_start to rt_guard_stop, a
 * thread gives the caller FSDPC_START_TIMEOUT seconds, then prints one line
 * naming the phase (a static string; rt_guard_phase changes it) and exits 1:
 * for MPI_Init and the first collectives, which no watchdog watches yet. */
void rt_guard_start(const char *phase);
void rt_guard_phase(const char *phase);
void rt_guard_stop(void);

/* ------------------------------------------------ start-up errors (err.c) */

/* Record this rank's first start-up error (exit status code: 1, or 2 for a
 * command-line error); rt_err_sync agrees on it across ranks and prints it once. */
void rt_err_set(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* where != NULL: every later rt_err_set message starts "WHERE: " (a run file's "PATH:LINE: key 'K'"), until
 * rt_err_where(NULL) */
void rt_err_where(const char *where);
/* Collective: did any rank fail?  The lowest failing rank prints its one
 * line; returns its exit status on every rank (0 if none failed). */
int rt_err_sync(void);
/* this rank's number in the error lines and rank-0 lines (rt_main, once the control plane has said it) */
void rt_err_rank(int rank);
/* this rank's recorded status (0: no error yet), and its error printed as one line on stderr: for use before
 * the control plane is up, when there is no one to agree with */
int rt_err_code(void);
void rt_err_print(void);
/* rank 0's one line "PROG: warning: ..." / "PROG: note: ..." on stderr (the other ranks say nothing) */
void rt_warn0(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void rt_note0(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* rank 0: directory dir of flag (--dump-grads, --out-dir) exists (created if
 * missing, one level) and is writable.  0, or -1 (rt_err_set called). */
int rt_prepare_dir(const char *flag, const char *dir);

/* FNV-1a-64 of n bytes at p, continuing h (RT_FNV0 to start): the checkpoint's checksums (ckpt.c) */
#define RT_FNV0 14695981039346656037ull
uint64_t rt_fnv(uint64_t h, const void *p, size_t n);

/* ------------------------------------------- run files (runcfg.c) */

/* The TOML subset of --config files and of a checkpoint's run.toml (runcfg.c's essay). */
#define RT_CFG_LINE 65536      /* the longest line read */
#define RT_CFG_MAX (1 << 20)   /* the largest file read */
enum { RT_CV_STR, RT_CV_INT, RT_CV_REAL, RT_CV_BOOL, RT_CV_ARRAY };
typedef struct {
    char *key;   /* as written, '_' read as '-' */
    int line;
    int type;    /* RT_CV_*: what was written */
    char **val;  /* nval strings, as the flag would take them: a string's bytes, a number's text (no '_', no
                  * leading '+'), "true" / "false", an array's strings */
    int nval;
} RtCfgEntry;
typedef struct {
    char *path;  /* for messages */
    RtCfgEntry *e;
    int n;
} RtCfg;
/* Read PATH (a regular file of at most RT_CFG_MAX bytes; nofollow: a link is refused) into c.  0; 1: no such
 * file and missing_ok; -1: rt_err_set(2, "WHAT PATH: ..." or "PATH:LINE: ...").  Free c with rt_cfg_free
 * whatever it returned. */
int rt_cfg_load(RtCfg *c, const char *what, const char *path, int nofollow, int missing_ok);
/* the n bytes of text (c->path names them) into c: 0, or -1 (rt_err_set(2, "PATH:LINE: ...")) */
int rt_cfg_parse(RtCfg *c, const char *text, size_t n);
void rt_cfg_free(RtCfg *c);

/* a growing string (bad: out of memory, the text is incomplete) */
typedef struct {
    char *s;
    size_t n, cap;
    int bad;
} RtStr;
void rt_str_add(RtStr *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s as a TOML basic string, quoted */
void rt_cfg_put_string(RtStr *b, const char *s);
/* v (finite) as a TOML float, in the fewest digits that read back as v */
void rt_cfg_put_real(RtStr *b, double v);

/* ------------------------------------------- options (opts.c, args.c) */

typedef struct {
    const char *name, *file;
} RtDataArg;

enum { RT_SCHED_CONSTANT, RT_SCHED_COSINE, RT_SCHED_LINEAR, RT_SCHED_WSD };

typedef struct {
    RtDataArg *data;      /* --data (training) or --input (eval) NAME=FILE */
    int ndata;
    RtDataArg *val_data;  /* --val-data NAME=FILE: the validation set's .npy per input */
    int nval_data;
    const char *val_tokens;   /* --val-tokens FILE.bin */
    int64_t eval_every;       /* --eval-every K (0: validate after the last step only) */
    int64_t eval_steps;       /* --eval-steps N (0: one pass over the validation set) */
    int save_best;            /* --save-best: keep the checkpoint of the best validation loss in
                               * --ckpt-dir/best */
    const char *data_flag, *tokens_flag; /* the flags in messages: --data/--tokens, or --val-data/--val-tokens */
    const char **no_decay;    /* --no-decay PATTERN: the parameters weight decay skips (none given: those of
                               * rank < 2; "none": every parameter decays) */
    int nno_decay;
    struct {
        const char *pattern;
        double mult;
    } *lr_mult;               /* --lr-mult PATTERN=X: the learning rate times X for the parameters PATTERN names
                               * (the first pattern that matches) */
    int nlr_mult;
    int64_t steps, log_every;
    double lr, wd, momentum, beta1, beta2, eps;
    int set_wd, set_momentum, set_beta1, set_beta2, set_eps;
    double clip;              /* --clip-grad-norm (0: none) */
    int sched;                /* --lr-schedule: RT_SCHED_* */
    int64_t wsd_decay;        /* --wsd-decay-steps K: wsd's decay phase (0: a fifth of the steps after warmup) */
    int64_t warmup, decay_steps; /* --warmup-steps, --decay-steps (0: --steps) */
    double min_lr;            /* --min-lr */
    int set_min_lr, set_decay;
    const char *ckpt_dir;     /* --ckpt-dir DIR */
    int64_t ckpt_every;       /* --ckpt-every K (0: at the end only) */
    const char *resume;       /* --resume PATH */
    const char *config;       /* --config FILE */
    int64_t accum;            /* --accum K: micro-steps per step (1) */
    int accum_local;          /* --accum-mode local */
    int skip_nonfinite;       /* --on-nonfinite skip (0: stop) */
    const char *trace;        /* --trace FILE.json */
    int64_t trace_steps;      /* --trace-steps N (2) */
    const char *metrics, *export_path, *init;
    const char *export_st;    /* --export-safetensors FILE */
    const char *out_dir;  /* eval: --out-dir */
    const char *tokens;       /* --tokens FILE.bin (uint16 token stream) */
    const char *token_inputs; /* --token-inputs INPUT,LABELS (NULL: the defaults) */
    const char *dump_grads;   /* --dump-grads DIR */
    const char *rendezvous;   /* --rendezvous SPEC (cuda target: rt_ctl_init) */
    int no_cuda_graph;        /* --no-cuda-graph (cuda target) */
    double loss_scale_init;   /* fp16 builds: --loss-scale-init S (65536), or the fixed --loss-scale S */
    int64_t growth_interval;  /* --loss-scale-growth-interval N (2000): S doubles after N good steps */
    int static_scale;         /* --loss-scale S given: S never changes (overflowing steps still skip) */
    int set_scale_init, set_growth;
    double peak_tflops;       /* --peak-tflops X (0: measured, cpu) */
    int shuffle;              /* --shuffle */
    int random_windows;       /* --random-windows (with --tokens) */
    int nesterov;             /* --nesterov (sgd) */
    int64_t seed;             /* --seed S (0) */
    int quiet;
    struct RtOptSrc *src;     /* where the options came from: the command line, --config, run.toml (opts.c) */
    char *run_toml;           /* the options a checkpoint keeps, as its run.toml */
    char *restored;           /* --resume: the start-up line on what its run.toml gave (NULL: no --resume) */
    uint64_t opts_hash;       /* of every option in force: the ranks agree on it (rt.c) */
    int from_files;           /* a --config file or a run.toml was read */
} RtOpts;
typedef struct RtOptSrc RtOptSrc;

/* The options of m's kind (training, or eval when m->eval): the command line's, over the --config file's,
 * over the --resume checkpoint's run.toml.  Every rank reads them itself (rt.c then checks that they agree).
 * 0: run; 1: --help; -1: error (rt_err_set called).  Free with rt_opts_free, whatever it returned. */
int rt_parse_flags(int argc, char **argv, const RtModel *m, RtOpts *o);
/* args.c: o's defaults for m; one flag's value (flag: "--NAME"; val: its text, kept by reference) into o,
 * 0 or -1 (rt_err_set called); the checks across options once all are in, 0 or -1 */
void rt_opts_defaults(const RtModel *m, RtOpts *o);
int rt_set_flag(RtOpts *o, const char *flag, const char *val);
int rt_opts_check(const RtModel *m, RtOpts *o);
/* the learning rate of 1-based step under o's schedule */
double rt_lr_at(const RtOpts *o, int64_t step);
void rt_opts_free(RtOpts *o);
void rt_usage(const RtModel *m);

/* ------------------------------- init file (load.c) and data (data.c) */

/* The memory of one rank, for the start-up report. */
typedef struct {
    uint64_t param, grad, optim, model_state, slots, arena, total;
    uint64_t accum;               /* --accum-mode local: the unsharded gradient sums */
    uint64_t init_param_read;     /* parameter bytes this rank read from the init file */
    uint64_t init_param_read_max; /* max over ranks (valid on rank 0 after start-up) */
} RtMem;

/* All of start-up's memory and init work, each step agreed across ranks:
 * plan the one allocation (shard lengths into c, sizes into mem), the
 * device (rt_dev_init, rt_dev_set_graph), open and check the init file
 * (o->init, or OUT.init beside the executable), carve the allocation, load
 * the constants and this rank's parameter shards, then the device copy
 * (rt_dev_attach).  mem is filled but for init_param_read_max.  *path is
 * malloc'd, *fd open.  Returns 0, or the exit status every
 * rank uses. */
int rt_start_init(RtCtx *c, RtMem *mem, char **base, const RtOpts *o, const char *argv0, char **path,
                  int *fd);

/* "[2, 3]" ("[N, 3]" when first_any; "[]" for rank 0) into buf */
void rt_dims_str(char *buf, size_t cap, int rank, const int64_t *shape, int first_any);
/* Match the NAME=FILE arguments of flag (--data or --input) in o to the
 * model inputs: each names an input, each input has one.  files[i] = the file
 * of input i.  Returns 0 or -1 (rt_err_set called). */
int rt_match_inputs(const RtModel *m, const RtOpts *o, const char *flag, const char **files);

typedef struct RtFeed RtFeed;
/* one file of a --tokens stream: the mapping, its tokens (past an llm.c header, if any: header 1),
 * little-endian, the stream's tok_bytes each, and where they sit in the stream */
typedef struct {
    char *path;
    void *map;
    size_t map_len;
    const unsigned char *tok;
    int header;
    int64_t first, n;
} RtTokSeg;
/* The training data: per model input a mapped .npy (--data) or a view of the
 * token stream (--tokens: the tokens, or the labels = tokens shifted by one),
 * and the sample where the next global batch starts.  Every feed has the
 * same number of samples N (checked at open). */
typedef struct {
    RtFeed *feed;   /* m->ninput entries */
    int nfeed;
    int64_t rows;   /* N: samples in every feed */
    int64_t pos;    /* the global position of the next global batch: samples read so far (a checkpoint
                     * written before --shuffle existed holds it modulo N) */
    int64_t gstep;  /* samples per global batch */
    int shuffle;    /* --shuffle: position p reads sample rt_shuffle(p mod N, N, seed, p / N) */
    int random_windows; /* --random-windows: position p's token window starts at rt_window(seed, p, ntok - T) */
    uint64_t seed;
    /* --tokens: the mapped files of the stream, in order (a glob's, by name) */
    RtTokSeg *seg;
    int nseg;
    int tok_bytes;            /* 2 (uint16: raw streams, llm.c version 1) or 4 (uint32: llm.c version 2) */
    int64_t ntok;             /* tokens in all of them */
    int tok_input, tok_labels; /* model input indices fed from the stream (-1: none) */
} RtData;

/* match --data/--tokens to the model inputs, open and check every file;
 * returns 0 or -1 (rt_err_set called).  Close with rt_data_close, whatever
 * it returned. */
int rt_data_open(const RtModel *m, const RtOpts *o, int world, RtData *d);
/* the place of i in a permutation of [0, n) drawn from (seed, epoch): an 8-round Feistel network on the
 * smallest 4^h >= n, walked until it lands below n (--shuffle) */
int64_t rt_shuffle(int64_t i, int64_t n, uint64_t seed, uint64_t epoch);
/* --random-windows: the first token of global position p's window, uniform in [0, n) from (seed, p),
 * as nanoGPT's get_batch draws them (independently, with replacement) */
int64_t rt_window(uint64_t seed, int64_t p, int64_t n);
/* optim_runs.c: c->opt_run / opt_nrun from --no-decay and --lr-mult (a pattern no parameter matches is an
 * error); print: the start-up line on weight decay.  0, or -1 (rt_err_set called).  Free with
 * rt_opt_runs_free. */
int rt_opt_runs(RtCtx *c, const RtOpts *o, int print);
void rt_opt_runs_free(RtCtx *c);
/* the name of an optimizer code (RT_ADAMW, ...; a checkpoint's may be anything) */
static inline const char *rt_opt_name(int o)
{
    return o == RT_ADAMW ? "adamw" : o == RT_ADAM ? "adam" : o == RT_SGD ? "sgd" : "unknown";
}
/* Dropout's seed for --seed S: the build's seed when S = 0 (the default), another one per S */
static inline uint64_t rt_seed(const RtModel *m, int64_t s) { return m->dropout_seed + (uint64_t)s * 0x9e3779b97f4a7c15ull; }
/* Collective, after every rank's rt_data_open succeeded: do all ranks see the
 * same data (sample counts; --tokens: token count; checksums of the first and
 * last MiB of the token stream and of every .npy's data)?  0, or -1
 * (rt_err_set called on the ranks that differ from rank 0). */
int rt_data_agree(const RtOpts *o, const RtData *d, int rank);
/* this rank's samples of the next global batch into the arena (and to the
 * device: rt_dev_upload); then advance */
void rt_data_next(RtCtx *c, RtData *d);
/* rank 0: one line on what --tokens feeds (nothing without --tokens) */
void rt_data_describe(const RtModel *m, const RtOpts *o, const RtData *d);
/* --tokens: which inputs it feeds, by --token-inputs or the defaults (the
 * first int64 rank-2 input, the other one).  0, or -1 with a one-line reason
 * in err.  Also used by --help (args.c). */
int rt_token_inputs(const RtModel *m, const char *spec, int *input, int *labels, char *err, size_t errlen);
void rt_data_close(const RtModel *m, RtData *d);

/* ------------------------------------------- forward-only builds (eval.c) */

/* The life of an eval executable after its flags and rt_ctl_init (rt_main
 * calls it when m->eval); returns the exit status. */
int rt_eval_main(const RtOpts *o, const char *argv0, const RtModel *m, int rank, int world);
/* DIR-relative file name (malloc'd, NULL if out of memory) of graph output
 * name: bytes outside [A-Za-z0-9_.-] and a leading '.' become '_', + ".npy" */
char *rt_output_file_name(const char *name);
/* --input FILE.pb: an ONNX TensorProto of exactly in's dtype and shape into
 * dst (rt_elem_size(dtype) * numel bytes).  Returns 0 or -1 (rt_err_set). */
int rt_read_tensor_pb(const RtInput *in, const char *path, void *dst);

/* For the reduce-scatters of comm.c / comm_nccl.c: checks that numel fits
 * c->sf shards of shard_len (es-byte elements; else rt_step_fail naming
 * what), zeroes full's padding [numel, sf*shard_len) so that it carries
 * nothing into the sum (rt_memset: on the device on cuda) and returns
 * sf*shard_len.  Inline: the device layer's self-test links no core. */
static inline int64_t rt_rs_prepare(RtCtx *c, const char *what, void *full, int64_t numel, int64_t shard_len, int64_t es)
{
    int64_t total = (int64_t)c->sf * shard_len;
    if (shard_len < 0 || numel < 0 || numel > total)
        rt_step_fail(c, "%s: numel %lld does not fit %d shards of %lld", what, (long long)numel, c->sf,
                     (long long)shard_len);
    if (total > numel)
        rt_memset((char *)full + numel * es, 0, (total - numel) * es);
    return total;
}


/* ckpt.c: a checkpoint of the state after step into DIR/step-NNNNNNNN, or
 * DIR/SUB/step-NNNNNNNN when sub is not NULL (--save-best: "best"); DIR
 * (made if missing) may be a link, SUB may not (pos: the data position the
 * next step reads from; run_toml: the run's options, rank 0 writes them as
 * run.toml); collective, returns the exit status every rank uses */
int rt_ckpt_save(RtCtx *c, const char *dir, const char *sub, int64_t step, int64_t pos, const char *run_toml);
/* rank 0, after a save into DIR[/SUB]: remove its other step-N checkpoints (--save-best keeps one), never
 * following a link */
void rt_ckpt_prune(const char *dir, const char *sub, int64_t keep);
/* the checkpoint folder of --resume PATH (PATH itself, or PATH/latest's) into dir: 0, or -1 (rt_err_set
 * unless quiet) */
int rt_ckpt_resolve(const char *path, char *dir, size_t cap, int quiet);
/* --resume PATH: this rank's shards and the persistent state from a
 * checkpoint of the same model (any world size, strategy or layout) after
 * the init file was loaded; *step, *pos: where it was taken.  Collective;
 * returns the exit status. */
int rt_ckpt_resume(RtCtx *c, const char *path, int64_t *step, int64_t *pos);

/* noclobber.c: rank 0, before anything is written: the run's input files
 * (o's data and token files, the init file, the executable, the --resume
 * checkpoint's files) by identity, and the checks that no output is one */
typedef struct {
    const char *flag;     /* --data, --tokens, ..., "init"; NULL: path describes it */
    char *path;
    dev_t dev;
    ino_t ino;
    int resume;           /* a file of the --resume checkpoint */
} RtInFile;
typedef struct {
    RtInFile *f;
    int n;
} RtInputs;
/* 0, or -1 (out of memory: rt_err_set) */
int rt_inputs_collect(RtInputs *in, const RtOpts *o, const char *init_path);
void rt_inputs_free(RtInputs *in);
/* -1 and rt_err_set (one line naming both) when out, written by flag, is one of in's files; else 0 */
int rt_inputs_refuse(const RtInputs *in, const char *flag, const char *out);
/* -1 and rt_err_set when a save or prune in --ckpt-dir dir would overwrite or remove an input; else 0 */
int rt_inputs_refuse_ckpt(const RtInputs *in, const char *dir);

/* tables.c: the model tables the compiler emitted are consistent (training or forward-only, by m->eval);
 * 0, or -1 (rt_err_set(1, "corrupt model tables: ...") called) */
int rt_check_model(const RtModel *m);

/* dumpgrads.c (--dump-grads DIR): rank 0's plan of the files, and where each parameter's gradient goes */
typedef struct {
    char **path;                       /* per parameter: DIR/<name>.npy */
    int *rank;                         /* per parameter: -1 = unknown (written flat) */
    int64_t (*shape)[RT_MAX_RANK];
} RtDump;
/* rank 0, at start-up: DIR, distinct file names that fit, the shapes into d; 0, or -1 (rt_err_set called) */
int rt_dump_prepare(const RtModel *m, const char *dir, int init_fd, const RtInputs *in, RtDump *d);
/* collective, after step 1: the gradients to rank 0, one file per parameter, divided by the loss scale step 1
 * ran with (scale; 0: none); returns the exit status (0: go on) */
int rt_dump_grads(RtCtx *c, const RtDump *d, const char *dir, int quiet, double scale);
/* d's memory released; d zeroed (so a second call does nothing) */
void rt_dump_free(const RtModel *m, RtDump *d);

/* trace.c (--trace): record the first `steps` steps' node stamps (rt_trace);
 * then write them, every rank's, as one Chrome trace (collective; returns the
 * exit status) */
int rt_trace_start(RtCtx *c, int64_t steps);
/* the communication thread: the collective of node ran from t0 to t1 (rt_now_ns) */
void rt_trace_coll(RtCtx *c, int node, int64_t t0, int64_t t1);
int64_t rt_now_ns(void);
int rt_trace_write(RtCtx *c, const char *path);

/* rdv_mpi.c (the cuda target's control plane): rank 0's cap-byte line to
 * every rank through Open MPI loaded at run time.  1: done; 0: no MPI
 * library here (nothing happened); -1: err. */
int rt_rdv_mpi(char *line, int cap, int rank, int world, char *err, size_t errlen);

#endif
