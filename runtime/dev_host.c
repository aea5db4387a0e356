/* dev_host.c — the device layer of the cpu target (rt_dev.h): the step runs
 * on the host allocation itself, so there is nothing to pick, copy or free;
 * the step's byte copies and fills (rt.h) are memcpy and memset; and its
 * collectives run on the communication thread.  rt_dev_init also sizes the
 * kernels' team and chooses the float32 GEMMs' library (gemm_choose).
 *
 * The communication thread (rt_coll_start / rt_coll_wait) is the cpu's
 * collective stream: a FIFO of jobs, run one at a time in start order while
 * the step computes, so every rank issues its collectives in the step's
 * order and they overlap the compute the schedule put between a start and
 * its Wait.  It needs a core of its own: on shared memory a collective is
 * CPU work (copies, sums, MPI polling for the peers), so beside a compute
 * thread on the same core it only takes turns with it.  It runs where this
 * rank has two cores or more (the CPUs it may run on, and its share of the
 * node's: online CPUs / ranks on the node), and not at world 1, where the
 * control plane cannot call from another thread (rt_ctl_threads), or with
 * FSDPC_COMM_THREAD=0; FSDPC_COMM_THREAD=1 starts it whatever the cores.
 * Without it a job runs at once on the step's thread (the same results, no
 * overlap).  It starts at rt_dev_overlap and stops in rt_dev_finish.
 *
 * Both lanes of rt.h (gathers, reductions) are this one thread, unlike the
 * cuda target's two streams: a collective between the ranks of a node is
 * copies and sums that already take the memory bandwidth, a second thread
 * would take a core from the kernels and need MPI_THREAD_MULTIPLE, and
 * measured (bench/comm_lanes.c, 2 ranks: an all-gather and an all-reduce
 * of 4-32 MiB) two threads issuing them at once were never faster than
 * one issuing them in turn (1.0x to several times slower).
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "afile.h"
#include "rt_ctl.h"
#include "rt_dev.h"
#include "rt_priv.h"
#include "kernels.h"


void rt_dev_set_graph(int use_graph) { (void)use_graph; }

int rt_dev_attach(RtCtx *c, char *base, int64_t bytes, char *err, size_t errlen)
{
    (void)base, (void)bytes, (void)err, (void)errlen;
    c->dev_arena = c->arena;
    c->dev_slot = c->slot;
    c->dev_shard = c->shard;
    c->dev_acc = c->acc;
    return 0;
}

void rt_dev_upload(RtCtx *c, const void *p, int64_t n) { (void)c, (void)p, (void)n; }

void rt_dev_download(RtCtx *c, void *p, int64_t n) { (void)c, (void)p, (void)n; }

void rt_dev_step(RtCtx *c)
{
    rt_progress_step(c->m, c->step); /* the progress record (rt_priv.h) */
    c->m->step(c);
}

void rt_memcpy(void *dst, const void *src, int64_t bytes)
{
    if (bytes > 0)
        memcpy(dst, src, (size_t)bytes);
}

void rt_memset(void *dst, int byte, int64_t bytes)
{
    if (bytes > 0)
        memset(dst, byte, (size_t)bytes);
}

/* ------------------------------------------------- the communication thread */

typedef struct {
    void (*job)(RtCtx *);
    RtCtx *c;
    int node;
} Job;

static struct {
    int state;             /* 0 not decided, 1 the thread runs, -1 jobs run in place */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t more, done_cv;
    Job *q;                /* ring of cap jobs: [head, tail) queued; jobs 1 .. head have finished */
    int64_t cap, head, tail;
    int64_t *ticket;       /* per tag: the number of its last job */
    int stop;
} ct = {.lock = PTHREAD_MUTEX_INITIALIZER, .more = PTHREAD_COND_INITIALIZER, .done_cv = PTHREAD_COND_INITIALIZER};

