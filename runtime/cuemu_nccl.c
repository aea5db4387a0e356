/* cuemu_nccl.c — the subset of NCCL that comm_nccl.c calls, on the host,
 * between the processes of one machine (the ranks of an mpirun job).
 *
 * A communicator is a shared memory segment named by its ncclUniqueId
 * (ncclGetUniqueId makes "/fsdpc-cuemu-PID-TIME-N"): a header (who joined,
 * two arrival counters, an abort flag, each rank's pid, the colors and
 * keys of a split) and one staging slot of CHUNK bytes per rank.  Every
 * rank maps it (the first creates it; the last to join unlinks the name,
 * so nothing is left in /dev/shm).  ncclCommInitRankConfig returns at once
 * in non-blocking mode (ncclInProgress until every rank has joined, seen by
 * ncclCommGetAsyncError), as comm_nccl.c expects.
 *
 * A collective is a task on its stream (cuemu_enqueue: captured into a
 * graph like a kernel).  Per chunk, each rank copies its part into its
 * slot, all wait at a barrier, each computes its result from all slots in
 * rank order (sums in double, rounded once: float32, float64, bfloat16,
 * float16; ncclAvg divides by the rank count), and all wait again before
 * the slots are reused.  Ranks issue collectives in the same order, as
 * NCCL demands; and a communicator takes its collectives from one stream
 * only (the first it was given: another is refused, ncclInvalidUsage), the
 * rule comm_nccl.c keeps so that NCCL, which runs a communicator's
 * operations one after another, sees them in one order on every rank.
 * Communicators are independent: two streams may each run a collective of
 * their own communicator at once (fsdpc's gather and reduction lanes).  The barrier is an arrival counter: the k-th barrier waits
 * until it reaches k times the rank count.
 *
 * Failures: a wait that sees the abort flag (a rank called ncclCommAbort),
 * or a peer process gone (checked every 50 ms), gives up, marks the
 * communicator broken with ncclRemoteError (ncclCommGetAsyncError reports
 * it, ncclGetLastError says which rank) and skips its later collectives,
 * so the host's watchdog (cu_wait) sees the error instead of a hang.
 * ncclCommSplit runs on the host, blocking: colors and keys through the
 * header, then a communicator per color named after the parent's.
 *
 * Non-blocking communicators are strict as NCCL 2.28 is: after
 * ncclCommInitRankConfig or ncclCommSplit (the parent too), a communicator
 * takes no call until ncclCommGetAsyncError has read it settled, even where
 * the call itself answered ncclSuccess; a collective before that is refused
 * (ncclInvalidArgument, "Attempt to use communicator before the previous
 * operation returned ncclSuccess"), as an H200 refused comm_nccl.c's first
 * reduce-scatter when it did not poll after a split that answered ncclSuccess.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <nccl.h>

#include "cuemu.h"

#define MAX_RANKS 256
#define CHUNK ((size_t)1 << 20) /* bytes of one rank's slot */

typedef struct {
    atomic_uint_fast64_t joined;
    atomic_uint_fast64_t coll_arrived; /* the streams' collectives */
    atomic_uint_fast64_t host_arrived; /* the host's (ncclCommSplit) */
    atomic_int abort;
    int pid[MAX_RANKS];
    int color[MAX_RANKS], key[MAX_RANKS];
} Shared;

struct ncclComm {
    char name[NCCL_UNIQUE_ID_BYTES];
    int nranks, rank;
    Shared *sh;
    unsigned char *slot;     /* nranks slots of CHUNK bytes */
    size_t bytes;            /* the mapping */
    uint64_t coll_seq, host_seq; /* barriers passed by this rank */
    atomic_int state;        /* ncclInProgress until every rank joined, then ncclSuccess or the error */
    atomic_int aborted;
    int nonblocking;         /* made with config.blocking = 0 */
    atomic_int unsettled;    /* non-blocking, and not yet read settled by ncclCommGetAsyncError since init/split */
    int nsplit;              /* splits made from it so far */
    cudaStream_t stream;     /* the stream of its first collective: the only one it takes */
};

