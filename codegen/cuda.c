/* cuda.c — what the cuda target adds to the executable: the device code.
 *
 * requires: the sources of kernels/cuda (embedded in fsdpc at build time,
 *           gen/cuda_src.c) and NVRTC from the CUDA toolkit, loaded with
 *           dlopen so that fsdpc itself runs without the toolkit for
 *           --target cpu.
 * ensures:  two programs, each compiled to one cubin per --arch (sm_XY)
 *           plus PTX for the lowest arch (compute_XY: newer GPUs JIT it):
 *           the library (common.cuh, fused.h and every .cu file: the kernels
 *           of kc_names, the same text for every model) and, when the model
 *           has fused kernels (cg->fused_src, emit_fused.c), the model's own
 *           program (common.cuh, fused.h and those kernels alone).  The
 *           images go into a temporary directory with an assembler file that
 *           embeds them (.incbin) and the C text of the RtImage table that
 *           names them, each with its part (RT_IMAGE_KERNELS or
 *           RT_IMAGE_MODEL); dev_cuda.c loads one library per part.
 *
 * Kernel cache: the library takes a minute or more per arch, the model's
 * program about a second, so each output is kept in $FSDPC_CACHE_DIR (else
 * $XDG_CACHE_HOME/fsdpc, else ~/.cache/fsdpc) as kernels-KEY.ARCH or
 * model-KEY.ARCH, KEY hashing the program text, the NVRTC options and the
 * NVRTC version: the library is compiled once per (arch, NVRTC, kernels/cuda)
 * and shared by every model, a model's program once per model.  An entry is
 * written atomically and checked (magic, key, length, checksum) when read;
 * a bad or unreadable entry is compiled again, and a cache that cannot be
 * written is only a warning.  Two fsdpc compiling the same entry at once
 * (a parallel build, a test suite) do it once: the compiling one holds an
 * flock on ENTRY.lock beside it, the other waits for it (saying so) and
 * reads the entry.
 *
 * Progress: a compile that misses the cache says on stderr what it compiles
 * (the library, the model's program) for which archs, what it takes from the
 * cache, where the cache is, each program and arch as it is done (the jobs
 * on threads of their own; wall and CPU time) and the total time, one line each (not under
 * --quiet); a compile served from the cache alone says nothing.
 *
 * A compile error in kernels/cuda or in generated kernels is a bug in
 * fsdpc, never in the user's model: the message says so and prints the
 * NVRTC log.
 */
#define _POSIX_C_SOURCE 200809L
#include "cg.h"
#include "fsdpc_config.h"
#include "afile.h"
#include "kc.h" /* KC_COUNT: the kernels of kernels/cuda */

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* the sources of kernels/cuda, in concatenation order (gen/cuda_src.c) */
extern const char *const fsdpc_cuda_src_name[];
extern const char *const fsdpc_cuda_src_text[];
extern const int fsdpc_cuda_src_count;

/* ---- NVRTC through dlopen ------------------------------------------------ */
typedef int nvrtcResult_;
typedef struct _nvrtcProgram *nvrtcProgram_;
static struct {
    nvrtcResult_ (*create)(nvrtcProgram_ *, const char *, const char *, int, const char *const *,
                           const char *const *);
    nvrtcResult_ (*compile)(nvrtcProgram_, int, const char *const *);
    nvrtcResult_ (*destroy)(nvrtcProgram_ *);
    nvrtcResult_ (*log_size)(nvrtcProgram_, size_t *);
    nvrtcResult_ (*log)(nvrtcProgram_, char *);
    nvrtcResult_ (*cubin_size)(nvrtcProgram_, size_t *);
    nvrtcResult_ (*cubin)(nvrtcProgram_, char *);
    nvrtcResult_ (*ptx_size)(nvrtcProgram_, size_t *);
    nvrtcResult_ (*ptx)(nvrtcProgram_, char *);
    nvrtcResult_ (*version)(int *, int *);
    const char *(*errstr)(nvrtcResult_);
    int major, minor;
} nv;

