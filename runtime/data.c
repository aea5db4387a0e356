/* data.c — the training data a rank reads at start-up and per step: match
 * --data and --tokens to the model inputs, check the .npy files, map the
 * token stream, agree on the data across ranks, and copy each step's samples
 * into the arena and upload them.  A file that shrinks under the run ends it
 * with one line (the SIGBUS guard of npy.h), never a signal.
 * Errors go through rt_err_set; err.c agrees on them across ranks.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <glob.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rt_ctl.h"
#include "rt_dev.h"
#include "rt_priv.h"

enum { FEED_NPY = 0, FEED_TOKENS = 1, FEED_LABELS = 2 };

struct RtFeed {
    int kind;          /* FEED_* */
    NpyArray *part;    /* FEED_NPY: the file's array, or a glob's files' in name order, rows one after another */
    int64_t *first;    /*   the first row of each */
    int npart;
    const char *file;
    int64_t rows;      /* samples */
    uint64_t row_bytes;
};

void rt_dims_str(char *buf, size_t cap, int rank, const int64_t *shape, int first_any)
{
    size_t n = 0;
    if (cap == 0)
        return;
    buf[0] = 0;
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (int d = 0; d < rank && d < RT_MAX_RANK && n < cap; d++) {
        if (d == 0 && first_any)
            n += (size_t)snprintf(buf + n, cap - n, "N");
        else
            n += (size_t)snprintf(buf + n, cap - n, d ? ", %" PRId64 : "%" PRId64, shape[d]);
    }
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
}

/* "a, b, c" of the model inputs (all, or those with int64_2d set) into buf */
static void input_list(char *buf, size_t cap, const RtModel *m, int int64_2d)
{
    size_t n = 0;
    int k = 0;
    buf[0] = 0;
    for (int i = 0; i < m->ninput && n < cap; i++) {
        if (int64_2d && !(m->input[i].dtype == RT_I64 && m->input[i].rank == 2))
            continue;
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", k++ ? ", " : "", m->input[i].name);
    }
    if (k == 0)
        snprintf(buf, cap, "none");
}

static int find_input(const RtModel *m, const char *name, size_t len)
{
    for (int i = 0; i < m->ninput; i++)
        if (strlen(m->input[i].name) == len && strncmp(m->input[i].name, name, len) == 0)
            return i;
    return -1;
}

int rt_token_inputs(const RtModel *m, const char *spec, int *input, int *labels, char *err, size_t errlen)
{
    char list[1024];
    int pick[2] = {-1, -1};
    if (spec) {
        const char *comma = strchr(spec, ',');
        if (!comma || comma == spec || comma[1] == 0 || strchr(comma + 1, ',')) {
            snprintf(err, errlen, "--token-inputs expects INPUT,LABELS (two model input names), got '%s'", spec);
            return -1;
        }
        const char *name[2] = {spec, comma + 1};
        size_t len[2] = {(size_t)(comma - spec), strlen(comma + 1)};
        for (int k = 0; k < 2; k++) {
            pick[k] = find_input(m, name[k], len[k]);
            if (pick[k] < 0) {
                input_list(list, sizeof list, m, 0);
                snprintf(err, errlen, "--token-inputs: the model has no input '%.*s' (model inputs: %s)",
                         (int)len[k], name[k], list);
                return -1;
            }
        }
        if (pick[0] == pick[1]) {
            snprintf(err, errlen, "--token-inputs: INPUT and LABELS are both '%s'; they must be two inputs",
                     m->input[pick[0]].name);
            return -1;
        }
        for (int k = 0; k < 2; k++) {
            const RtInput *in = &m->input[pick[k]];
            if (in->dtype != RT_I64 || in->rank != 2) {
                char dims[256];
                rt_dims_str(dims, sizeof dims, in->rank, in->shape, 1);
                snprintf(err, errlen, "--token-inputs: input '%s' is %s %s; --tokens feeds int64 [N, T] inputs",
                         in->name, npy_dtype_name(in->dtype), dims);
                return -1;
            }
        }
    } else {
        int n = 0;
        for (int i = 0; i < m->ninput; i++)
            if (m->input[i].dtype == RT_I64 && m->input[i].rank == 2) {
                if (n < 2)
                    pick[n] = i;
                n++;
            }
        input_list(list, sizeof list, m, 1);
        if (n < 2) {
            snprintf(err, errlen, "--tokens feeds two int64 [N, T] inputs (the tokens and the next-token labels, "
                     "e.g. from --loss cross_entropy:logits,labels); the model has %d (%s)", n, list);
            return -1;
        }
        if (n > 2) {
            snprintf(err, errlen, "--tokens: the model has %d int64 [N, T] inputs (%s); say which two it feeds "
                     "with --token-inputs INPUT,LABELS", n, list);
            return -1;
        }
    }
    const RtInput *a = &m->input[pick[0]], *b = &m->input[pick[1]];
    if (a->shape[1] != b->shape[1] || a->shape[1] < 1) {
        snprintf(err, errlen, "--tokens: inputs '%s' [N, %" PRId64 "] and '%s' [N, %" PRId64 "] must have the "
                 "same sequence length T >= 1", a->name, a->shape[1], b->name, b->shape[1]);
        return -1;
    }
    *input = pick[0];
    *labels = pick[1];
    return 0;
}