static pthread_mutex_t g_err_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_err[256];

static void set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&g_err_mu);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    pthread_mutex_unlock(&g_err_mu);
    va_end(ap);
}

const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return g_err;
}

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code (cuemu)";
    }
}

/* --------------------------------------------------------------- waiting */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* a reason to stop waiting: this rank or another aborted, or a peer died; 0 if none */
static int broken(ncclComm_t c, double *next_check)
{
    if (atomic_load(&c->aborted) || atomic_load(&c->state) != ncclSuccess)
        return 1;
    if (atomic_load(&c->sh->abort)) {
        set_error("cuemu NCCL: another rank of communicator %s aborted", c->name);
        return 1;
    }
    double t = now_s();
    if (t < *next_check)
        return 0;
    *next_check = t + 0.05;
    for (int r = 0; r < c->nranks; r++)
        if (c->sh->pid[r] > 0 && kill(c->sh->pid[r], 0) != 0 && errno == ESRCH) {
            set_error("cuemu NCCL: rank %d (pid %d) of communicator %s is gone", r, c->sh->pid[r], c->name);
            return 1;
        }
    return 0;
}

/* waits until *counter reaches want; 0, or -1 when the communicator broke (its state set) */
static int wait_for(ncclComm_t c, atomic_uint_fast64_t *counter, uint64_t want)
{
    double next_check = 0;
    for (unsigned spin = 0; atomic_load(counter) < want; spin++) {
        if (broken(c, &next_check)) {
            int ok = ncclSuccess;
            atomic_compare_exchange_strong(&c->state, &ok, ncclRemoteError);
            return -1;
        }
        if (spin < 64)
            sched_yield();
        else {
            struct timespec nap = {0, 20 * 1000};
            nanosleep(&nap, NULL);
        }
    }
    return 0;
}

static int barrier(ncclComm_t c, atomic_uint_fast64_t *counter, uint64_t *seq)
{
    (*seq)++;
    atomic_fetch_add(counter, 1);
    return wait_for(c, counter, *seq * (uint64_t)c->nranks);
}

/* ---------------------------------------------------------- communicators */

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    static atomic_int counter;
    if (!id)
        return ncclInvalidArgument;
    memset(id, 0, sizeof *id);
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    snprintf(id->internal, sizeof id->internal, "/fsdpc-cuemu-%d-%lld%09ld-%d", (int)getpid(), (long long)t.tv_sec,
             t.tv_nsec, atomic_fetch_add(&counter, 1));
    return ncclSuccess;
}

/* maps communicator name for nranks ranks; this rank joins as rank */
static ncclResult_t open_comm(ncclComm_t *out, const char *name, int nranks, int rank)
{
    *out = NULL;
    if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks || name[0] != '/') {
        set_error("cuemu NCCL: rank %d of %d ranks (at most %d), communicator '%.60s'", rank, nranks, MAX_RANKS, name);
        return ncclInvalidArgument;
    }
    ncclComm_t c = calloc(1, sizeof *c);
    if (!c)
        return ncclSystemError;
    snprintf(c->name, sizeof c->name, "%s", name);
    c->nranks = nranks, c->rank = rank;
    size_t head = (sizeof(Shared) + 4095) / 4096 * 4096;
    c->bytes = head + (size_t)nranks * CHUNK;
    int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
    void *p = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, (off_t)c->bytes) == 0)
        p = mmap(NULL, c->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    if (fd >= 0)
        close(fd);
    if (p == MAP_FAILED) {
        set_error("cuemu NCCL: shared memory %s (%zu bytes): %s", name, c->bytes, strerror(err));
        free(c);
        return ncclSystemError;
    }
    c->sh = p;
    c->slot = (unsigned char *)p + head;
    c->sh->pid[rank] = (int)getpid();
    atomic_init(&c->state, ncclInProgress);
    if (atomic_fetch_add(&c->sh->joined, 1) + 1 == (uint64_t)nranks)
        shm_unlink(name); /* everyone has it mapped */
    *out = c;
    return ncclSuccess;
}