static void run_job(const Job *j)
{
    int64_t t0 = j->c->trace ? rt_now_ns() : 0;
    rt_progress_begin(j->node);
    j->job(j->c);
    rt_progress_end();
    if (j->c->trace)
        rt_trace_coll(j->c, j->node, t0, rt_now_ns());
}

static void *comm_thread(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&ct.lock);
    for (;;) {
        while (ct.head == ct.tail && !ct.stop)
            pthread_cond_wait(&ct.more, &ct.lock);
        if (ct.head == ct.tail)
            break;
        Job j = ct.q[ct.head % ct.cap];
        pthread_mutex_unlock(&ct.lock);
        run_job(&j);
        pthread_mutex_lock(&ct.lock);
        ct.head++;
        pthread_cond_broadcast(&ct.done_cv);
    }
    pthread_mutex_unlock(&ct.lock);
    return NULL;
}

/* the cores this rank may count on: those it may run on, and at most its share of the node's */
static long my_cores(void)
{
    cpu_set_t set;
    long online = sysconf(_SC_NPROCESSORS_ONLN), n = online > 0 ? online : 1;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) < n)
        n = CPU_COUNT(&set);
    int local = rt_ctl_local_size();
    if (local > 1 && online / local < n)
        n = online / local;
    return n > 1 ? n : 1;
}

/* ------------------------------------------------------ how the threads wait
 *
 * Every fused loop, kernel and GEMM of the step is an OpenMP parallel region
 * (about 210 a step of the 128/4/128/8 GPT at 2 threads), and libgomp's
 * threads wait for the next one, and at each barrier, by spinning for about
 * 3 ms (GOMP_SPINCOUNT 300000) before they sleep.  On cores of their own
 * that is the fastest; on cores shared with other work it is a collapse: a
 * spinning thread holds a core that the thread the team waits for needs, at
 * every region.  Measured on this project's 2-core machine (a 128/4/128/8
 * GPT, 2 threads, load ~18): steps of 4.3-6.6 s spinning, 75-450 ms with
 * OMP_WAIT_POLICY=passive, 200-280 ms with GOMP_SPINCOUNT=1000
 * (docs/internals.md).  Open MPI's progress loop spins likewise while a rank
 * waits for its peers, unless mpi_yield_when_idle.
 *
 * libgomp reads its policy once, as it loads, before main: so rt_main calls
 * rt_dev_preinit first, and unless the user set OMP_WAIT_POLICY or
 * GOMP_SPINCOUNT (or FSDPC_WAIT=spin), a team of 2 threads or more gets
 *   - OMP_WAIT_POLICY=passive where the cores are oversubscribed at start-up
 *     (this rank's threads more than its cores, or more runnable threads on
 *     the machine than its CPUs once this job's are counted);
 *   - else GOMP_SPINCOUNT=K_SPIN (libgomp's own count for a team larger than
 *     its CPUs): a few microseconds of spinning, enough to catch the next
 *     region of a step, then sleep, so that a process arriving after
 *     start-up does not find the threads holding its core for 3 ms at every
 *     region;
 * and the program execs itself again with it; FSDPC_WAIT_WHY carries the
 * reason to the threads line.  Open MPI's mpi_yield_when_idle (read at
 * MPI_Init, still to come: no exec needed) is set whatever the load, unless
 * set.  A user's setting of either is kept and named on the threads line;
 * FSDPC_WAIT=spin keeps libgomp's and Open MPI's defaults whatever the load. */

#define K_SPIN "1000"

static char g_wait[512]; /* the threads line's clause on waiting */

/* runnable threads on the machine now: the least of a few looks at
 * /proc/stat's procs_running 2 ms apart (a process starting beside us is not
 * load); -1 where unreadable */
static int runnable_now(void)
{
    int least = -1;
    for (int k = 0; k < 5; k++) {
        FILE *f = fopen("/proc/stat", "r");
        char line[256];
        int n = -1;
        while (f && fgets(line, sizeof line, f))
            if (sscanf(line, "procs_running %d", &n) == 1)
                break;
        if (f)
            fclose(f);
        if (n >= 0 && (least < 0 || n < least))
            least = n;
        struct timespec nap = {0, 2000000};
        nanosleep(&nap, NULL);
    }
    return least;
}