static void load_nvrtc(void)
{
    if (nv.create)
        return;
    static const char *names[] = {"libnvrtc.so.13", "libnvrtc.so", FSDPC_CUDA_LIBDIR "/libnvrtc.so.13", NULL};
    void *h = NULL;
    for (int i = 0; names[i] && !h; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h)
        fatal("--target cuda: cannot load NVRTC (libnvrtc.so.13): %s; install the CUDA 13 toolkit or add its "
              "lib64 directory to LD_LIBRARY_PATH", dlerror());
#define SYM(field, name)                                                        \
    do {                                                                        \
        *(void **)&nv.field = dlsym(h, name);                                   \
        if (!nv.field)                                                          \
            fatal("--target cuda: NVRTC has no %s (need CUDA 13)", name);       \
    } while (0)
    SYM(create, "nvrtcCreateProgram");
    SYM(compile, "nvrtcCompileProgram");
    SYM(destroy, "nvrtcDestroyProgram");
    SYM(log_size, "nvrtcGetProgramLogSize");
    SYM(log, "nvrtcGetProgramLog");
    SYM(cubin_size, "nvrtcGetCUBINSize");
    SYM(cubin, "nvrtcGetCUBIN");
    SYM(ptx_size, "nvrtcGetPTXSize");
    SYM(ptx, "nvrtcGetPTX");
    SYM(version, "nvrtcVersion");
    SYM(errstr, "nvrtcGetErrorString");
#undef SYM
    if (nv.version(&nv.major, &nv.minor))
        fatal("--target cuda: nvrtcVersion failed");
}

/* ---- the two programs ---------------------------------------------------- */

/* the two programs, by part: the name of the part in the RtImage table (rt.h), the NVRTC file name, the cache
 * entries' prefix and the progress lines' words */
enum { KERNELS, MODEL };
static const char *const part_enum[] = {"RT_IMAGE_KERNELS", "RT_IMAGE_MODEL"};
static const char *const part_file[] = {"fsdpc_kernels.cu", "fsdpc_model.cu"};
static const char *const part_entry[] = {"kernels", "model"};
static const char *const part_said[] = {"kernels/cuda", "the model's kernels"};

/* the library (KERNELS): every embedded source after the header,
 * in order (fused.h first); the same text for every model */
static const char *library_text(void)
{
    Buf b = {0};
    cg_put(&b, "#include \"%s\"\n", fsdpc_cuda_src_name[0]);
    for (int i = 1; i < fsdpc_cuda_src_count; i++)
        cg_put(&b, "/* ---- %s ---- */\n%s\n", fsdpc_cuda_src_name[i], fsdpc_cuda_src_text[i]);
    return b.buf;
}

/* the model's program (MODEL): the header, fused.h (the
 * elementwise math of the generated loops) and this model's fused kernels */
static const char *model_text(const Cg *cg)
{
    int fh = 1;
    while (fh < fsdpc_cuda_src_count && strcmp(fsdpc_cuda_src_name[fh], "fused.h"))
        fh++;
    if (fh == fsdpc_cuda_src_count)
        die("this fsdpc was built without kernels/c/fused.h among the kernels/cuda sources");
    Buf b = {0};
    cg_put(&b, "#include \"%s\"\n/* ---- fused.h ---- */\n%s\n/* ---- generated ---- */\n%s", fsdpc_cuda_src_name[0],
           fsdpc_cuda_src_text[fh], cg->fused_src.buf);
    return b.buf;
}

/* NVRTC options besides the arch (also part of the cache key) */
#define COMMON_OPTS "--std=c++17", "-default-device", "-I" FSDPC_CUDA_INCDIR
static const char *const common_opts[] = {COMMON_OPTS};