/* ncclInProgress until every rank joined */
static ncclResult_t poll_join(ncclComm_t c)
{
    int st = atomic_load(&c->state);
    if (st == ncclInProgress && atomic_load(&c->sh->joined) >= (uint64_t)c->nranks) {
        atomic_compare_exchange_strong(&c->state, &st, ncclSuccess);
        st = atomic_load(&c->state);
    }
    return (ncclResult_t)st;
}

static int blocking(const ncclConfig_t *cfg)
{
    return !cfg || cfg->blocking == NCCL_CONFIG_UNDEF_INT || cfg->blocking != 0;
}

/* a blocking communicator waits for every rank to join; a non-blocking one is unsettled until polled */
static ncclResult_t settle(ncclComm_t c, const ncclConfig_t *cfg)
{
    if (!blocking(cfg)) {
        c->nonblocking = 1;
        atomic_store(&c->unsettled, 1);
        return poll_join(c);
    }
    atomic_store(&c->state, ncclSuccess); /* wait_for's "broken" reads it */
    if (wait_for(c, &c->sh->joined, (uint64_t)c->nranks) != 0)
        return ncclRemoteError;
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *cfg)
{
    if (!comm)
        return ncclInvalidArgument;
    id.internal[NCCL_UNIQUE_ID_BYTES - 1] = 0;
    ncclResult_t r = open_comm(comm, id.internal, nranks, rank);
    return r == ncclSuccess ? settle(*comm, cfg) : r;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *st)
{
    if (!c || !st)
        return ncclInvalidArgument;
    *st = poll_join(c);
    if (*st != ncclInProgress)
        atomic_store(&c->unsettled, 0);
    return ncclSuccess;
}

/* NCCL's rule for a non-blocking communicator not yet polled settled: refused, said as NCCL says it */
static int refuse_unsettled(ncclComm_t c, const char *call)
{
    if (!atomic_load(&c->unsettled))
        return 0;
    set_error("cuemu NCCL: %s: Attempt to use communicator before the previous operation returned ncclSuccess "
              "(poll ncclCommGetAsyncError after a non-blocking init or split, even one that answered ncclSuccess)",
              call);
    return 1;
}

/* the members of this rank's color, in (key, rank) order: its new rank and their count */
static void members(ncclComm_t c, int color, int key, int *newrank, int *count)
{
    *newrank = *count = 0;
    for (int r = 0; r < c->nranks; r++) {
        if (c->sh->color[r] != color)
            continue;
        (*count)++;
        int rk = c->sh->key[r];
        if (rk < key || (rk == key && r < c->rank))
            (*newrank)++;
    }
}

ncclResult_t ncclCommSplit(ncclComm_t c, int color, int key, ncclComm_t *out, ncclConfig_t *cfg)
{
    if (!c || !out)
        return ncclInvalidArgument;
    *out = NULL;
    if (refuse_unsettled(c, "ncclCommSplit"))
        return ncclInvalidArgument;
    if (c->nonblocking) /* the parent is busy with the split until polled (NCCL 2.28) */
        atomic_store(&c->unsettled, 1);
    if (poll_join(c) != ncclSuccess || wait_for(c, &c->sh->joined, (uint64_t)c->nranks) != 0)
        return ncclInvalidUsage;
    /* nobody overwrites the colors of the previous split before all have read them: a barrier before */
    if (barrier(c, &c->sh->host_arrived, &c->host_seq) != 0)
        return ncclRemoteError;
    c->sh->color[c->rank] = color, c->sh->key[c->rank] = key;
    if (barrier(c, &c->sh->host_arrived, &c->host_seq) != 0)
        return ncclRemoteError;
    int newrank, count;
    members(c, color, key, &newrank, &count);
    if (barrier(c, &c->sh->host_arrived, &c->host_seq) != 0)
        return ncclRemoteError;
    int n = c->nsplit++;
    if (color == NCCL_SPLIT_NOCOLOR)
        return ncclSuccess;
    char name[NCCL_UNIQUE_ID_BYTES];
    snprintf(name, sizeof name, "%.80s-s%d-c%d", c->name, n, color);
    ncclResult_t r = open_comm(out, name, count, newrank);
    return r == ncclSuccess ? settle(*out, cfg) : r;
}