static long env_long(const char *name, long dflt)
{
    const char *v = getenv(name);
    char *end;
    long n = v && *v ? strtol(v, &end, 10) : 0;
    return v && *v && !*end && n > 0 ? n : dflt;
}

/* why this rank's threads should wait passively, in why; 0 where they may spin */
static int oversubscribed(char *why, size_t cap)
{
    long cores = my_cores(), online = sysconf(_SC_NPROCESSORS_ONLN);
    long local = env_long("OMPI_COMM_WORLD_LOCAL_SIZE", 1), team = env_long("OMP_NUM_THREADS", cores);
    online = online > 0 ? online : 1;
    if (team > cores) {
        snprintf(why, cap, "%ld threads on %ld core%s", team, cores, cores > 1 ? "s" : "");
        return 1;
    }
    int run = runnable_now(); /* this thread is one of them, and so may be this job's other ranks */
    long others = run - 1 - (local - 1);
    if (run >= 0 && others > 0 && others + local * team > online) {
        snprintf(why, cap, "%ld other runnable thread%s at start-up beside this job's %ld on %ld CPU%s", others,
                 others > 1 ? "s" : "", local * team, online, online > 1 ? "s" : "");
        return 1;
    }
    return 0;
}

void rt_dev_preinit(char **argv)
{
    const char *why = getenv("FSDPC_WAIT_WHY"), *wp = getenv("OMP_WAIT_POLICY"), *sc = getenv("GOMP_SPINCOUNT");
    const char *mine = getenv("FSDPC_WAIT");
    if (why && ((wp && *wp) || (sc && *sc))) { /* our own exec (below) */
        snprintf(g_wait, sizeof g_wait, "%s", why);
        unsetenv("FSDPC_WAIT_WHY");
        return;
    }
    if ((wp && *wp) || (sc && *sc)) {
        snprintf(g_wait, sizeof g_wait, "threads wait as set (OMP_WAIT_POLICY=%s, GOMP_SPINCOUNT=%s)",
                 wp && *wp ? wp : "unset", sc && *sc ? sc : "unset");
        return;
    }
    if (mine && !strcmp(mine, "spin")) {
        snprintf(g_wait, sizeof g_wait, "threads spin briefly while they wait (FSDPC_WAIT=spin)");
        return;
    }
    char r[160];
    int over = oversubscribed(r, sizeof r);
    const char *y = getenv("OMPI_MCA_mpi_yield_when_idle");
    const char *mpi = y && *y ? "Open MPI's mpi_yield_when_idle as set" : "MPI yielding when idle";
    if (!(y && *y))
        setenv("OMPI_MCA_mpi_yield_when_idle", "1", 1); /* read at MPI_Init, still to come */
    if (env_long("OMP_NUM_THREADS", my_cores()) < 2) { /* no OpenMP team to wait: nothing to exec for */
        snprintf(g_wait, sizeof g_wait, "one thread; %s (%s; FSDPC_WAIT=spin to spin)", mpi,
                 over ? r : "the cores were not oversubscribed at start-up");
        return;
    }
    char line[sizeof g_wait];
    if (over) {
        snprintf(line, sizeof line, "threads wait passively (set here: OMP_WAIT_POLICY=passive, %s; %s; "
                 "FSDPC_WAIT=spin to spin)", mpi, r);
        setenv("OMP_WAIT_POLICY", "passive", 1);
    } else {
        snprintf(line, sizeof line, "threads spin briefly, then sleep (set here: GOMP_SPINCOUNT=%s, %s; the cores "
                 "were not oversubscribed at start-up, and a process arriving later finds the threads asleep; "
                 "FSDPC_WAIT=spin for libgomp's 300000)", K_SPIN, mpi);
        setenv("GOMP_SPINCOUNT", K_SPIN, 1);
    }
    setenv("FSDPC_WAIT_WHY", line, 1);
    char self[4096]; /* the program's own path, not /proc/self/exe: ps and top would name it "exe" */
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = 0;
        execv(self, argv);
    }
    snprintf(g_wait, sizeof g_wait, "threads spin while they wait: %s, but this program could not exec itself again "
             "with %s (%s); set it yourself", over ? r : "the cores were not oversubscribed at start-up",
             over ? "OMP_WAIT_POLICY=passive" : "GOMP_SPINCOUNT=" K_SPIN, strerror(errno));
    unsetenv("OMP_WAIT_POLICY");
    unsetenv("GOMP_SPINCOUNT");
    unsetenv("FSDPC_WAIT_WHY");
}