typedef struct {
    const char *arch;      /* "sm_90" or "compute_80" */
    int part;              /* RT_IMAGE_KERNELS (the library) or RT_IMAGE_MODEL (the model's program) */
    const char *text;      /* the program */
    unsigned char *data;   /* out */
    size_t len;
    char *log;             /* on failure */
    int failed;
    int say;               /* print a line when compiled (not --quiet) */
    const char *entry;     /* its cache entry (NULL: no cache) and the entry's lock file */
    const char *lock;
    uint64_t key;
    int waited;            /* read from the cache after another fsdpc compiled it */
    int kept;              /* written to the cache */
} Job;

/* seconds on the monotonic clock */
static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* NVRTC's compile of j's program for j's arch: j->data (a cubin or PTX), else j->failed and j->log */
static void compile_one(Job *j)
{
    nvrtcProgram_ p;
    const char *hdr_name = fsdpc_cuda_src_name[0], *hdr_text = fsdpc_cuda_src_text[0];
    if (nv.create(&p, j->text, part_file[j->part], 1, &hdr_text, &hdr_name)) {
        j->failed = 1;
        j->log = ir_strdup("nvrtcCreateProgram failed");
        return;
    }
    char archopt[64];
    snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", j->arch);
    const char *opts[] = {archopt, COMMON_OPTS};
    int rc = nv.compile(p, (int)(sizeof opts / sizeof *opts), opts);
    size_t ls = 0;
    nv.log_size(p, &ls);
    char *log = malloc(ls + 1);
    if (log) {
        log[0] = 0;
        if (ls)
            nv.log(p, log);
        log[ls] = 0;
    }
    if (rc) {
        j->failed = 1;
        j->log = log;
        nv.destroy(&p);
        return;
    }
    free(log);
    int is_ptx = !strncmp(j->arch, "compute_", 8);
    size_t n = 0;
    if (is_ptx ? nv.ptx_size(p, &n) : nv.cubin_size(p, &n)) {
        j->failed = 1;
        j->log = ir_strdup("cannot read NVRTC's output");
        nv.destroy(&p);
        return;
    }
    j->data = malloc(n ? n : 1);
    if (!j->data || (is_ptx ? nv.ptx(p, (char *)j->data) : nv.cubin(p, (char *)j->data))) {
        j->failed = 1;
        j->log = ir_strdup("cannot read NVRTC's output");
    }
    j->len = n;
    nv.destroy(&p);
}

/* this thread's CPU seconds (NVRTC compiles on the calling thread: its own cost, whatever the load) */
static double thread_cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* compile_one on a thread of its own, then j's progress line */
static void *compile_job(void *arg)
{
    Job *j = arg;
    double t0 = now_s(), c0 = thread_cpu_s();
    compile_one(j);
    if (j->say && !j->failed) /* one fprintf: one whole line, whichever thread prints beside it */
        fprintf(stderr, "fsdpc: NVRTC: %s for %s compiled in %.1f s (%.1f s of CPU)\n", part_said[j->part], j->arch,
                now_s() - t0, thread_cpu_s() - c0);
    return NULL;
}

/* ---- the cache ----------------------------------------------------------- */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 1099511628211ull;
    return h;
}

#define CACHE_MAGIC "FSDPC-NVRTC-v1\n"

static uint64_t job_key(const Job *j)
{
    uint64_t h = fnv(14695981039346656037ull, j->text, strlen(j->text));
    h = fnv(h, fsdpc_cuda_src_text[0], strlen(fsdpc_cuda_src_text[0]));
    h = fnv(h, j->arch, strlen(j->arch));
    for (size_t i = 0; i < sizeof common_opts / sizeof *common_opts; i++)
        h = fnv(h, common_opts[i], strlen(common_opts[i]) + 1);
    int v[2] = {nv.major, nv.minor};
    return fnv(h, v, sizeof v);
}

/* j's entry in the cache dir: kernels-KEY.ARCH or model-KEY.ARCH */
static const char *entry_path(const Job *j, const char *dir, uint64_t key)
{
    return ir_fmt("%s/%s-%016llx.%s", dir, part_entry[j->part], (unsigned long long)key, j->arch);
}