ncclResult_t ncclCommFinalize(ncclComm_t c)
{
    return c ? ncclSuccess : ncclInvalidArgument; /* the work is on streams, which the caller waits for */
}

ncclResult_t ncclCommDestroy(ncclComm_t c)
{
    if (!c)
        return ncclInvalidArgument;
    munmap(c->sh, c->bytes);
    free(c);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c)
{
    if (!c)
        return ncclSuccess;
    /* a stream's worker may be inside a collective: it sees the flag and leaves; the mapping stays */
    atomic_store(&c->aborted, 1);
    atomic_store(&c->sh->abort, 1);
    return ncclSuccess;
}

/* ----------------------------------------------------------- collectives */

typedef enum { ALLREDUCE, ALLGATHER, REDUCE_SCATTER } Kind;

typedef struct {
    Kind kind;
    ncclComm_t comm;
    const void *send;
    void *recv;
    size_t count;            /* recvcount (reduce-scatter), sendcount (all-gather), count (all-reduce) */
    ncclDataType_t type;
    ncclRedOp_t op;
} Coll;

static size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclFloat64: return 8;
    case ncclFloat32: return 4;
    case ncclBfloat16:
    case ncclFloat16: return 2;
    default: return 0;
    }
}

static double get(ncclDataType_t t, const void *p, size_t i)
{
    switch (t) {
    case ncclFloat64: return ((const double *)p)[i];
    case ncclFloat32: return ((const float *)p)[i];
    case ncclBfloat16: {
        uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    default: {
        uint16_t h = ((const uint16_t *)p)[i];
        int e = (h >> 10) & 0x1f, m = h & 0x3ff;
        double v = e == 0x1f ? (m ? NAN : INFINITY) : e ? ldexp(m | 0x400, e - 25) : ldexp(m, -24);
        return h & 0x8000 ? -v : v;
    }
    }
}

/* float -> float16 bits, to nearest even */
static uint16_t to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)(u >> 16 & 0x8000);
    float a = fabsf(f);
    if (a != a)
        return sign | 0x7e00;
    if (a >= 65520.0f)
        return sign | 0x7c00;
    if (a < 6.103515625e-05f) /* subnormal: units of 2^-24 */
        return sign | (uint16_t)lrintf(a * 16777216.0f);
    int e;
    float m = frexpf(a, &e); /* a = m 2^e, m in [0.5, 1) */
    long q = lrintf(m * 2048.0f); /* 11 bits, to nearest even */
    if (q == 2048)
        q = 1024, e++;
    return sign | (uint16_t)((e + 14) << 10 | (q & 0x3ff));
}

static void put(ncclDataType_t t, void *p, size_t i, double v)
{
    switch (t) {
    case ncclFloat64: ((double *)p)[i] = v; break;
    case ncclFloat32: ((float *)p)[i] = (float)v; break;
    case ncclBfloat16: {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        if ((u & 0x7fffffffu) > 0x7f800000u)
            u = 0x7fc00000u;
        else
            u += 0x7fffu + (u >> 16 & 1u);
        ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
        break;
    }
    default: ((uint16_t *)p)[i] = to_f16((float)v); break;
    }
}