static char g_mode[160], g_threads[2800];
static int g_gemm_threads = 1; /* OpenBLAS's threads (k_threads), for the peak probe */

/* will the communication thread run?  where not, g_mode says why */
static int comm_thread_wanted(int world, long cores)
{
    const char *env = getenv("FSDPC_COMM_THREAD");
    if (world == 1) {
        snprintf(g_mode, sizeof g_mode, "inside the step (one rank)");
        return 0;
    }
    if (env && !strcmp(env, "0")) {
        snprintf(g_mode, sizeof g_mode, "inside the step (FSDPC_COMM_THREAD=0)");
        return 0;
    }
    if (!rt_ctl_threads()) {
        snprintf(g_mode, sizeof g_mode, "inside the step: the MPI library cannot take calls from a second thread "
                 "(MPI_THREAD_SERIALIZED), so nothing overlaps");
        return 0;
    }
    if (cores < 2 && !(env && !strcmp(env, "1"))) {
        snprintf(g_mode, sizeof g_mode, "inside the step: 1 core for this rank, none spare for a communication "
                 "thread (FSDPC_COMM_THREAD=1 starts it anyway)");
        return 0;
    }
    return 1;
}

/* The features the step and its kernels were compiled for (fsdpc --cpu) that this CPU lacks, space-separated
 * in out ("" none).  Checked before any of that code runs: an instruction the CPU lacks is SIGILL. */
static void cpu_missing(const RtModel *m, char *out, size_t n)
{
    out[0] = 0;
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    __builtin_cpu_init();
    for (const char *const *f = m->cpu_needs; f && *f; f++) {
        int has = 0;
#define HAS(macro, name) if (!strcmp(*f, name)) has = __builtin_cpu_supports(name) != 0;
        RT_CPU_FEATURES(HAS)
#undef HAS
        if (!has && strlen(out) + strlen(*f) + 2 < n)
            snprintf(out + strlen(out), n - strlen(out), "%s%s", out[0] ? " " : "", *f);
    }
#else
    (void)m, (void)n;
#endif
}

