/* eval.c — the life of a forward-only executable (fsdpc --eval, m->eval = 1)
 * after its flags (args.c) and the control plane (rt.c): a check of the
 * model tables (tables.c), the output file names, the init file (constants only;
 * load.c), the --input files (.npy here, .pb in tensor_pb.c) copied into the
 * arena at their exact shapes and uploaded (rt_dev.h), --out-dir, one step,
 * then rank 0 downloads every graph output and writes it to DIR/<name>.npy
 * atomically (npy.c) and syncs DIR.
 *
 * Every rank runs the same checks and the step (a forward-only step has no
 * collectives; a single rank is the normal case); only rank 0 writes.
 * Start-up and write errors are agreed on by all ranks (rt_err_sync) and
 * printed once (err.c), as in training executables.
 *
 * Output file names: the graph output name, every byte outside
 * [A-Za-z0-9_.-] replaced by '_' and a leading '.' by '_' (never a path
 * escape, never a hidden file), then ".npy".  Two outputs that map to the
 * same name are an error.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kernels.h" /* k_bf16_from_f32, k_bf16_to_f32 (inline) */
#include "rt_dev.h"
#include "rt_priv.h"

#ifndef NAME_MAX
#define NAME_MAX 255
#endif

typedef struct {
    RtCtx ctx;
    const RtOpts *o;
    RtMem mem;
    char *init_path, *base;
    int init_fd;
    char **fname; /* per output: the file name inside --out-dir */
    char **path;  /* per output: DIR/fname */
} Eval;

/* ------------------------------------------------------------- output names */

char *rt_output_file_name(const char *name)
{
    size_t n = strlen(name);
    char *f = malloc(n + 5);
    if (!f)
        return NULL;
    for (size_t k = 0; k < n; k++) {
        unsigned char ch = (unsigned char)name[k];
        int ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' ||
                 ch == '.' || ch == '-';
        f[k] = ok && !(k == 0 && ch == '.') ? (char)ch : '_';
    }
    memcpy(f + n, ".npy", 5);
    return f;
}

/* file names and paths of every output; distinct, each fits NAME_MAX */
static int output_paths(Eval *e)
{
    const RtModel *m = e->ctx.m;
    const char *dir = e->o->out_dir;
    size_t dl = strlen(dir);
    int slash = dl > 0 && dir[dl - 1] == '/';
    e->fname = calloc((size_t)m->noutput + 1, sizeof *e->fname);
    e->path = calloc((size_t)m->noutput + 1, sizeof *e->path);
    if (!e->fname || !e->path) {
        rt_err_set(1, "out of memory");
        return -1;
    }
    for (int i = 0; i < m->noutput; i++) {
        const char *name = m->output[i].name;
        char *f = e->fname[i] = rt_output_file_name(name);
        if (!f || !(e->path[i] = malloc(dl + strlen(f) + 2))) {
            rt_err_set(1, "out of memory");
            return -1;
        }
        sprintf(e->path[i], "%s%s%s", dir, slash ? "" : "/", f);
        if (strlen(f) > NAME_MAX - 24) /* room for the temporary .NAME.XXXXXX */
            rt_err_set(1, "output '%.60s...': the name is too long for a file name (%zu bytes)", name, strlen(name));
        for (int j = 0; j < i; j++)
            if (strcmp(e->fname[j], f) == 0)
                rt_err_set(1, "outputs '%s' and '%s' would both be written to %s", m->output[j].name, name,
                           e->path[i]);
    }
    return 0;
}

/* rank 0, before --out-dir is made: no output file is an input (noclobber.c); 0, or -1 (rt_err_set) */
static int refuse_clobber(const Eval *e)
{
    RtInputs in;
    RtOpts v = *e->o;
    v.data_flag = "--input";
    int rc = rt_inputs_collect(&in, &v, e->init_path);
    for (int i = 0; rc == 0 && i < e->ctx.m->noutput; i++)
        rc = rt_inputs_refuse(&in, "--out-dir", e->path[i]);
    rt_inputs_free(&in);
    return rc;
}

/* ---------------------------------------------------------------- start-up */