/* out[i] = op over the ranks of slot r's element at + i, for i < n */
static void reduce(const Coll *k, void *out, size_t at, size_t n)
{
    ncclComm_t c = k->comm;
    for (size_t i = 0; i < n; i++) {
        double s = 0;
        for (int r = 0; r < c->nranks; r++)
            s += get(k->type, c->slot + (size_t)r * CHUNK, at + i);
        put(k->type, out, i, k->op == ncclAvg ? s / c->nranks : s);
    }
}

static void run_coll(void *p)
{
    const Coll *k = p;
    ncclComm_t c = k->comm;
    size_t es = type_size(k->type), n = (size_t)c->nranks;
    unsigned char *mine = c->slot + (size_t)c->rank * CHUNK;
    const unsigned char *send = k->send;
    unsigned char *recv = k->recv;
    size_t per = k->kind == REDUCE_SCATTER ? CHUNK / es / n : CHUNK / es; /* elements a chunk carries */
    for (size_t o = 0; o < k->count && atomic_load(&c->state) == ncclSuccess; o += per) {
        size_t m = k->count - o < per ? k->count - o : per;
        if (k->kind == REDUCE_SCATTER)
            for (size_t q = 0; q < n; q++)
                memcpy(mine + q * m * es, send + (q * k->count + o) * es, m * es);
        else
            memcpy(mine, send + o * es, m * es);
        if (barrier(c, &c->sh->coll_arrived, &c->coll_seq) != 0)
            return;
        if (k->kind == ALLGATHER)
            for (size_t q = 0; q < n; q++)
                memcpy(recv + (q * k->count + o) * es, c->slot + q * CHUNK, m * es);
        else
            reduce(k, recv + o * es, k->kind == REDUCE_SCATTER ? (size_t)c->rank * m : 0, m);
        if (barrier(c, &c->sh->coll_arrived, &c->coll_seq) != 0)
            return;
    }
}

static ncclResult_t enqueue(const char *call, Coll k, size_t send_n, size_t recv_n, cudaStream_t s)
{
    size_t es = type_size(k.type);
    if (!k.comm || !es || (k.op != ncclSum && k.op != ncclAvg)) {
        set_error("cuemu NCCL: %s: %s", call, !k.comm ? "no communicator" : "a type or operation not emulated");
        return ncclInvalidArgument;
    }
    if (refuse_unsettled(k.comm, call))
        return ncclInvalidArgument;
    if (poll_join(k.comm) != ncclSuccess)
        return atomic_load(&k.comm->state) == ncclInProgress ? ncclInvalidUsage : ncclRemoteError;
    if (k.count && (!cuemu_is_device(k.send, send_n * es) || !cuemu_is_device(k.recv, recv_n * es))) {
        cuemu_complain(call, "a buffer (send %p, %zu elements; receive %p, %zu) is not inside a device allocation",
                       k.send, send_n, k.recv, recv_n);
        set_error("cuemu NCCL: %s: a buffer is not device memory", call);
        return ncclInvalidArgument;
    }
    if (!k.comm->stream)
        k.comm->stream = s;
    if (k.comm->stream != s) {
        set_error("cuemu NCCL: %s: the communicator's collectives came from another stream before (one stream per "
                  "communicator, or the ranks may see them in different orders)", call);
        return ncclInvalidUsage;
    }
    if (!k.count)
        return ncclSuccess;
    return cuemu_enqueue(s, call, run_coll, &k, sizeof k) == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t s)
{
    Coll k = {ALLREDUCE, comm, send, recv, count, type, op};
    return enqueue("ncclAllReduce", k, count, count, s);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t s)
{
    Coll k = {ALLGATHER, comm, send, recv, count, type, ncclSum};
    return enqueue("ncclAllGather", k, count, comm ? count * (size_t)comm->nranks : 0, s);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t s)
{
    Coll k = {REDUCE_SCATTER, comm, send, recv, count, type, op};
    return enqueue("ncclReduceScatter", k, comm ? count * (size_t)comm->nranks : 0, count, s);
}