static double seconds(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ------------------------------------------------ the float32 GEMM's library
 *
 * Which library runs the float32 GEMMs (kernels/c/matmul.c): FSDPC_GEMM
 * (openblas, onednn) where set, else the faster of the two on this CPU,
 * measured by rank 0 at start-up on one thread (what sets them apart is the
 * kernel a core runs: AVX-512 or AVX2; on one thread a busy machine's other
 * processes cost a probe nothing but the wall time, and no team spins): a
 * 512^3 GEMM (0.27 GFLOP, B transposed as a Linear reads its weight) on
 * each, once to warm up (oneDNN generates its kernel on the first call),
 * then GEMM_REPS times in turn, each library's best thread CPU time taken.
 * oneDNN is taken where it is at least GEMM_MARGIN times as fast: a near
 * tie keeps OpenBLAS, the library of the float64 GEMMs too, so that a
 * machine where the two are alike does not flip between runs (and the
 * choice is kept per machine: below).  About 12 ms of CPU on an AMD Zen 5 (oneDNN 214, OpenBLAS's Haswell kernels 121
 * GFLOP/s).  Every rank takes rank 0's choice (rt_dev_agree), rank 0's
 * FSDPC_GEMM included: the ranks compute with the same sums. */
enum { GEMM_N = 512, GEMM_REPS = 3 };
#define GEMM_MARGIN 1.1
static char g_gemm_why[1600];

/* the thread CPU seconds of one GEMM on lib */
static double gemm_time(int lib, float *c, const float *a, const float *b)
{
    double t0 = seconds(CLOCK_THREAD_CPUTIME_ID);
    k_gemm_f32_on(lib, c, GEMM_N, a, GEMM_N, b, GEMM_N, GEMM_N, GEMM_N, GEMM_N, 0, 1, 1.0, 0.0);
    return seconds(CLOCK_THREAD_CPUTIME_ID) - t0;
}

/* The measured choice is kept per machine: rank 0 measures once and writes
 * the rates into the cache folder (the compiler's: $FSDPC_CACHE_DIR, else
 * $XDG_CACHE_HOME/fsdpc, else ~/.cache/fsdpc) as gemm-KEY, KEY hashing what
 * decides the race (the CPU's model name, OpenBLAS's kernels, a oneDNN ISA
 * limit in the environment); later runs read it.  So two runs on one
 * machine never differ by a probe's noise (a resumed run sums as the run it
 * resumes), and a start-up costs nothing.  The folder must be this user's
 * (or root's) and writable by no one else (rt_cache_dir, as for the
 * compiler's objects), else nothing is read or kept and every run measures
 * (the line says why). */
static uint64_t fnv_str(uint64_t h, const char *s)
{
    for (; s && *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return (h ^ 0xff) * 1099511628211ull; /* a separator: "ab","c" is not "a","bc" */
}

/* path of this machine's entry into buf (n bytes); NULL with why (wn bytes) where there is none to use */
static const char *gemm_cache_path(char *buf, size_t n, char *why, size_t wn)
{
    char dir[768];
    if (!rt_cache_dir(dir, sizeof dir, why, wn)) {
        if (!why[0])
            snprintf(why, wn, "no $FSDPC_CACHE_DIR, $XDG_CACHE_HOME or $HOME");
        else {
            char r[160];
            snprintf(r, sizeof r, "%.159s", why);
            snprintf(why, wn, "the cache folder %.500s: %s", dir, r);
        }
        return NULL;
    }
    char model[512] = "?", line[512];
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            snprintf(model, sizeof model, "%s", line);
            break;
        }
    if (f)
        fclose(f);
    uint64_t k = fnv_str(14695981039346656037ull, "gemm-v1");
    k = fnv_str(fnv_str(k, model), k_blas_kernels());
    k = fnv_str(fnv_str(k, getenv("DNNL_MAX_CPU_ISA")), getenv("ONEDNN_MAX_CPU_ISA"));
    snprintf(buf, n, "%s/gemm-%016llx", dir, (unsigned long long)k);
    return buf;
}

/* the rates kept at path (GFLOP/s); 0, or -1 where there is no good entry */
static int gemm_cache_read(const char *path, double *dn, double *ob)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK);
    struct stat st;
    char text[128] = "";
    ssize_t got = -1;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size < (off_t)sizeof text)
        got = read(fd, text, sizeof text - 1);
    if (fd >= 0)
        close(fd);
    if (got <= 0)
        return -1;
    text[got] = 0;
    char tail = 0;
    return sscanf(text, "fsdpc-gemm-v1 onednn %lf openblas %lf%c", dn, ob, &tail) == 3 && tail == '\n' && *dn > 0 &&
                   *ob > 0 && *dn < 1e9 && *ob < 1e9
               ? 0
               : -1;
}