static int cache_read(Job *j)
{
    if (!j->entry)
        return 0;
    uint64_t key = j->key;
    int64_t size;
    const char *why;
    int fd = ir_open_regular(j->entry, 0, &size, &why);
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) { /* a miss: none there, or no regular file (never waited on); compiled again */
        if (fd >= 0)
            close(fd);
        return 0;
    }
    char magic[16] = {0};
    uint64_t hdr[3]; /* key, length, checksum */
    int ok = fread(magic, 1, 16, f) == 16 && !memcmp(magic, CACHE_MAGIC, 16) && fread(hdr, 8, 3, f) == 3 &&
             hdr[0] == key && hdr[1] > 0 && hdr[1] < ((uint64_t)1 << 31);
    if (ok) {
        j->data = malloc(hdr[1]);
        ok = j->data && fread(j->data, 1, hdr[1], f) == hdr[1] &&
             fnv(14695981039346656037ull, j->data, hdr[1]) == hdr[2];
        j->len = hdr[1];
    }
    fclose(f);
    if (!ok) {
        free(j->data);
        j->data = NULL;
    }
    return ok;
}

/* j's image into its cache entry; 0 when written, else -1 after a warning */
static int cache_write(const Job *j)
{
    if (!j->entry)
        return -1;
    const char *path = j->entry;
    uint64_t key = j->key;
    RtAFile af; /* a shared cache folder: written beside path and renamed, never through a planted link */
    FILE *f = rt_afile_fopen(&af, path, 0644);
    uint64_t hdr[3] = {key, j->len, fnv(14695981039346656037ull, j->data, j->len)};
    int ok = f && fwrite(CACHE_MAGIC, 1, 16, f) == 16 && fwrite(hdr, 8, 3, f) == 3 &&
             fwrite(j->data, 1, j->len, f) == j->len;
    if (f && !ok)
        rt_afile_abort(&af);
    if (!ok || rt_afile_commit(&af) != 0) {
        fprintf(stderr, "fsdpc: warning: cannot write the kernel cache entry %s (%s); kernels will be compiled "
                "again next time\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* A job's thread: its entry locked (ENTRY.lock, flock: released by the kernel if this process dies), read again
 * if another fsdpc held the lock (it compiled the entry meanwhile), else compiled and written; the lock is let go
 * after the write.  A lock that cannot be made (a read-only cache) only means no waiting. */
static void *cached_job(void *arg)
{
    Job *j = arg;
    int lk = j->entry ? open(j->lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600) : -1;
    if (lk >= 0 && flock(lk, LOCK_EX | LOCK_NB) != 0) {
        if (j->say)
            fprintf(stderr, "fsdpc: NVRTC: another fsdpc is compiling %s for %s into the cache: waiting for it\n",
                    part_said[j->part], j->arch);
        int rc;
        while ((rc = flock(lk, LOCK_EX)) != 0 && errno == EINTR)
            ;
        if (rc == 0 && cache_read(j)) {
            j->waited = 1;
            close(lk);
            return NULL;
        }
    }
    compile_job(j);
    if (!j->failed)
        j->kept = cache_write(j) == 0;
    if (lk >= 0)
        close(lk);
    return NULL;
}

/* ---- the archs ------------------------------------------------------------ */

/* "sm_80,sm_90" -> the list, validated; the PTX arch is the lowest one */
static int parse_archs(const char *spec, int *sm, int max)
{
    int n = 0;
    const char *s = spec;
    while (*s) {
        int v = 0, digits = 0;
        if (strncmp(s, "sm_", 3))
            fatal("--arch %s: expected a comma-separated list like sm_80,sm_90", spec);
        s += 3;
        while (*s >= '0' && *s <= '9' && digits < 4)
            v = v * 10 + (*s++ - '0'), digits++;
        if (*s == 'a' && s[1] != ',') /* sm_90a: arch-specific features; not used by our kernels */
            fatal("--arch %s: arch-specific targets (sm_90a) are not supported; use sm_90", spec);
        if (!digits || (*s && *s != ','))
            fatal("--arch %s: expected a comma-separated list like sm_80,sm_90", spec);
        if (v < 70)
            fatal("--arch sm_%d: the cuda target needs sm_70 or newer (bf16 and the kernels' shuffles)", v);
        if (n == max)
            fatal("--arch %s: at most %d archs", spec, max);
        int dup = 0;
        for (int i = 0; i < n; i++)
            dup |= sm[i] == v;
        if (!dup)
            sm[n++] = v;
        if (*s == ',')
            s++;
    }
    if (!n)
        fatal("--arch: empty list");
    return n;
}

/* "kernels/cuda's 180 kernels for sm_80, sm_90, compute_80 (PTX)": the jobs of part whose cache state is
 * `missed` (1: to compile, 0: from the cache), "" when none; what: the part's words */
static const char *part_archs(const Job *job, int njob, const int *missed, int part, int want, const char *what)
{
    Buf b = {0};
    for (int i = 0; i < njob; i++)
        if (job[i].part == part && missed[i] == want)
            cg_put(&b, "%s%s%s", b.len ? ", " : ir_fmt("%s for ", what), job[i].arch,
                   strncmp(job[i].arch, "compute_", 8) ? "" : " (PTX)");
    return b.buf ? b.buf : "";
}

/* The first progress line of a compile that misses the cache (missed[i]: job i is compiled): what NVRTC
 * compiles, what comes from the cache, where the cache is */
static void say_start(const Job *job, int njob, const int *missed, const char *cdir, int nfused)
{
    const char *todo[2], *kept[2];
    for (int part = KERNELS; part <= MODEL; part++) {
        const char *w = part == KERNELS ? ir_fmt("kernels/cuda's %d kernels", KC_COUNT)
                                        : ir_fmt("this model's %d fused kernels", nfused);
        todo[part] = part_archs(job, njob, missed, part, 1, w);
        kept[part] = part_archs(job, njob, missed, part, 0, part_said[part]);
    }
    fprintf(stderr, "fsdpc: compiling %s%s%s with NVRTC %d.%d, a program and arch per thread%s%s%s%s; kernel cache: "
            "%s\n", todo[KERNELS], *todo[KERNELS] && *todo[MODEL] ? " and " : "", todo[MODEL], nv.major, nv.minor,
            *kept[KERNELS] || *kept[MODEL] ? "; from the cache: " : "", kept[KERNELS],
            *kept[KERNELS] && *kept[MODEL] ? " and " : "", kept[MODEL],
            cdir ? cdir : "none (no $FSDPC_CACHE_DIR, $XDG_CACHE_HOME or $HOME, or a folder refused above)");
}

/* Every job's image: from the cache, else compiled by NVRTC (a thread per
 * job, each written to the cache); say: the progress lines on stderr */
static void compile_all(Job *job, int njob, int say, int nfused)
{
    const char *cdir = cg_cache_dir();
    pthread_t *th = ir_alloc(sizeof(pthread_t) * (size_t)njob);
    int *started = ir_alloc(sizeof(int) * (size_t)njob), *missed = ir_alloc(sizeof(int) * (size_t)njob), nmiss = 0;
    for (int i = 0; i < njob; i++) {
        job[i].key = job_key(&job[i]);
        job[i].entry = cdir ? entry_path(&job[i], cdir, job[i].key) : NULL;
        job[i].lock = cdir ? ir_fmt("%s.lock", job[i].entry) : NULL;
        missed[i] = !cache_read(&job[i]);
        nmiss += missed[i];
    }
    if (!nmiss)
        return;
    double t0 = now_s();
    if (say)
        say_start(job, njob, missed, cdir, nfused);
    for (int i = 0; i < njob; i++)
        if (missed[i]) {
            job[i].say = say;
            started[i] = !pthread_create(&th[i], NULL, cached_job, &job[i]);
            if (!started[i])
                cached_job(&job[i]);
        }
    int ok = 1, kept = 1, ncompiled = 0;
    for (int i = 0; i < njob; i++)
        if (missed[i]) {
            if (started[i])
                pthread_join(th[i], NULL);
            ok &= !job[i].failed;
            if (!job[i].waited) {
                ncompiled++;
                kept &= job[i].kept;
            }
        }
    if (say && ok && !ncompiled) /* a failure: cg_cuda_images says so */
        fprintf(stderr, "fsdpc: NVRTC: %d program%s read from the cache after %.1f s waiting for another fsdpc to "
                "compile them\n", nmiss, nmiss != 1 ? "s" : "", now_s() - t0);
    else if (say && ok)
        fprintf(stderr, "fsdpc: NVRTC: %d program%s compiled in %.1f s%s%s\n", ncompiled, ncompiled != 1 ? "s" : "",
                now_s() - t0, ncompiled < nmiss ? ir_fmt(", %d read from the cache another fsdpc wrote meanwhile",
                                                          nmiss - ncompiled) : "",
                kept ? ir_fmt("; kept in %s for the next compile", cdir) : "");
}

/* Compile both programs for every arch (cache first, threads for the rest);
 * write the images into dir, the .S that embeds them, and the RtImage table
 * `images` as C into tables.  Returns the number of images. */
int cg_cuda_images(const Cg *cg, const char *dir, Buf *tables, const char **asm_path)
{
    const Graph *g = cg->g;
    load_nvrtc();
    if (fsdpc_cuda_src_count < 1)
        die("this fsdpc was built without kernels/cuda sources");
    int sm[16];
    int nsm = parse_archs(g->opt->arch ? g->opt->arch : FSDPC_DEFAULT_ARCH, sm, 16);
    int lowest = sm[0];
    for (int i = 1; i < nsm; i++)
        lowest = sm[i] < lowest ? sm[i] : lowest;
    int nparts = cg->nfused > 0 ? 2 : 1, njob = 0; /* no fused kernel: no program of the model's */
    Job *job = ir_alloc(sizeof(Job) * (size_t)(nsm + 1) * (size_t)nparts);
    for (int part = KERNELS; part < nparts; part++) {
        const char *text = part == KERNELS ? library_text() : model_text(cg);
        for (int i = 0; i <= nsm; i++)
            job[njob++] = (Job){.arch = i < nsm ? ir_fmt("sm_%d", sm[i]) : ir_fmt("compute_%d", lowest),
                                .part = part, .text = text};
    }
    compile_all(job, njob, !g->opt->quiet, cg->nfused);
    for (int i = 0; i < njob; i++)
        if (job[i].failed) {
            fprintf(stderr, "%s\n", job[i].log ? job[i].log : "");
            die("NVRTC failed to compile %s for %s: this is a bug in fsdpc, not in the model (NVRTC's log is "
                "above; please report it)", job[i].part == KERNELS ? "the device kernels" : "the model's fused kernels",
                job[i].arch);
        }
    /* the images and the assembler file that embeds them */
    Buf s = {0};
    cg_put(&s, "\t.section .rodata\n");
    cg_put(tables, "static const RtImage images[] = {\n");
    for (int i = 0; i < njob; i++) {
        const char *path = ir_fmt("%s/img%d.bin", dir, i);
        if (rt_afile_write(path, job[i].data, job[i].len, 0644) != 0)
            fatal("%s: cannot write: %s", path, strerror(errno));
        /* dir comes from mkdtemp: only [A-Za-z0-9/._-], safe inside the quotes */
        cg_put(&s, "\t.global fsdpc_img%d\n\t.balign 64\nfsdpc_img%d:\n\t.incbin \"%s\"\n", i, i, path);
        cg_put(tables, "    {\"%s\", fsdpc_img%d, %lld, %s},\n", job[i].arch, i, (long long)job[i].len,
               part_enum[job[i].part]);
    }
    cg_put(&s, "\t.section .note.GNU-stack,\"\",@progbits\n");
    cg_put(tables, "};\n\n");
    Buf decl = {0};
    for (int i = 0; i < njob; i++)
        cg_put(&decl, "extern const unsigned char fsdpc_img%d[];\n", i);
    cg_put(&decl, "%s", tables->buf);
    *tables = decl;
    const char *sp = ir_fmt("%s/images.S", dir);
    if (rt_afile_write(sp, s.buf, s.len, 0644) != 0)
        fatal("%s: cannot write: %s", sp, strerror(errno));
    *asm_path = sp;
    for (int i = 0; i < njob; i++)
        free(job[i].data);
    return njob;
}

/* ---- --emulate ------------------------------------------------------------
 * The executable links the CUDA emulation (runtime/cuemu_*.c) in place of
 * the CUDA runtime, cuBLASLt and NCCL.  Its images name the emulation's
 * kernel tables, one each, as the two programs of a GPU build:
 * "cuemu:kernels/cuda" (kernels.def's, in the library) and, when the model
 * has fused kernels, "cuemu:fsdpc_model", which fused.cc defines on top of
 * kernels/cuda/emu.h, as NVRTC would see them (common.cuh first, fused.h
 * before it), with a trampoline each and a constructor that registers the
 * table before main.  dev_cuda.c loads each as a library of its own, as on
 * a GPU (a kernel looked up in the other one is not found). */
int cg_cuemu_images(const Cg *cg, const char *dir, Buf *tables, const char **cc_path)
{
    Buf s = {0};
    cg_put(&s, "/* generated by fsdpc --emulate: this model's fused kernels on the host */\n"
               "#include \"emu.h\"\n#include \"fused.h\"\n#include \"cuemu_kernel.h\"\n\n"
               "namespace fsdpc_model {\n#include \"common.cuh\"\n\n%s\n", cg->fused_src.buf ? cg->fused_src.buf : "");
    for (int k = 0; k < cg->nfused; k++)
        cg_put(&s, "static void run%d(void *const *a, unsigned g, unsigned b, unsigned m)\n{\n    (void)m;\n"
                   "    emu::run_args(\"fsdpc_fused%d\", &fsdpc_fused%d, g, b, a);\n}\n", k, k, k);
    cg_put(&s, "static const CuemuKernel table[] = {\n");
    for (int k = 0; k < cg->nfused; k++)
        cg_put(&s, "    {\"fsdpc_fused%d\", emu::Params<decltype(fsdpc_fused%d)>::n, emu::Params<decltype(fsdpc_fused%d)>::size,"
                   " emu::Params<decltype(fsdpc_fused%d)>::is_ptr, run%d},\n", k, k, k, k, k);
    cg_put(&s, "    {\"\", 0, nullptr, nullptr, nullptr}};\n\n"
               "__attribute__((constructor)) static void add()\n{\n"
               "    if (cuemu_kernels_add(\"fsdpc_model\", table, %d) != 0)\n        abort();\n}\n} // namespace fsdpc_model\n",
           cg->nfused);
    const char *path = ir_fmt("%s/fused.cc", dir);
    if (rt_afile_write(path, s.buf, s.len, 0644) != 0)
        fatal("%s: cannot write: %s", path, strerror(errno));
    *cc_path = path;
    static const char *const image[] = {"cuemu:kernels/cuda", "cuemu:fsdpc_model"};
    int n = cg->nfused > 0 ? 2 : 1;
    cg_put(tables, "static const RtImage images[] = {\n");
    for (int part = KERNELS; part < n; part++)
        cg_put(tables, "    {\"sm_90\", (const unsigned char *)\"%s\", %d, %s},\n", image[part],
               (int)strlen(image[part]) + 1, part_enum[part]);
    cg_put(tables, "};\n\n");
    return n;
}