/* every NAME=FILE of flag must name an input, and none one fed by --tokens */
static int check_data_names(const RtModel *m, const RtOpts *o, const char *flag, const char *skip)
{
    for (int k = 0; k < o->ndata; k++) {
        int found = -1;
        for (int i = 0; i < m->ninput; i++)
            if (strcmp(m->input[i].name, o->data[k].name) == 0)
                found = i;
        if (found < 0) {
            char list[1024];
            input_list(list, sizeof list, m, 0);
            rt_err_set(1, "%s %s: the model has no input '%s' (model inputs: %s)", flag, o->data[k].name,
                       o->data[k].name, list);
            return -1;
        }
        if (skip && skip[found]) {
            rt_err_set(2, "%s %s: input '%s' is fed by %s %s; drop one of the two", flag, o->data[k].name,
                       o->data[k].name, o->tokens_flag, o->tokens);
            return -1;
        }
    }
    return 0;
}

/* rt_match_inputs, but inputs with skip[i] set need no file (files[i] = NULL) */
static int match_inputs(const RtModel *m, const RtOpts *o, const char *flag, const char **files, const char *skip)
{
    if (check_data_names(m, o, flag, skip) != 0)
        return -1;
    for (int i = 0; i < m->ninput; i++) {
        const RtInput *in = &m->input[i];
        files[i] = NULL;
        if (skip && skip[i])
            continue;
        int k;
        for (k = 0; k < o->ndata; k++)
            if (strcmp(in->name, o->data[k].name) == 0)
                break;
        if (k == o->ndata) {
            char want[256];
            rt_dims_str(want, sizeof want, in->rank, in->shape, !m->eval);
            rt_err_set(1, "no data for model input '%s' (%s %s): pass %s %s=FILE.npy%s", in->name,
                       npy_dtype_name(in->dtype), want, flag, in->name, m->eval ? " (or FILE.pb)" : "");
            return -1;
        }
        files[i] = o->data[k].file;
    }
    return 0;
}

int rt_match_inputs(const RtModel *m, const RtOpts *o, const char *flag, const char **files)
{
    return match_inputs(m, o, flag, files, NULL);
}

/* How many files spec names: itself, or, for a glob pattern (*, ?, [), its files in name order, held by gl
 * (globfree it whatever this returns; file k is then gl->gl_pathv[k], else spec).  The count, or -1
 * (rt_err_set called, naming what). */
static int64_t files_of(const char *what, const char *spec, glob_t *gl)
{
    if (!strpbrk(spec, "*?["))
        return 1;
    int g = glob(spec, GLOB_ERR, NULL, gl);
    if (g != 0) {
        rt_err_set(1, "%s: %s", what, g == GLOB_NOMATCH ? "no file matches the pattern"
                                                        : "cannot read the directories of the pattern");
        return -1;
    }
    return (int64_t)gl->gl_pathc;
}

/* Which of n parts, the k-th starting at element first(k) of a stream (first(0) = 0, increasing), holds
 * element i: the last starting at or before it.  first(k) is the int64 at base + k * stride bytes. */