/* rank 0's probe: each library's rate on one thread (GFLOP/s); 0, or -1 out of memory */
static int gemm_measure(double *dn, double *ob)
{
    const size_t nn = (size_t)GEMM_N * GEMM_N;
    float *a = malloc(sizeof(float) * 3 * nn);
    if (!a)
        return -1;
    for (size_t i = 0; i < 2 * nn; i++)
        a[i] = (float)(i % 13) * 0.0625f - 0.375f;
    int omp, blas;
    k_team_get(&omp, &blas);
    k_team_set(1, 1);
    double best[2] = {0, 0};
    for (int r = 0; r <= GEMM_REPS; r++)
        for (int lib = K_GEMM_OPENBLAS; lib <= K_GEMM_ONEDNN; lib++) {
            double t = gemm_time(lib, a + 2 * nn, a, a + nn);
            if (r > 0 && (best[lib] == 0 || t < best[lib]))
                best[lib] = t;
        }
    k_team_set(omp, blas);
    free(a);
    const double flop = 2.0 * GEMM_N * GEMM_N * GEMM_N;
    *ob = best[0] > 0 ? 1e-9 * flop / best[0] : 0;
    *dn = best[1] > 0 ? 1e-9 * flop / best[1] : 0;
    return 0;
}

/* sets the library (k_gemm_use) and g_gemm_why; 0, or -1 with a line in err (a bad FSDPC_GEMM) */
static int gemm_choose(int rank, char *err, size_t errlen)
{
    const char *env = getenv("FSDPC_GEMM");
    if (env && *env) {
        int lib = !strcmp(env, "openblas") ? K_GEMM_OPENBLAS : !strcmp(env, "onednn") ? K_GEMM_ONEDNN : -1;
        if (lib < 0) {
            snprintf(err, errlen, "FSDPC_GEMM=%s: expected openblas or onednn (the float32 GEMMs' library), or "
                     "unset it to measure which is faster here", env);
            return -1;
        }
        k_gemm_use(lib);
        snprintf(g_gemm_why, sizeof g_gemm_why, "float32 GEMMs on %s (FSDPC_GEMM)", k_gemm_name(lib));
        return 0;
    }
    k_gemm_use(K_GEMM_OPENBLAS);
    if (rank != 0) { /* rank 0 measures; rt_dev_agree hands every rank its choice */
        snprintf(g_gemm_why, sizeof g_gemm_why, "float32 GEMMs on rank 0's choice");
        return 0;
    }
    char path[1024], kept[1200], why[700];
    const char *p = gemm_cache_path(path, sizeof path, why, sizeof why);
    double dn = 0, ob = 0;
    if (p && gemm_cache_read(p, &dn, &ob) == 0)
        snprintf(kept, sizeof kept, "from %s", p);
    else {
        if (gemm_measure(&dn, &ob) != 0) {
            snprintf(err, errlen, "out of memory for the float32 GEMM libraries' probe (3 MiB)");
            return -1;
        }
        char text[128];
        int n = snprintf(text, sizeof text, "fsdpc-gemm-v1 onednn %.1f openblas %.1f\n", dn, ob);
        /* decide and say by the rates as kept, so that a run reading them decides and says the same */
        if (sscanf(text, "fsdpc-gemm-v1 onednn %lf openblas %lf", &dn, &ob) != 2)
            dn = ob = 0;
        if (!p)
            snprintf(kept, sizeof kept, "not kept: %s", why);
        else if (rt_afile_write(p, text, (size_t)n, 0644) != 0)
            snprintf(kept, sizeof kept, "not kept: cannot write %s: %s", p, strerror(errno));
        else
            snprintf(kept, sizeof kept, "kept in %s", p);
    }
    const int lib = ob > 0 && dn >= GEMM_MARGIN * ob ? K_GEMM_ONEDNN : K_GEMM_OPENBLAS;
    k_gemm_use(lib);
    snprintf(g_gemm_why, sizeof g_gemm_why, "float32 GEMMs on %s (measured on one thread on this machine: oneDNN "
             "%.0f, OpenBLAS %.0f GFLOP/s, %s; oneDNN where %.1fx OpenBLAS's or more; FSDPC_GEMM=openblas or onednn "
             "picks one)", k_gemm_name(lib), dn, ob, kept, GEMM_MARGIN);
    return 0;
}

void rt_dev_agree(RtCtx *c)
{
    if (c->world > 1) {
        int32_t lib = k_gemm_lib();
        rt_ctl_bcast(&lib, sizeof lib, 0);
        k_gemm_use(lib);
    }
}