/* ".npy" / ".pb" (any case) at the end of the file name, else "" */
static const char *extension(const char *file)
{
    const char *dot = strrchr(file, '.'), *slash = strrchr(file, '/');
    if (!dot || (slash && dot < slash))
        return "";
    static const char *const known[] = {".npy", ".pb"};
    for (size_t k = 0; k < 2; k++) {
        size_t n = strlen(known[k]);
        int same = strlen(dot) == n;
        for (size_t j = 0; same && j < n; j++)
            same = (dot[j] | 0x20) == known[k][j];
        if (same)
            return known[k];
    }
    return "";
}

/* the .npy dtype of a tensor of dtype dt: its own, float32 for bfloat16 (numpy has none) */
static int npy_dtype(int dt) { return dt == RT_BF16 ? RT_F32 : dt; }

/* FILE.npy of exactly in's dtype and shape into dst; a bfloat16 input
 * reads float32 (rounded to nearest even) or uint16 (the bits, as
 * numpy-only code and older onnx packages hold bfloat16) */
static int read_npy(const RtInput *in, const char *file, void *dst)
{
    NpyArray a;
    char why[1024];
    if (npy_open(file, &a, why, sizeof why) != 0) {
        rt_err_set(1, "--input %s: %s", in->name, why);
        return -1;
    }
    int bits = in->dtype == RT_BF16 && a.dtype == RT_U16;
    int want = bits ? RT_U16 : npy_dtype(in->dtype), same = a.dtype == want && a.rank == in->rank;
    for (int d = 0; same && d < in->rank; d++)
        same = a.shape[d] == in->shape[d];
    if (!same) {
        char want_s[256], got[256];
        rt_dims_str(want_s, sizeof want_s, in->rank, in->shape, 0);
        rt_dims_str(got, sizeof got, a.rank, a.shape, 0);
        rt_err_set(1, "--input %s: %s holds %s %s; input '%s' needs %s %s%s", in->name, file,
                   npy_dtype_name(a.dtype), got, in->name, npy_dtype_name(want), want_s,
                   in->dtype == RT_BF16 ? " (a bfloat16 input reads float32, or uint16 bits: numpy has no bfloat16)" : "");
        npy_close(&a);
        return -1;
    }
    if (in->dtype == RT_BF16 && !bits)
        for (size_t i = 0; i < a.nbytes / 4; i++)
            ((uint16_t *)dst)[i] = k_bf16_from_f32(((const float *)a.data)[i]);
    else if (a.nbytes)
        memcpy(dst, a.data, a.nbytes);
    npy_close(&a);
    return 0;
}

/* every --input into the arena */
static int read_inputs(Eval *e)
{
    const RtModel *m = e->ctx.m;
    const char **files = calloc((size_t)m->ninput + 1, sizeof *files);
    if (!files) {
        rt_err_set(1, "out of memory");
        return -1;
    }
    int rc = rt_match_inputs(m, e->o, "--input", files);
    for (int i = 0; rc == 0 && i < m->ninput; i++) {
        const RtInput *in = &m->input[i];
        char *dst = e->ctx.arena + in->arena_off;
        const char *ext = extension(files[i]);
        if (strcmp(ext, ".pb") == 0)
            rc = rt_read_tensor_pb(in, files[i], dst);
        else if (strcmp(ext, ".npy") == 0)
            rc = read_npy(in, files[i], dst);
        else {
            rt_err_set(1, "--input %s: %s: unknown file type (expected FILE.npy or FILE.pb)", in->name, files[i]);
            rc = -1;
        }
        if (rc == 0 && in->dtype == RT_BOOL) { /* kernels see 0/1 only */
            int64_t n = 1;
            for (int d = 0; d < in->rank; d++)
                n *= in->shape[d];
            for (int64_t k = 0; k < n; k++)
                dst[k] = dst[k] != 0;
        }
        if (rc == 0) {
            int64_t bytes = rt_elem_size(in->dtype);
            for (int d = 0; d < in->rank; d++)
                bytes *= in->shape[d];
            rt_dev_upload(&e->ctx, dst, bytes);
        }
    }
    free(files);
    return rc;
}

/* Everything before the step: the init file (constants) and the device
 * (load.c), the inputs, --out-dir.  Returns the exit status; 0 to run. */
