/* rt_priv.h — private to runtime/ (rt.c, args.c, load.c, comm.c, export.c, eval.c);
 * never seen by generated code.  Needs <mpi.h>. */
#ifndef FSDPC_RT_PRIV_H
#define FSDPC_RT_PRIV_H

#include <mpi.h>
#include <stdint.h>

#include "rt.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the fsdpc runtime assumes a little-endian host (init file, .npy and ONNX raw_data are little-endian)"
#endif

/* The program name used as the prefix of every message ("NAME: error: ..."). */
extern const char *rt_prog;

/* Report a failed MPI call and bring every rank down (MPI_Abort when the
 * world has more than one rank).  Used through RT_MPI. */
_Noreturn void rt_mpi_fail(const char *file, int line, const char *call, int rc);

#define RT_MPI(call)                                              \
    do {                                                          \
        int rt_rc_ = (call);                                      \
        if (rt_rc_ != MPI_SUCCESS)                                \
            rt_mpi_fail(__FILE__, __LINE__, #call, rt_rc_);       \
    } while (0)

/* bytes per element of an RT_* dtype (0 if unknown) */
int64_t rt_elem_size(int dtype);
/* MPI datatype of an RT_* dtype, MPI_DATATYPE_NULL if none */
MPI_Datatype rt_mpi_type(int dtype);

/* Gather every rank's shard of shard_len elements into full (world*shard_len
 * elements, rank-major) on root, or on every rank when root < 0 (allgather).
 * Handles counts beyond INT_MAX.  full is only written on root. */
void rt_gather_shards(RtCtx *c, void *full, const void *shard, int64_t shard_len, int dtype, int root);

/* --export-onnx: collective over all ranks.  init_fd is the open init file.
 * Returns 0 on every rank if FILE was written, 1 on every rank otherwise
 * (the message has been printed by rank 0). */
int rt_export_onnx(RtCtx *c, const char *path, int init_fd, const char *init_path);

/* Start-up check on rank 0, so that a run does not train for hours and then
 * fail to export: the model is embedded and FILE's directory is writable.
 * Returns 0, or -1 with a one-line reason in err. */
int rt_export_check(const RtModel *m, const char *path, char *err, size_t errlen);

/* ------------------------------------------------ start-up errors (rt.c) */

/* Record this rank's first start-up error (exit status code: 1, or 2 for a
 * command-line error); rt.c agrees on it across ranks and prints it once. */
void rt_err_set(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Collective: did any rank fail?  The lowest failing rank prints its one
 * line; returns its exit status on every rank (0 if none failed). */
int rt_err_sync(void);

/* ---------------------------------------------------------- flags (args.c) */

typedef struct {
    const char *name, *file;
} RtDataArg;

typedef struct {
    RtDataArg *data;      /* --data (training) or --input (eval) NAME=FILE */
    int ndata;
    int64_t steps, log_every;
    double lr, wd, momentum, beta1, beta2, eps;
    int set_wd, set_momentum, set_beta1, set_beta2, set_eps;
    const char *metrics, *export_path, *init;
    const char *out_dir;  /* eval: --out-dir */
    const char *tokens;       /* --tokens FILE.bin (uint16 token stream) */
    const char *token_inputs; /* --token-inputs INPUT,LABELS (NULL: the defaults) */
    const char *dump_grads;   /* --dump-grads DIR */
    int quiet;
} RtOpts;

/* The flags of m's kind (training, or eval when m->eval).  0: run; 1: --help;
 * -1: error (rt_err_set called).  Free with rt_opts_free, whatever it returned. */
int rt_parse_flags(int argc, char **argv, const RtModel *m, RtOpts *o);
void rt_opts_free(RtOpts *o);
void rt_usage(const RtModel *m);

/* ------------------------------------------- init file and data (load.c) */

/* The memory of one rank, for the start-up report. */
typedef struct {
    uint64_t param, grad, optim, model_state, slots, arena, total;
    uint64_t init_param_read;     /* parameter bytes this rank read from the init file */
    uint64_t init_param_read_max; /* max over ranks (valid on rank 0 after start-up) */
} RtMem;

/* OUT.init beside the executable (from /proc/self/exe, else argv0); malloc'd */
char *rt_default_init_path(const char *argv0);
/* open and validate the init file; returns the fd, or -1 (rt_err_set called) */
int rt_open_init(const RtModel *m, const char *path, int is_default, uint64_t *size_out);
/* shard lengths, sizes, the one allocation and its carving into c; fills mem
 * but for init_param_read*.  Returns 0 or -1 (rt_err_set called). */
int rt_carve(RtCtx *c, RtMem *mem, char **base_out);
/* constants and this rank's parameter shards from the init file; adds the
 * parameter bytes read to mem->init_param_read.  Returns 0 or -1. */
int rt_load_init(RtCtx *c, int fd, const char *path, RtMem *mem);
/* all of start-up's init work, agreed across ranks: open and check the init
 * file (init, or the default beside argv0), carve the allocation, load it.
 * *path is malloc'd, *fd open.  Returns 0, or the exit status every rank uses. */
int rt_start_init(RtCtx *c, RtMem *mem, char **base, const char *init, const char *argv0, char **path,
                  int *fd);

/* "[2, 3]" ("[N, 3]" when first_any; "[]" for rank 0) into buf */
void rt_dims_str(char *buf, size_t cap, int rank, const int64_t *shape, int first_any);
/* Match the NAME=FILE arguments of flag (--data or --input) in o to the
 * model inputs: each names an input, each input has one.  files[i] = the file
 * of input i.  Returns 0 or -1 (rt_err_set called). */
int rt_match_inputs(const RtModel *m, const RtOpts *o, const char *flag, const char **files);

typedef struct RtFeed RtFeed;
/* The training data: per model input a mapped .npy (--data) or a view of the
 * token stream (--tokens: the tokens, or the labels = tokens shifted by one),
 * and the sample where the next global batch starts.  Every feed has the
 * same number of samples N (checked at open). */
typedef struct {
    RtFeed *feed;   /* m->ninput entries */
    int nfeed;
    int64_t rows;   /* N: samples in every feed */
    int64_t pos;    /* first sample of the next global batch */
    int64_t gstep;  /* samples per global batch, mod N */
    /* --tokens: the mapped file, its tokens (past an llm.c header, if any) */
    void *tok_map;
    size_t tok_map_len;
    const uint16_t *tok;
    int64_t ntok;
    int tok_input, tok_labels; /* model input indices fed from the stream (-1: none) */
} RtData;

/* match --data/--tokens to the model inputs, open and check every file;
 * returns 0 or -1 (rt_err_set called).  Close with rt_data_close, whatever
 * it returned. */
int rt_data_open(const RtModel *m, const RtOpts *o, int world, RtData *d);
/* Collective, after every rank's rt_data_open succeeded: do all ranks see the
 * same data (sample counts; --tokens: token count; checksums of the first and
 * last MiB of the token stream and of every .npy's data)?  0, or -1
 * (rt_err_set called on the ranks that differ from rank 0). */
int rt_data_agree(const RtOpts *o, const RtData *d);
/* this rank's samples of the next global batch into the arena; then advance */
void rt_data_next(RtCtx *c, RtData *d);
/* rank 0: one line on what --tokens feeds (nothing without --tokens) */
void rt_data_describe(const RtModel *m, const RtOpts *o, const RtData *d);
/* --tokens: which inputs it feeds, by --token-inputs or the defaults (the
 * first int64 rank-2 input, the other one).  0, or -1 with a one-line reason
 * in err.  Also used by --help (args.c). */
int rt_token_inputs(const RtModel *m, const char *spec, int *input, int *labels, char *err, size_t errlen);
void rt_data_close(const RtModel *m, RtData *d);

/* ------------------------------------------- forward-only builds (eval.c) */

/* The whole life of an eval executable between MPI_Init and MPI_Finalize
 * (rt_main calls it when m->eval); returns the exit status. */
int rt_eval_main(int argc, char **argv, const RtModel *m, int rank, int world);
/* DIR-relative file name (malloc'd, NULL if out of memory) of graph output
 * name: bytes outside [A-Za-z0-9_.-] and a leading '.' become '_', + ".npy" */
char *rt_output_file_name(const char *name);
/* --input FILE.pb: an ONNX TensorProto of exactly in's dtype and shape into
 * dst (rt_elem_size(dtype) * numel bytes).  Returns 0 or -1 (rt_err_set). */
int rt_read_tensor_pb(const RtInput *in, const char *path, void *dst);

#endif