/* The rank's cores: the communication thread takes one where it runs, the
 * kernels' team (OpenMP and OpenBLAS, k_threads) the others; the float32
 * GEMMs' library (gemm_choose). */
int rt_dev_init(const RtModel *m, int rank, int world, int64_t bytes, char *err, size_t errlen)
{
    (void)bytes;
    char missing[200];
    cpu_missing(m, missing, sizeof missing);
    if (missing[0]) {
        const int native = m->cpu && !strcmp(m->cpu, "native");
        snprintf(err, errlen, "this executable was built for %s%s%s and this CPU lacks %s: rebuild it with --cpu set "
                 "to a level every node has (x86-64-v4: AVX-512, x86-64-v3: AVX2, x86-64-v2, x86-64), or with "
                 "--cpu native on this machine", native ? "the CPU of the machine it was compiled on (fsdpc --cpu "
                 "native)" : "the CPU level ", native ? "" : m->cpu ? m->cpu : "?", native ? "" : " (fsdpc --cpu)",
                 missing);
        return 1;
    }
    long cores = my_cores();
    int comm = comm_thread_wanted(world, cores);
    long n = comm && cores > 1 ? cores - 1 : cores;
    char t[160];
    g_gemm_threads = k_threads((int)(n < 4096 ? n : 4096), t, sizeof t);
    if (gemm_choose(rank, err, errlen) != 0)
        return 1;
    snprintf(g_threads, sizeof g_threads, "%s (%ld core%s for this rank%s); code for %s, kernels for %s; %s; "
             "OpenBLAS's %s kernels; %s", t, cores, cores > 1 ? "s" : "",
             comm && cores > 1 ? ", one of them the communication thread's" : "", m->cpu ? m->cpu : "?",
             m->cpu_kernels ? m->cpu_kernels : "?",
             g_wait[0] ? g_wait : "threads spin briefly while they wait (libgomp's default)", k_blas_kernels(),
             g_gemm_why);
    return 0;
}

const char *rt_dev_threads(void) { return g_threads; }

int rt_dev_comm_thread(int world) { return comm_thread_wanted(world, my_cores()); }

/* a thread, or in place (g_mode says which, and why) */
static void decide(RtCtx *c)
{
    long cores = my_cores();
    ct.state = -1;
    if (!comm_thread_wanted(c->world, cores))
        return;
    ct.cap = c->m->ncoll + 1;
    ct.q = calloc((size_t)ct.cap, sizeof *ct.q);
    ct.ticket = calloc((size_t)ct.cap, sizeof *ct.ticket);
    if (!ct.q || !ct.ticket || pthread_create(&ct.thread, NULL, comm_thread, NULL) != 0)
        rt_step_fail(c, "cannot start the communication thread");
    ct.state = 1;
    snprintf(g_mode, sizeof g_mode, "on a communication thread beside the step (%ld core%s for this rank%s)", cores,
             cores > 1 ? "s" : "", cores < 2 ? ", FSDPC_COMM_THREAD=1" : "");
}

const char *rt_dev_overlap(RtCtx *c)
{
    if (ct.state == 0)
        decide(c);
    return g_mode;
}

void rt_coll_start(RtCtx *c, int tag, int node, int lane, void (*job)(RtCtx *))
{
    (void)lane; /* one thread serves both lanes (see the top of this file) */
    if (tag < 0 || tag >= c->m->ncoll)
        rt_step_fail(c, "rt_coll_start: internal error: tag %d of %d", tag, c->m->ncoll);
    if (ct.state == 0)
        decide(c);
    Job j = {job, c, node};
    if (ct.state < 0) {
        run_job(&j);
        return;
    }
    pthread_mutex_lock(&ct.lock);
    if (ct.tail - ct.head == ct.cap) {
        pthread_mutex_unlock(&ct.lock);
        rt_step_fail(c, "rt_coll_start: internal error: more than %lld collectives in flight", (long long)ct.cap);
    }
    ct.q[ct.tail % ct.cap] = j;
    ct.ticket[tag] = ++ct.tail; /* job numbers count from 1: head >= ticket once it ran */
    pthread_cond_signal(&ct.more);
    pthread_mutex_unlock(&ct.lock);
}