static int start_up(Eval *e, const char *argv0)
{
    const RtModel *m = e->ctx.m;
    int status;
    rt_check_model(m);
    if ((status = rt_err_sync()) != 0)
        return status;
    output_paths(e);
    if ((status = rt_err_sync()) != 0)
        return status;
    status = rt_start_init(&e->ctx, &e->mem, &e->base, e->o, argv0, &e->init_path, &e->init_fd);
    if (status != 0)
        return status;
    read_inputs(e);
    if ((status = rt_err_sync()) != 0)
        return status;
    if (e->ctx.rank == 0 && refuse_clobber(e) == 0)
        rt_prepare_dir("--out-dir", e->o->out_dir);
    return rt_err_sync();
}

/* ------------------------------------------------------------------ outputs */

/* output out (bytes at data) to path: a bfloat16 output widened to float32 (exact; numpy has no bfloat16) */
static int save_output(const char *path, const RtOutput *out, const void *data, int64_t bytes, char *why,
                       size_t whylen)
{
    if (out->dtype != RT_BF16)
        return npy_save(path, out->dtype, out->rank, out->shape, data, why, whylen);
    float *f = malloc((size_t)bytes * 2 + 1);
    if (!f) {
        snprintf(why, whylen, "%s: out of memory", path);
        return -1;
    }
    for (int64_t i = 0; i < bytes / 2; i++)
        f[i] = k_bf16_to_f32(((const uint16_t *)data)[i]);
    int rc = npy_save(path, RT_F32, out->rank, out->shape, f, why, whylen);
    free(f);
    return rc;
}

/* rank 0: every output to its file, then sync the directory */
static void write_outputs(Eval *e)
{
    const RtModel *m = e->ctx.m;
    for (int i = 0; i < m->noutput; i++) {
        const RtOutput *out = &m->output[i];
        char why[1024], *data = e->ctx.arena + out->arena_off;
        int64_t bytes = rt_elem_size(out->dtype);
        for (int d = 0; d < out->rank; d++)
            bytes *= out->shape[d];
        rt_dev_download(&e->ctx, data, bytes);
        if (save_output(e->path[i], out, data, bytes, why, sizeof why) != 0) {
            rt_err_set(1, "output '%s': %s", out->name, why);
            return;
        }
        if (!e->o->quiet) {
            char dims[256];
            rt_dims_str(dims, sizeof dims, out->rank, out->shape, 0);
            printf("wrote %s (%s %s)\n", e->path[i], npy_dtype_name(npy_dtype(out->dtype)), dims);
        }
    }
    if (npy_sync_dir(e->o->out_dir) != 0)
        rt_err_set(1, "--out-dir %s: syncing the directory: %s", e->o->out_dir, strerror(errno));
    fflush(stdout);
}

static void release(Eval *e)
{
    const RtModel *m = e->ctx.m;
    rt_dev_finish(&e->ctx);
    for (int i = 0; i < m->noutput; i++) {
        if (e->fname)
            free(e->fname[i]);
        if (e->path)
            free(e->path[i]);
    }
    free(e->fname);
    free(e->path);
    if (e->init_fd >= 0)
        close(e->init_fd);
    free(e->init_path);
    free(e->base);
    free(e->ctx.slot);
    free(e->ctx.shard);
    free(e->ctx.shard_len);
}

int rt_eval_main(const RtOpts *o, const char *argv0, const RtModel *m, int rank, int world)
{
    Eval ev;
    Eval *e = &ev;
    memset(e, 0, sizeof *e);
    e->ctx.m = m;
    e->ctx.seed = rt_seed(m, 0);
    e->ctx.rank = rank;
    e->ctx.world = world;
    e->ctx.sf = world, e->ctx.srank = rank, e->ctx.accum = 1;
    e->o = o;
    e->init_fd = -1;

    int status = start_up(e, argv0);
    if (status == 0) {
        e->ctx.step = 1;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        rt_dev_step(&e->ctx);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
        if (rank == 0) {
            if (!e->o->quiet) {
                printf("forward pass of %s: %.2f ms\n", m->name ? m->name : "the model", ms);
                fflush(stdout);
            }
            write_outputs(e);
        }
        status = rt_err_sync();
    }
    release(e);
    return status;
}