static int part_of(const void *base, size_t stride, int n, int64_t i)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (*(const int64_t *)(const void *)((const char *)base + (size_t)mid * stride) <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* open f->file (one .npy, or a glob pattern: *, ?, [ — its files in name order, rows read as one array) and
 * check each against input in (dtype, shape past the rows) */
static int open_feed(const char *flag, const RtInput *in, RtFeed *f)
{
    glob_t gl = {0};
    char what[512];
    snprintf(what, sizeof what, "%s %s: %s", flag, in->name, f->file);
    int64_t n = files_of(what, f->file, &gl);
    if (n < 0) {
        globfree(&gl);
        return -1;
    }
    f->part = calloc((size_t)n + 1, sizeof *f->part);
    f->first = calloc((size_t)n + 1, sizeof *f->first);
    int rc = f->part && f->first ? 0 : -1;
    if (rc)
        rt_err_set(1, "out of memory");
    for (int64_t k = 0; rc == 0 && k < n; k++) {
        const char *file = gl.gl_pathc ? gl.gl_pathv[k] : f->file;
        NpyArray *a = &f->part[k];
        char why[1024];
        if (npy_open(file, a, why, sizeof why) != 0) {
            rt_err_set(1, "%s %s: %s", flag, in->name, why);
            rc = -1;
            break;
        }
        f->npart++;
        int same = a->dtype == in->dtype && a->rank == in->rank;
        for (int d = 1; same && d < in->rank; d++)
            same = a->shape[d] == in->shape[d];
        if (!same) {
            char want[256], got[256];
            rt_dims_str(want, sizeof want, in->rank, in->shape, 1);
            rt_dims_str(got, sizeof got, a->rank, a->shape, 0);
            rt_err_set(1, "%s %s: %s holds %s %s; input '%s' needs %s %s", flag, in->name, file,
                       npy_dtype_name(a->dtype), got, in->name, npy_dtype_name(in->dtype), want);
            rc = -1;
        } else if (a->shape[0] < 1) {
            rt_err_set(1, "%s %s: %s has no rows", flag, in->name, file);
            rc = -1;
        } else {
            f->first[k] = f->rows;
            f->rows += a->shape[0];
            f->row_bytes = (uint64_t)a->nbytes / (uint64_t)a->shape[0];
        }
    }
    globfree(&gl);
    return rc;
}

/* row r of feed f (0 <= r < rows): a pointer to it, and how many rows follow it in its file */
static const char *row_at(const RtFeed *f, int64_t r, int64_t *run)
{
    int lo = part_of(f->first, sizeof *f->first, f->npart, r);
    *run = f->first[lo] + f->part[lo].shape[0] - r;
    return f->part[lo].data + (uint64_t)(r - f->first[lo]) * f->row_bytes;
}

/* llm.c's .bin header: 256 int32 LE, [0] = magic, [1] = version (1: uint16
 * tokens, 2: uint32), [2] = number of tokens */
#define LLMC_MAGIC 20240520
#define LLMC_HEADER 1024

static uint32_t le32(const unsigned char *b)
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* map one token file into d's next segment: a raw stream of uint16 LE tokens, or one with llm.c's header
 * (uint16 or uint32 tokens); every segment has the first one's token width */
static int map_tokens(const RtOpts *o, const char *path, RtData *d)
{
    RtTokSeg *sg = &d->seg[d->nseg];
    struct stat st;
    int fd = rt_open_regular(path, &st);
    if (fd < 0) {
        rt_err_set(1, "%s %s: %s", o->tokens_flag, path, rt_open_why(fd));
        return -1;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size == 0 || size > (uint64_t)SIZE_MAX) {
        rt_err_set(1, "%s %s: %s", o->tokens_flag, path, size ? "too large to map" : "the file is empty");
        close(fd);
        return -1;
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd);
    if (map == MAP_FAILED) {
        rt_err_set(1, "%s %s: cannot map it: %s", o->tokens_flag, path, strerror(map_errno));
        return -1;
    }
    sg->map = map;
    sg->map_len = (size_t)size;
    d->nseg++;
    const unsigned char *b = map;
    uint64_t off = 0, ntok;
    int w = 2;
    if (size >= LLMC_HEADER && le32(b) == LLMC_MAGIC) {
        uint32_t version = le32(b + 4);
        ntok = le32(b + 8);
        if (version != 1 && version != 2) {
            rt_err_set(1, "%s %s: llm.c token file version %u; fsdpc reads versions 1 (uint16 tokens) and 2 "
                          "(uint32 tokens), or a raw uint16 stream", o->tokens_flag, path, version);
            return -1;
        }
        w = version == 1 ? 2 : 4;
        if (size != LLMC_HEADER + (uint64_t)w * ntok) {
            rt_err_set(1, "%s %s: its llm.c header says %" PRIu64 " %s tokens (%" PRIu64 " bytes with the "
                          "header), the file has %" PRIu64 " bytes", o->tokens_flag, path, ntok,
                       version == 1 ? "uint16" : "uint32", LLMC_HEADER + (uint64_t)w * ntok, size);
            return -1;
        }
        off = LLMC_HEADER;
        sg->header = 1;
    } else {
        if (size % 2 != 0) {
            rt_err_set(1, "%s %s: %" PRIu64 " bytes, an odd number: not a stream of uint16 tokens", o->tokens_flag,
                       path, size);
            return -1;
        }
        ntok = size / 2;
    }
    if (d->nseg > 1 && w != d->tok_bytes) {
        rt_err_set(1, "%s %s: %s tokens, but %s holds %s ones: the files of one stream share a token width",
                   o->tokens_flag, path, w == 2 ? "uint16" : "uint32", d->seg[0].path, w == 2 ? "uint32" : "uint16");
        return -1;
    }
    d->tok_bytes = w;
    sg->tok = b + off;
    sg->first = d->ntok;
    sg->n = (int64_t)ntok;
    d->ntok += (int64_t)ntok;
    return 0;
}

/* o->tokens: one file, or a glob pattern (*, ?, [) whose files, in name order, are read as one stream */
static int open_tokens(const RtOpts *o, int64_t T, RtData *d)
{
    glob_t gl = {0};
    int rc = 0;
    char what[512];
    snprintf(what, sizeof what, "%s %s", o->tokens_flag, o->tokens);
    int64_t n = files_of(what, o->tokens, &gl);
    if (n < 0) {
        globfree(&gl);
        return -1;
    }
    d->seg = calloc((size_t)n + 1, sizeof *d->seg);
    if (!d->seg) {
        globfree(&gl);
        rt_err_set(1, "out of memory");
        return -1;
    }
    for (int64_t k = 0; rc == 0 && k < n; k++) {
        d->seg[d->nseg].path = strdup(gl.gl_pathc ? gl.gl_pathv[k] : o->tokens);
        if (!d->seg[d->nseg].path) {
            rt_err_set(1, "out of memory");
            rc = -1;
        } else {
            rc = map_tokens(o, d->seg[d->nseg].path, d);
        }
    }
    globfree(&gl);
    if (rc == 0 && d->ntok < T + 1) {
        rt_err_set(1, "%s %s: %" PRId64 " tokens; one sample of T = %" PRId64 " needs at least %" PRId64,
                   o->tokens_flag, o->tokens, d->ntok, T, T + 1);
        rc = -1;
    }
    return rc;
}

/* token i of the stream (0 <= i < ntok): a pointer to it, and how many tokens follow it in its file */
static const unsigned char *tok_at(const RtData *d, int64_t i, int64_t *run)
{
    const RtTokSeg *sg = &d->seg[part_of(&d->seg[0].first, sizeof *d->seg, d->nseg, i)];
    *run = sg->first + sg->n - i;
    return sg->tok + (i - sg->first) * d->tok_bytes;
}

/* the feeds of --tokens: which inputs, the mapped stream */
static int open_token_feeds(const RtModel *m, const RtOpts *o, RtData *d, char *skip)
{
    char why[1024];
    if (rt_token_inputs(m, o->token_inputs, &d->tok_input, &d->tok_labels, why, sizeof why) != 0) {
        rt_err_set(o->token_inputs ? 2 : 1, "%s", why);
        return -1;
    }
    int64_t T = m->input[d->tok_input].shape[1];
    if (open_tokens(o, T, d) != 0)
        return -1;
    int64_t N = (d->ntok - 1) / T;
    int idx[2] = {d->tok_input, d->tok_labels};
    for (int k = 0; k < 2; k++) {
        RtFeed *f = &d->feed[idx[k]];
        f->kind = k == 0 ? FEED_TOKENS : FEED_LABELS;
        f->file = o->tokens;
        f->rows = N;
        f->row_bytes = (uint64_t)T * sizeof(int64_t);
        skip[idx[k]] = 1;
    }
    return 0;
}

int rt_data_open(const RtModel *m, const RtOpts *o, int world, RtData *d)
{
    memset(d, 0, sizeof *d);
    d->tok_input = d->tok_labels = -1;
    d->feed = calloc((size_t)m->ninput + 1, sizeof *d->feed);
    d->nfeed = d->feed ? m->ninput : 0;
    char *skip = calloc((size_t)m->ninput + 1, 1);
    const char **files = calloc((size_t)m->ninput + 1, sizeof *files);
    if (!d->feed || !skip || !files) {
        free(skip);
        free(files);
        rt_err_set(1, "out of memory");
        return -1;
    }
    int rc = 0;
    if (rt_map_guard_install() != 0) {
        rt_err_set(1, "cannot install the SIGBUS handler that reports a data file shrinking: %s", strerror(errno));
        rc = -1;
    }
    if (rc == 0 && o->tokens)
        rc = open_token_feeds(m, o, d, skip);
    if (rc == 0)
        rc = match_inputs(m, o, o->data_flag, files, skip);
    for (int i = 0; rc == 0 && i < m->ninput; i++)
        if (!skip[i])
            d->feed[i].file = files[i];
    free(files);
    /* every .npy opens and fits its input; all feeds have the same samples */
    int first = -1;
    for (int i = 0; rc == 0 && i < m->ninput; i++) {
        RtFeed *f = &d->feed[i];
        if (f->kind == FEED_NPY && open_feed(o->data_flag, &m->input[i], f) != 0) {
            rc = -1;
        } else if (first < 0) {
            first = i;
        } else if (f->rows != d->feed[first].rows) {
            const RtFeed *a = &d->feed[first];
            if (a->kind != FEED_NPY || f->kind != FEED_NPY) {
                int n = a->kind == FEED_NPY ? first : i; /* the .npy one */
                rt_err_set(1, "%s %s: %s has %" PRId64 " rows, but %s %s holds %" PRId64 " samples "
                              "of T+1 = %" PRId64 " tokens; the two must agree", o->data_flag, m->input[n].name,
                           d->feed[n].file, d->feed[n].rows, o->tokens_flag, o->tokens, a->kind == FEED_NPY ? f->rows : a->rows,
                           m->input[d->tok_input].shape[1] + 1);
            } else {
                rt_err_set(1, "data files disagree on the number of rows: %s has %" PRId64 ", %s has %" PRId64,
                           a->file, a->rows, f->file, f->rows);
            }
            rc = -1;
        }
    }
    free(skip);
    if (rc != 0)
        return -1;
    /* step s starts at global position s * b * world */
    if (m->ninput > 0) {
        d->rows = d->feed[0].rows;
        d->gstep = m->input[0].shape[0] * world;
    }
    d->shuffle = o->shuffle;
    d->random_windows = o->random_windows;
    d->seed = (uint64_t)o->seed;
    return 0;
}

/* splitmix64's finaliser */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30, x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27, x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

int64_t rt_shuffle(int64_t i, int64_t n, uint64_t seed, uint64_t epoch)
{
    if (n <= 1)
        return 0;
    int h = 1;
    while (h < 31 && ((int64_t)1 << (2 * h)) < n)
        h++;
    const uint64_t mask = ((uint64_t)1 << h) - 1, key = mix64(seed ^ mix64(epoch + 0x9e3779b97f4a7c15ull));
    uint64_t x = (uint64_t)i;
    do { /* a bijection on [0, 4^h); from x < n it returns below n within a few rounds (4^h < 4n) */
        uint64_t l = x >> h, r = x & mask;
        for (uint64_t k = 0; k < 8; k++) {
            uint64_t t = l ^ (mix64(r ^ key ^ (k + 1) * 0xd6e8feb86659fd93ull) & mask);
            l = r, r = t;
        }
        x = l << h | r;
    } while (x >= (uint64_t)n);
    return (int64_t)x;
}

int64_t rt_window(uint64_t seed, int64_t p, int64_t n)
{
    return n > 1 ? (int64_t)(mix64(mix64(seed ^ 0x5851f42d4c957f2dull) ^ (uint64_t)p) % (uint64_t)n) : 0;
}

/* FNV-1a over up to 1 MiB at the head and 1 MiB at the tail of [p, p+n) */
static uint64_t sample_hash(const void *p, uint64_t n)
{
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull, cap = (uint64_t)1 << 20;
    uint64_t head = n < cap ? n : cap, tail_from = n > 2 * cap ? n - cap : head;
    for (uint64_t i = 0; i < head; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    for (uint64_t i = tail_from; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h ^ n;
}

int rt_data_agree(const RtOpts *o, const RtData *d, int rank)
{
    uint64_t mine[4] = {(uint64_t)d->rows, (uint64_t)d->ntok, 0, 0}, ref[4];
    for (int k = 0; k < d->nseg; k++)
        mine[2] = mine[2] * 31 + sample_hash(d->seg[k].tok, (uint64_t)d->seg[k].n * (uint64_t)d->tok_bytes);
    for (int i = 0; d->feed && i < d->nfeed; i++)
        for (int k = 0; d->feed[i].kind == FEED_NPY && k < d->feed[i].npart; k++)
            mine[3] = mine[3] * 31 + sample_hash(d->feed[i].part[k].data, d->feed[i].part[k].nbytes);
    memcpy(ref, mine, sizeof ref);
    rt_ctl_bcast(ref, sizeof ref, 0);
    if (rank == 0)
        return 0;
    if (d->nseg && ref[1] != mine[1]) {
        rt_err_set(1, "%s %s: this rank reads %" PRIu64 " tokens, rank 0 reads %" PRIu64
                      " (every rank must read the same file)", o->tokens_flag, o->tokens, mine[1], ref[1]);
        return -1;
    }
    if (d->nseg && ref[2] != mine[2]) {
        rt_err_set(1, "%s %s: this rank's copy of the file differs from rank 0's (every rank must read "
                      "the same file)", o->tokens_flag, o->tokens);
        return -1;
    }
    if (ref[3] != mine[3]) {
        rt_err_set(1, "this rank's %s files differ from rank 0's (every rank must read the same files)", o->data_flag);
        return -1;
    }
    if (ref[0] != mine[0]) {
        rt_err_set(1, "this rank's data has %" PRIu64 " samples, rank 0's has %" PRIu64
                      " (every rank must read the same files)", mine[0], ref[0]);
        return -1;
    }
    return 0;
}

void rt_data_describe(const RtModel *m, const RtOpts *o, const RtData *d)
{
    if (!d->nseg || d->tok_input < 0)
        return;
    int64_t T = m->input[d->tok_input].shape[1];
    char files[64] = "";
    if (d->nseg > 1)
        snprintf(files, sizeof files, " (%d files, read as one stream)", d->nseg);
    printf("tokens %s%s: %" PRId64 " tokens%s, %" PRId64 " samples of T+1 = %" PRId64 " -> inputs '%s', '%s' "
           "(shifted by one)\n", o->tokens, files, d->ntok,
           !d->seg[0].header ? "" : d->tok_bytes == 2 ? " (llm.c header, uint16)" : " (llm.c header, uint32)",
           d->rows, T + 1, m->input[d->tok_input].name, m->input[d->tok_labels].name);
    fflush(stdout);
}

/* the sample global position p reads */
static int64_t sample_at(const RtData *d, int64_t p)
{
    int64_t N = d->rows, j = p % N;
    return d->shuffle ? rt_shuffle(j, N, d->seed, (uint64_t)(p / N)) : j;
}

/* the samples of global positions p, p+1, ..., p+b-1 of feed f into dst */
static void fill(const RtData *d, const RtFeed *f, const RtInput *in, char *dst, int64_t p, int64_t b)
{
    int64_t N = d->rows, r = p % N;
    if (f->kind != FEED_NPY) {
        int64_t T = in->shape[1], *out = (int64_t *)(void *)dst;
        const int64_t w = d->tok_bytes, first = f->kind == FEED_LABELS;
        for (int64_t s = 0; s < b; s++) {
            /* window k starts at k*T, k < N = (ntok-1)/T; a random one below ntok - T: either way its T+1
             * tokens are in the stream (which may run across files) */
            int64_t start = d->random_windows ? rt_window(d->seed, p + s, d->ntok - T) : sample_at(d, p + s) * T;
            int64_t run = 0;
            const unsigned char *src = NULL;
            for (int64_t t = 0; t < T; t++, src += w, run--) {
                if (run == 0)
                    src = tok_at(d, start + first + t, &run);
                out[s * T + t] = w == 2 ? (int64_t)(src[0] | src[1] << 8) : (int64_t)le32(src);
            }
        }
        return;
    }
    int64_t avail;
    if (d->shuffle) {
        for (int64_t s = 0; s < b; s++)
            memcpy(dst + (uint64_t)s * f->row_bytes, row_at(f, sample_at(d, p + s), &avail), (size_t)f->row_bytes);
        return;
    }
    while (b > 0) { /* runs of rows of one file, wrapping at N */
        const char *src = row_at(f, r, &avail);
        int64_t run = avail < b ? avail : b;
        memcpy(dst, src, (size_t)((uint64_t)run * f->row_bytes));
        dst += (uint64_t)run * f->row_bytes;
        b -= run;
        r = (r + run) % N;
    }
}

/* the mapped file of d that holds address at (a .npy or a token file), or NULL */
static const char *file_at(const RtModel *m, const RtData *d, const void *at)
{
    const char *p = at;
    for (int i = 0; d->feed && i < m->ninput; i++)
        for (int k = 0; d->feed[i].kind == FEED_NPY && k < d->feed[i].npart; k++) {
            const NpyArray *a = &d->feed[i].part[k];
            if (a->map && p >= (const char *)a->map && p < (const char *)a->map + a->map_len)
                return a->path;
        }
    for (int k = 0; k < d->nseg; k++)
        if (p >= (const char *)d->seg[k].map && p < (const char *)d->seg[k].map + d->seg[k].map_len)
            return d->seg[k].path;
    return NULL;
}

/* the samples of global positions pos + rank*b + i, i < b, of every input
 * into the arena and to the device; a data file that shrank under the run
 * (SIGBUS in the copy out of its map) ends it with one line naming it */
void rt_data_next(RtCtx *c, RtData *d)
{
    const RtModel *m = c->m;
    if (m->ninput == 0)
        return;
    if (d->pos > INT64_MAX / 2) /* never in a real run; a manifest may say so: stay defined */
        d->pos %= d->rows;
    sigjmp_buf jb;
    if (RT_MAP_TRY(jb)) {
        const char *f = file_at(m, d, rt_map_fault());
        rt_fatal(1, "%s: the file shrank while the run read it (truncated or rewritten in place?): a data file must "
                    "stay as it was at start-up; restore it and --resume from the last checkpoint",
                 f ? f : "a data file");
    }
    for (int i = 0; i < m->ninput; i++)
        fill(d, &d->feed[i], &m->input[i], c->arena + m->input[i].arena_off, d->pos + m->input[i].shape[0] * c->rank,
             m->input[i].shape[0]);
    rt_map_guard_end();
    for (int i = 0; i < m->ninput; i++)
        rt_dev_upload(c, c->arena + m->input[i].arena_off, m->input[i].shape[0] * (int64_t)d->feed[i].row_bytes);
    d->pos += d->gstep;
}

void rt_data_close(const RtModel *m, RtData *d)
{
    if (d->feed) {
        for (int i = 0; i < m->ninput; i++)
            if (d->feed[i].kind == FEED_NPY)
                for (int k = 0; k < d->feed[i].npart; k++)
                    npy_close(&d->feed[i].part[k]);
        for (int i = 0; i < m->ninput; i++) {
            free(d->feed[i].part);
            free(d->feed[i].first);
        }
        free(d->feed);
        d->feed = NULL;
    }
    for (int k = 0; d->seg && k < d->nseg; k++)
        munmap(d->seg[k].map, d->seg[k].map_len);
    for (int k = 0; d->seg && d->seg[k].path; k++)
        free(d->seg[k].path);
    free(d->seg);
    d->seg = NULL;
    d->nseg = 0;
}