void rt_coll_wait(RtCtx *c, int tag)
{
    if (tag < 0 || tag >= c->m->ncoll)
        rt_step_fail(c, "rt_coll_wait: internal error: tag %d of %d", tag, c->m->ncoll);
    if (ct.state < 0)
        return;
    pthread_mutex_lock(&ct.lock);
    while (ct.head < ct.ticket[tag])
        pthread_cond_wait(&ct.done_cv, &ct.lock);
    pthread_mutex_unlock(&ct.lock);
}

/* The best of 4 timed 1024^3 GEMMs after one warm-up (about 0.1 s at 100
 * GFLOP/s): float32, or bfloat16 operands (bf16) where the step's GEMMs are
 * oneDNN's native bf16 ones, which run about twice float32's rate (against
 * float32's peak a bf16 GPT printed MFU 153 %).  Each is timed by the wall
 * clock and by the process's CPU time: a GEMM's g_gemm_threads threads that
 * all ran the whole time used threads x wall of CPU time.  Where other
 * processes took the cores, they used less, and the wall-clock rate
 * understates the hardware (a busy machine once probed 0.027 TFLOPS and a
 * 46 s step printed MFU 70.8 %): the rate is taken over the threads' CPU
 * time instead, the rate they reach while they run, and *share says which
 * fraction of their time they got. */
double rt_dev_peak_flops(int bf16, double *share)
{
    enum { N = 1024 };
    const double flop = 2.0 * N * N * N, nt = g_gemm_threads > 0 ? g_gemm_threads : 1;
    *share = -1;
    float *c = malloc(sizeof(float) * N * N), *a = bf16 ? NULL : malloc(sizeof(float) * N * N * 2);
    uint16_t *h = bf16 ? malloc(sizeof(uint16_t) * N * N * 2) : NULL; /* the operands of the GEMM timed */
    if (!c || (!a && !h)) {
        free(c), free(a), free(h);
        return 0;
    }
    for (int64_t i = 0; i < 2 * (int64_t)N * N; i++) {
        const float v = (float)(i % 7) * 0.125f; /* exact in bfloat16 */
        if (h)
            h[i] = k_bf16_from_f32(v);
        else
            a[i] = v;
    }
    double best = 0;
    for (int r = 0; r < 5; r++) {
        double w0 = seconds(CLOCK_MONOTONIC), c0 = seconds(CLOCK_PROCESS_CPUTIME_ID);
        if (bf16)
            k_matmul_bf16(c, h, h + N * N, 1, 0, 0, N, N, N, 0, 0, 0.0);
        else
            k_matmul_f32(c, a, a + N * N, 1, 0, 0, N, N, N, 0, 0, 0.0);
        double w = seconds(CLOCK_MONOTONIC) - w0, t = seconds(CLOCK_PROCESS_CPUTIME_ID) - c0;
        double ran = t / nt < w ? t / nt : w; /* seconds each thread ran */
        if (r > 0 && ran > 0 && flop / ran > best) {
            best = flop / ran;
            *share = t / (w * nt) < 1 ? t / (w * nt) : 1;
        }
    }
    free(c), free(a), free(h);
    return best;
}

void rt_dev_finish(RtCtx *c)
{
    (void)c;
    if (ct.state == 1) {
        pthread_mutex_lock(&ct.lock);
        ct.stop = 1;
        pthread_cond_signal(&ct.more);
        pthread_mutex_unlock(&ct.lock);
        pthread_join(ct.thread, NULL);
    }
    free(ct.q);
    free(ct.ticket);
    ct.q = NULL;
    ct.ticket = NULL;
    ct.state = 0;
    ct.stop = 0;
    ct.head = ct.tail = 0;
}
